/*
 * The action stream from C99 (frt_stream_*), written from the header alone: a simulated control
 * loop on the micro Pi0.5 (observation in, one action out per tick, at a fixed period), the
 * counters, every error path and the panic boundary. Driven by ffi/tests/c_api.rs (under
 * valgrind when present):
 *
 *   stream_test CHECKPOINT_DIR TOKENIZER_JSON
 *
 * The control period adapts to the machine: 20 ms (50 Hz), or longer where one step (measured
 * first) takes more than a few ticks, as under valgrind, so that chunks arrive before the horizon
 * runs out. Compiled with -DFRT_PANIC_HOOK when the library exports the debug hook.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include <flashrt.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int failures = 0;
static int checks = 0;

#define CHECK(cond)                                                                \
    do {                                                                           \
        checks++;                                                                  \
        if (!(cond)) {                                                             \
            failures++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                          \
    } while (0)

#define EXPECT_STATUS(call, status) CHECK((call) == (status))

static char message[4096];

#define EXPECT_MENTIONS(text, needle)                                                   \
    do {                                                                                \
        checks++;                                                                       \
        if (strstr((text), (needle)) == NULL) {                                         \
            failures++;                                                                 \
            fprintf(stderr, "%s:%d: \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__, (text), (needle)); \
        }                                                                               \
    } while (0)

static const char *stream_error(const FrtStream *s) {
    size_t n = 0;
    if (frt_stream_last_error(s, message, sizeof message, &n) != FRT_STATUS_OK) return "<no message>";
    return message;
}

static const char *thread_error(void) {
    size_t n = 0;
    if (frt_last_error(message, sizeof message, &n) != FRT_STATUS_OK) return "<no message>";
    return message;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t) {
    double left = t - now_s();
    if (left > 0) {
        struct timespec ts;
        ts.tv_sec = (time_t)left;
        ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
    }
}

#define W 56
#define H 56
static unsigned char rgb[W * H * 3];
static float state[8];
static float chunk[50 * 7];

int main(int argc, char **argv) {
    FrtPolicyConfig pc;
    FrtPolicy *policy = NULL;
    FrtPolicyInfo info;
    FrtStreamConfig sc;
    FrtStream *stream = NULL, *other = NULL;
    FrtFrame cameras[3];
    FrtObservation obs;
    FrtActionTick tick;
    FrtStreamStats stats;
    float action[7], noise[1] = {0.0f};
    double t0, step_s, period_s, next;
    size_t i, n = 0, cpu = 0;
    long fresh = 0, late = 0, waiting = 0, switches = 0, ticks = 0;
    if (argc != 3) {
        fprintf(stderr, "usage: %s CHECKPOINT_DIR TOKENIZER_JSON\n", argv[0]);
        return 2;
    }
    for (i = 0; i < sizeof rgb; i++) rgb[i] = (unsigned char)(i * 13 % 251);

    pc.struct_size = sizeof pc;
    EXPECT_STATUS(frt_policy_config_default(&pc), FRT_STATUS_OK);
    pc.checkpoint = argv[1];
    pc.tokenizer = argv[2];
    pc.backend = FRT_BACKEND_CPU;
    pc.threads = 1;
    pc.denoise_steps = 2;
    pc.prompt_capacity = 64;
    pc.max_frame_width = W;
    pc.max_frame_height = H;
    pc.log_level = FRT_LOG_LEVEL_OFF;
    EXPECT_STATUS(frt_policy_open(&pc, &policy), FRT_STATUS_OK);
    if (policy == NULL) {
        fprintf(stderr, "cannot open %s: %s\n", argv[1], thread_error());
        return 1;
    }
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_STATUS(frt_policy_info(policy, &info), FRT_STATUS_OK);
    CHECK(info.action_dim == 7 && info.horizon == 50 && info.state_dim == 8 && info.cameras == 3);
    EXPECT_STATUS(frt_policy_set_prompt(policy, "pick up the cube", 16), FRT_STATUS_OK);

    cameras[0].data = rgb;
    cameras[0].data_len = sizeof rgb;
    cameras[0].width = W;
    cameras[0].height = H;
    cameras[0].stride = 0;
    cameras[0].format = FRT_PIXEL_FORMAT_RGB8;
    cameras[0].present = true;
    cameras[1] = cameras[0];
    cameras[1].format = FRT_PIXEL_FORMAT_BGR8;
    memset(&cameras[2], 0, sizeof cameras[2]);
    memset(&obs, 0, sizeof obs);
    obs.struct_size = sizeof obs;
    obs.cameras = cameras;
    obs.cameras_len = 3;
    obs.state = state;
    obs.state_len = 8;

    /* One plain step first: it warms the policy and says how fast this machine is. */
    t0 = now_s();
    EXPECT_STATUS(frt_policy_step(policy, &obs, chunk, 50 * 7, NULL), FRT_STATUS_OK);
    step_s = now_s() - t0;
    period_s = step_s / 8 > 0.02 ? step_s / 8 : 0.02;

    /* Config defaults and refusals. */
    sc.struct_size = 8;
    EXPECT_STATUS(frt_stream_config_default(&sc), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.struct_size");
    EXPECT_STATUS(frt_stream_config_default(NULL), FRT_STATUS_NULL_ARGUMENT);
    sc.struct_size = sizeof sc;
    EXPECT_STATUS(frt_stream_config_default(&sc), FRT_STATUS_OK);
    CHECK(sc.control_period_us == 20000 && sc.refill_at == 0 && sc.fallback == FRT_FALLBACK_HOLD && sc.cpus == NULL);
    EXPECT_STATUS(frt_stream_create(NULL, &sc, &stream), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_stream_create(policy, NULL, &stream), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_stream_create(policy, &sc, NULL), FRT_STATUS_NULL_ARGUMENT);
    sc.fallback = 7;
    EXPECT_STATUS(frt_stream_create(policy, &sc, &stream), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.fallback");
    sc.fallback = FRT_FALLBACK_DECELERATE;
    sc.refill_at = 50;
    EXPECT_STATUS(frt_stream_create(policy, &sc, &stream), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "refill_at");
    sc.refill_at = 40;
    sc.fifo_priority = 100;
    EXPECT_STATUS(frt_stream_create(policy, &sc, &stream), FRT_STATUS_INVALID_ARGUMENT);
    sc.fifo_priority = 1; /* applied as root, refused and skipped otherwise */
    sc.cpus_len = 1;
    EXPECT_STATUS(frt_stream_create(policy, &sc, &stream), FRT_STATUS_NULL_ARGUMENT);
    sc.cpus = &cpu;
    sc.control_period_us = (uint64_t)(period_s * 1e6);
    CHECK(stream == NULL);
    EXPECT_STATUS(frt_stream_create(policy, &sc, &stream), FRT_STATUS_OK);
    if (stream == NULL) return 1;

    /* Before any observation: waiting, the action untouched. */
    action[0] = -7.0f;
    tick.struct_size = sizeof tick;
    EXPECT_STATUS(frt_stream_next_action(stream, action, 7, &tick), FRT_STATUS_OK);
    CHECK(tick.status == FRT_ACTION_STATUS_WAITING && action[0] == -7.0f && tick.tick == 0);
    waiting++;
    ticks++;
    /* Refusals on the control path name the field and write nothing. */
    EXPECT_STATUS(frt_stream_next_action(stream, action, 6, &tick), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(stream_error(stream), "action_len");
    EXPECT_STATUS(frt_stream_next_action(stream, action, 7, NULL), FRT_STATUS_NULL_ARGUMENT);
    tick.struct_size = 8;
    EXPECT_STATUS(frt_stream_next_action(stream, action, 7, &tick), FRT_STATUS_INVALID_ARGUMENT);
    tick.struct_size = sizeof tick;
    EXPECT_STATUS(frt_stream_push_observation(stream, NULL), FRT_STATUS_NULL_ARGUMENT);
    obs.state_len = 7;
    EXPECT_STATUS(frt_stream_push_observation(stream, &obs), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(stream_error(stream), "observation.state");
    obs.state_len = 8;
    obs.noise = noise;
    obs.noise_len = 1;
    EXPECT_STATUS(frt_stream_push_observation(stream, &obs), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(stream_error(stream), "observation.noise");
    obs.noise = NULL;
    obs.noise_len = 0;
    EXPECT_STATUS(frt_stream_set_prompt(stream, "\xff", 1), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(frt_stream_set_prompt(stream, "pick up the red cube", 20), FRT_STATUS_OK);
    CHECK(stream_error(stream)[0] == '\0');

    /* The control loop: push, take one action, sleep to the next tick; until 3 chunks came. */
    next = now_s();
    while (ticks < 3000) {
        for (i = 0; i < 8; i++) state[i] = (float)sin(0.05 * (double)ticks + (double)i);
        EXPECT_STATUS(frt_stream_push_observation(stream, &obs), FRT_STATUS_OK);
        EXPECT_STATUS(frt_stream_next_action(stream, action, 7, &tick), FRT_STATUS_OK);
        CHECK(tick.tick == (uint64_t)ticks);
        if (tick.status == FRT_ACTION_STATUS_FRESH) {
            fresh++;
            for (i = 0; i < 7; i++) CHECK(isfinite(action[i]));
            CHECK(tick.chunk_age + tick.remaining == 49);
        } else if (tick.status == FRT_ACTION_STATUS_WAITING) {
            waiting++;
        } else {
            late++;
        }
        if (tick.new_chunk) {
            switches++;
            CHECK(tick.skipped == tick.chunk_age);
        }
        ticks++;
        stats.struct_size = sizeof stats;
        EXPECT_STATUS(frt_stream_stats(stream, &stats), FRT_STATUS_OK);
        if (stats.chunks >= 3 && fresh > 0) break;
        next += period_s;
        sleep_until(next);
    }
    CHECK(stats.chunks >= 3 && switches >= 2);
    CHECK(stats.ticks == (uint64_t)ticks);
    CHECK(stats.waiting_ticks == (uint64_t)waiting && stats.late_ticks == (uint64_t)late);
    CHECK(stats.ticks == (uint64_t)(fresh + late + waiting));
    CHECK(stats.errors == 0 && stats.running && stats.latency_max_us >= stats.latency_p50_us && stats.latency_p50_us > 0);
    EXPECT_STATUS(frt_stream_inference_error(stream, NULL, 0, &n), FRT_STATUS_OK);
    CHECK(n == 0);
    stats.struct_size = 8;
    EXPECT_STATUS(frt_stream_stats(stream, &stats), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(frt_stream_stats(NULL, &stats), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_stream_last_error(NULL, message, sizeof message, &n), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_stream_push_observation(NULL, &obs), FRT_STATUS_NULL_ARGUMENT);
    printf("stream: %ld ticks of %.0f ms (one step %.1f ms): %ld fresh, %ld late, %ld waiting, %llu chunks, delay %llu ticks\n", ticks,
           period_s * 1e3, step_s * 1e3, fresh, late, waiting, (unsigned long long)stats.chunks, (unsigned long long)stats.delay_ticks);

#ifdef FRT_PANIC_HOOK
    {
        void frt_debug_panic_next_call(void);
#define EXPECT_PANIC(call)                     \
    do {                                       \
        frt_debug_panic_next_call();           \
        EXPECT_STATUS(call, FRT_STATUS_PANIC); \
    } while (0)
        stats.struct_size = sizeof stats;
        EXPECT_PANIC(frt_stream_config_default(&sc));
        EXPECT_PANIC(frt_stream_create(policy, &sc, &other));
        CHECK(other == NULL);
        EXPECT_PANIC(frt_stream_push_observation(stream, &obs));
        EXPECT_PANIC(frt_stream_next_action(stream, action, 7, &tick));
        EXPECT_PANIC(frt_stream_stats(stream, &stats));
        EXPECT_PANIC(frt_stream_set_prompt(stream, "x", 1));
        EXPECT_PANIC(frt_stream_last_error(stream, message, sizeof message, &n));
        EXPECT_PANIC(frt_stream_inference_error(stream, message, sizeof message, &n));
        frt_debug_panic_next_call();
        frt_stream_free(NULL); /* void: the panic is swallowed */
        EXPECT_STATUS(frt_stream_next_action(stream, action, 7, &tick), FRT_STATUS_OK);
    }
#endif

    /* Free joins the inference thread; the policy is the caller's again. */
    frt_stream_free(stream);
    frt_stream_free(NULL);
    EXPECT_STATUS(frt_policy_step(policy, &obs, chunk, 50 * 7, NULL), FRT_STATUS_OK);
    frt_policy_free(policy);
    printf("stream_test: %d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}

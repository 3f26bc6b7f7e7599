// include/flashrt.hpp from C++17: RAII, exceptions carrying status and message, the noexcept
// try_step, move semantics. Linked against the static libflashrt.a by ffi/tests/c_api.rs.
//
//   hpp_test CHECKPOINT_DIR TOKENIZER_JSON
#include <flashrt.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

static int failures = 0;
static int checks = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        checks++;                                                                    \
        if (!(cond)) {                                                               \
            failures++;                                                              \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

static bool mentions(const std::string &text, const char *needle) {
    bool found = text.find(needle) != std::string::npos;
    if (!found) std::fprintf(stderr, "\"%s\" does not mention \"%s\"\n", text.c_str(), needle);
    return found;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s CHECKPOINT_DIR TOKENIZER_JSON\n", argv[0]);
        return 2;
    }
    CHECK(frt::version() == frt_version());
    CHECK(mentions(frt::status_message(FRT_STATUS_CHECKPOINT), "checkpoint"));

    // A failed open throws with the status and the library's message.
    try {
        frt::Config missing(std::string(argv[1]) + "/nope");
        frt::Policy::open(missing);
        CHECK(false);
    } catch (const frt::Error &e) {
        CHECK(e.status() == FRT_STATUS_IO);
        CHECK(mentions(e.what(), "nope"));
    }

    frt::Config config(argv[1]);
    config.tokenizer = argv[2];
    config.options.backend = FRT_BACKEND_CPU;
    config.options.max_frame_width = 640;
    config.options.max_frame_height = 480;
    config.options.log_level = FRT_LOG_LEVEL_OFF;
    config.options.denoise_steps = 2;  // less compute: this runs under valgrind
    config.options.prompt_capacity = 64;
    // One thread: valgrind runs one thread at a time, so a worker waiting for its next part
    // spins away the other's time slice (tests/c/abi_test.c covers the pool under valgrind).
    config.options.threads = 1;
    frt::Policy opened = frt::Policy::open(config);
    frt::Policy policy = std::move(opened);  // the moved-from handle is empty; its destructor is a no-op
    // A const call on the empty handle throws with the thread's message (frt_last_error).
    try {
        (void)opened.info();
        CHECK(false);
    } catch (const frt::Error &e) {
        CHECK(e.status() == FRT_STATUS_NULL_ARGUMENT && mentions(e.what(), "policy is NULL"));
    }
    CHECK(opened.get() == nullptr && policy.get() != nullptr);

    const frt::Info info = policy.info();
    CHECK(info.model == "pi05" && info.backend == FRT_BACKEND_CPU && !info.device_name.empty());
    CHECK(info.camera_names.size() == 3 && info.camera_names[0] == "observation.images.base_0_rgb");
    CHECK(info.actions_len == info.horizon * info.action_dim && info.max_frame_width == 640);
    CHECK(mentions(policy.explain(), "\n"));

    policy.set_prompt("open the drawer");
    std::vector<uint8_t> pixels(480 * 640 * 3);
    for (size_t i = 0; i < pixels.size(); i++) pixels[i] = static_cast<uint8_t>(i * 7 % 255);
    std::vector<float> state(info.state_dim, 0.25f);
    std::vector<float> actions(info.actions_len, NAN);
    frt::Observation obs(info.camera_names.size());
    obs.set_frame(0, pixels.data(), pixels.size(), 640, 480, FRT_PIXEL_FORMAT_BGR8);
    obs.set_missing(1);
    obs.set_frame(2, pixels.data(), pixels.size(), 320, 240, FRT_PIXEL_FORMAT_RGB8, 640 * 3);
    obs.set_state(state.data(), state.size());

    FrtStepInfo step = policy.step(obs, actions.data(), actions.size());
    CHECK(step.latency_ms > 0.0);
    bool finite = true;
    for (float a : actions) finite = finite && std::isfinite(a);
    CHECK(finite);

    // A bad tick: try_step reports by status, step throws naming the field; then it steps again.
    state[2] = INFINITY;
    CHECK(policy.try_step(obs, actions.data(), actions.size()) == FRT_STATUS_INVALID_ARGUMENT);
    CHECK(mentions(policy.last_error(), "observation.state[2]"));
    try {
        policy.step(obs, actions.data(), actions.size());
        CHECK(false);
    } catch (const frt::Error &e) {
        CHECK(e.status() == FRT_STATUS_INVALID_ARGUMENT && mentions(e.what(), "observation.state[2]"));
    }
    state[2] = 0.0f;
    FrtStepInfo again = frt::sized<FrtStepInfo>();
    CHECK(policy.try_step(obs, actions.data(), actions.size(), &again) == FRT_STATUS_OK && again.latency_ms > 0.0);
    CHECK(policy.last_error().empty());
    // Opened without real-time chunking: a continuing step throws, naming why.
    try {
        policy.step_continuing(obs, 10, 2, actions.data(), actions.size());
        CHECK(false);
    } catch (const frt::Error &e) {
        CHECK(e.status() == FRT_STATUS_INVALID_ARGUMENT && mentions(e.what(), "real-time chunking"));
    }

    try {
        policy.set_prompt_tokens({});
        CHECK(false);
    } catch (const frt::Error &e) {
        CHECK(e.status() == FRT_STATUS_INVALID_ARGUMENT && mentions(e.what(), "prompt_tokens"));
    }

    // Pi0.5 has no embodiments: set_embodiment throws saying so, and info names none.
    CHECK(info.embodiment.empty());
    try {
        policy.set_embodiment("robot");
        CHECK(false);
    } catch (const frt::Error &e) {
        CHECK(e.status() == FRT_STATUS_INVALID_ARGUMENT && mentions(e.what(), "Pi0.5 has no embodiments"));
    }

    // An empty view (data() may be NULL) reaches the library as an empty prompt, refused as such.
    try {
        policy.set_prompt(std::string_view{});
        CHECK(false);
    } catch (const frt::Error &e) {
        CHECK(e.status() == FRT_STATUS_INVALID_ARGUMENT && mentions(e.what(), "empty"));
    }

    // The action stream over the same policy: one chunk arrives, a fresh action comes out; the
    // destructor joins the inference thread and the policy steps again afterwards.
    {
        frt::StreamConfig sc;
        sc.options.control_period_us = 100000;
        sc.options.refill_at = 40;
        frt::Stream made = frt::Stream::create(policy, sc);
        frt::Stream stream = std::move(made);
        CHECK(made.get() == nullptr && stream.get() != nullptr);
        std::vector<float> action(info.action_dim, NAN);
        FrtActionTick tick = frt::sized<FrtActionTick>();
        CHECK(stream.try_push(obs) == FRT_STATUS_OK);
        bool got = false;
        for (int i = 0; i < 600 && !got; i++) {
            CHECK(stream.try_next_action(action.data(), action.size(), &tick) == FRT_STATUS_OK);
            got = tick.status == FRT_ACTION_STATUS_FRESH;
            if (!got) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        CHECK(got && std::isfinite(action[0]) && stream.stats().chunks >= 1);
        CHECK(stream.try_next_action(action.data(), 1, &tick) == FRT_STATUS_INVALID_ARGUMENT);
        CHECK(mentions(stream.last_error(), "action_len"));
        CHECK(stream.inference_error().empty());
        try {
            frt::Stream::create(policy, [] { frt::StreamConfig bad; bad.options.fallback = 9; return bad; }());
            CHECK(false);
        } catch (const frt::Error &e) {
            CHECK(e.status() == FRT_STATUS_INVALID_ARGUMENT && mentions(e.what(), "config.fallback"));
        }
    }
    CHECK(policy.try_step(obs, actions.data(), actions.size()) == FRT_STATUS_OK);

    FrtLatencyStats stats = policy.stats();
    CHECK(stats.count >= 4 && stats.p50_ms > 0.0);  // the stream's steps count too
    policy.reset_stats();
    CHECK(policy.stats().count == 0);
    // Recording (tests/c/abi_test.c reads a log back): a file that cannot be created throws
    // naming it; stopping without a recording is nothing.
    try {
        policy.record_start("/nonexistent-dir/obs.frtobs");
        CHECK(false);
    } catch (const frt::Error &e) {
        CHECK(e.status() == FRT_STATUS_IO && mentions(e.what(), "/nonexistent-dir/obs.frtobs"));
    }
    policy.record_stop();
    // Calibration: a log that does not exist throws naming it.
    try {
        policy.calibrate("/nonexistent-dir/obs.frtobs", 1);
        CHECK(false);
    } catch (const frt::Error &e) {
        CHECK(e.status() == FRT_STATUS_IO && mentions(e.what(), "/nonexistent-dir/obs.frtobs"));
    }

    // Real-time chunking: the second chunk continues the first, so it differs from a fresh one.
    config.options.rtc_schedule = FRT_RTC_SCHEDULE_LINEAR;
    config.options.rtc_execution_horizon = 20;
    frt::Policy rtc = frt::Policy::open(config);
    rtc.set_prompt("open the drawer");
    std::vector<float> first(info.actions_len, NAN), fresh(info.actions_len, NAN), continued(info.actions_len, NAN);
    std::vector<float> noise(rtc.info().noise_len, 0.5f);
    obs.set_noise(noise.data(), noise.size());
    rtc.step(obs, first.data(), first.size());
    rtc.step(obs, fresh.data(), fresh.size());
    rtc.step_continuing(obs, 5, 2, continued.data(), continued.size());
    CHECK(fresh == first && continued != fresh);

    std::printf("hpp_test: %d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}

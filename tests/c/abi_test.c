/*
 * Every function of include/flashrt.h and every error path, from C99, written from the header
 * alone. Driven by ffi/tests/c_api.rs (under valgrind when present):
 *
 *   abi_test CHECKPOINT_DIR TOKENIZER_JSON SCRATCH_DIR GROOT_CHECKPOINT_DIR
 *
 * CHECKPOINT_DIR is a tiny Pi0.5 synthesized by flashrt::synth (3 cameras, state 8, action 7);
 * SCRATCH_DIR receives the broken checkpoints and recorded.frtobs, the observation log of
 * test_steps (ffi/tests/c_api.rs reads its records back); GROOT_CHECKPOINT_DIR is the tiny GR00T N1.7
 * fixture (tests/data/groot_n17_tiny). Compiled with -DEXPECTED_MAJOR/MINOR/PATCH and
 * -DEXPECTED_VERSION from Cargo.toml, and -DFRT_PANIC_HOOK when the library is a debug build that
 * exports the debug hooks frt_debug_panic_next_call and frt_debug_fault_next_step.
 */
#define _POSIX_C_SOURCE 200809L /* mkdir, dup2 */
#include <flashrt.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static char *long_message = NULL;

/* Reads a text output the way the header says: query the length, then copy (messages can be long:
 * a corrupted checkpoint lists every broken tensor). */
static const char *read_text(FrtStatus (*read)(const FrtPolicy *, char *, size_t, size_t *), const FrtPolicy *policy) {
    size_t n = 0, again = 0;
    if (read(policy, NULL, 0, &n) != FRT_STATUS_OK) return "<no message>";
    free(long_message);
    long_message = (char *)malloc(n + 1);
    if (long_message == NULL || read(policy, long_message, n + 1, &again) != FRT_STATUS_OK || again != n) return "<no message>";
    return long_message;
}

static FrtStatus read_thread_error(const FrtPolicy *unused, char *buf, size_t len, size_t *written) {
    (void)unused;
    return frt_last_error(buf, len, written);
}

static const char *last_error(const FrtPolicy *policy) { return read_text(frt_policy_last_error, policy); }

static const char *thread_error(void) { return read_text(read_thread_error, NULL); }

#define EXPECT_MENTIONS(text, needle)                                                   \
    do {                                                                                \
        const char *t_ = (text);                                                        \
        checks++;                                                                       \
        if (strstr(t_, (needle)) == NULL) {                                             \
            failures++;                                                                 \
            fprintf(stderr, "%s:%d: \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__, t_, (needle)); \
        }                                                                               \
    } while (0)

static const char *checkpoint_dir;
static const char *tokenizer_path;
static const char *scratch_dir;

/* ---- version, status messages, config defaults ---------------------------------------------- */

static void test_version(void) {
    char composed[64];
    CHECK(FRT_VERSION_MAJOR == EXPECTED_MAJOR);
    CHECK(FRT_VERSION_MINOR == EXPECTED_MINOR);
    CHECK(FRT_VERSION_PATCH == EXPECTED_PATCH);
    /* The composed number must carry every part, PATCH included. */
    CHECK(FRT_VERSION_NUMBER == EXPECTED_MAJOR * 1000000 + EXPECTED_MINOR * 1000 + EXPECTED_PATCH);
    CHECK(frt_version() != NULL);
    CHECK(strcmp(frt_version(), EXPECTED_VERSION) == 0);
    snprintf(composed, sizeof composed, "%d.%d.%d", FRT_VERSION_MAJOR, FRT_VERSION_MINOR, FRT_VERSION_PATCH);
    CHECK(strcmp(frt_version(), composed) == 0);
}

static void test_status_message(void) {
    char buf[256];
    char tiny[4] = {'x', 'x', 'x', 'x'};
    size_t n = 12345, need = 0;
    uint32_t s;
    for (s = FRT_STATUS_OK; s <= FRT_STATUS_CALIBRATION; s++) {
        EXPECT_STATUS(frt_status_message(s, NULL, 0, &need), FRT_STATUS_OK);
        CHECK(need > 0);
        EXPECT_STATUS(frt_status_message(s, buf, sizeof buf, &n), FRT_STATUS_OK);
        CHECK(n == need && strlen(buf) == n);
    }
    EXPECT_MENTIONS((frt_status_message(FRT_STATUS_PANIC, buf, sizeof buf, &n), buf), "panic");
    EXPECT_MENTIONS((frt_status_message(FRT_STATUS_BUSY, buf, sizeof buf, &n), buf), "another thread");
    EXPECT_MENTIONS((frt_status_message(FRT_STATUS_FAULTED, buf, sizeof buf, &n), buf), "open a new one");
    EXPECT_MENTIONS((frt_status_message(FRT_STATUS_CALIBRATION, buf, sizeof buf, &n), buf), "calibration");
    /* Unknown number, NULL outputs, buffer too small (untouched). */
    n = 777;
    EXPECT_STATUS(frt_status_message(FRT_STATUS_CALIBRATION + 1, buf, sizeof buf, &n), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(frt_status_message(0xFFFFFFFFu, buf, sizeof buf, &n), FRT_STATUS_INVALID_ARGUMENT);
    CHECK(n == 777);
    EXPECT_STATUS(frt_status_message(FRT_STATUS_OK, buf, sizeof buf, NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_status_message(FRT_STATUS_OK, NULL, 10, &n), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_status_message(FRT_STATUS_IO, tiny, sizeof tiny, &n), FRT_STATUS_BUFFER_TOO_SMALL);
    /* A buffer too small is untouched, and the failed call still reports the length needed. */
    EXPECT_STATUS(frt_status_message(FRT_STATUS_IO, NULL, 0, &need), FRT_STATUS_OK);
    CHECK(tiny[0] == 'x' && tiny[3] == 'x' && n == need);
    /* Exactly text + NUL fits. */
    EXPECT_STATUS(frt_status_message(FRT_STATUS_IO, buf, need, &n), FRT_STATUS_BUFFER_TOO_SMALL);
    EXPECT_STATUS(frt_status_message(FRT_STATUS_IO, buf, need + 1, &n), FRT_STATUS_OK);
    CHECK(n == need && buf[need] == '\0');
}

static FrtPolicyConfig base_config(void) {
    FrtPolicyConfig c;
    memset(&c, 0xAB, sizeof c);
    c.struct_size = sizeof c;
    if (frt_policy_config_default(&c) != FRT_STATUS_OK) abort();
    c.checkpoint = checkpoint_dir;
    c.tokenizer = tokenizer_path;
    c.backend = FRT_BACKEND_CPU;
    /* One thread: valgrind runs one thread at a time, and a waiting worker spins away the other's
       time slice; test_deadline runs the worker pool (two threads) under valgrind. */
    c.threads = 1;
    c.max_frame_width = 320;
    c.max_frame_height = 240;
    c.log_level = FRT_LOG_LEVEL_OFF;
    /* Less compute per step: the whole program runs under valgrind. */
    c.denoise_steps = 2;
    c.prompt_capacity = 64;
    return c;
}

static void test_config_default(void) {
    FrtPolicyConfig c;
    memset(&c, 0xAB, sizeof c);
    EXPECT_STATUS(frt_policy_config_default(NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config is NULL");
    c.struct_size = sizeof c - 1;
    EXPECT_STATUS(frt_policy_config_default(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.struct_size");
    EXPECT_MENTIONS(thread_error(), "sizeof(FrtPolicyConfig)");
    CHECK(c.backend == 0xABABABABu); /* untouched */
    c.struct_size = sizeof c;
    EXPECT_STATUS(frt_policy_config_default(&c), FRT_STATUS_OK);
    CHECK(thread_error()[0] == '\0'); /* a success clears the thread's error */
    CHECK(c.struct_size == sizeof c);
    CHECK(c.checkpoint == NULL && c.tokenizer == NULL && c.kernel_cache_dir == NULL);
    CHECK(c.backend == FRT_BACKEND_AUTO && c.precision == FRT_PRECISION_AUTO && c.device == 0);
    CHECK(c.log_level == FRT_LOG_LEVEL_WARN && c.log_callback == NULL && c.log_user_data == NULL);
    CHECK(c.cameras == 0 && c.prompt_capacity == 0 && c.denoise_steps == 0 && c.state_dim == 0);
    CHECK(c.prompt_buckets);
    CHECK(c.max_frame_width == 1920 && c.max_frame_height == 1080);
    CHECK(c.seed == 0 && c.deadline_us == 0 && c.threads == 0);
}

/* ---- open: bad configs, missing and corrupted checkpoints ------------------------------------- */

static FrtStatus try_open(const FrtPolicyConfig *c) {
    FrtPolicy *p = (FrtPolicy *)&failures; /* a sentinel: must stay untouched on failure */
    FrtStatus s = frt_policy_open(c, &p);
    if (s == FRT_STATUS_OK) {
        frt_policy_free(p);
    } else {
        CHECK(p == (FrtPolicy *)&failures);
    }
    return s;
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len) {
        fprintf(stderr, "cannot write %s\n", path);
        abort();
    }
    fclose(f);
}

/* Copies `name` from the good checkpoint into dir, keeping `keep` bytes (all when keep is -1). */
static void copy_file(const char *dir, const char *name, long keep) {
    char src[1024], dst[1024];
    FILE *f;
    long len;
    char *data;
    snprintf(src, sizeof src, "%s/%s", checkpoint_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    f = fopen(src, "rb");
    if (f == NULL) abort();
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    data = (char *)malloc((size_t)len);
    if (data == NULL || fread(data, 1, (size_t)len, f) != (size_t)len) abort();
    fclose(f);
    write_file(dst, data, (size_t)(keep < 0 ? len : keep));
    free(data);
}

static void make_dir(const char *dir) {
    if (mkdir(dir, 0755) != 0) {
        perror(dir);
        abort();
    }
}

static void make_checkpoint_copy(const char *dir, long model_bytes) {
    make_dir(dir);
    copy_file(dir, "config.json", -1);
    copy_file(dir, "policy_preprocessor_step_3_normalizer_processor.safetensors", -1);
    copy_file(dir, "policy_postprocessor_step_0_unnormalizer_processor.safetensors", -1);
    copy_file(dir, "model.safetensors", model_bytes);
}

static void test_open_errors(void) {
    FrtPolicyConfig c = base_config();
    FrtPolicy *p = NULL;
    char dir[1024], path[1100];
    char small[8];
    size_t n = 0;

    EXPECT_STATUS(frt_policy_open(NULL, &p), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config is NULL");
    EXPECT_STATUS(frt_policy_open(&c, NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "out is NULL");
    c.checkpoint = NULL;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.checkpoint");
    /* The thread's error text follows the text rule too. */
    EXPECT_STATUS(frt_last_error(small, sizeof small, &n), FRT_STATUS_BUFFER_TOO_SMALL);
    EXPECT_STATUS(frt_last_error(NULL, 0, NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_last_error(NULL, 5, &n), FRT_STATUS_NULL_ARGUMENT);

    c = base_config();
    c.struct_size = sizeof c - 8;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.struct_size");
    c = base_config();
    c.backend = 7;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.backend");
    c = base_config();
    c.precision = 99;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.precision");
    c = base_config();
    c.threads = 65;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.threads");
    c = base_config();
    c.log_level = 6;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.log_level");
    c = base_config();
    c.cameras = FRT_MAX_CAMERAS + 1;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.cameras");
    c = base_config();
    c.max_frame_height = 0;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.max_frame_height");
    c = base_config();
    c.precision = FRT_PRECISION_BF16; /* a valid value the CPU backend cannot compute in */
    EXPECT_STATUS(try_open(&c), FRT_STATUS_BACKEND);
    EXPECT_MENTIONS(thread_error(), "config.precision");
    /* FP8 (emulated on the CPU) needs a calibration: without one, how to make it. */
    c = base_config();
    c.precision = FRT_PRECISION_FP8;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_CALIBRATION);
    EXPECT_MENTIONS(thread_error(), "flashrt calibrate");
    snprintf(path, sizeof path, "%s/no-calibration.json", scratch_dir);
    c.fp8_calibration = path;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_CALIBRATION);
    EXPECT_MENTIONS(thread_error(), "no-calibration.json");
    /* A state width other than the checkpoint's is refused, naming the checkpoint's. */
    c = base_config();
    c.state_dim = 5;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.state_dim");
    EXPECT_MENTIONS(thread_error(), "checkpoint's 8");
    /* A prompt capacity that cannot hold BOS, the task label and the state tokens. */
    c = base_config();
    c.prompt_capacity = 1;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "prompt_capacity");

    /* No GPU here: the CUDA backend reports itself unavailable (on a GPU machine it may open). */
    c = base_config();
    c.backend = FRT_BACKEND_CUDA;
    {
        FrtStatus s = try_open(&c);
        CHECK(s == FRT_STATUS_BACKEND || s == FRT_STATUS_OK);
        if (s == FRT_STATUS_BACKEND) EXPECT_MENTIONS(thread_error(), "backend");
    }

    /* Missing checkpoint, missing tokenizer. */
    c = base_config();
    snprintf(path, sizeof path, "%s/does-not-exist", scratch_dir);
    c.checkpoint = path;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_IO);
    EXPECT_MENTIONS(thread_error(), "does-not-exist");
    c = base_config();
    c.tokenizer = path;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_IO); /* an unreadable file, as for the checkpoint */
    EXPECT_MENTIONS(thread_error(), "does-not-exist");

    /* A directory without weights, truncated weights, garbage weights. */
    snprintf(dir, sizeof dir, "%s/empty", scratch_dir);
    make_dir(dir);
    c = base_config();
    c.checkpoint = dir;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_CHECKPOINT);
    EXPECT_MENTIONS(thread_error(), "model.safetensors");

    snprintf(dir, sizeof dir, "%s/truncated", scratch_dir);
    make_checkpoint_copy(dir, 100000);
    c.checkpoint = dir;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_CHECKPOINT);
    EXPECT_MENTIONS(thread_error(), "truncated");

    snprintf(dir, sizeof dir, "%s/garbage", scratch_dir);
    make_checkpoint_copy(dir, 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_file(path, "\xff\xff\xff\xff\xff\xff\xff\x7fnot a safetensors file", 30);
    c.checkpoint = dir;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_CHECKPOINT);
    EXPECT_MENTIONS(thread_error(), "garbage");

    /* A corrupted tokenizer. */
    snprintf(path, sizeof path, "%s/tokenizer-garbage.json", scratch_dir);
    write_file(path, "{\"model\": 42", 12);
    c = base_config();
    c.tokenizer = path;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_TOKENIZER);
    EXPECT_MENTIONS(thread_error(), "tokenizer");

    /* A successful open clears the thread's error. */
    c = base_config();
    EXPECT_STATUS(try_open(&c), FRT_STATUS_OK);
    EXPECT_STATUS(frt_last_error(message, sizeof message, &n), FRT_STATUS_OK);
    CHECK(n == 0 && message[0] == '\0');
}

/* ---- logging ---------------------------------------------------------------------------------- */

struct log_record {
    int calls;
    int infos;
    int warnings;
    int errors;
    int bad_text;
    char last[1024]; /* the most recent message */
};

static void on_log(void *user_data, FrtLogLevel level, const char *text, size_t len) {
    struct log_record *r = (struct log_record *)user_data;
    r->calls++;
    r->infos += level == FRT_LOG_LEVEL_INFO;
    r->warnings += level == FRT_LOG_LEVEL_WARN;
    r->errors += level == FRT_LOG_LEVEL_ERROR;
    r->bad_text += text == NULL || strlen(text) != len || len == 0;
    if (text != NULL) snprintf(r->last, sizeof r->last, "%s", text);
}

/* frt_policy_open with stderr (fd 2) redirected to a file; `text` receives what it wrote there. */
static FrtStatus open_capturing_stderr(const FrtPolicyConfig *c, char *text, size_t cap) {
    char path[1100];
    FrtPolicy *p = NULL;
    FrtStatus s;
    int saved, fd;
    FILE *f;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/stderr.txt", scratch_dir);
    fflush(stderr);
    saved = dup(2);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (saved < 0 || fd < 0 || dup2(fd, 2) < 0) abort();
    close(fd);
    s = frt_policy_open(c, &p);
    fflush(stderr);
    if (dup2(saved, 2) < 0) abort();
    close(saved);
    if (s == FRT_STATUS_OK) frt_policy_free(p);
    f = fopen(path, "rb");
    if (f != NULL) {
        n = fread(text, 1, cap - 1, f);
        fclose(f);
    }
    text[n] = '\0';
    return s;
}

static void test_log_callback(void) {
    struct log_record r = {0};
    FrtPolicyConfig c = base_config();
    char missing[1100];
    c.log_level = FRT_LOG_LEVEL_INFO;
    c.log_callback = on_log;
    c.log_user_data = &r;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_OK);
    CHECK(r.infos >= 1 && r.bad_text == 0);
    /* A failed open is logged as an error. */
    snprintf(missing, sizeof missing, "%s/does-not-exist", scratch_dir);
    c.checkpoint = missing;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_IO);
    CHECK(r.errors == 1);
    /* So is every other failed open: a config field the library refuses, a NULL `out`... */
    c.checkpoint = checkpoint_dir;
    c.backend = 7;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    c.backend = FRT_BACKEND_CPU;
    c.cameras = FRT_MAX_CAMERAS + 1;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    c.cameras = 0;
    EXPECT_STATUS(frt_policy_open(&c, NULL), FRT_STATUS_NULL_ARGUMENT);
    CHECK(r.errors == 4 && r.bad_text == 0);
    /* ... and, to stderr, one whose config cannot be read at all. */
    {
        char text[2048];
        FrtPolicyConfig unreadable = base_config();
        unreadable.struct_size = 8;
        EXPECT_STATUS(open_capturing_stderr(&unreadable, text, sizeof text), FRT_STATUS_INVALID_ARGUMENT);
        EXPECT_MENTIONS(text, "frt_policy_open: invalid config.struct_size");
        EXPECT_STATUS(open_capturing_stderr(NULL, text, sizeof text), FRT_STATUS_NULL_ARGUMENT);
        EXPECT_MENTIONS(text, "config is NULL");
    }
    /* Without a tokenizer (none given, none beside the checkpoint): a warning at open, and text
     * prompts are refused. */
    {
        FrtPolicy *p = NULL;
        char dir[1100];
        snprintf(dir, sizeof dir, "%s/no-tokenizer", scratch_dir);
        make_checkpoint_copy(dir, -1);
        memset(&r, 0, sizeof r);
        c = base_config();
        c.checkpoint = dir;
        c.tokenizer = NULL;
        c.log_level = FRT_LOG_LEVEL_WARN;
        c.log_callback = on_log;
        c.log_user_data = &r;
        EXPECT_STATUS(frt_policy_open(&c, &p), FRT_STATUS_OK);
        CHECK(r.warnings == 1 && r.infos == 0 && r.bad_text == 0);
        EXPECT_STATUS(frt_policy_set_prompt(p, "wave", 4), FRT_STATUS_TOKENIZER);
        EXPECT_MENTIONS(last_error(p), "tokenizer");
        frt_policy_free(p);
    }
    /* A task longer than the prompt capacity: one warning per set_prompt, naming what is dropped. */
    {
        FrtPolicy *p = NULL;
        char long_task[400];
        size_t i;
        for (i = 0; i + 1 < sizeof long_task; i++) long_task[i] = (i % 6 == 5) ? ' ' : (char)('a' + i % 26);
        memset(&r, 0, sizeof r);
        c = base_config();
        c.log_level = FRT_LOG_LEVEL_WARN;
        c.log_callback = on_log;
        c.log_user_data = &r;
        EXPECT_STATUS(frt_policy_open(&c, &p), FRT_STATUS_OK);
        EXPECT_STATUS(frt_policy_set_prompt(p, long_task, sizeof long_task - 1), FRT_STATUS_OK);
        CHECK(r.warnings == 1 && r.calls == 1);
        EXPECT_MENTIONS(r.last, "prompt truncated");
        EXPECT_MENTIONS(r.last, "capacity 64");
        EXPECT_MENTIONS(r.last, "no state token survives");
        EXPECT_STATUS(frt_policy_set_prompt(p, "pick up the cube", 16), FRT_STATUS_OK);
        CHECK(r.calls == 1);
        frt_policy_free(p);
    }
    /* Above the level: nothing. */
    memset(&r, 0, sizeof r);
    c = base_config();
    c.log_level = FRT_LOG_LEVEL_ERROR;
    c.log_callback = on_log;
    c.log_user_data = &r;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_OK);
    CHECK(r.calls == 0);
}

/* ---- an open policy ----------------------------------------------------------------------------- */

enum { W = 64, H = 48 };
static unsigned char rgb[W * H * 3];
static unsigned char bgr[W * H * 3];
static unsigned char rgba_padded[H * (W * 4 + 16)];
static unsigned char big[400 * 240 * 3];

static FrtFrame frame(const unsigned char *data, size_t len, size_t w, size_t h, size_t stride, uint32_t format) {
    FrtFrame f;
    memset(&f, 0, sizeof f);
    f.data = data;
    f.data_len = len;
    f.width = w;
    f.height = h;
    f.stride = stride;
    f.format = format;
    f.present = true;
    return f;
}

static void fill_frames(void) {
    size_t y, x, c;
    for (y = 0; y < H; y++) {
        for (x = 0; x < W; x++) {
            for (c = 0; c < 3; c++) {
                unsigned char v = (unsigned char)((y * 7 + x * 13 + c * 101) % 251);
                rgb[(y * W + x) * 3 + c] = v;
                bgr[(y * W + x) * 3 + (2 - c)] = v;
                rgba_padded[y * (W * 4 + 16) + x * 4 + c] = v;
            }
            rgba_padded[y * (W * 4 + 16) + x * 4 + 3] = 255;
        }
    }
}

static void test_info_explain(FrtPolicy *p) {
    FrtPolicyInfo info;
    char small[16];
    char *plan;
    size_t need = 0, n = 0, i;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_STATUS(frt_policy_info(NULL, &info), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "policy is NULL");
    EXPECT_STATUS(frt_policy_info(p, NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "info is NULL");
    info.struct_size = sizeof info - 1;
    EXPECT_STATUS(frt_policy_info(p, &info), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "info.struct_size");
    EXPECT_MENTIONS(thread_error(), "sizeof(FrtPolicyInfo)");
    CHECK(last_error(p)[0] == '\0'); /* a const call writes nothing to the policy */
    CHECK(info.model == NULL);
    info.struct_size = sizeof info;
    EXPECT_STATUS(frt_policy_info(p, &info), FRT_STATUS_OK);
    CHECK(thread_error()[0] == '\0');
    CHECK(info.struct_size == sizeof info);
    CHECK(strcmp(info.model, "pi05") == 0);
    CHECK(info.backend == FRT_BACKEND_CPU);
    CHECK(info.device_name != NULL && strlen(info.device_name) > 0);
    CHECK(info.action_dim == 7 && info.horizon == 50 && info.actions_len == 350);
    CHECK(info.state_dim == 8 && info.noise_len == 50 * 32);
    CHECK(info.cameras == 3 && info.camera_names != NULL);
    for (i = 0; i < info.cameras; i++) CHECK(strncmp(info.camera_names[i], "observation.images.", 19) == 0);
    CHECK(strcmp(info.camera_names[0], "observation.images.base_0_rgb") == 0);
    CHECK(info.max_frame_width == 320 && info.max_frame_height == 240);
    CHECK(info.denoise_steps == 2 && info.prompt_capacity == 64);
    CHECK(info.parameters > 0 && info.memory_bytes > 0);

    EXPECT_STATUS(frt_policy_explain(NULL, NULL, 0, &need), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_explain(p, NULL, 0, NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_explain(p, NULL, 0, &need), FRT_STATUS_OK);
    CHECK(need > 100);
    EXPECT_STATUS(frt_policy_explain(p, small, sizeof small, &n), FRT_STATUS_BUFFER_TOO_SMALL);
    plan = (char *)malloc(need + 1);
    EXPECT_STATUS(frt_policy_explain(p, plan, need + 1, &n), FRT_STATUS_OK);
    CHECK(n == need && strlen(plan) == need);
    /* 64 prompt slots: the prefix exists for the first 32 and for all 64. */
    CHECK(strstr(plan, "prompt buckets: [32, 64] slots") != NULL);
    free(plan);
}

static void test_prompts(FrtPolicy *p) {
    const char bad_utf8[] = "pick \xff\xfe up";
    const int32_t tokens[] = {2, 100, 200, 300};
    const int32_t bad_tokens[] = {2, 5000000};
    char *long_text;
    size_t i;
    size_t n = 0;

    EXPECT_STATUS(frt_policy_set_prompt(NULL, "a", 1), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_set_prompt(p, NULL, 1), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "text is NULL");
    EXPECT_STATUS(frt_policy_set_prompt(p, bad_utf8, sizeof bad_utf8 - 1), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "UTF-8");
    /* An empty or blank task is refused, not silently run without an instruction. */
    EXPECT_STATUS(frt_policy_set_prompt(p, "", 0), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "empty");
    EXPECT_STATUS(frt_policy_set_prompt(p, " \n ", 3), FRT_STATUS_INVALID_ARGUMENT);
    long_text = (char *)malloc(20000);
    for (i = 0; i < 20000; i++) long_text[i] = (i % 6 == 5) ? ' ' : (char)('a' + i % 26);
    /* Longer than the prompt capacity: truncated (with a warning in the log), as lerobot does. */
    EXPECT_STATUS(frt_policy_set_prompt(p, long_text, 20000), FRT_STATUS_OK);
    free(long_text);
    EXPECT_STATUS(frt_policy_set_prompt(p, "pick up the cube", 16), FRT_STATUS_OK);
    /* Success clears the last error. */
    EXPECT_STATUS(frt_policy_last_error(p, message, sizeof message, &n), FRT_STATUS_OK);
    CHECK(n == 0);

    EXPECT_STATUS(frt_policy_set_prompt_tokens(NULL, tokens, 4), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_set_prompt_tokens(p, NULL, 4), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "tokens is NULL");
    EXPECT_STATUS(frt_policy_set_prompt_tokens(p, tokens, 0), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "prompt_tokens");
    EXPECT_STATUS(frt_policy_set_prompt_tokens(p, bad_tokens, 2), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "prompt_tokens[1]");
    EXPECT_STATUS(frt_policy_set_prompt_tokens(p, tokens, 4), FRT_STATUS_OK);
}

struct tick {
    FrtFrame cameras[3];
    float state[8];
    float noise[50 * 32];
    float actions[350];
    FrtObservation obs;
    FrtStepInfo info;
};

static void reset_tick(struct tick *t) {
    size_t i;
    memset(t, 0, sizeof *t);
    t->cameras[0] = frame(rgb, sizeof rgb, W, H, 0, FRT_PIXEL_FORMAT_RGB8);
    t->cameras[1] = frame(rgb, sizeof rgb, W, H, W * 3, FRT_PIXEL_FORMAT_RGB8);
    t->cameras[2].present = false;
    for (i = 0; i < 8; i++) t->state[i] = 0.1f * (float)i - 0.2f;
    for (i = 0; i < 50 * 32; i++) t->noise[i] = (float)((int)(i * 37 % 101) - 50) / 50.0f;
    for (i = 0; i < 350; i++) t->actions[i] = -12345.0f; /* poison: unwritten values show */
    t->obs.struct_size = sizeof t->obs;
    t->obs.cameras = t->cameras;
    t->obs.cameras_len = 3;
    t->obs.state = t->state;
    t->obs.state_len = 8;
    t->obs.noise = t->noise;
    t->obs.noise_len = 50 * 32;
    t->info.struct_size = sizeof t->info;
}

static FrtStatus step(FrtPolicy *p, struct tick *t) {
    return frt_policy_step(p, &t->obs, t->actions, 350, &t->info);
}

static int poisoned(const struct tick *t) {
    size_t i;
    for (i = 0; i < 350; i++)
        if (t->actions[i] != -12345.0f) return 0;
    return t->info.latency_ms == 0.0;
}

/* A bad observation: the expected status, a message naming `field`, outputs untouched. */
#define EXPECT_STEP_FAILS(p, t, status, field)         \
    do {                                               \
        EXPECT_STATUS(step((p), (t)), (status));       \
        EXPECT_MENTIONS(last_error(p), (field));       \
        CHECK(poisoned(t));                            \
        reset_tick(t);                                 \
    } while (0)

static void test_step_errors(FrtPolicy *p) {
    static struct tick t;
    reset_tick(&t);
    EXPECT_STATUS(frt_policy_step(NULL, &t.obs, t.actions, 350, NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_step(p, NULL, t.actions, 350, NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "observation is NULL");
    EXPECT_STATUS(frt_policy_step(p, &t.obs, NULL, 350, NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "actions is NULL");

    t.obs.struct_size = 8;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.struct_size");
    t.info.struct_size = 4;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "step_info.struct_size");
    t.obs.cameras = NULL;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_NULL_ARGUMENT, "observation.cameras is NULL");
    t.obs.state = NULL;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_NULL_ARGUMENT, "observation.state is NULL");
    t.cameras[1].data = NULL;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_NULL_ARGUMENT, "observation.cameras[1].data");

    /* Sizes. */
    t.obs.cameras_len = 2;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.cameras_len");
    t.obs.cameras_len = FRT_MAX_CAMERAS + 5;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.cameras_len");
    t.obs.state_len = 7;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.state");
    t.obs.noise_len = 10;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.noise");
    t.obs.noise = NULL;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.noise_len");
    EXPECT_STATUS(frt_policy_step(p, &t.obs, t.actions, 349, &t.info), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "actions");
    CHECK(poisoned(&t));

    /* Frames. */
    t.cameras[0].present = false;
    t.cameras[1].present = false;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.cameras");
    t.cameras[1].format = 3;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.cameras[1].format");
    t.cameras[1].format = 0xFFFFFFFFu;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.cameras[1].format");
    t.cameras[0] = frame(big, sizeof big, 400, 240, 0, FRT_PIXEL_FORMAT_RGB8);
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.cameras[0]");
    t.cameras[0] = frame(big, sizeof big, 320, 241, 0, FRT_PIXEL_FORMAT_RGB8);
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "exceeds");
    t.cameras[0].data_len = sizeof rgb - 1;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.cameras[0]");
    t.cameras[0].format = FRT_PIXEL_FORMAT_RGBA8; /* rgb holds too few bytes for RGBA */
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.cameras[0]");
    t.cameras[0].stride = W * 3 - 1;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "stride");
    t.cameras[0].stride = (size_t)-1 / 2;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.cameras[0].stride");
    t.cameras[0].width = 0;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "empty");

    /* Values. */
    t.state[3] = NAN;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.state[3]");
    t.state[7] = -INFINITY;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.state[7]");
    t.noise[100] = NAN;
    EXPECT_STEP_FAILS(p, &t, FRT_STATUS_INVALID_ARGUMENT, "observation.noise[100]");

    /* After all of that the policy still steps, and success clears the message. */
    EXPECT_STATUS(step(p, &t), FRT_STATUS_OK);
    CHECK(!poisoned(&t));
    CHECK(strcmp(last_error(p), "") == 0);
}

static int same_actions(const struct tick *a, const struct tick *b) {
    return memcmp(a->actions, b->actions, sizeof a->actions) == 0;
}

/* ---- recording the observations stepped on -------------------------------------------------- */

static char recorded_path[1100];

static void test_recording_errors(FrtPolicy *p) {
    char path[1100];
    EXPECT_STATUS(frt_policy_record_start(NULL, recorded_path, strlen(recorded_path)), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_record_start(p, NULL, 5), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "path is NULL");
    EXPECT_STATUS(frt_policy_record_start(p, recorded_path, 0), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "path");
    snprintf(path, sizeof path, "%s/no-such-dir/obs.frtobs", scratch_dir);
    EXPECT_STATUS(frt_policy_record_start(p, path, strlen(path)), FRT_STATUS_IO);
    EXPECT_MENTIONS(last_error(p), "no-such-dir/obs.frtobs");
    EXPECT_STATUS(frt_policy_record_stop(NULL), FRT_STATUS_NULL_ARGUMENT);
    /* One recording at a time: a second start is refused naming the first. */
    snprintf(path, sizeof path, "%s/second.frtobs", scratch_dir);
    EXPECT_STATUS(frt_policy_record_start(p, path, strlen(path)), FRT_STATUS_OK);
    EXPECT_STATUS(frt_policy_record_start(p, path, strlen(path)), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "already recording to");
    EXPECT_STATUS(frt_policy_record_stop(p), FRT_STATUS_OK);
}

/* The log test_steps wrote: the magic, and at least the frames of its 6 records. */
static void check_recorded_file(void) {
    unsigned char magic[8] = {0};
    long size;
    FILE *f = fopen(recorded_path, "rb");
    CHECK(f != NULL);
    if (f == NULL) return;
    CHECK(fread(magic, 1, sizeof magic, f) == sizeof magic);
    CHECK(memcmp(magic, "FRTOBS\0\0", 8) == 0);
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fclose(f);
    CHECK(size > 6 * 2 * W * H * 3);
}

/* FP8 calibration on the log test_steps recorded; a policy opened in FP8 with it (the CPU
   backend's emulation) steps, and cannot be calibrated itself (not f32). */
static void test_calibration(FrtPolicy *p) {
    char out[1100];
    FrtPolicyConfig c = base_config();
    FrtPolicy *fp8 = NULL;
    static struct tick t;
    snprintf(out, sizeof out, "%s/calibration.json", scratch_dir);
    EXPECT_STATUS(frt_policy_calibrate(NULL, recorded_path, strlen(recorded_path), 1, out, strlen(out)), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_calibrate(p, recorded_path, 0, 1, out, strlen(out)), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "observations");
    EXPECT_STATUS(frt_policy_calibrate(p, recorded_path, strlen(recorded_path), 1, out, strlen(out)), FRT_STATUS_OK);
    c.precision = FRT_PRECISION_FP8;
    c.fp8_calibration = out;
    EXPECT_STATUS(frt_policy_open(&c, &fp8), FRT_STATUS_OK);
    if (fp8 == NULL) return;
    EXPECT_STATUS(frt_policy_calibrate(fp8, recorded_path, strlen(recorded_path), 1, NULL, 0), FRT_STATUS_BACKEND);
    EXPECT_MENTIONS(last_error(fp8), "f32");
    EXPECT_STATUS(frt_policy_set_prompt(fp8, "pick up the cube", 16), FRT_STATUS_OK);
    reset_tick(&t);
    EXPECT_STATUS(step(fp8, &t), FRT_STATUS_OK);
    CHECK(isfinite(t.actions[0]) && t.actions[0] != -12345.0f);
    frt_policy_free(fp8);
}

static void test_steps(FrtPolicy *p) {
    static struct tick a, b;
    FrtLatencyStats stats;
    size_t i;
    int finite = 1;

    /* No prompt yet: a clear error, then usable. */
    reset_tick(&a);
    EXPECT_STATUS(step(p, &a), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "prompt");
    EXPECT_STATUS(frt_policy_set_prompt(p, "pick up the cube", 16), FRT_STATUS_OK);
    /* The steps below are recorded (test_recording checks the calls, ffi/tests/c_api.rs the log's
       records); the recording starts with the prompt already set. */
    test_recording_errors(p);
    EXPECT_STATUS(frt_policy_record_start(p, recorded_path, strlen(recorded_path)), FRT_STATUS_OK);

    reset_tick(&a);
    EXPECT_STATUS(step(p, &a), FRT_STATUS_OK);
    for (i = 0; i < 350; i++) finite &= isfinite(a.actions[i]) && a.actions[i] != -12345.0f;
    CHECK(finite);
    CHECK(a.info.latency_ms > 0.0 && a.info.prompt_tokens > 8 && !a.info.deadline_missed);

    /* Same noise, same inputs: same actions. BGR, RGBA with padded rows and a NULL step_info
     * describe the same pixels: same actions again. */
    reset_tick(&b);
    EXPECT_STATUS(step(p, &b), FRT_STATUS_OK);
    CHECK(same_actions(&a, &b));
    reset_tick(&b);
    b.cameras[0] = frame(bgr, sizeof bgr, W, H, 0, FRT_PIXEL_FORMAT_BGR8);
    b.cameras[1] = frame(rgba_padded, sizeof rgba_padded, W, H, W * 4 + 16, FRT_PIXEL_FORMAT_RGBA8);
    EXPECT_STATUS(frt_policy_step(p, &b.obs, b.actions, 350, NULL), FRT_STATUS_OK);
    CHECK(same_actions(&a, &b));
    /* The state reaches the prompt: a different state, different actions. */
    reset_tick(&b);
    b.state[0] = 0.9f;
    EXPECT_STATUS(step(p, &b), FRT_STATUS_OK);
    CHECK(!same_actions(&a, &b));
    /* Drawn noise (NULL): different from the given noise, still finite. */
    reset_tick(&b);
    b.obs.noise = NULL;
    b.obs.noise_len = 0;
    EXPECT_STATUS(step(p, &b), FRT_STATUS_OK);
    CHECK(!same_actions(&a, &b) && isfinite(b.actions[0]));

    /* A refused step is not recorded; a new prompt is, with the step after it. */
    reset_tick(&b);
    b.state[2] = NAN;
    EXPECT_STATUS(step(p, &b), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(frt_policy_set_prompt(p, "place it in the bowl", 20), FRT_STATUS_OK);
    reset_tick(&b);
    EXPECT_STATUS(step(p, &b), FRT_STATUS_OK);
    EXPECT_STATUS(frt_policy_record_stop(p), FRT_STATUS_OK);
    EXPECT_STATUS(frt_policy_record_stop(p), FRT_STATUS_OK); /* nothing to stop: nothing done */
    check_recorded_file();
    EXPECT_STATUS(frt_policy_set_prompt(p, "pick up the cube", 16), FRT_STATUS_OK);
    test_calibration(p);

    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    EXPECT_STATUS(frt_policy_stats(NULL, &stats), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_stats(p, NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "stats is NULL");
    stats.struct_size = 8;
    EXPECT_STATUS(frt_policy_stats(p, &stats), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "stats.struct_size: 8 is below sizeof(FrtLatencyStats)");
    CHECK(stats.count == 0);
    stats.struct_size = sizeof stats;
    EXPECT_STATUS(frt_policy_stats(p, &stats), FRT_STATUS_OK);
    CHECK(stats.count >= 5);
    CHECK(stats.p50_ms > 0.0 && stats.p50_ms <= stats.p90_ms && stats.p90_ms <= stats.p99_ms && stats.p99_ms <= stats.max_ms);
    CHECK(stats.deadline_misses == 0);
    EXPECT_STATUS(frt_policy_reset_stats(NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_reset_stats(p), FRT_STATUS_OK);
    EXPECT_STATUS(frt_policy_stats(p, &stats), FRT_STATUS_OK);
    CHECK(stats.count == 0 && stats.max_ms == 0.0);
}

static void test_deadline(void) {
    FrtPolicyConfig c = base_config();
    FrtPolicy *p = NULL;
    FrtLatencyStats stats;
    static struct tick t;
    size_t n = 0;
    c.deadline_us = 1; /* every step misses it */
    c.prompt_buckets = false;
    c.threads = 2; /* the worker pool on every machine */
    EXPECT_STATUS(frt_policy_open(&c, &p), FRT_STATUS_OK);
    /* Without buckets the plan has one prefix, for every slot: no bucket line in the explanation. */
    EXPECT_STATUS(frt_policy_explain(p, NULL, 0, &n), FRT_STATUS_OK);
    {
        char *text = (char *)malloc(n + 1);
        EXPECT_STATUS(frt_policy_explain(p, text, n + 1, &n), FRT_STATUS_OK);
        CHECK(strstr(text, "prompt bucket") == NULL && strstr(text, "phase prefix") != NULL);
        free(text);
    }
    EXPECT_STATUS(frt_policy_set_prompt(p, "stack the cups", 14), FRT_STATUS_OK);
    reset_tick(&t);
    EXPECT_STATUS(step(p, &t), FRT_STATUS_OK);
    CHECK(t.info.deadline_missed);
    stats.struct_size = sizeof stats;
    EXPECT_STATUS(frt_policy_stats(p, &stats), FRT_STATUS_OK);
    CHECK(stats.count == 1 && stats.deadline_misses == 1);
    frt_policy_free(p);
}

#ifdef FRT_PANIC_HOOK
/* Debug builds of the library export this hook (not in the header): the next frt_* call on this
 * thread panics inside its boundary. Every export must turn that into FRT_STATUS_PANIC (or its
 * documented fallback) and leave the process running. */
void frt_debug_panic_next_call(void);

static void test_panic_boundary(FrtPolicy *p) {
    FrtPolicyConfig c = base_config();
    FrtPolicy *out = NULL;
    FrtPolicyInfo info;
    FrtLatencyStats stats;
    static struct tick t;
    const int32_t tokens[] = {2, 100};
    size_t n = 0;
    reset_tick(&t);
    info.struct_size = sizeof info;
    stats.struct_size = sizeof stats;

#define EXPECT_PANIC(call)                                  \
    do {                                                    \
        frt_debug_panic_next_call();                        \
        EXPECT_STATUS(call, FRT_STATUS_PANIC);              \
    } while (0)
    EXPECT_PANIC(frt_status_message(FRT_STATUS_OK, message, sizeof message, &n));
    EXPECT_PANIC(frt_policy_config_default(&c));
    EXPECT_PANIC(frt_policy_open(&c, &out));
    CHECK(out == NULL);
    EXPECT_PANIC(frt_last_error(message, sizeof message, &n));
    EXPECT_PANIC(frt_policy_info(p, &info));
    EXPECT_PANIC(frt_policy_set_prompt(p, "x", 1));
    EXPECT_PANIC(frt_policy_set_prompt_tokens(p, tokens, 2));
    EXPECT_PANIC(frt_policy_set_embodiment(p, "robot", 5));
    EXPECT_PANIC(frt_policy_step(p, &t.obs, t.actions, 350, &t.info));
    CHECK(poisoned(&t));
    EXPECT_PANIC(frt_policy_stats(p, &stats));
    EXPECT_PANIC(frt_policy_reset_stats(p));
    EXPECT_PANIC(frt_policy_record_start(p, recorded_path, strlen(recorded_path)));
    EXPECT_PANIC(frt_policy_record_stop(p));
    EXPECT_PANIC(frt_policy_explain(p, message, sizeof message, &n));
    EXPECT_PANIC(frt_policy_last_error(p, message, sizeof message, &n));
    frt_debug_panic_next_call();
    CHECK(frt_version() != NULL && strcmp(frt_version(), EXPECTED_VERSION) == 0);
    frt_debug_panic_next_call();
    frt_policy_free(NULL); /* void: the panic is swallowed */
    /* The injected panics fired before touching the policy: it still works. */
    EXPECT_STATUS(frt_policy_set_prompt(p, "pick up the cube", 16), FRT_STATUS_OK);
    EXPECT_STATUS(step(p, &t), FRT_STATUS_OK);
    printf("panic boundary: every export caught an injected panic\n");
}

/* Debug builds also export this hook (not in the header): the policy's next valid step fails as a
 * device failure would. The policy is then faulted: that step and every later step or prompt call
 * returns FRT_STATUS_FAULTED with the first failure as its last error; the const calls answer. */
FrtStatus frt_debug_fault_next_step(FrtPolicy *policy);

static void test_device_fault(void) {
    FrtPolicyConfig c = base_config();
    FrtPolicy *p = NULL;
    FrtPolicyInfo info;
    FrtLatencyStats stats;
    static struct tick t;
    const int32_t tokens[] = {2, 100};
    EXPECT_STATUS(frt_debug_fault_next_step(NULL), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_open(&c, &p), FRT_STATUS_OK);
    if (p == NULL) return;
    EXPECT_STATUS(frt_policy_set_prompt(p, "pick up the cube", 16), FRT_STATUS_OK);
    reset_tick(&t);
    EXPECT_STATUS(step(p, &t), FRT_STATUS_OK);
    EXPECT_STATUS(frt_debug_fault_next_step(p), FRT_STATUS_OK);
    reset_tick(&t);
    EXPECT_STATUS(step(p, &t), FRT_STATUS_FAULTED);
    CHECK(poisoned(&t)); /* outputs untouched */
    EXPECT_MENTIONS(last_error(p), "injected fault");
    EXPECT_MENTIONS(last_error(p), "open a new one");
    EXPECT_STATUS(step(p, &t), FRT_STATUS_FAULTED);
    EXPECT_STATUS(frt_policy_step_continuing(p, &t.obs, 0, 0, t.actions, 350, &t.info), FRT_STATUS_FAULTED);
    EXPECT_STATUS(frt_policy_set_prompt(p, "place it", 8), FRT_STATUS_FAULTED);
    EXPECT_STATUS(frt_policy_set_prompt_tokens(p, tokens, 2), FRT_STATUS_FAULTED);
    EXPECT_MENTIONS(last_error(p), "injected fault");
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_STATUS(frt_policy_info(p, &info), FRT_STATUS_OK);
    stats.struct_size = sizeof stats;
    EXPECT_STATUS(frt_policy_stats(p, &stats), FRT_STATUS_OK);
    CHECK(stats.count == 1);
    frt_policy_free(p);
    printf("device fault: the policy refuses every later call with FRT_STATUS_FAULTED\n");
}
#endif

/* GR00T N1.7 (the tiny lerobot fixture) through the same calls: the embodiment chosen in the
   config, a text prompt, two cameras, its state width; an unknown tag and an embodiment for Pi0.5
   are refused by name. Real-time chunking: Pi0.5's guidance schedules are refused, GR00T's ramp
   opens (the first step has nothing to continue: a plain chunk). */
static void test_groot(const char *dir) {
    FrtPolicyConfig c = base_config();
    FrtPolicy *p = NULL;
    FrtPolicyInfo info;
    FrtFrame cameras[2];
    FrtObservation obs;
    static float state[12], actions[6 * 13];
    size_t i;
    int finite = 1;

    c.embodiment = "tiny_robot";
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT); /* the Pi0.5 checkpoint */
    EXPECT_MENTIONS(thread_error(), "Pi0.5 has no embodiments");
    c.checkpoint = dir;
    c.tokenizer = NULL; /* the checkpoint's own */
    c.denoise_steps = 0;
    c.prompt_capacity = 0;
    c.embodiment = "franka";
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "unknown embodiment tag");
    EXPECT_MENTIONS(thread_error(), "tiny_robot");
    c.embodiment = "tiny_robot";
    c.rtc_schedule = FRT_RTC_SCHEDULE_LINEAR;
    EXPECT_STATUS(try_open(&c), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(thread_error(), "config.rtc.schedule");
    c.rtc_schedule = FRT_RTC_SCHEDULE_RAMP;
    EXPECT_STATUS(frt_policy_open(&c, &p), FRT_STATUS_OK);
    if (p == NULL) return;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_STATUS(frt_policy_info(p, &info), FRT_STATUS_OK);
    CHECK(strcmp(info.model, "groot-n17") == 0);
    CHECK(info.cameras == 2 && info.state_dim == 12 && info.horizon == 6 && info.action_dim == 13);
    CHECK(info.actions_len == sizeof actions / sizeof actions[0]);
    EXPECT_STATUS(frt_policy_set_prompt(p, "Pick up the red block!", 22), FRT_STATUS_OK);
    cameras[0] = frame(rgb, sizeof rgb, W, H, 0, FRT_PIXEL_FORMAT_RGB8);
    cameras[1] = frame(bgr, sizeof bgr, W, H, 0, FRT_PIXEL_FORMAT_BGR8);
    for (i = 0; i < 12; i++) state[i] = 0.05f * (float)i - 0.3f;
    memset(&obs, 0, sizeof obs);
    obs.struct_size = sizeof obs;
    obs.cameras = cameras;
    obs.cameras_len = 2;
    obs.state = state;
    obs.state_len = 11;
    EXPECT_STATUS(frt_policy_step(p, &obs, actions, info.actions_len, NULL), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "observation.state");
    obs.state_len = 12;
    EXPECT_STATUS(frt_policy_step_continuing(p, &obs, 1, 2, actions, info.actions_len, NULL), FRT_STATUS_OK);
    for (i = 0; i < info.actions_len; i++) finite &= isfinite(actions[i]);
    CHECK(finite);
    CHECK(info.embodiment != NULL && strcmp(info.embodiment, "tiny_robot") == 0);
    /* Switching (ffi/tests/golden.rs switches between two embodiments and steps): an unknown tag
       is refused naming it and the known ones; NULL and bad UTF-8 are refused. */
    EXPECT_STATUS(frt_policy_set_embodiment(NULL, "tiny_robot", 10), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_set_embodiment(p, NULL, 10), FRT_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(frt_policy_set_embodiment(p, "\xff", 1), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(frt_policy_set_embodiment(p, "franka", 6), FRT_STATUS_INVALID_ARGUMENT);
    EXPECT_MENTIONS(last_error(p), "unknown embodiment tag \"franka\"");
    EXPECT_MENTIONS(last_error(p), "tiny_robot");
    EXPECT_STATUS(frt_policy_set_embodiment(p, "tiny_robot", 10), FRT_STATUS_OK);
    EXPECT_STATUS(frt_policy_info(p, &info), FRT_STATUS_OK);
    CHECK(info.state_dim == 12 && strcmp(info.embodiment, "tiny_robot") == 0);
    frt_policy_free(p);
    printf("groot: opened, stepped, refused what it must\n");
}

int main(int argc, char **argv) {
    FrtPolicyConfig c;
    FrtPolicy *p = NULL;
    if (argc != 5) {
        fprintf(stderr, "usage: %s CHECKPOINT_DIR TOKENIZER_JSON SCRATCH_DIR GROOT_CHECKPOINT_DIR\n", argv[0]);
        return 2;
    }
    checkpoint_dir = argv[1];
    tokenizer_path = argv[2];
    scratch_dir = argv[3];
    snprintf(recorded_path, sizeof recorded_path, "%s/recorded.frtobs", scratch_dir);
    fill_frames();

    test_version();
    test_status_message();
    test_config_default();
    test_open_errors();
    test_log_callback();

    c = base_config();
    EXPECT_STATUS(frt_policy_open(&c, &p), FRT_STATUS_OK);
    if (p == NULL) {
        fprintf(stderr, "cannot open %s: %s\n", checkpoint_dir, thread_error());
        return 1;
    }
    test_info_explain(p);
    test_steps(p);
    test_prompts(p);
    test_step_errors(p);
#ifdef FRT_PANIC_HOOK
    test_panic_boundary(p);
#else
    printf("panic boundary: not tested (release library without the debug hook)\n");
#endif
    frt_policy_free(p);
    frt_policy_free(NULL);
    test_deadline();
#ifdef FRT_PANIC_HOOK
    test_device_fault();
#else
    printf("device fault: not tested (release library without the debug hook)\n");
#endif
    test_groot(argv[4]);
    free(long_message);

    printf("abi_test: %d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}

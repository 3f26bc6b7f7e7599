/*
 * flashrt.h - the C API of FlashRT, a real-time inference runtime for vision-language-action robot
 * policies (Pi0.5). Link libflashrt (pkg-config flashrt, or CMake find_package(flashrt)).
 *
 * Typical use:
 *
 *   FrtPolicyConfig config;
 *   config.struct_size = sizeof config;
 *   frt_policy_config_default(&config);
 *   config.checkpoint = "/data/pi05";
 *   FrtPolicy *policy = NULL;
 *   if (frt_policy_open(&config, &policy) != FRT_STATUS_OK) { frt_last_error(...); ... }
 *   frt_policy_set_prompt(policy, task, strlen(task));
 *   every control tick: frt_policy_step(policy, &observation, actions, actions_len, NULL);
 *   frt_policy_free(policy);
 *
 * Conventions, the same for every function:
 * - Every fallible function returns an FrtStatus; numbers are stable. Arguments come receiver
 *   first, then inputs, then outputs. Outputs are written only when FRT_STATUS_OK is returned.
 * - Every buffer pointer is followed by its length. A NULL pointer where one is required gives
 *   FRT_STATUS_NULL_ARGUMENT; nothing else about a NULL is undefined.
 * - Structs grow by appending fields. Every struct except FrtFrame starts with struct_size: set it
 *   to sizeof(the struct) before passing the struct to any function, inputs and outputs alike.
 *   A struct_size below the library's struct gives FRT_STATUS_INVALID_ARGUMENT.
 * - Text output (status message, last error, plan): on success the buffer holds the text and a
 *   NUL, and *written the text length without the NUL. If the text and its NUL do not fit,
 *   FRT_STATUS_BUFFER_TOO_SMALL is returned and nothing is written: call with buf = NULL, len = 0
 *   to get the length first.
 * - Text input is UTF-8; paths are NUL-terminated, other text comes with its length.
 * - Errors never abort the process: a Rust panic is caught and reported as FRT_STATUS_PANIC.
 *   Every failure but a text copy's leaves a message naming the problem: frt_policy_last_error
 *   for calls taking an FrtPolicy* ("observation.state[3]", ...), frt_last_error (per thread)
 *   for frt_policy_open, frt_policy_config_default and the const FrtPolicy* calls.
 * - Nothing the library returns must be freed by the caller except the policy (frt_policy_free).
 *
 * Thread safety: an FrtPolicy* is used by one thread at a time; functions taking a
 * const FrtPolicy* may run concurrently with each other (but not with a call taking FrtPolicy* on
 * the same policy). Different policies are independent. Functions without a policy argument are
 * safe from any thread. Misuse is detected where it is cheap: a call taking FrtPolicy* while
 * another such call runs on the same policy returns FRT_STATUS_BUSY and does nothing. Not
 * detected (undefined): a const call during a mutating one, and any call during or after
 * frt_policy_free. SECURITY.md states what else the library guarantees under misuse.
 */

#ifndef FLASHRT_H
#define FLASHRT_H

/* Generated with cbindgen:0.29.4 */

/* Generated from ffi/src by cbindgen. Do not edit: FRT_BLESS=1 cargo test -p flashrt-ffi --test header */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/**
 * Major version of the library this header belongs to.
 */
#define FRT_VERSION_MAJOR 0

/**
 * Minor version.
 */
#define FRT_VERSION_MINOR 4

/**
 * Patch version.
 */
#define FRT_VERSION_PATCH 0

/**
 * The version as one comparable number: MAJOR * 1000000 + MINOR * 1000 + PATCH.
 */
#define FRT_VERSION_NUMBER (((FRT_VERSION_MAJOR * 1000000) + (FRT_VERSION_MINOR * 1000)) + FRT_VERSION_PATCH)

/**
 * Most camera slots a policy may have through the C ABI (`frt_policy_step` stages the frames in a
 * fixed array on the stack, so it never allocates).
 */
#define FRT_MAX_CAMERAS 16

/**
 * Result of every fallible function. The numbers are stable: a value is never renumbered and a
 * retired value is never reused.
 */
enum FrtStatus
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * Success.
   */
  FRT_STATUS_OK = 0,
  /**
   * A pointer argument (or a pointer field of a struct argument) that must not be NULL was NULL.
   */
  FRT_STATUS_NULL_ARGUMENT = 1,
  /**
   * An argument or struct field has a wrong value; the last error (`frt_policy_last_error`, or
   * `frt_last_error` for calls without a mutable policy) names the field.
   */
  FRT_STATUS_INVALID_ARGUMENT = 2,
  /**
   * The caller's text buffer cannot hold the text and its NUL; the buffer is untouched and
   * `*written` holds the text length (the size needed is that plus one for the NUL).
   */
  FRT_STATUS_BUFFER_TOO_SMALL = 3,
  /**
   * A file could not be read or written (missing checkpoint or tokenizer file, permission
   * denied, an observation log that cannot be created or written, ...).
   */
  FRT_STATUS_IO = 4,
  /**
   * The checkpoint (weights, config.json, normalization statistics) is unusable.
   */
  FRT_STATUS_CHECKPOINT = 5,
  /**
   * No tokenizer is loaded (text prompt without tokenizer.json), or the tokenizer file was read
   * but is unusable (not tokenizer JSON, no `<bos>`, cannot assemble Pi0.5 prompts).
   */
  FRT_STATUS_TOKENIZER = 6,
  /**
   * The requested backend or precision cannot run here (no GPU, no driver, a precision the
   * backend does not compute in, e.g. FP8 or bf16 on the CPU).
   */
  FRT_STATUS_BACKEND = 7,
  /**
   * An internal error (a Rust panic) was caught at the ABI boundary. This is a bug in FlashRT;
   * free the policy involved, its state may be inconsistent.
   */
  FRT_STATUS_PANIC = 8,
  /**
   * Another call on the same `FrtPolicy*` was running (two threads used one policy at once,
   * against the one-thread-at-a-time rule). This call did nothing: the policy, its outputs and
   * its last error are as the other call leaves them. Serialize the calls on a policy.
   */
  FRT_STATUS_BUSY = 9,
  /**
   * A step failed inside the backend (a device error, e.g. a failed CUDA launch or
   * synchronization): the policy's state is unknown, so this step and every later step or
   * prompt call on the policy returns this status, with the first failure in
   * `frt_policy_last_error`. The const calls still work. Free the policy and open a new one.
   */
  FRT_STATUS_FAULTED = 10,
  /**
   * FP8 was asked for and its calibration file is missing, unreadable or made for another
   * checkpoint, plan or runtime version (the message names each field that differs):
   * recalibrate (`flashrt calibrate`) for this checkpoint and these options.
   */
  FRT_STATUS_CALIBRATION = 11,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum FrtStatus FrtStatus;
#else
typedef uint32_t FrtStatus;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Severity of a log message; in `FrtPolicyConfig.log_level`, the least severe level delivered.
 */
enum FrtLogLevel
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * No messages.
   */
  FRT_LOG_LEVEL_OFF = 0,
  FRT_LOG_LEVEL_ERROR = 1,
  FRT_LOG_LEVEL_WARN = 2,
  FRT_LOG_LEVEL_INFO = 3,
  FRT_LOG_LEVEL_DEBUG = 4,
  FRT_LOG_LEVEL_TRACE = 5,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum FrtLogLevel FrtLogLevel;
#else
typedef uint32_t FrtLogLevel;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Which backend executes the policy (`FrtPolicyConfig.backend`, `FrtPolicyInfo.backend`).
 */
enum FrtBackend
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * CUDA when a driver and GPU are present, else the CPU.
   */
  FRT_BACKEND_AUTO = 0,
  /**
   * The f32 CPU reference backend.
   */
  FRT_BACKEND_CPU = 1,
  /**
   * The CUDA backend.
   */
  FRT_BACKEND_CUDA = 2,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum FrtBackend FrtBackend;
#else
typedef uint32_t FrtBackend;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * How a tick's action was made (`FrtActionTick.status`).
 */
enum FrtActionStatus
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * No chunk yet and no earlier action: the action buffer was not written.
   */
  FRT_ACTION_STATUS_WAITING = 0,
  /**
   * A row of the current chunk.
   */
  FRT_ACTION_STATUS_FRESH = 1,
  /**
   * The chunk ran out: the last action repeated.
   */
  FRT_ACTION_STATUS_HELD = 2,
  /**
   * The chunk ran out: the last action moved on by its decaying velocity.
   */
  FRT_ACTION_STATUS_DECELERATING = 3,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum FrtActionStatus FrtActionStatus;
#else
typedef uint32_t FrtActionStatus;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Numeric precision of weights and activations (`FrtPolicyConfig.precision`).
 */
enum FrtPrecision
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * The backend's best: f32 on the CPU, bf16 on CUDA.
   */
  FRT_PRECISION_AUTO = 0,
  FRT_PRECISION_F32 = 1,
  FRT_PRECISION_BF16 = 2,
  FRT_PRECISION_FP8 = 3,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum FrtPrecision FrtPrecision;
#else
typedef uint32_t FrtPrecision;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Pixel layout of a frame: interleaved, 8 bits per channel (`FrtFrame.format`).
 */
enum FrtPixelFormat
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  FRT_PIXEL_FORMAT_RGB8 = 0,
  FRT_PIXEL_FORMAT_BGR8 = 1,
  FRT_PIXEL_FORMAT_RGBA8 = 2,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum FrtPixelFormat FrtPixelFormat;
#else
typedef uint32_t FrtPixelFormat;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Real-time chunking's prefix-weight schedule (`FrtPolicyConfig.rtc_schedule`; see
 * `frt_policy_step_continuing`).
 */
enum FrtRtcSchedule
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * No real-time chunking (the default).
   */
  FRT_RTC_SCHEDULE_OFF = 0,
  /**
   * Weight 1 for the rows executed during inference, 0 after.
   */
  FRT_RTC_SCHEDULE_ZEROS = 1,
  /**
   * Weight 1 up to the execution horizon.
   */
  FRT_RTC_SCHEDULE_ONES = 2,
  /**
   * 1 for the rows executed during inference, falling linearly to 0 at the execution horizon.
   */
  FRT_RTC_SCHEDULE_LINEAR = 3,
  /**
   * As linear, each weight w shaped to w (e^w - 1) / (e - 1).
   */
  FRT_RTC_SCHEDULE_EXP = 4,
  /**
   * GR00T N1.7's real-time chunking (no guidance): the new chunk starts from the rest of the
   * previous one up to the execution horizon, the rows executed during inference frozen, the
   * velocity of the others ramped up (rate: the checkpoint's `rtc_ramp_rate`). GR00T takes only
   * this one, Pi0.5 only the others.
   */
  FRT_RTC_SCHEDULE_RAMP = 5,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum FrtRtcSchedule FrtRtcSchedule;
#else
typedef uint32_t FrtRtcSchedule;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * What the stream does when a chunk is late (`FrtStreamConfig.fallback`).
 */
enum FrtFallback
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
  /**
   * Repeat the last action.
   */
  FRT_FALLBACK_HOLD = 0,
  /**
   * Continue the last action's change per tick, scaled down linearly to zero over
   * `FrtStreamConfig.decelerate_ticks` ticks, then hold.
   */
  FRT_FALLBACK_DECELERATE = 1,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum FrtFallback FrtFallback;
#else
typedef uint32_t FrtFallback;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * An open policy: weights, plan, buffers, prompt, statistics and the last error. Opaque.
 *
 * The documented rule is one thread at a time per policy. Misuse is made safe for the calls that
 * take `FrtPolicy*`: each holds `busy` while it runs, and a second one that finds it held
 * returns `FRT_STATUS_BUSY` without touching the policy (one atomic swap per call). The state sits
 * in an `UnsafeCell` so the flag can be read through a shared reference while another thread
 * holds the state mutably.
 */
typedef struct FrtPolicy FrtPolicy;

/**
 * A running action stream over a policy. Opaque.
 */
typedef struct FrtStream FrtStream;

/**
 * Receives one log message: `message` is NUL-terminated, `message_len` bytes long (without the
 * NUL), truncated to 1023 bytes, and valid only during the call. Called on the thread that made
 * the `frt_*` call, before that call returns.
 */
typedef void (*FrtLogCallback)(void *user_data,
                               FrtLogLevel level,
                               const char *message,
                               size_t message_len);

/**
 * Everything `frt_policy_open` needs. Fill it with `frt_policy_config_default` (after setting
 * `struct_size`), then set `checkpoint` and whatever else differs. Zero in an optional count
 * means "from the checkpoint". The library keeps no pointer from this struct after
 * `frt_policy_open` returns, except `log_callback` and `log_user_data`.
 */
typedef struct FrtPolicyConfig {
  /**
   * `sizeof(FrtPolicyConfig)`, set by the caller before any call that takes the struct.
   */
  size_t struct_size;
  /**
   * Checkpoint directory (lerobot layout) or `.safetensors` file; NUL-terminated. Required.
   */
  const char *checkpoint;
  /**
   * `tokenizer.json`; NULL: the one beside the checkpoint, if any (without a tokenizer only
   * `frt_policy_set_prompt_tokens` works).
   */
  const char *tokenizer;
  /**
   * Where a GPU backend caches compiled kernels; NULL: `$XDG_CACHE_HOME/flashrt/kernels`.
   */
  const char *kernel_cache_dir;
  /**
   * An `FrtBackend` value. Default `FRT_BACKEND_AUTO`.
   */
  uint32_t backend;
  /**
   * An `FrtPrecision` value. Default `FRT_PRECISION_AUTO`.
   */
  uint32_t precision;
  /**
   * GPU ordinal for the CUDA backend. Default 0.
   */
  uint32_t device;
  /**
   * Least severe `FrtLogLevel` delivered. Default `FRT_LOG_LEVEL_WARN`.
   */
  uint32_t log_level;
  /**
   * Camera slots; 0: the cameras named in the checkpoint's config.json. At most
   * `FRT_MAX_CAMERAS`.
   */
  size_t cameras;
  /**
   * Largest frame `frt_policy_step` accepts, in pixels (staging buffers are sized for it).
   * Default 1920 x 1080.
   */
  size_t max_frame_width;
  size_t max_frame_height;
  /**
   * Prompt token capacity; 0: from the checkpoint (config.json `tokenizer_max_length`).
   */
  size_t prompt_capacity;
  /**
   * Compute the prefix only for the smallest bucket of 32, 64, 128 slots or the capacity that
   * holds the step's prompt, picked on the device (default true). false: every slot every
   * step, so the step time never depends on the prompt's length (Pi0.5's state tokens make
   * that length move from step to step).
   */
  bool prompt_buckets;
  /**
   * Denoising steps; 0: from the checkpoint (config.json `num_inference_steps`).
   */
  size_t denoise_steps;
  /**
   * The robot's state width; 0: from the checkpoint. Needed only when the checkpoint states none;
   * a value other than the checkpoint's is refused (`FRT_STATUS_INVALID_ARGUMENT`, naming it).
   */
  size_t state_dim;
  /**
   * Seed of the noise drawn when an observation carries no noise. Default 0.
   */
  uint64_t seed;
  /**
   * Steps slower than this many microseconds count as deadline misses in the statistics;
   * 0: no deadline.
   */
  uint64_t deadline_us;
  /**
   * Receives the policy's log messages at or above `log_level`; NULL: they go to stderr.
   */
  FrtLogCallback log_callback;
  /**
   * Passed unchanged to `log_callback`.
   */
  void *log_user_data;
  /**
   * CPU backend: threads that split each step's GEMMs and attention, the calling one included
   * (started at open, parked between steps); 0: the available parallelism. At most 64.
   */
  size_t threads;
  /**
   * GR00T: the embodiment tag (a key of the checkpoint's `embodiment_id.json` and
   * `processor_config.json`), NUL-terminated; NULL: the checkpoint's only one. An unknown tag
   * is refused, naming the known ones. Must be NULL for Pi0.5, which has none.
   */
  const char *embodiment;
  /**
   * Real-time chunking: an `FrtRtcSchedule` value — zeros, ones, linear or exp for Pi0.5,
   * ramp for GR00T N1.7 (each model refuses the other's); `FRT_RTC_SCHEDULE_OFF` (default)
   * opens the policy without it. With it, `frt_policy_step_continuing` samples each chunk as a
   * continuation of the previous one (lerobot 0.6.1's RTC for that model).
   */
  uint32_t rtc_schedule;
  /**
   * Real-time chunking: rows of a new chunk that continue the previous one at all. Default 10.
   */
  size_t rtc_execution_horizon;
  /**
   * Real-time chunking: upper bound of the guidance weight (positive). Default 10. Pi0.5's
   * schedules only: ramp has no guidance and ignores it.
   */
  float rtc_max_guidance_weight;
  /**
   * With `FRT_PRECISION_FP8`: the calibration file (`flashrt calibrate`), NUL-terminated;
   * NULL: `flashrt_fp8_calibration.json` beside the checkpoint. A missing file, or one made
   * for another checkpoint, plan or runtime version, is refused with `FRT_STATUS_CALIBRATION`
   * naming what differs.
   */
  const char *fp8_calibration;
} FrtPolicyConfig;

/**
 * What an open policy is. Strings and arrays belong to the policy: valid until `frt_policy_free`.
 */
typedef struct FrtPolicyInfo {
  /**
   * `sizeof(FrtPolicyInfo)`, set by the caller.
   */
  size_t struct_size;
  /**
   * Model kind, e.g. "pi05".
   */
  const char *model;
  /**
   * The backend in use (never `FRT_BACKEND_AUTO`).
   */
  FrtBackend backend;
  /**
   * The device that runs the policy, e.g. "NVIDIA H200" or the CPU model.
   */
  const char *device_name;
  /**
   * Action values per row of the chunk (the robot's action width).
   */
  size_t action_dim;
  /**
   * Rows of the action chunk.
   */
  size_t horizon;
  /**
   * `horizon * action_dim`: the `actions_len` that `frt_policy_step` expects.
   */
  size_t actions_len;
  /**
   * Values of the robot state (`FrtObservation.state_len`).
   */
  size_t state_dim;
  /**
   * Length of an optional `FrtObservation.noise`.
   */
  size_t noise_len;
  /**
   * Camera slots (`FrtObservation.cameras_len`).
   */
  size_t cameras;
  /**
   * `cameras` camera names (e.g. "observation.images.base_0_rgb"), in slot order.
   */
  const char *const *camera_names;
  /**
   * Largest frame accepted.
   */
  size_t max_frame_width;
  size_t max_frame_height;
  size_t denoise_steps;
  /**
   * Prompt token capacity (task and state tokens).
   */
  size_t prompt_capacity;
  /**
   * Model parameters.
   */
  uint64_t parameters;
  /**
   * Bytes of weights and buffers held (device memory for a GPU backend).
   */
  uint64_t memory_bytes;
  /**
   * The embodiment the steps run for (GR00T's tag, `frt_policy_set_embodiment`); NULL for a
   * model without embodiments (Pi0.5).
   */
  const char *embodiment;
} FrtPolicyInfo;

/**
 * One camera frame owned by the caller, read during `frt_policy_step` only.
 */
typedef struct FrtFrame {
  /**
   * Pixels: `height` rows of `stride` bytes. Must not be NULL when `present`.
   */
  const uint8_t *data;
  /**
   * Bytes readable at `data`.
   */
  size_t data_len;
  /**
   * In pixels; at most the configured `max_frame_width` x `max_frame_height`.
   */
  size_t width;
  size_t height;
  /**
   * Bytes from one row to the next; 0: tightly packed (`width` x bytes per pixel).
   */
  size_t stride;
  /**
   * An `FrtPixelFormat` value.
   */
  uint32_t format;
  /**
   * false: this camera is missing this tick (the other fields are ignored).
   */
  bool present;
} FrtFrame;

/**
 * One control tick's inputs.
 */
typedef struct FrtObservation {
  /**
   * `sizeof(FrtObservation)`.
   */
  size_t struct_size;
  /**
   * One frame per camera slot, in the policy's camera order (`FrtPolicyInfo.camera_names`);
   * at least one present.
   */
  const struct FrtFrame *cameras;
  /**
   * Must equal `FrtPolicyInfo.cameras`.
   */
  size_t cameras_len;
  /**
   * Raw (unnormalized) robot state; finite values.
   */
  const float *state;
  /**
   * Must equal `FrtPolicyInfo.state_dim`.
   */
  size_t state_len;
  /**
   * Optional initial noise, `FrtPolicyInfo.noise_len` finite values (for reproducible runs);
   * NULL: drawn from the generator seeded by `FrtPolicyConfig.seed`.
   */
  const float *noise;
  /**
   * Must be `FrtPolicyInfo.noise_len` when `noise` is set, 0 when it is NULL.
   */
  size_t noise_len;
} FrtObservation;

/**
 * What one step did.
 */
typedef struct FrtStepInfo {
  /**
   * `sizeof(FrtStepInfo)`, set by the caller.
   */
  size_t struct_size;
  /**
   * Wall time of the step inside the library.
   */
  double latency_ms;
  /**
   * Valid prompt tokens this step (state tokens included).
   */
  size_t prompt_tokens;
  /**
   * The step took longer than `FrtPolicyConfig.deadline_us`.
   */
  bool deadline_missed;
} FrtStepInfo;

/**
 * Step latency statistics: percentiles over the most recent 8192 steps, count, maximum and
 * deadline misses over all steps since open or `frt_policy_reset_stats`.
 */
typedef struct FrtLatencyStats {
  /**
   * `sizeof(FrtLatencyStats)`, set by the caller.
   */
  size_t struct_size;
  uint64_t count;
  double p50_ms;
  double p90_ms;
  double p99_ms;
  double max_ms;
  uint64_t deadline_misses;
} FrtLatencyStats;

/**
 * How a stream runs. Fill it with `frt_stream_config_default` (after setting `struct_size`).
 */
typedef struct FrtStreamConfig {
  /**
   * `sizeof(FrtStreamConfig)`, set by the caller.
   */
  size_t struct_size;
  /**
   * The caller's control period in microseconds (one `frt_stream_next_action` per period).
   * Default 20000 (50 Hz).
   */
  uint64_t control_period_us;
  /**
   * Request the next chunk when this many actions or fewer are left; 0: half the horizon.
   * Must be below the horizon.
   */
  size_t refill_at;
  /**
   * An `FrtFallback` value. Default `FRT_FALLBACK_HOLD`.
   */
  uint32_t fallback;
  /**
   * Ticks over which `FRT_FALLBACK_DECELERATE` brings the velocity to zero. Default 10.
   */
  size_t decelerate_ticks;
  /**
   * CPUs the inference thread is pinned to (read during `frt_stream_create` only); NULL with
   * `cpus_len` 0: not pinned.
   */
  const size_t *cpus;
  size_t cpus_len;
  /**
   * SCHED_FIFO priority of the inference thread (1-99); 0: the default policy. A setting the
   * system refuses (no CAP_SYS_NICE / RLIMIT_RTPRIO, CPUs outside the cpuset) is logged and
   * skipped; `FrtStreamStats.realtime` says whether all took.
   */
  int32_t fifo_priority;
  /**
   * Stop the inference thread after this many failed steps in a row; 0: never. Default 10.
   */
  uint32_t max_consecutive_errors;
} FrtStreamConfig;

/**
 * One tick's report (`frt_stream_next_action`).
 */
typedef struct FrtActionTick {
  /**
   * `sizeof(FrtActionTick)`, set by the caller.
   */
  size_t struct_size;
  FrtActionStatus status;
  /**
   * This tick's number (0 for the first call).
   */
  uint64_t tick;
  /**
   * Sequence number of the chunk in use (1 for the first), 0 before the first.
   */
  uint64_t chunk;
  /**
   * Ticks since the chunk in use was observed (the row taken when fresh).
   */
  size_t chunk_age;
  /**
   * Actions left in the chunk after this one.
   */
  size_t remaining;
  /**
   * This tick switched to a new chunk.
   */
  bool new_chunk;
  /**
   * Rows of the new chunk skipped because their ticks passed during inference.
   */
  size_t skipped;
} FrtActionTick;

/**
 * The stream's counters (`frt_stream_stats`); see `flashrt::StreamStats`.
 */
typedef struct FrtStreamStats {
  /**
   * `sizeof(FrtStreamStats)`, set by the caller.
   */
  size_t struct_size;
  /**
   * `frt_stream_next_action` calls.
   */
  uint64_t ticks;
  /**
   * Chunks produced by the inference thread.
   */
  uint64_t chunks;
  /**
   * Ticks answered by the fallback because a chunk was late.
   */
  uint64_t late_ticks;
  /**
   * Of `late_ticks`, the decelerating ones.
   */
  uint64_t decelerating_ticks;
  /**
   * Ticks before the first chunk.
   */
  uint64_t waiting_ticks;
  /**
   * Chunk rows skipped because their ticks passed during inference.
   */
  uint64_t skipped_actions;
  /**
   * Chunks that arrived entirely in the past and were dropped.
   */
  uint64_t stale_chunks;
  /**
   * Delay of the last chunk taken, in ticks (observation to first use).
   */
  uint64_t delay_ticks;
  /**
   * The delay passed to the policy with the next request, in ticks.
   */
  uint64_t delay_estimate;
  /**
   * Inference latency over the last 32 chunks, microseconds.
   */
  uint64_t latency_p50_us;
  uint64_t latency_max_us;
  /**
   * Failed policy steps on the inference thread (`frt_stream_inference_error` has the last).
   */
  uint64_t errors;
  /**
   * The inference thread runs (false after too many errors in a row or a panic).
   */
  bool running;
  /**
   * Every real-time setting asked for was applied.
   */
  bool realtime;
} FrtStreamStats;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The library's version, e.g. "0.4.0": a static NUL-terminated string, never NULL. Compare it with
 * the `FRT_VERSION_*` macros to detect a header/library mismatch.
 *
 * Thread safety: safe to call from any thread.
 */
const char *frt_version(void);

/**
 * Copies a short English description of `status` (an `FrtStatus` value) into `buf`.
 *
 * Text output follows the rule of every text function: on success `buf` holds the text and a
 * terminating NUL and `*written` is the text length without the NUL. Pass `buf = NULL, len = 0`
 * to query the length only. On `FRT_STATUS_BUFFER_TOO_SMALL` `buf` is untouched and `*written`
 * is the text length too: allocate `*written + 1` bytes and call again.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` when `written` is NULL or `buf` is NULL with
 * `len > 0`; `FRT_STATUS_BUFFER_TOO_SMALL` when `len` cannot hold the text and its NUL;
 * `FRT_STATUS_INVALID_ARGUMENT` when `status` is not an `FrtStatus` value.
 *
 * Thread safety: safe to call from any thread.
 *
 * # Safety
 * `buf` must be valid for `len` bytes of writing and `written` for one `size_t`, or NULL.
 */
FrtStatus frt_status_message(uint32_t status, char *buf, size_t len, size_t *written);

/**
 * Copies the message of the most recent call on this thread that failed without a mutable policy
 * to keep its message — `frt_policy_open`, `frt_policy_config_default`, `frt_policy_info`,
 * `frt_policy_stats` — naming the problem, e.g. "checkpoint /data/pi05: tensor ... missing" or
 * "invalid info.struct_size: 8 is below sizeof(FrtPolicyInfo) = 152". Empty after one of them
 * succeeded. The text-copying calls (`frt_status_message`, `frt_last_error`,
 * `frt_policy_last_error`, `frt_policy_explain`) never change it: their statuses say everything,
 * and reading a message must not replace it. Text rule as in `frt_status_message`.
 *
 * Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
 *
 * Thread safety: safe; each thread has its own message.
 *
 * # Safety
 * `buf` must be valid for `len` bytes of writing and `written` for one `size_t`, or NULL.
 */
FrtStatus frt_last_error(char *buf, size_t len, size_t *written);

/**
 * Fills `*config` with the defaults; `config->struct_size` must be set first.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` when `config` is NULL;
 * `FRT_STATUS_INVALID_ARGUMENT` when `struct_size` is smaller than this library's
 * `FrtPolicyConfig` (a header older than the library); the struct is untouched then and
 * `frt_last_error` says which.
 *
 * Thread safety: safe to call from any thread.
 *
 * # Safety
 * `config` must point to a writable `FrtPolicyConfig`, or be NULL.
 */
FrtStatus frt_policy_config_default(struct FrtPolicyConfig *config);

/**
 * Opens a checkpoint: loads and converts the weights, builds the plan and its buffers and warms
 * the backend. Slow (not for the control loop); call once.
 *
 * On success `*out` receives the policy, to be released with `frt_policy_free`. On failure `*out`
 * is untouched and `frt_last_error` describes the problem; every failure is also logged at
 * `FRT_LOG_LEVEL_ERROR`, through the config's `log_level` and `log_callback`, or to stderr when
 * they cannot be read (`config` NULL, `struct_size` too small, `log_level` not a level).
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` (`config`, `out` or `config->checkpoint` is
 * NULL); `FRT_STATUS_INVALID_ARGUMENT` (a config field is wrong: `struct_size`, an enum value, a
 * zero frame size, more than `FRT_MAX_CAMERAS` cameras, a zero/unfit prompt capacity or denoise
 * count, ...); `FRT_STATUS_IO` (a file is missing or unreadable); `FRT_STATUS_CHECKPOINT` (the
 * checkpoint is corrupt or inconsistent); `FRT_STATUS_TOKENIZER` (the tokenizer is unusable);
 * `FRT_STATUS_BACKEND` (the backend or precision cannot run here); `FRT_STATUS_PANIC`.
 *
 * Thread safety: safe to call from any thread; policies are independent of each other.
 *
 * # Safety
 * `config` must point to a readable `FrtPolicyConfig` whose string fields are NUL-terminated or
 * NULL; `out` must be writable. Either may be NULL (reported as such).
 */
FrtStatus frt_policy_open(const struct FrtPolicyConfig *config, struct FrtPolicy **out);

/**
 * Releases a policy and everything it holds. NULL is accepted and ignored.
 *
 * Thread safety: no other call may use `policy` during or after this call.
 *
 * # Safety
 * `policy` must come from `frt_policy_open` and not have been freed, or be NULL.
 */
void frt_policy_free(struct FrtPolicy *policy);

/**
 * Describes the policy: model, backend, device, sizes and camera names.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` when
 * `info->struct_size` is below `sizeof(FrtPolicyInfo)`. A failure's message is in
 * `frt_last_error` (a `const` call writes nothing to the policy).
 *
 * Thread safety: `const`: may run concurrently with other `const FrtPolicy*` calls.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `info` writable or NULL.
 */
FrtStatus frt_policy_info(const struct FrtPolicy *policy, struct FrtPolicyInfo *info);

/**
 * Sets the task text (UTF-8, `len` bytes, no NUL needed). It is tokenized once here; the state is
 * appended in every step (Pi0.5 prompt format). Needs a tokenizer. May allocate: not for the
 * control loop's hot path, but fine between chunks.
 *
 * A prompt longer than the capacity is truncated, as lerobot does, and logged once as a warning
 * naming how many tokens may be dropped and whether the state tokens survive. A text that is
 * empty or only whitespace is refused (it would drop the instruction without a word).
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (not UTF-8,
 * empty or whitespace-only text);
 * `FRT_STATUS_TOKENIZER` (no tokenizer loaded, or it cannot encode the text); `FRT_STATUS_FAULTED`
 * (a step failed in the device before); `FRT_STATUS_PANIC`.
 * On failure the previous prompt stays in effect.
 *
 * Thread safety: not concurrently with any other call on `policy`; one that finds another call
 * taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `text` readable for `len` bytes or NULL.
 */
FrtStatus frt_policy_set_prompt(struct FrtPolicy *policy, const char *text, size_t len);

/**
 * Sets the complete prompt as token ids (BOS, task, state and all), used unchanged in every
 * step; for callers that tokenize themselves.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (`len` is 0
 * or above the prompt capacity, or an id is outside the vocabulary); `FRT_STATUS_FAULTED` (a step
 * failed in the device before); `FRT_STATUS_PANIC`. On failure the previous prompt stays in effect.
 *
 * Thread safety: not concurrently with any other call on `policy`; one that finds another call
 * taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `tokens` readable for `len` values or NULL.
 */
FrtStatus frt_policy_set_prompt_tokens(struct FrtPolicy *policy, const int32_t *tokens, size_t len);

/**
 * Switches a GR00T N1.7 policy to another embodiment (UTF-8 tag, `len` bytes, no NUL needed),
 * one of those whose statistics the checkpoint holds, with the cameras it was opened with: the
 * embodiment-specific weights are selected inside the same plan (and CUDA graph) by a value in
 * device memory, so nothing is reopened, recaptured or allocated on the device; the state
 * normalization and action decoding follow the tag. May allocate: not for the control loop.
 * The state width, action width, horizon and camera names become the embodiment's: call
 * `frt_policy_info` again (strings and arrays it returned earlier stay valid until free).
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (not UTF-8,
 * an unknown tag or one with other cameras: `frt_policy_last_error` names it and the tags the
 * policy switches between; a Pi0.5 policy, which has no embodiments); `FRT_STATUS_PANIC`. On
 * failure the previous embodiment stays in effect.
 *
 * Thread safety: not concurrently with any other call on `policy`; one that finds another call
 * taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `tag` readable for `len` bytes or NULL.
 */
FrtStatus frt_policy_set_embodiment(struct FrtPolicy *policy, const char *tag, size_t len);

/**
 * One control tick: frames and state in, the action chunk out. The hot path: no heap allocation
 * after the first call, no blocking other than the computation itself. The no-allocation promise
 * covers successful steps: a failing step may allocate (the runtime formats its error message;
 * the last-error buffer is reused, so a short message does not grow it).
 *
 * `actions` receives `horizon x action_dim` floats, row-major (row = time step), unnormalized
 * (robot units); `actions_len` must be `FrtPolicyInfo.actions_len`. `step_info` may be NULL.
 * Needs a prompt (`frt_policy_set_prompt` or `frt_policy_set_prompt_tokens`).
 *
 * The whole observation is checked before anything is touched: on failure `actions` and
 * `step_info` are untouched, the policy stays usable for the next step, and
 * `frt_policy_last_error` names the field ("observation.cameras[1]", "observation.state[3]", ...).
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` (`policy`, `observation`, `actions`,
 * `observation->cameras`, `observation->state`, or the data of a present frame is NULL);
 * `FRT_STATUS_INVALID_ARGUMENT` (a `struct_size` too small, wrong `cameras_len`, `state_len`,
 * `noise_len` or `actions_len`, no present frame, an unknown pixel format, a frame that is empty,
 * larger than the configured maximum, or whose `data_len` or `stride` does not cover its
 * geometry, a NaN or infinite state or noise value, no prompt set); `FRT_STATUS_FAULTED` (the
 * device failed during this or an earlier step: free the policy and open a new one);
 * `FRT_STATUS_PANIC`.
 *
 * Thread safety: not concurrently with any other call on `policy`; one that finds another call
 * taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `observation` readable with its arrays valid for the
 * lengths it states; `actions` writable for `actions_len` floats; `step_info` writable; any of
 * them may be NULL (reported as such, except `step_info`, which is optional).
 */
FrtStatus frt_policy_step(struct FrtPolicy *policy,
                          const struct FrtObservation *observation,
                          float *actions,
                          size_t actions_len,
                          struct FrtStepInfo *step_info);

/**
 * `frt_policy_step` for a policy opened with real-time chunking (`FrtPolicyConfig.rtc_schedule`):
 * the new chunk continues the one this policy's previous step returned. `executed` is how many
 * actions of that chunk the robot had executed when this observation was taken (what is left
 * starts there; at or past the horizon nothing is, and the chunk is sampled afresh);
 * `inference_delay` is how many more of them it executes while this step runs (the new chunk's
 * first rows are pinned to those: guided towards them for Pi0.5, frozen for GR00T N1.7). The
 * first step after open has nothing to continue.
 *
 * Returns as `frt_policy_step`, and `FRT_STATUS_INVALID_ARGUMENT` ("continuation") when the
 * policy was opened without real-time chunking. No heap allocation after the first step.
 *
 * Thread safety: not concurrently with any other call on `policy`; one that finds another call
 * taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
 *
 * # Safety
 * As `frt_policy_step`.
 */
FrtStatus frt_policy_step_continuing(struct FrtPolicy *policy,
                                     const struct FrtObservation *observation,
                                     size_t executed,
                                     size_t inference_delay,
                                     float *actions,
                                     size_t actions_len,
                                     struct FrtStepInfo *step_info);

/**
 * Starts recording every observation this policy steps on successfully — through
 * `frt_policy_step`, `frt_policy_step_continuing` or an action stream over it — with the prompt in
 * force, into an observation log at `path` (`path_len` bytes, no NUL needed), created or
 * truncated. `flashrt run --observations PATH` replays the log; it serves FP8 calibration and
 * regression tests on the robot's own data.
 *
 * The steps stay on the hot path's terms: each observation is copied into one of a few buffers
 * reused from step to step and written by a thread of the library; when the disk falls behind,
 * observations are dropped (counted and logged once) instead of delaying the step. A step
 * allocates only when a camera's frame is larger than any it recorded before. A prompt set with
 * `frt_policy_set_prompt_tokens` is not text: the records after it carry an empty prompt. After
 * `frt_policy_set_embodiment` to an embodiment of another state width, observations are dropped:
 * record each embodiment into its own log.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (`path_len`
 * is 0, or the policy is already recording: stop that first); `FRT_STATUS_IO` (the file cannot
 * be created); `FRT_STATUS_PANIC`.
 *
 * Thread safety: not concurrently with any other call on `policy`; one that finds another call
 * taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `path` readable for `path_len` bytes or NULL.
 */
FrtStatus frt_policy_record_start(struct FrtPolicy *policy,
                                  const char *path,
                                  size_t path_len);

/**
 * FP8 calibration of this policy's plan, as `flashrt calibrate` makes it: steps the policy over
 * the first `steps` observations (0: 8; the first two of them measured again for each product's
 * FP8 error) of the observation log at `observations`
 * (`observations_len` bytes, no NUL needed; recorded with `frt_policy_record_start`, `flashrt
 * record` or the ROS 2 node), measures each product's input range and FP8 error, and writes the
 * calibration JSON to `out` (`out_len` bytes; NULL: `flashrt_fp8_calibration.json` beside the
 * checkpoint, where an FP8 open looks for it). With `observations` NULL it calibrates on
 * synthetic observations and logs a warning: the scales then fit random inputs, not the robot's.
 *
 * Open the policy on the CPU backend in f32 with the options the deployment opens with (cameras,
 * prompt capacity, denoise steps, real-time chunking): the calibration is only accepted by a
 * policy with the same plan and checkpoint. Takes seconds (tiny models) to many minutes (full
 * size on the CPU): not for the control loop. Afterwards the policy's prompt is the text it had
 * (after `frt_policy_set_prompt_tokens`, the last calibration prompt: set it again); the
 * calibration's steps count in its latency statistics.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` (`policy`); `FRT_STATUS_INVALID_ARGUMENT`
 * (an empty log, a record without prompt text, an empty path); `FRT_STATUS_BACKEND` (the
 * policy is not on the CPU backend in f32); `FRT_STATUS_IO` (the log is unreadable, damaged or
 * recorded for another policy, or `out` cannot be written); `FRT_STATUS_PANIC`.
 *
 * Thread safety: not concurrently with any other call on `policy`; one that finds another call
 * taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `observations` and `out` readable for their lengths
 * or NULL.
 */
FrtStatus frt_policy_calibrate(struct FrtPolicy *policy,
                               const char *observations,
                               size_t observations_len,
                               uint32_t steps,
                               const char *out,
                               size_t out_len);

/**
 * Stops the recording `frt_policy_record_start` began: writes the observations still queued and
 * closes the log (waits for the disk: not for the control loop). Logs how many observations were
 * written and dropped. Without a recording, does nothing and returns `FRT_STATUS_OK`.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_IO` (writing the log failed:
 * `frt_policy_last_error` names the file and the error; the log holds the records before it);
 * `FRT_STATUS_PANIC`. `frt_policy_free` stops a recording too (and only logs such an error).
 *
 * Thread safety: not concurrently with any other call on `policy`; one that finds another call
 * taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL.
 */
FrtStatus frt_policy_record_stop(struct FrtPolicy *policy);

/**
 * Copies the latency statistics of the steps so far into `*stats`.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` when
 * `stats->struct_size` is below `sizeof(FrtLatencyStats)`; a failure's message is in
 * `frt_last_error`. Computes percentiles (allocates): call it between chunks or at the end, not
 * every tick.
 *
 * Thread safety: `const`: may run concurrently with other `const FrtPolicy*` calls.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `stats` writable or NULL.
 */
FrtStatus frt_policy_stats(const struct FrtPolicy *policy, struct FrtLatencyStats *stats);

/**
 * Forgets the latency statistics (count, percentiles, maximum, deadline misses), e.g. after
 * warm-up.
 *
 * Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_PANIC`.
 *
 * Thread safety: not concurrently with any other call on `policy`; one that finds another call
 * taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL.
 */
FrtStatus frt_policy_reset_stats(struct FrtPolicy *policy);

/**
 * Copies the execution plan as text: every op with its shapes, and which ops were fused or folded
 * and why. Text rule as in `frt_status_message` (query the length with `buf = NULL, len = 0`).
 *
 * Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
 *
 * Thread safety: `const`: may run concurrently with other `const FrtPolicy*` calls.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `buf` writable for `len` bytes and `written` for one
 * `size_t`, or NULL.
 */
FrtStatus frt_policy_explain(const struct FrtPolicy *policy,
                             char *buf,
                             size_t len,
                             size_t *written);

/**
 * Copies the message of the most recent failed call on `policy` that takes a non-const
 * `FrtPolicy*` (empty after a call that succeeded), naming the field at fault, e.g. "invalid
 * observation.state[3]: value NaN is not finite". Text rule as in `frt_status_message`.
 *
 * Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
 *
 * Thread safety: `const`: may run concurrently with other `const FrtPolicy*` calls.
 *
 * # Safety
 * `policy` from `frt_policy_open` or NULL; `buf` writable for `len` bytes and `written` for one
 * `size_t`, or NULL.
 */
FrtStatus frt_policy_last_error(const struct FrtPolicy *policy,
                                char *buf,
                                size_t len,
                                size_t *written);

/**
 * Fills `*config` with the defaults; `config->struct_size` must be set first.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` when
 * `struct_size` is below `sizeof(FrtStreamConfig)` (message in `frt_last_error`).
 *
 * Thread safety: safe to call from any thread.
 *
 * # Safety
 * `config` writable or NULL.
 */
FrtStatus frt_stream_config_default(struct FrtStreamConfig *config);

/**
 * Starts a stream over an open policy: a library thread (pinned and SCHED_FIFO as configured)
 * runs the policy's steps; the caller then pushes observations and takes one action per tick.
 * The policy needs its prompt set (or set one with `frt_stream_set_prompt`).
 *
 * The stream borrows `policy` until `frt_stream_free`: meanwhile the policy must not be freed,
 * every call taking `FrtPolicy*` returns `FRT_STATUS_BUSY` (as does a second stream over it), and
 * of the `const FrtPolicy*` calls only `frt_policy_info` and `frt_policy_explain` may be made
 * (they read data made at open). After `frt_stream_free` the policy is usable again — unless
 * `frt_stream_inference_error` reports a panic, after which it must be freed.
 *
 * On success `*out` receives the stream. Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`
 * (`policy`, `config`, `out`, or `cpus` with `cpus_len > 0`); `FRT_STATUS_INVALID_ARGUMENT`
 * (`struct_size`, `control_period_us` 0, `refill_at` not below the horizon, an unknown
 * `fallback`, `fifo_priority` outside 0-99); `FRT_STATUS_BUSY` (another call or stream holds
 * `policy`); `FRT_STATUS_BACKEND` (the thread cannot start);
 * `FRT_STATUS_PANIC`. Failures leave their message in `frt_last_error`.
 *
 * Thread safety: not concurrently with any call on `policy`.
 *
 * # Safety
 * `policy` from `frt_policy_open` (not freed) or NULL; `config` readable with `cpus` valid for
 * `cpus_len` values, or NULL; `out` writable or NULL.
 */
FrtStatus frt_stream_create(struct FrtPolicy *policy,
                            const struct FrtStreamConfig *config,
                            struct FrtStream **out);

/**
 * Stops the stream: the inference thread finishes its step in progress and is joined. The
 * policy is the caller's again. NULL is accepted and ignored.
 *
 * Thread safety: no other call may use `stream` during or after this call.
 *
 * # Safety
 * `stream` from `frt_stream_create`, not freed, or NULL.
 */
void frt_stream_free(struct FrtStream *stream);

/**
 * Hands in the latest observation (frames and state are copied; `noise` must be NULL). Call it
 * each tick before `frt_stream_next_action`, or whenever new sensor data is there. No heap
 * allocation, lock or wait when it succeeds.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (as for
 * `frt_policy_step`'s observation, and a non-NULL `noise`). On failure the previous observation
 * stays in force and `frt_stream_last_error` names the field.
 *
 * Thread safety: the stream's control thread: not concurrently with other non-const calls on it.
 *
 * # Safety
 * `stream` from `frt_stream_create` or NULL; `observation` as for `frt_policy_step`.
 */
FrtStatus frt_stream_push_observation(struct FrtStream *stream,
                                      const struct FrtObservation *observation);

/**
 * The action for this tick: `action_dim` floats into `action` unless `tick->status` is
 * `FRT_ACTION_STATUS_WAITING` (no chunk yet), and the tick's report into `*tick`. Call exactly
 * once per control tick. No heap allocation, lock or wait.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` (`stream`, `action`, `tick`);
 * `FRT_STATUS_INVALID_ARGUMENT` (`action_len` is not the policy's `action_dim`, or
 * `tick->struct_size` too small); nothing is written then.
 *
 * Thread safety: the stream's control thread.
 *
 * # Safety
 * `stream` from `frt_stream_create` or NULL; `action` writable for `action_len` floats; `tick`
 * writable; or NULL.
 */
FrtStatus frt_stream_next_action(struct FrtStream *stream,
                                 float *action,
                                 size_t action_len,
                                 struct FrtActionTick *tick);

/**
 * Copies the stream's counters (atomic loads: cheap, fine every tick).
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` when
 * `stats->struct_size` is too small (message in `frt_last_error`).
 *
 * Thread safety: `const`: from any thread, concurrently with every other stream call.
 *
 * # Safety
 * `stream` from `frt_stream_create` or NULL; `stats` writable or NULL.
 */
FrtStatus frt_stream_stats(const struct FrtStream *stream, struct FrtStreamStats *stats);

/**
 * Sets the task text; the inference thread tokenizes it before its next step (a refusal there
 * counts as an inference error). Allocates: not for the control loop.
 *
 * Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (not UTF-8).
 *
 * Thread safety: not concurrently with other non-const calls on `stream`.
 *
 * # Safety
 * `stream` from `frt_stream_create` or NULL; `text` readable for `len` bytes or NULL.
 */
FrtStatus frt_stream_set_prompt(struct FrtStream *stream, const char *text, size_t len);

/**
 * Copies the message of the last failed call on `stream` (`frt_stream_push_observation`,
 * `frt_stream_next_action`, `frt_stream_set_prompt`); empty after one succeeded. Text rule as in
 * `frt_status_message`.
 *
 * Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
 *
 * Thread safety: `const`; not concurrently with a non-const call on `stream`.
 *
 * # Safety
 * `stream` from `frt_stream_create` or NULL; `buf` writable for `len` bytes and `written` for
 * one `size_t`, or NULL.
 */
FrtStatus frt_stream_last_error(const struct FrtStream *stream,
                                char *buf,
                                size_t len,
                                size_t *written);

/**
 * Copies the message of the last failure on the inference thread (a failed step, a refused
 * prompt, a caught panic), empty if none; `FrtStreamStats.errors` counts them. Takes a lock the
 * inference thread holds briefly after a failure: not for the control loop. Text rule as in
 * `frt_status_message`.
 *
 * Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
 *
 * Thread safety: `const`: from any thread.
 *
 * # Safety
 * As `frt_stream_last_error`.
 */
FrtStatus frt_stream_inference_error(const struct FrtStream *stream,
                                     char *buf,
                                     size_t len,
                                     size_t *written);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* FLASHRT_H */

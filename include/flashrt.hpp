// flashrt.hpp - a header-only C++17 RAII layer over flashrt.h.
//
// frt::Policy owns an FrtPolicy (move-only, freed by its destructor); failures throw frt::Error,
// which carries the FrtStatus and the library's message. For the control loop, Policy::try_step
// is noexcept and reports failure by status, so a bad tick costs no exception.
//
// Thread safety is that of flashrt.h: a Policy is used by one thread at a time; its const member
// functions may run concurrently with each other. frt::Stream runs a policy on a library thread
// and hands the control thread one action per tick (try_push / try_next_action).
#ifndef FLASHRT_HPP
#define FLASHRT_HPP

#include <flashrt.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace frt {

/// A failed call: its status and the library's message.
class Error : public std::runtime_error {
public:
    Error(FrtStatus status, const std::string &message) : std::runtime_error(message), status_(status) {}
    FrtStatus status() const noexcept { return status_; }

private:
    FrtStatus status_;
};

/// A zeroed struct with struct_size set, as every flashrt.h struct wants it.
template <class T>
T sized() noexcept {
    T t{};
    t.struct_size = sizeof(T);
    return t;
}

namespace detail {

// Reads a text output under the library's text rule: query the length, then copy.
template <class Read>
std::string read_text(Read read) {
    size_t n = 0;
    if (read(nullptr, 0, &n) != FRT_STATUS_OK) return std::string();
    std::string text(n + 1, '\0');
    if (read(&text[0], text.size(), &n) != FRT_STATUS_OK) return std::string();
    text.resize(n);
    return text;
}

/// Throws for a failed call whose message is kept per thread (frt_last_error).
inline void check_on_thread(FrtStatus s) {
    if (s != FRT_STATUS_OK) throw Error(s, read_text([](char *buf, size_t len, size_t *written) { return frt_last_error(buf, len, written); }));
}

}  // namespace detail

/// A short description of a status, e.g. "the checkpoint is unusable".
inline std::string status_message(FrtStatus status) {
    return detail::read_text([&](char *buf, size_t len, size_t *written) { return frt_status_message(status, buf, len, written); });
}

/// The library's version ("0.4.0").
inline std::string version() { return frt_version(); }

/// FrtPolicyConfig with its defaults, owning the path strings. Set plain fields on `options`.
struct Config {
    explicit Config(std::string checkpoint_path) : checkpoint(std::move(checkpoint_path)), options(sized<FrtPolicyConfig>()) {
        detail::check_on_thread(frt_policy_config_default(&options));
    }
    std::string checkpoint;
    std::string tokenizer;         // empty: the one beside the checkpoint
    std::string kernel_cache_dir;  // empty: the default cache
    FrtPolicyConfig options;       // the string fields here are ignored; the ones above are used
};

/// An FrtObservation with its own camera array. Build it once, update it every tick: setting
/// frames and state does not allocate.
class Observation {
public:
    explicit Observation(size_t cameras) : frames_(cameras, FrtFrame{}), raw_(sized<FrtObservation>()) {
        raw_.cameras = frames_.data();
        raw_.cameras_len = frames_.size();
    }
    Observation(const Observation &) = delete;
    Observation &operator=(const Observation &) = delete;
    Observation(Observation &&) noexcept = default;  // the vector's buffer moves along
    Observation &operator=(Observation &&) noexcept = default;

    /// Camera `i` sees `data` (`height` rows of `stride` bytes; 0: packed) this tick.
    void set_frame(size_t i, const uint8_t *data, size_t len, size_t width, size_t height, FrtPixelFormat format, size_t stride = 0) {
        FrtFrame &f = frames_.at(i);
        f.data = data;
        f.data_len = len;
        f.width = width;
        f.height = height;
        f.stride = stride;
        f.format = static_cast<uint32_t>(format);
        f.present = true;
    }
    /// Camera `i` has no frame this tick.
    void set_missing(size_t i) { frames_.at(i).present = false; }
    void set_state(const float *state, size_t len) noexcept {
        raw_.state = state;
        raw_.state_len = len;
    }
    /// Initial noise for a reproducible step; (nullptr, 0): drawn by the policy.
    void set_noise(const float *noise, size_t len) noexcept {
        raw_.noise = noise;
        raw_.noise_len = len;
    }
    const FrtObservation &raw() const noexcept { return raw_; }

private:
    std::vector<FrtFrame> frames_;
    FrtObservation raw_;
};

/// FrtPolicyInfo with owned strings.
struct Info {
    std::string model;
    FrtBackend backend;
    std::string device_name;
    size_t action_dim, horizon, actions_len, state_dim, noise_len;
    std::vector<std::string> camera_names;
    size_t max_frame_width, max_frame_height, denoise_steps, prompt_capacity;
    uint64_t parameters, memory_bytes;
    /// GR00T's embodiment tag; empty for a model without embodiments (Pi0.5).
    std::string embodiment;
};

/// An open policy. Move-only; the destructor frees it.
class Policy {
public:
    /// Opens a checkpoint (slow: call once). Throws Error with frt_last_error's message.
    static Policy open(const Config &config) {
        FrtPolicyConfig c = config.options;
        c.checkpoint = config.checkpoint.c_str();
        c.tokenizer = config.tokenizer.empty() ? nullptr : config.tokenizer.c_str();
        c.kernel_cache_dir = config.kernel_cache_dir.empty() ? nullptr : config.kernel_cache_dir.c_str();
        FrtPolicy *p = nullptr;
        detail::check_on_thread(frt_policy_open(&c, &p));
        return Policy(p);
    }

    Policy(Policy &&other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
    Policy &operator=(Policy &&other) noexcept {
        if (this != &other) {
            frt_policy_free(p_);
            p_ = std::exchange(other.p_, nullptr);
        }
        return *this;
    }
    Policy(const Policy &) = delete;
    Policy &operator=(const Policy &) = delete;
    ~Policy() { frt_policy_free(p_); }

    Info info() const {
        FrtPolicyInfo i = sized<FrtPolicyInfo>();
        detail::check_on_thread(frt_policy_info(p_, &i));
        Info out{i.model, i.backend, i.device_name, i.action_dim, i.horizon, i.actions_len, i.state_dim, i.noise_len, {},
                 i.max_frame_width, i.max_frame_height, i.denoise_steps, i.prompt_capacity, i.parameters, i.memory_bytes,
                 i.embodiment != nullptr ? i.embodiment : ""};
        out.camera_names.assign(i.camera_names, i.camera_names + i.cameras);
        return out;
    }

    /// Sets the task text (tokenized once; may allocate: not per tick).
    // An empty view may carry a NULL data(); pass "" so the library reports the empty prompt.
    void set_prompt(std::string_view text) { check(frt_policy_set_prompt(p_, text.empty() ? "" : text.data(), text.size())); }
    /// Sets the complete prompt as token ids.
    void set_prompt_tokens(const std::vector<int32_t> &tokens) {
        static const int32_t none = 0;  // an empty vector's data() may be NULL: report the length instead
        check(frt_policy_set_prompt_tokens(p_, tokens.empty() ? &none : tokens.data(), tokens.size()));
    }

    /// Switches a GR00T policy to another embodiment tag (not per tick): the state width, action
    /// width, horizon and camera names follow it, so read info() again. Throws Error naming an
    /// unknown tag with the known ones, or saying the model (Pi0.5) has no embodiments.
    void set_embodiment(std::string_view tag) { check(frt_policy_set_embodiment(p_, tag.empty() ? "" : tag.data(), tag.size())); }

    /// One control tick; throws Error naming the bad field. `actions` holds info().actions_len floats.
    FrtStepInfo step(const Observation &obs, float *actions, size_t actions_len) {
        FrtStepInfo info = sized<FrtStepInfo>();
        check(frt_policy_step(p_, &obs.raw(), actions, actions_len, &info));
        return info;
    }
    /// One control tick without exceptions (the hot-loop form); last_error() explains a failure.
    FrtStatus try_step(const Observation &obs, float *actions, size_t actions_len, FrtStepInfo *info = nullptr) noexcept {
        return frt_policy_step(p_, &obs.raw(), actions, actions_len, info);
    }
    /// A tick whose chunk continues the previous one (real-time chunking; the policy was opened
    /// with Config::rtc_schedule): `executed` actions of that chunk were done when `obs` was
    /// taken, `inference_delay` more run while this step does.
    FrtStepInfo step_continuing(const Observation &obs, size_t executed, size_t inference_delay, float *actions, size_t actions_len) {
        FrtStepInfo info = sized<FrtStepInfo>();
        check(frt_policy_step_continuing(p_, &obs.raw(), executed, inference_delay, actions, actions_len, &info));
        return info;
    }

    FrtLatencyStats stats() const {
        FrtLatencyStats s = sized<FrtLatencyStats>();
        detail::check_on_thread(frt_policy_stats(p_, &s));
        return s;
    }
    void reset_stats() { check(frt_policy_reset_stats(p_)); }

    /// Records every observation stepped from now on, with its prompt, into an observation log at
    /// `path` (`frt_policy_record_start`; `flashrt run --observations` replays it).
    void record_start(std::string_view path) { check(frt_policy_record_start(p_, path.empty() ? "" : path.data(), path.size())); }
    /// Writes what is queued and closes the log; throws Error if writing it failed.
    void record_stop() { check(frt_policy_record_stop(p_)); }
    /// FP8 calibration of this policy's plan (`frt_policy_calibrate`) over the first `steps`
    /// observations of a recorded log (empty: synthetic observations, with a warning), written to
    /// `out` (empty: beside the checkpoint). The policy must be on the CPU backend in f32.
    void calibrate(std::string_view observations, uint32_t steps = 0, std::string_view out = {}) {
        check(frt_policy_calibrate(p_, observations.empty() ? nullptr : observations.data(), observations.size(), steps,
                                   out.empty() ? nullptr : out.data(), out.size()));
    }

    /// The execution plan as text.
    std::string explain() const {
        return detail::read_text([this](char *buf, size_t len, size_t *written) { return frt_policy_explain(p_, buf, len, written); });
    }
    /// The message of the last failed call on this policy ("" after a success).
    std::string last_error() const {
        return detail::read_text([this](char *buf, size_t len, size_t *written) { return frt_policy_last_error(p_, buf, len, written); });
    }

    /// The C handle, for calls this wrapper does not cover. Still owned by this object.
    FrtPolicy *get() const noexcept { return p_; }

private:
    explicit Policy(FrtPolicy *p) noexcept : p_(p) {}
    void check(FrtStatus s) const {
        if (s != FRT_STATUS_OK) throw Error(s, last_error());
    }

    FrtPolicy *p_;
};

/// FrtStreamConfig with its defaults. Set plain fields directly; `cpus` is read at create only.
struct StreamConfig {
    StreamConfig() : options(sized<FrtStreamConfig>()) { detail::check_on_thread(frt_stream_config_default(&options)); }
    std::vector<size_t> cpus;  // the inference thread's CPUs; empty: not pinned
    FrtStreamConfig options;   // options.cpus / cpus_len are ignored; `cpus` above is used
};

/// An action stream: the policy's steps on a library thread, one action per control tick on the
/// caller's. Borrows the Policy until destroyed (make no call on the Policy meanwhile, except
/// info() and explain()). Move-only; the destructor stops and joins the inference thread.
class Stream {
public:
    /// Starts the stream (throws Error with frt_last_error's message).
    static Stream create(Policy &policy, const StreamConfig &config) {
        FrtStreamConfig c = config.options;
        c.cpus = config.cpus.empty() ? nullptr : config.cpus.data();
        c.cpus_len = config.cpus.size();
        FrtStream *s = nullptr;
        detail::check_on_thread(frt_stream_create(policy.get(), &c, &s));
        return Stream(s);
    }

    Stream(Stream &&other) noexcept : s_(std::exchange(other.s_, nullptr)) {}
    Stream &operator=(Stream &&other) noexcept {
        if (this != &other) {
            frt_stream_free(s_);
            s_ = std::exchange(other.s_, nullptr);
        }
        return *this;
    }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    ~Stream() { frt_stream_free(s_); }

    /// Hands in the latest observation (copied; no allocation). Noexcept for the control loop;
    /// last_error() explains a failure.
    FrtStatus try_push(const Observation &obs) noexcept { return frt_stream_push_observation(s_, &obs.raw()); }
    /// This tick's action (`action_len` = the policy's action_dim) and its report; not written
    /// when tick->status is FRT_ACTION_STATUS_WAITING. Noexcept, no allocation.
    FrtStatus try_next_action(float *action, size_t action_len, FrtActionTick *tick) noexcept {
        return frt_stream_next_action(s_, action, action_len, tick);
    }
    /// The counters (cheap; any thread).
    FrtStreamStats stats() const {
        FrtStreamStats st = sized<FrtStreamStats>();
        detail::check_on_thread(frt_stream_stats(s_, &st));
        return st;
    }
    /// Sets the task text; applied by the inference thread before its next step.
    void set_prompt(std::string_view text) {
        FrtStatus st = frt_stream_set_prompt(s_, text.empty() ? "" : text.data(), text.size());
        if (st != FRT_STATUS_OK) throw Error(st, last_error());
    }
    /// The message of the last failed call on this stream ("" after a success).
    std::string last_error() const {
        return detail::read_text([this](char *buf, size_t len, size_t *written) { return frt_stream_last_error(s_, buf, len, written); });
    }
    /// The last failure on the inference thread ("" if none); not for the control loop.
    std::string inference_error() const {
        return detail::read_text([this](char *buf, size_t len, size_t *written) { return frt_stream_inference_error(s_, buf, len, written); });
    }
    FrtStream *get() const noexcept { return s_; }

private:
    explicit Stream(FrtStream *s) noexcept : s_(s) {}
    FrtStream *s_;
};

}  // namespace frt

#endif  // FLASHRT_HPP

// A robot controller on FlashRT: a fixed-rate loop on std::chrono::steady_clock deadlines that
// executes an action chunk tick by tick and re-plans every K ticks from fresh camera frames and
// joint state. The "robot" here is simulated (joint positions integrate the commanded actions,
// cameras show a moving pattern); replace those two functions with your drivers.
//
//   cpp_controller --checkpoint DIR [--tokenizer FILE] [--prompt TEXT] [--hz 50] [--replan 10]
//                  [--ticks N] [--backend auto|cpu|cuda] [--threads N] [--stream]
//
// --stream runs the policy on the library's inference thread (frt::Stream): each tick pushes the
// latest frames and joints and takes one action; the next chunk is requested when --replan actions
// are left, the actions executed during inference are skipped, and a late chunk holds the last
// action. Without it, the loop itself steps the policy every --replan ticks (and waits for it).
//
// --threads sets the CPU backend's threads (default 0: every core the process may use).
// --ticks 0 runs until Ctrl-C. At the end it prints the policy's step latency statistics and the
// deadline misses: steps slower than one tick (counted by the library) and ticks whose work ended
// after their deadline (counted here).
#include <flashrt.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> stop_requested{false};

struct Options {
    std::string checkpoint, tokenizer, prompt = "pick up the red block and put it in the bowl";
    double hz = 50.0;
    long replan = 10, ticks = 0, threads = 0;
    FrtBackend backend = FRT_BACKEND_AUTO;
    bool stream = false;
};

[[noreturn]] void usage(const char *why) {
    std::fprintf(stderr,
                 "%s\nusage: cpp_controller --checkpoint DIR [--tokenizer FILE] [--prompt TEXT] [--hz 50] "
                 "[--replan K] [--ticks N] [--backend auto|cpu|cuda] [--threads N] [--stream]\n",
                 why);
    std::exit(2);
}

Options parse(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string flag = argv[i];
        if (flag == "--stream") {
            o.stream = true;
            continue;
        }
        if (i + 1 >= argc) usage(("missing value for " + flag).c_str());
        const char *value = argv[++i];
        if (flag == "--checkpoint") o.checkpoint = value;
        else if (flag == "--tokenizer") o.tokenizer = value;
        else if (flag == "--prompt") o.prompt = value;
        else if (flag == "--hz") o.hz = std::atof(value);
        else if (flag == "--replan") o.replan = std::atol(value);
        else if (flag == "--ticks") o.ticks = std::atol(value);
        else if (flag == "--threads") o.threads = std::atol(value);
        else if (flag == "--backend") {
            std::string b = value;
            o.backend = b == "cpu" ? FRT_BACKEND_CPU : b == "cuda" ? FRT_BACKEND_CUDA : b == "auto" ? FRT_BACKEND_AUTO : (usage("bad --backend"), FRT_BACKEND_AUTO);
        } else usage(("unknown flag " + flag).c_str());
    }
    if (o.checkpoint.empty()) usage("--checkpoint is required");
    if (o.hz <= 0.0 || o.replan < 1 || o.ticks < 0 || o.threads < 0) usage("--hz and --replan must be positive, --ticks and --threads not negative");
    return o;
}

// Simulated camera: a 640x480 RGB pattern that drifts with time.
constexpr size_t kWidth = 640, kHeight = 480;
void capture(std::vector<uint8_t> &image, long tick, size_t camera) {
    for (size_t y = 0; y < kHeight; y++)
        for (size_t x = 0; x < kWidth; x++)
            for (size_t c = 0; c < 3; c++)
                image[(y * kWidth + x) * 3 + c] = static_cast<uint8_t>((x + 2 * y + 3 * static_cast<size_t>(tick) + 40 * c + 85 * camera) & 0xFF);
}

// Simulated robot: each joint moves a little toward the commanded action.
void actuate(std::vector<float> &joints, const float *action, size_t action_dim) {
    for (size_t i = 0; i < joints.size() && i < action_dim; i++) joints[i] += 0.05f * (action[i] - joints[i]);
}

// Stream mode: the library's thread computes chunks; this loop pushes an observation and takes
// one action every tick, never waiting for inference.
int run_stream(const Options &opt, frt::Policy &policy, const frt::Info &info, Clock::duration period) {
    frt::StreamConfig sc;
    sc.options.control_period_us = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(period).count());
    sc.options.refill_at = static_cast<size_t>(std::min<long>(opt.replan, static_cast<long>(info.horizon) - 1));
    sc.options.fallback = FRT_FALLBACK_HOLD;
    frt::Stream stream = frt::Stream::create(policy, sc);

    std::vector<std::vector<uint8_t>> images(info.camera_names.size(), std::vector<uint8_t>(kWidth * kHeight * 3));
    std::vector<float> joints(info.state_dim, 0.0f), action(info.action_dim, 0.0f);
    frt::Observation obs(info.camera_names.size());
    obs.set_state(joints.data(), joints.size());
    FrtActionTick tick = frt::sized<FrtActionTick>();
    long ticks = 0, overruns = 0, failed = 0;
    auto deadline = Clock::now() + period;
    while (!stop_requested && (opt.ticks == 0 || ticks < opt.ticks)) {
        for (size_t cam = 0; cam < images.size(); cam++) {
            capture(images[cam], ticks, cam);
            obs.set_frame(cam, images[cam].data(), images[cam].size(), kWidth, kHeight, FRT_PIXEL_FORMAT_RGB8);
        }
        if (stream.try_push(obs) != FRT_STATUS_OK || stream.try_next_action(action.data(), action.size(), &tick) != FRT_STATUS_OK) {
            failed++;
            std::fprintf(stderr, "tick %ld: %s\n", ticks, stream.last_error().c_str());
        } else if (tick.status != FRT_ACTION_STATUS_WAITING) {
            actuate(joints, action.data(), info.action_dim);
        }
        ticks++;
        if (Clock::now() > deadline) {
            overruns++;
            deadline = Clock::now();
        }
        std::this_thread::sleep_until(deadline);
        deadline += period;
    }
    const FrtStreamStats s = stream.stats();
    std::printf("stream: ticks %ld at %.0f Hz, request at %zu left: %llu chunks, delay %llu ticks, %llu actions skipped, %llu late "
                "ticks held, %llu waiting, inference p50 %.1f ms max %.1f ms, %llu errors, %ld ticks overran\n",
                ticks, opt.hz, sc.options.refill_at, static_cast<unsigned long long>(s.chunks), static_cast<unsigned long long>(s.delay_ticks),
                static_cast<unsigned long long>(s.skipped_actions), static_cast<unsigned long long>(s.late_ticks),
                static_cast<unsigned long long>(s.waiting_ticks), s.latency_p50_us / 1e3, s.latency_max_us / 1e3,
                static_cast<unsigned long long>(s.errors), overruns);
    if (s.errors > 0) std::fprintf(stderr, "last inference error: %s\n", stream.inference_error().c_str());
    return failed == 0 && s.errors == 0 && s.chunks > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
    const Options opt = parse(argc, argv);
    std::signal(SIGINT, [](int) { stop_requested = true; });

    try {
        frt::Config config(opt.checkpoint);
        config.tokenizer = opt.tokenizer;
        config.options.backend = opt.backend;
        config.options.threads = static_cast<size_t>(opt.threads);
        config.options.max_frame_width = kWidth;
        config.options.max_frame_height = kHeight;
        const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / opt.hz));
        // A step slower than one tick counts as a deadline miss in the library's statistics.
        config.options.deadline_us = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(period).count());

        frt::Policy policy = frt::Policy::open(config);
        const frt::Info info = policy.info();
        std::printf("flashrt %s: %s on %s (%s), %zu cameras, state %zu, chunk %zu x %zu\n", frt::version().c_str(), info.model.c_str(),
                    info.backend == FRT_BACKEND_CUDA ? "cuda" : "cpu", info.device_name.c_str(), info.camera_names.size(), info.state_dim,
                    info.horizon, info.action_dim);
        const long replan = std::min<long>(opt.replan, static_cast<long>(info.horizon));
        policy.set_prompt(opt.prompt);

        if (opt.stream) return run_stream(opt, policy, info, period);

        // Everything the loop touches is allocated here, before it starts.
        std::vector<std::vector<uint8_t>> images(info.camera_names.size(), std::vector<uint8_t>(kWidth * kHeight * 3));
        std::vector<float> joints(info.state_dim, 0.0f);
        std::vector<float> chunk(info.actions_len, 0.0f);
        frt::Observation obs(info.camera_names.size());
        obs.set_state(joints.data(), joints.size());
        long row = static_cast<long>(info.horizon);  // no chunk yet: plan on the first tick
        long ticks = 0, overruns = 0, failed = 0;

        auto deadline = Clock::now() + period;
        while (!stop_requested && (opt.ticks == 0 || ticks < opt.ticks)) {
            if (row >= replan) {
                for (size_t cam = 0; cam < images.size(); cam++) {
                    capture(images[cam], ticks, cam);
                    obs.set_frame(cam, images[cam].data(), images[cam].size(), kWidth, kHeight, FRT_PIXEL_FORMAT_RGB8);
                }
                // try_step: a bad tick must not throw out of the control loop; keep the old chunk.
                if (policy.try_step(obs, chunk.data(), chunk.size()) == FRT_STATUS_OK) {
                    row = 0;
                } else {
                    failed++;
                    std::fprintf(stderr, "tick %ld: step failed: %s\n", ticks, policy.last_error().c_str());
                }
            }
            const long r = std::min<long>(row, static_cast<long>(info.horizon) - 1);
            actuate(joints, chunk.data() + static_cast<size_t>(r) * info.action_dim, info.action_dim);
            row++;
            ticks++;

            if (Clock::now() > deadline) {
                overruns++;
                deadline = Clock::now();  // late: restart the schedule instead of bursting to catch up
            }
            std::this_thread::sleep_until(deadline);
            deadline += period;
        }

        const FrtLatencyStats s = policy.stats();
        std::printf("ticks %ld at %.0f Hz, re-plan every %ld ticks: %llu steps, %ld failed\n", ticks, opt.hz, replan,
                    static_cast<unsigned long long>(s.count), failed);
        std::printf("step latency ms: p50 %.3f  p90 %.3f  p99 %.3f  max %.3f\n", s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms);
        std::printf("deadline misses: %llu steps longer than a tick, %ld ticks overran\n", static_cast<unsigned long long>(s.deadline_misses), overruns);
        return failed == 0 ? 0 : 1;
    } catch (const frt::Error &e) {
        std::fprintf(stderr, "flashrt error (status %u): %s\n", static_cast<unsigned>(e.status()), e.what());
        return 1;
    }
}

//! The hot-path contract: after the first (warm-up) step, `Policy::step` performs no heap
//! allocation — over steps with changing frames (sizes, pixel formats, missing cameras), states,
//! noise and prompt lengths, with the CPU worker pool active. A counting global allocator sees
//! every allocation of the process (the pool's threads included) while armed.
//!
//! `STEPS` is as small as covers every combination the schedule below cycles through (asserted at
//! the end): a step costs seconds under emulation (jetson/ci.sh runs this under qemu), and a
//! repetition of a combination already seen proves nothing new.
//!
//! Runs without the libtest harness (`harness = false`): libtest's own thread allocates, e.g. for
//! its "has been running for over 60 seconds" notice under emulation, and would be counted.

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::count;
use flashrt::image::{Frame, PixelFormat};
use flashrt::models::pi05::synth::{SynthSize, synthesize};
use flashrt::{Continuation, Observation, Policy, PolicyConfig, RtcConfig, RtcSchedule};

fn main() {
    step_does_not_allocate_after_warm_up();
    continuing_step_does_not_allocate();
    groot_step_does_not_allocate_after_warm_up(false);
    groot_step_does_not_allocate_after_warm_up(true);
    groot_step_does_not_allocate_after_an_embodiment_switch();
    println!("no_alloc_pi05: 5 passed, 0 failed");
}

/// Frames cycle through 4 sizes/formats, the missing-camera pattern through 15 steps, noise through
/// 2, states through 7 and the prompt through 3 texts (changed every `STEPS / 3` steps).
const STEPS: usize = 30;

fn step_does_not_allocate_after_warm_up() {
    let dir = tempfile::tempdir().unwrap();
    // The smallest synthesized model: jetson/ci.sh runs this under qemu, where a step of the tiny
    // one costs seconds. The code paths are the same.
    synthesize(dir.path(), SynthSize::Micro, 11, &|_| {}).unwrap();
    let mut config = PolicyConfig::new(dir.path());
    config.max_frame_width = 640;
    config.max_frame_height = 480;
    // Two threads even on a one-core machine: the pool's hand-offs are part of the hot path.
    config.threads = Some(2);
    let mut policy = Policy::open(&config).unwrap();
    let info = policy.info();
    let mut actions = vec![0.0; policy.actions_len()];

    // Inputs prepared up front (the test's own buffers must not be counted). The first size is the
    // model's own (no resize), the others are resized with padding.
    let flashrt::models::ModelConfig::Pi05(config) = &info.config else { panic!("the synthesized checkpoint is a Pi0.5") };
    let side = config.image_size;
    let sizes =
        [(side, side, PixelFormat::Rgb8), (640, 480, PixelFormat::Bgr8), (300, 200, PixelFormat::Rgba8), (96, 128, PixelFormat::Rgb8)];
    let frames: Vec<Vec<u8>> =
        sizes.iter().enumerate().map(|(i, (w, h, f))| (0..w * h * f.bytes_per_pixel()).map(|p| (p * 31 + i * 7) as u8).collect()).collect();
    let states: Vec<Vec<f32>> = (0..7).map(|i| (0..info.state_dim).map(|d| ((i * 13 + d * 5) % 17) as f32 / 4.0 - 2.0).collect()).collect();
    let noises: Vec<Vec<f32>> = (0..3).map(|i| (0..policy.noise_len()).map(|j| ((i + j * 7) % 11) as f32 / 5.0 - 1.0).collect()).collect();
    let tasks = ["pick up the cup", "stack the red block on the blue block and then push the tower to the left edge", "open drawer"];

    policy.set_prompt(tasks[0]).unwrap();
    let frame = |i: usize| {
        let (w, h, f) = sizes[i % sizes.len()];
        Frame::packed(&frames[i % sizes.len()], w, h, f)
    };
    let cameras_for =
        |i: usize| -> [Option<Frame>; 3] { [Some(frame(i)), (i % 3 != 0).then(|| frame(i + 1)), (i % 5 == 0).then(|| frame(i + 2))] };

    // Warm-up step (may allocate, e.g. lazily initialised thread-locals).
    let cams = cameras_for(0);
    policy.step(&Observation { cameras: &cams, state: &states[0], noise: None }, &mut actions).unwrap();

    let mut total = 0;
    let mut prompt_lengths = std::collections::BTreeSet::new();
    let mut camera_patterns = std::collections::BTreeSet::new();
    for i in 1..=STEPS {
        if i % (STEPS / 3) == 0 {
            policy.set_prompt(tasks[(i / (STEPS / 3)) % tasks.len()]).unwrap(); // not the hot path
        }
        let cams = cameras_for(i);
        camera_patterns.insert(cams.each_ref().map(|c| c.map(|f| (f.width, f.height))));
        let noise = (i % 2 == 0).then(|| noises[i % noises.len()].as_slice());
        let obs = Observation { cameras: &cams, state: &states[i % states.len()], noise };
        let (result, n) = count(|| policy.step(&obs, &mut actions));
        let info = result.unwrap();
        prompt_lengths.insert(info.prompt_tokens);
        total += n;
        assert!(actions.iter().all(|a| a.is_finite()));
    }
    assert_eq!(total, 0, "step allocated {total} times over {STEPS} steps");
    assert!(prompt_lengths.len() >= 3, "prompt lengths should vary, saw {prompt_lengths:?}");
    // Every size in every slot, and each slot both present and missing.
    assert!(STEPS >= 15 && STEPS >= states.len(), "{STEPS} steps do not cover the schedule");
    for slot in 0..3 {
        let seen: std::collections::BTreeSet<_> = camera_patterns.iter().map(|p| p[slot]).collect();
        let want = if slot == 0 { sizes.len() } else { sizes.len() + 1 };
        assert_eq!(seen.len(), want, "camera {slot} saw {seen:?}");
    }

    // The counter works: an allocation while armed is seen.
    let (_, n) = count(|| std::hint::black_box(vec![1u8; 64]));
    assert_eq!(n, 1);
}

/// Real-time chunking's steps (`Policy::step_continuing`): the row weights and the shift are
/// written in place, whatever the schedule and the continuation (none, inside the previous
/// chunk, past its end). The frames and prompt paths are those above.
fn continuing_step_does_not_allocate() {
    let dir = tempfile::tempdir().unwrap();
    synthesize(dir.path(), SynthSize::Micro, 12, &|_| {}).unwrap();
    let continuations = [
        None,
        Some(Continuation { executed: 3, inference_delay: 2 }),
        Some(Continuation { executed: 40, inference_delay: 9 }),
        Some(Continuation { executed: 80, inference_delay: 1 }),
    ];
    for schedule in [RtcSchedule::Linear, RtcSchedule::Exp] {
        let mut config = PolicyConfig::new(dir.path());
        (config.max_frame_width, config.max_frame_height, config.threads) = (64, 64, Some(2));
        config.rtc = Some(RtcConfig { schedule, max_guidance_weight: 5.0, execution_horizon: 20 });
        let mut policy = Policy::open(&config).unwrap();
        let mut actions = vec![0.0; policy.actions_len()];
        let pixels = vec![7u8; 64 * 64 * 3];
        let cams = [Some(Frame::packed(&pixels, 64, 64, PixelFormat::Rgb8)), None, None];
        let state = vec![0.25; policy.info().state_dim];
        policy.set_prompt("wipe the table").unwrap();
        let obs = Observation { cameras: &cams, state: &state, noise: None };
        policy.step(&obs, &mut actions).unwrap();
        let mut total = 0;
        for continuation in continuations {
            let (result, n) = count(|| policy.step_continuing(&obs, continuation, &mut actions));
            result.unwrap();
            total += n;
            assert!(actions.iter().all(|a| a.is_finite()));
        }
        assert_eq!(total, 0, "{schedule:?}: continuing steps allocated {total} times");
    }
}

/// The same contract for GR00T N1.7 (tiny fixture): frames of changing sizes and formats, a
/// missing camera, states, noise and prompts of different lengths; its host work (state
/// normalization, action decoding with the relative end-effector poses) is inside `step`. With
/// `albumentations`, the checkpoint's processor_config.json asks for that image path (OpenCV's
/// INTER_AREA resizes) with its letterbox; without, the policy continues its chunks (real-time
/// chunking, GR00T's `ramp`) at changing continuations: inside the previous chunk, past its end.
fn groot_step_does_not_allocate_after_warm_up(albumentations: bool) {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/groot_n17_tiny");
    let copy = tempfile::tempdir().unwrap();
    let dir = if albumentations {
        for entry in std::fs::read_dir(&fixture).unwrap() {
            let entry = entry.unwrap();
            let to = copy.path().join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                std::fs::create_dir(&to).unwrap();
                std::fs::copy(entry.path().join("config.json"), to.join("config.json")).unwrap();
            } else {
                std::fs::copy(entry.path(), to).unwrap();
            }
        }
        let path = copy.path().join("processor_config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let edited = text
            .replace("\"use_albumentations\": false", "\"use_albumentations\": true")
            .replace("\"letter_box_transform\": false", "\"letter_box_transform\": true");
        assert_eq!(edited.matches(": true").count(), text.matches(": true").count() + 2, "processor_config.json: both switches");
        std::fs::write(&path, edited).unwrap();
        copy.path().to_path_buf()
    } else {
        fixture
    };
    let mut config = PolicyConfig::new(&dir);
    (config.max_frame_width, config.max_frame_height) = (320, 240);
    config.threads = Some(2);
    config.embodiment = Some("tiny_robot".into());
    config.rtc = (!albumentations).then(|| RtcConfig { schedule: RtcSchedule::Ramp, ..RtcConfig::default() });
    let mut policy = Policy::open(&config).unwrap();
    let state_dim = policy.info().state_dim;
    let mut actions = vec![0.0; policy.actions_len()];
    let sizes = [(320, 240, PixelFormat::Rgb8), (200, 150, PixelFormat::Bgr8), (97, 131, PixelFormat::Rgba8)];
    let frames: Vec<Vec<u8>> =
        sizes.iter().enumerate().map(|(i, (w, h, f))| (0..w * h * f.bytes_per_pixel()).map(|p| (p * 29 + i * 5) as u8).collect()).collect();
    let frame = |i: usize| {
        let (w, h, f) = sizes[i % sizes.len()];
        Frame::packed(&frames[i % sizes.len()], w, h, f)
    };
    let states: Vec<Vec<f32>> = (0..3).map(|i| (0..state_dim).map(|d| ((i * 7 + d * 3) % 13) as f32 / 3.0 - 2.0).collect()).collect();
    let noise: Vec<f32> = (0..policy.noise_len()).map(|j| (j % 9) as f32 / 4.0 - 1.0).collect();
    let tasks = ["pick up the cup", "stack the red block on the blue block, then push the tower left"];
    policy.set_prompt(tasks[0]).unwrap();
    let cams = [Some(frame(0)), Some(frame(1))];
    policy.step(&Observation { cameras: &cams, state: &states[0], noise: None }, &mut actions).unwrap();

    let (mut total, mut prompt_lengths) = (0, std::collections::BTreeSet::new());
    for i in 1..=6 {
        if i == 4 {
            policy.set_prompt(tasks[1]).unwrap(); // not the hot path
        }
        let cams = [Some(frame(i)), (i % 3 != 0).then(|| frame(i + 1))];
        let obs = Observation { cameras: &cams, state: &states[i % states.len()], noise: (i % 2 == 0).then_some(noise.as_slice()) };
        let continuation = (!albumentations).then_some(Continuation { executed: i % 4 * 2, inference_delay: i % 3 });
        let (result, n) = count(|| policy.step_continuing(&obs, continuation, &mut actions));
        prompt_lengths.insert(result.unwrap().prompt_tokens);
        total += n;
        assert!(actions.iter().all(|a| a.is_finite()));
    }
    assert_eq!(total, 0, "a GR00T step (albumentations: {albumentations}) allocated {total} times");
    assert_eq!(prompt_lengths.len(), 2, "{prompt_lengths:?}");
}

/// Switching the embodiment (not the hot path) leaves the steps after it allocation-free: the
/// plan selects the new embodiment's weights by an input, and its statistics were read at open.
/// The two synthesized embodiments differ in state and action widths.
fn groot_step_does_not_allocate_after_an_embodiment_switch() {
    use flashrt::models::groot_n17::synth::{Options, Size, synthesize_with};
    let dir = tempfile::tempdir().unwrap();
    synthesize_with(dir.path(), Size::Tiny, &Options { cameras: 2, embodiments: 2 }, 3, &|_| {}).unwrap();
    let mut config = PolicyConfig::new(dir.path());
    (config.max_frame_width, config.max_frame_height) = (128, 128);
    config.threads = Some(2);
    config.embodiment = Some("robot".into());
    let mut policy = Policy::open(&config).unwrap();
    policy.set_prompt("pick up the cup").unwrap();
    let frame: Vec<u8> = (0..128 * 96 * 3).map(|p| (p * 13) as u8).collect();
    let cams = [Some(Frame::packed(&frame, 128, 96, PixelFormat::Rgb8)), Some(Frame::packed(&frame, 96, 128, PixelFormat::Rgb8))];
    // Buffers for both embodiments, made before counting.
    let tags = ["robot", "robot_2", "robot"];
    let mut sized = Vec::new();
    for tag in tags {
        policy.set_embodiment(tag).unwrap();
        let state: Vec<f32> = (0..policy.info().state_dim).map(|d| (d as f32 * 0.3).sin()).collect();
        sized.push((state, vec![0.0; policy.actions_len()]));
    }
    policy.set_embodiment("robot").unwrap();
    let (state, actions) = &mut sized[0];
    policy.step(&Observation { cameras: &cams, state, noise: None }, actions).unwrap();

    let mut total = 0;
    for (tag, (state, actions)) in tags.iter().zip(&mut sized) {
        policy.set_embodiment(tag).unwrap(); // not the hot path
        for _ in 0..2 {
            let (result, n) = count(|| policy.step(&Observation { cameras: &cams, state, noise: None }, actions));
            result.unwrap();
            total += n;
            assert!(actions.iter().all(|a| a.is_finite()));
        }
    }
    assert_eq!(total, 0, "GR00T steps after embodiment switches allocated {total} times");
}

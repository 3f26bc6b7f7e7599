//! The hot-path contract through the C ABI: after the first step, `frt_policy_step` makes no heap
//! allocation (DESIGN.md §2). A counting global allocator is armed around steps with a text
//! prompt, missing cameras, strided frames, changing states, drawn and caller noise alternating,
//! and the CPU worker pool active (two threads). Own `main` (harness = false) so no test-runner
//! thread allocates while the counter is armed. A few steps cover every path (the variants repeat
//! every two steps, and each is seen three times); the model is the smallest synthesized one, since
//! under qemu (jetson/ci.sh) a step of the tiny one costs seconds. Then the same steps with
//! `frt_policy_record_start` on, counting the stepping thread only (the recorder's writer thread
//! allocates by design).

use std::ffi::CString;

use flashrt_ffi::*;

#[path = "../../tests/support/counting_alloc.rs"]
mod counting_alloc;

const STEPS: usize = 6;

fn main() {
    let dir = tempfile::tempdir().unwrap();
    flashrt::models::pi05::synth::synthesize(dir.path(), flashrt::models::pi05::synth::SynthSize::Micro, 7, &|_| {}).unwrap();
    let checkpoint = CString::new(dir.path().to_str().unwrap()).unwrap();
    let tokenizer = CString::new(dir.path().join("tokenizer.json").to_str().unwrap()).unwrap();
    unsafe {
        let mut config: FrtPolicyConfig = std::mem::zeroed();
        config.struct_size = size_of::<FrtPolicyConfig>();
        assert_eq!(frt_policy_config_default(&mut config), FrtStatus::Ok);
        config.checkpoint = checkpoint.as_ptr();
        config.tokenizer = tokenizer.as_ptr();
        config.backend = FrtBackend::Cpu as u32;
        config.max_frame_width = 320;
        config.max_frame_height = 240;
        config.deadline_us = 1;
        config.threads = 2;
        let mut policy = std::ptr::null_mut();
        assert_eq!(frt_policy_open(&config, &mut policy), FrtStatus::Ok);
        let mut info: FrtPolicyInfo = std::mem::zeroed();
        info.struct_size = size_of::<FrtPolicyInfo>();
        assert_eq!(frt_policy_info(policy, &mut info), FrtStatus::Ok);
        let prompt = "pick up the cube";
        assert_eq!(frt_policy_set_prompt(policy, prompt.as_ptr().cast(), prompt.len()), FrtStatus::Ok);

        // 320x240 RGBA with padded rows, 64x48 BGR packed, third camera missing.
        let (w0, h0, stride0) = (320, 240, 320 * 4 + 64);
        let big: Vec<u8> = (0..stride0 * h0).map(|i| (i * 31 % 251) as u8).collect();
        let small: Vec<u8> = (0..64 * 48 * 3).map(|i| (i * 17 % 253) as u8).collect();
        let frame = |data: &[u8], width, height, stride, format: FrtPixelFormat| FrtFrame {
            data: data.as_ptr(),
            data_len: data.len(),
            width,
            height,
            stride,
            format: format as u32,
            present: true,
        };
        let mut cameras = vec![frame(&big, w0, h0, stride0, FrtPixelFormat::Rgba8), frame(&small, 64, 48, 0, FrtPixelFormat::Bgr8)];
        cameras.resize_with(info.cameras, || FrtFrame { present: false, ..frame(&[], 0, 0, 0, FrtPixelFormat::Rgb8) });
        let mut state: Vec<f32> = (0..info.state_dim).map(|i| 0.1 * i as f32 - 0.3).collect();
        let noise: Vec<f32> = (0..info.noise_len).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        let mut actions = vec![f32::NAN; info.actions_len];
        let mut step_info: FrtStepInfo = std::mem::zeroed();
        step_info.struct_size = size_of::<FrtStepInfo>();
        let mut obs = FrtObservation {
            struct_size: size_of::<FrtObservation>(),
            cameras: cameras.as_ptr(),
            cameras_len: cameras.len(),
            state: state.as_ptr(),
            state_len: state.len(),
            noise: std::ptr::null(),
            noise_len: 0,
        };
        // Warm-up: the first step may allocate.
        assert_eq!(frt_policy_step(policy, &obs, actions.as_mut_ptr(), actions.len(), &mut step_info), FrtStatus::Ok);

        let (failure, counted) = counting_alloc::count(|| {
            for i in 0..STEPS {
                let n = state.len();
                state[i % n] += 0.01;
                obs.state = state.as_ptr();
                // Alternate drawn and caller noise: both paths are hot.
                (obs.noise, obs.noise_len) = if i % 2 == 0 { (std::ptr::null(), 0) } else { (noise.as_ptr(), noise.len()) };
                let status = frt_policy_step(policy, &obs, actions.as_mut_ptr(), actions.len(), &mut step_info);
                if status != FrtStatus::Ok {
                    return Some((i, status));
                }
            }
            None
        });
        if let Some((i, status)) = failure {
            panic!("step {i} failed: {status:?}");
        }

        assert!(actions.iter().all(|a| a.is_finite()), "every action written");
        assert!(step_info.deadline_missed, "a 1 us deadline is missed");
        let mut stats: FrtLatencyStats = std::mem::zeroed();
        stats.struct_size = size_of::<FrtLatencyStats>();
        assert_eq!(frt_policy_stats(policy, &stats as *const _ as *mut _), FrtStatus::Ok);
        assert_eq!(stats.count, STEPS as u64 + 1);
        assert_eq!(counted, 0, "frt_policy_step allocated {counted} times in {STEPS} steps after warm-up");

        // Recording on: the library's writer thread allocates, the stepping thread does not (the
        // first recorded step sizes the buffers).
        let log = dir.path().join("obs.frtobs");
        let log_path = log.to_str().unwrap();
        assert_eq!(frt_policy_record_start(policy, log_path.as_ptr().cast(), log_path.len()), FrtStatus::Ok);
        assert_eq!(frt_policy_step(policy, &obs, actions.as_mut_ptr(), actions.len(), &mut step_info), FrtStatus::Ok);
        let mut recorded_counted = 0;
        for i in 0..STEPS {
            (obs.noise, obs.noise_len) = if i % 2 == 0 { (std::ptr::null(), 0) } else { (noise.as_ptr(), noise.len()) };
            let (status, n) =
                counting_alloc::count_this_thread(|| frt_policy_step(policy, &obs, actions.as_mut_ptr(), actions.len(), &mut step_info));
            assert_eq!(status, FrtStatus::Ok, "recorded step {i}");
            recorded_counted += n;
        }
        assert_eq!(frt_policy_record_stop(policy), FrtStatus::Ok);
        frt_policy_free(policy);
        assert_eq!(recorded_counted, 0, "recorded steps allocated {recorded_counted} times on the stepping thread");
        // Whatever the writer kept up with (a drop is counted, not blocked on): a readable log.
        let records = flashrt::observation_log::ObservationLogReader::open(&log).unwrap().map(Result::unwrap).count();
        assert!((1..=STEPS + 1).contains(&records), "{records} records");
        println!(
            "no_alloc: {STEPS} steps through frt_policy_step, 0 allocations (p50 {:.2} ms); {STEPS} recorded steps, 0 allocations on the stepping thread ({records} records written)",
            stats.p50_ms
        );
        println!("1 passed, 0 failed");
    }
}

//! What `frt_policy_step` hands a C caller, against lerobot 0.6.1: the committed tiny fixture
//! (tests/data/pi05_tiny) with lerobot's inputs, through the C ABI, must return lerobot's
//! post-processed action chunk (`golden_postprocessed.safetensors`: x₀ cut to the robot's columns
//! and un-normalized by lerobot's own postprocessor) to the CPU tier's max-abs 1e-4.

use std::ffi::CString;
use std::path::Path;

use flashrt_ffi::*;
use safetensors::SafeTensors;

#[path = "../../tests/support/tolerance.rs"]
mod tolerance;

use tolerance::{CPU_MAX_ABS, max_abs};

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

#[test]
fn step_returns_lerobots_postprocessed_actions() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pi05_tiny");
    let golden_bytes = std::fs::read(data.join("golden.safetensors")).unwrap();
    let golden = SafeTensors::deserialize(&golden_bytes).unwrap();
    let post_bytes = std::fs::read(data.join("golden_postprocessed.safetensors")).unwrap();
    let post = SafeTensors::deserialize(&post_bytes).unwrap();
    let image = |name: &str| golden.tensor(&format!("input.image.{name}")).unwrap();
    let (base, wrist) = (image("base_0_rgb"), image("left_wrist_0_rgb"));
    let noise = f32s(golden.tensor("input.noise").unwrap().data());
    let ids = golden.tensor("input.a.tokens").unwrap();
    let mask = golden.tensor("input.a.token_mask").unwrap();
    let tokens: Vec<i32> = ids
        .data()
        .chunks_exact(8)
        .zip(mask.data())
        .filter(|(_, m)| **m != 0)
        .map(|(b, _)| i64::from_le_bytes(b.try_into().unwrap()) as i32)
        .collect();
    let want = f32s(post.tensor("output.a.actions.quantiles").unwrap().data());

    let checkpoint = CString::new(data.to_str().unwrap()).unwrap();
    // SAFETY: every pointer passed below outlives the call it is passed to; sizes are exact.
    unsafe {
        let mut config: FrtPolicyConfig = std::mem::zeroed();
        config.struct_size = size_of::<FrtPolicyConfig>();
        assert_eq!(frt_policy_config_default(&mut config), FrtStatus::Ok);
        config.checkpoint = checkpoint.as_ptr();
        config.backend = FrtBackend::Cpu as u32;
        config.max_frame_width = 320;
        config.max_frame_height = 240;
        let mut policy = std::ptr::null_mut();
        assert_eq!(frt_policy_open(&config, &mut policy), FrtStatus::Ok);
        let mut info: FrtPolicyInfo = std::mem::zeroed();
        info.struct_size = size_of::<FrtPolicyInfo>();
        assert_eq!(frt_policy_info(policy, &mut info), FrtStatus::Ok);
        assert_eq!(frt_policy_set_prompt_tokens(policy, tokens.as_ptr(), tokens.len()), FrtStatus::Ok);

        let frame = |t: &safetensors::tensor::TensorView, present: bool| FrtFrame {
            data: t.data().as_ptr(),
            data_len: t.data().len(),
            width: t.shape()[1],
            height: t.shape()[0],
            stride: 0,
            format: FrtPixelFormat::Rgb8 as u32,
            present,
        };
        // lerobot's run: base and left wrist present, right wrist missing.
        let cameras = [frame(&base, true), frame(&wrist, true), frame(&base, false)];
        assert_eq!(info.cameras, cameras.len());
        let state = vec![0.5f32; info.state_dim];
        let obs = FrtObservation {
            struct_size: size_of::<FrtObservation>(),
            cameras: cameras.as_ptr(),
            cameras_len: cameras.len(),
            state: state.as_ptr(),
            state_len: state.len(),
            noise: noise.as_ptr(),
            noise_len: noise.len(),
        };
        let mut actions = vec![f32::NAN; info.actions_len];
        let mut step: FrtStepInfo = std::mem::zeroed();
        step.struct_size = size_of::<FrtStepInfo>();
        assert_eq!(frt_policy_step(policy, &obs, actions.as_mut_ptr(), actions.len(), &mut step), FrtStatus::Ok);
        // Opened without real-time chunking: a continuation is refused and changes nothing.
        let mut untouched = vec![f32::NAN; info.actions_len];
        let status = frt_policy_step_continuing(policy, &obs, 5, 2, untouched.as_mut_ptr(), untouched.len(), std::ptr::null_mut());
        assert_eq!(status, FrtStatus::InvalidArgument);
        assert!(untouched.iter().all(|v| v.is_nan()));
        frt_policy_free(policy);

        assert_eq!(actions.len(), want.len(), "horizon x robot action columns");
        let err = max_abs(&actions, &want);
        eprintln!("frt_policy_step vs lerobot's post-processed actions: max abs error {err:e}");
        assert!(err <= CPU_MAX_ABS, "max abs error {err:e} > {CPU_MAX_ABS:e}");

        // Real-time chunking through the C ABI: a continuing step returns exactly what the Rust
        // API's does (tests/golden_pi05.rs holds that one to lerobot's RTCProcessor).
        config.rtc_schedule = FrtRtcSchedule::Exp as u32;
        config.rtc_execution_horizon = 30;
        config.rtc_max_guidance_weight = 5.0;
        assert_eq!(frt_policy_open(&config, &mut policy), FrtStatus::Ok);
        assert_eq!(frt_policy_set_prompt_tokens(policy, tokens.as_ptr(), tokens.len()), FrtStatus::Ok);
        let mut c_actions = vec![f32::NAN; info.actions_len];
        for _ in 0..2 {
            let status = frt_policy_step_continuing(policy, &obs, 12, 4, c_actions.as_mut_ptr(), c_actions.len(), std::ptr::null_mut());
            assert_eq!(status, FrtStatus::Ok);
        }
        frt_policy_free(policy);
        let mut rust = flashrt::PolicyConfig::new(&data);
        rust.backend = flashrt::BackendKind::Cpu;
        (rust.max_frame_width, rust.max_frame_height) = (320, 240);
        rust.rtc = Some(flashrt::RtcConfig { schedule: flashrt::RtcSchedule::Exp, max_guidance_weight: 5.0, execution_horizon: 30 });
        let mut policy = flashrt::Policy::open(&rust).unwrap();
        policy.set_prompt_tokens(&tokens).unwrap();
        let shape = |t: &safetensors::tensor::TensorView| (t.shape()[1], t.shape()[0]);
        let frames = [
            Some(flashrt::Frame::packed(base.data(), shape(&base).0, shape(&base).1, flashrt::PixelFormat::Rgb8)),
            Some(flashrt::Frame::packed(wrist.data(), shape(&wrist).0, shape(&wrist).1, flashrt::PixelFormat::Rgb8)),
            None,
        ];
        let rust_obs = flashrt::Observation { cameras: &frames, state: &state, noise: Some(&noise) };
        let continuation = flashrt::Continuation { executed: 12, inference_delay: 4 };
        let mut first = vec![0.0; info.actions_len];
        policy.step_continuing(&rust_obs, Some(continuation), &mut first).unwrap();
        let mut rust_actions = vec![0.0; info.actions_len];
        policy.step_continuing(&rust_obs, Some(continuation), &mut rust_actions).unwrap();
        assert_ne!(first, rust_actions, "the second chunk continues the first: guidance changes it");
        assert_eq!(c_actions, rust_actions, "frt_policy_step_continuing and Policy::step_continuing differ");
    }
}

/// GR00T through the C ABI: a policy switched with `frt_policy_set_embodiment` returns what one
/// opened with that embodiment does (bit for bit on the CPU), `frt_policy_info` follows it, and
/// the camera-name array returned before the switch stays valid.
#[test]
fn set_embodiment_switches_like_opening_with_the_tag() {
    use flashrt::models::groot_n17::synth::{Options, Size, synthesize_with};
    let dir = tempfile::tempdir().unwrap();
    synthesize_with(dir.path(), Size::Tiny, &Options { cameras: 2, embodiments: 2 }, 9, &|_| {}).unwrap();
    let checkpoint = CString::new(dir.path().to_str().unwrap()).unwrap();
    let pixels: Vec<u8> = (0..64 * 48 * 3).map(|i| (i * 11 % 253) as u8).collect();
    let cameras = [true, true].map(|present| FrtFrame {
        data: pixels.as_ptr(),
        data_len: pixels.len(),
        width: 64,
        height: 48,
        stride: 0,
        format: FrtPixelFormat::Rgb8 as u32,
        present,
    });
    let text = "stack the blocks";
    // SAFETY: every pointer passed below outlives the call it is passed to; sizes are exact.
    unsafe {
        let info_of = |policy: *const FrtPolicy| {
            let mut info: FrtPolicyInfo = std::mem::zeroed();
            info.struct_size = size_of::<FrtPolicyInfo>();
            assert_eq!(frt_policy_info(policy, &mut info), FrtStatus::Ok);
            info
        };
        let open = |tag: &str| {
            let tag = CString::new(tag).unwrap();
            let mut config: FrtPolicyConfig = std::mem::zeroed();
            config.struct_size = size_of::<FrtPolicyConfig>();
            assert_eq!(frt_policy_config_default(&mut config), FrtStatus::Ok);
            (config.checkpoint, config.embodiment, config.backend) = (checkpoint.as_ptr(), tag.as_ptr(), FrtBackend::Cpu as u32);
            (config.max_frame_width, config.max_frame_height, config.threads) = (64, 48, 1);
            let mut policy = std::ptr::null_mut();
            assert_eq!(frt_policy_open(&config, &mut policy), FrtStatus::Ok);
            assert_eq!(frt_policy_set_prompt(policy, text.as_ptr().cast(), text.len()), FrtStatus::Ok);
            policy
        };
        let step = |policy: *mut FrtPolicy| {
            let info = info_of(policy);
            let state: Vec<f32> = (0..info.state_dim).map(|i| 0.1 * i as f32 - 0.4).collect();
            let noise: Vec<f32> = (0..info.noise_len).map(|i| (i as f32 * 0.7).sin()).collect();
            let obs = FrtObservation {
                struct_size: size_of::<FrtObservation>(),
                cameras: cameras.as_ptr(),
                cameras_len: cameras.len(),
                state: state.as_ptr(),
                state_len: state.len(),
                noise: noise.as_ptr(),
                noise_len: noise.len(),
            };
            let mut actions = vec![f32::NAN; info.actions_len];
            assert_eq!(frt_policy_step(policy, &obs, actions.as_mut_ptr(), actions.len(), std::ptr::null_mut()), FrtStatus::Ok);
            actions
        };
        let tag_of = |info: &FrtPolicyInfo| std::ffi::CStr::from_ptr(info.embodiment).to_str().unwrap().to_string();
        let (robot, robot_2) = (open("robot"), open("robot_2"));
        let (from_robot, from_robot_2) = (step(robot), step(robot_2));
        let before = info_of(robot);
        assert_eq!((before.state_dim, before.action_dim, tag_of(&before).as_str()), (15, 16, "robot"));

        assert_eq!(frt_policy_set_embodiment(robot, "robot_2".as_ptr().cast(), 7), FrtStatus::Ok);
        let after = info_of(robot);
        assert_eq!((after.state_dim, after.action_dim, after.actions_len, tag_of(&after).as_str()), (7, 8, 48, "robot_2"));
        assert_eq!(step(robot), from_robot_2, "switched to robot_2 vs opened with it");
        assert_eq!(std::ffi::CStr::from_ptr(*before.camera_names).to_str().unwrap(), "front");
        assert_eq!(frt_policy_set_embodiment(robot, "robot".as_ptr().cast(), 5), FrtStatus::Ok);
        assert_eq!(info_of(robot).camera_names, before.camera_names, "the first embodiment's names are kept");
        assert_eq!(step(robot), from_robot, "switched back");
        frt_policy_free(robot);
        frt_policy_free(robot_2);
    }
}

//! A node's inference core without DDS: the tiny test checkpoint, the shared slots, and inputs
//! fed the way the receive thread feeds them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use flashrt_ros2::config::{CameraConfig, Config, MissingCamera};
use flashrt_ros2::infer::Inference;
use flashrt_ros2::msg::{Image, JointState};
use flashrt_ros2::shared::{Shared, lock};

pub const WIDTH: u32 = 32;
pub const HEIGHT: u32 = 24;
pub const STATE_DIM: usize = 8;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

/// Three cameras, 64x64 frame buffers, 0.5 s age limits, the given missing-camera behaviour.
pub fn config(missing_camera: MissingCamera, prompt: Option<&str>) -> Config {
    let mut c = Config::default();
    c.policy.checkpoint = data_dir().join("pi05_tiny");
    c.policy.tokenizer = Some(data_dir().join("tokenizer/tokenizer.json"));
    c.policy.backend = "cpu".into();
    c.policy.max_frame_width = 64;
    c.policy.max_frame_height = 64;
    c.policy.prompt = prompt.map(String::from);
    c.cameras = (0..3).map(|i| CameraConfig { topic: format!("/cam{i}"), ..CameraConfig::default() }).collect();
    c.inputs.missing_camera = missing_camera;
    c
}

pub fn open(config: &Config) -> (Inference, Shared) {
    config.check().unwrap();
    let policy = flashrt::Policy::open(&config.policy_config().unwrap()).unwrap();
    config.check_policy(&policy.info()).unwrap();
    let shared = Shared::new(3, (64, 64), STATE_DIM, policy.actions_len(), config.output.mode);
    (Inference::new(policy, config).unwrap(), shared)
}

pub fn image(encoding: &str, width: u32, height: u32, seed: u32) -> Image {
    let bpp = if encoding == "rgba8" { 4 } else { 3 };
    let step = width * bpp;
    let data = (0..step * height).map(|i| ((i * 7 + seed * 13) % 251) as u8).collect();
    Image { width, height, encoding: encoding.into(), step, data, ..Image::default() }
}

pub fn joints(position: &[f64]) -> JointState {
    JointState { name: (0..position.len()).map(|i| format!("j{i}")).collect(), position: position.to_vec(), ..JointState::default() }
}

pub fn good_state(seed: u32) -> JointState {
    joints(&(0..STATE_DIM).map(|i| 0.1 * i as f64 + 0.01 * seed as f64).collect::<Vec<_>>())
}

/// Stores one frame per listed camera and a joint state, as received at `now`; returns whether
/// each was accepted.
pub fn feed(shared: &Shared, config: &Config, cameras: &[(usize, &Image)], state: &JointState, now: Instant) -> (Vec<bool>, bool) {
    let frames = cameras.iter().map(|(i, img)| lock(&shared.frames[*i]).store(img, None, now).is_ok()).collect();
    let state_ok = lock(&shared.state).store(state, &config.joint_states.names, now).is_ok();
    (frames, state_ok)
}

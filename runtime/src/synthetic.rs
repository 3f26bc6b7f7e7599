//! Observations for when the robot's own are not at hand: FP8 calibration without a recorded
//! log, and `flashrt compare` without one. Random 224×224 RGB frames, random states in [-1, 1]
//! and three task prompts in turn. The cameras present go from all of them down to one and
//! around again, so the inputs a missing camera gives (for GR00T a black image in its slot) are
//! among them: a calibration that saw only full camera sets clips them (measured on GR00T N1.7,
//! bench/NOTES.md).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::image::PixelFormat;
use crate::observation_log::{RecordedFrame, RecordedObservation};
use crate::policy::Policy;

/// Tasks the synthetic observations cycle through.
pub const PROMPTS: [&str; 3] =
    ["pick up the red block and put it in the bowl", "open the top drawer", "fold the towel in half and place it on the left"];

/// What synthetic observation `i` of a policy with `cameras` slots shows: all of them first, then
/// one fewer each time down to one, and around again.
fn cameras_present(i: usize, cameras: usize) -> usize {
    cameras.max(1) - i % cameras.max(1)
}

/// The fewest cameras among the first `count` synthetic observations of a policy with `cameras`
/// slots: below `cameras` steps a calibration never sees the inputs of the missing cameras
/// past that.
pub fn fewest_cameras(count: usize, cameras: usize) -> usize {
    (0..count.min(cameras.max(1))).map(|i| cameras_present(i, cameras)).min().unwrap_or(cameras)
}

/// Where [`observations`] for `policy` with `seed` came from, for the records that use them
/// (a calibration's settings, `flashrt compare`'s JSON).
pub fn describe(policy: &Policy, seed: u64) -> String {
    format!(
        "synthetic (seed {seed}): random 224x224 frames on {} down to 1 cameras in turn, random states, {} prompts",
        policy.info().cameras.len(),
        PROMPTS.len()
    )
}

/// `count` synthetic observations for `policy` (the module's description), with no noise of
/// their own.
pub fn observations(policy: &Policy, count: usize, seed: u64) -> Vec<RecordedObservation> {
    let (cameras, state_dim) = (policy.info().cameras.len(), policy.info().state_dim);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (width, height) = (224, 224);
    (0..count)
        .map(|i| {
            let present = cameras_present(i, cameras);
            RecordedObservation {
                time_ns: 0,
                prompt: PROMPTS[i % PROMPTS.len()].into(),
                cameras: (0..cameras)
                    .map(|c| {
                        (c < present).then(|| RecordedFrame {
                            width,
                            height,
                            format: PixelFormat::Rgb8 as u8,
                            data: (0..width * height * 3).map(|_| rng.random()).collect(),
                        })
                    })
                    .collect(),
                state: (0..state_dim).map(|_| rng.random_range(-1.0..1.0)).collect(),
                noise: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camera_sets_go_from_all_down_to_one_and_around() {
        assert_eq!((0..7).map(|i| cameras_present(i, 3)).collect::<Vec<_>>(), [3, 2, 1, 3, 2, 1, 3]);
        // Two steps of a three-camera policy never show one camera; three do.
        assert_eq!((fewest_cameras(2, 3), fewest_cameras(3, 3), fewest_cameras(8, 3)), (2, 1, 1));
        assert_eq!((fewest_cameras(1, 1), fewest_cameras(0, 2)), (1, 2));
    }
}

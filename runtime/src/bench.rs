//! `flashrt bench`: latency of the whole step (host frames in → host actions out) over many
//! iterations after warm-up, cold start, memory, and the FLOP count of the plan; written as JSON
//! with the field names of DESIGN.md §8 so tools can read every result file the same way.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::Result;
use crate::image::{Frame, PixelFormat};
use crate::policy::{Observation, Policy};
use crate::rtc::Continuation;
use crate::stats::{Summary, summarize};

/// Synthetic observations: random frames and states that change every step (so no cache can
/// flatter the numbers), generated up front so the timed loop does nothing but `step`.
pub struct SyntheticInputs {
    frames: Vec<Vec<u8>>,
    states: Vec<Vec<f32>>,
    width: usize,
    height: usize,
    present: Vec<bool>,
    /// Under real-time chunking: what each step continues.
    continuation: Option<Continuation>,
}

impl SyntheticInputs {
    /// `variants` frame sets and states, `views` of the policy's camera slots present.
    pub fn new(policy: &Policy, views: usize, width: usize, height: usize, variants: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let info = policy.info();
        let cameras = info.cameras.len();
        let frames = (0..variants * cameras).map(|_| (0..width * height * 3).map(|_| rng.random()).collect()).collect();
        let states = (0..variants).map(|_| (0..info.state_dim).map(|_| rng.random_range(-1.0..1.0)).collect()).collect();
        SyntheticInputs { frames, states, width, height, present: (0..cameras).map(|c| c < views.max(1)).collect(), continuation: None }
    }

    /// Runs step `i` (cycling through the variants) into `actions`.
    pub fn step(&self, policy: &mut Policy, i: usize, actions: &mut [f32]) -> Result<crate::policy::StepInfo> {
        let cams = self.present.len();
        let v = i % self.states.len();
        let frame =
            |c: usize| self.present[c].then(|| Frame::packed(&self.frames[v * cams + c], self.width, self.height, PixelFormat::Rgb8));
        // At most 8 camera slots on the stack: no allocation in the timed loop.
        let slots: [Option<Frame>; 8] = std::array::from_fn(|c| if c < cams { frame(c) } else { None });
        policy.step_continuing(&Observation { cameras: &slots[..cams], state: &self.states[v], noise: None }, self.continuation, actions)
    }

    /// Each step continues the previous chunk at `continuation` (a policy opened with RTC).
    pub fn continuing(self, continuation: Option<Continuation>) -> Self {
        SyntheticInputs { continuation, ..self }
    }
}

/// Warm-up, then `iterations` timed steps: the whole step, and the backend's run inside it.
pub fn run(policy: &mut Policy, inputs: &SyntheticInputs, warmup: usize, iterations: usize) -> Result<(Summary, Summary)> {
    let mut actions = vec![0.0; policy.actions_len()];
    for i in 0..warmup {
        inputs.step(policy, i, &mut actions)?;
    }
    let (mut steps, mut runs) = (Vec::with_capacity(iterations), Vec::with_capacity(iterations));
    for i in 0..iterations {
        let t = Instant::now();
        let info = inputs.step(policy, i, &mut actions)?;
        steps.push(t.elapsed().as_secs_f64());
        runs.push(info.backend_time.as_secs_f64());
    }
    Ok((summarize(&steps), summarize(&runs)))
}

/// Seconds since the epoch as an ISO-8601 UTC timestamp (civil-from-days, H. Hinnant).
pub fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_timestamp_has_iso_shape() {
        let t = super::utc_now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'));
    }
}

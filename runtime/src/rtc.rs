//! Real-time chunking (RTC): the next action chunk is sampled so that it continues the one the
//! robot is still executing, instead of jumping to an unrelated plan at the boundary.
//!
//! As lerobot 0.6.1 implements it (`lerobot/policies/rtc/modeling_rtc.py`,
//! `RTCProcessor.denoise_step`, after Black et al., "Real-Time Execution of Action Chunking Flow
//! Policies"), every Euler step of the sampler guides its velocity towards what is left of the
//! previous chunk:
//!
//! ```text
//! v' = v − g(t) · W[r] · (prev[r] − (x − t·v))        x ← x + dt · v'
//! ```
//!
//! with `t` the flow time of the step, `W` the prefix weight of row `r` ([`prefix_weights`]) and
//! `g` the guidance weight ([`guidance_weight`]).
//!
//! lerobot computes the correction with autograd, but `v` is evaluated before `x` requires
//! gradients, so the vector-Jacobian product is the identity and the guidance is elementwise: the
//! plan computes it in one op per denoise step ([`crate::plan::Op::RtcGuide`]), inside the CUDA
//! graph, with the row weights `W` and the shift into the previous chunk as host inputs.
//!
//! The previous chunk is the policy's own: the plan keeps each step's normalized chunk on the
//! device, so the caller only says where the robot is in it ([`Continuation`]); nothing is
//! re-normalized or copied back in. As in lerobot, guidance covers the robot's action columns
//! (`prev` is what `predict_action_chunk` returned, padded with zeros to the model's width).

/// How the prefix weights fall from the frozen rows to the execution horizon
/// (lerobot's `RTCAttentionSchedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RtcSchedule {
    /// 1 for the frozen rows (the inference delay), 0 after.
    Zeros,
    /// 1 up to the execution horizon, 0 after.
    Ones,
    /// 1 for the frozen rows, then falling linearly to 0 at the execution horizon.
    Linear,
    /// As `Linear`, each weight `w` shaped to `w · (eʷ − 1) / (e − 1)`.
    Exp,
}

impl RtcSchedule {
    pub fn name(self) -> &'static str {
        match self {
            RtcSchedule::Zeros => "zeros",
            RtcSchedule::Ones => "ones",
            RtcSchedule::Linear => "linear",
            RtcSchedule::Exp => "exp",
        }
    }

    pub fn parse(s: &str) -> Option<RtcSchedule> {
        [RtcSchedule::Zeros, RtcSchedule::Ones, RtcSchedule::Linear, RtcSchedule::Exp]
            .into_iter()
            .find(|v| v.name().eq_ignore_ascii_case(s))
    }
}

/// RTC settings, fixed at open (lerobot's `RTCConfig`; its defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RtcConfig {
    pub schedule: RtcSchedule,
    /// Upper bound of the guidance weight `g(t)` (it is infinite at the first denoise step).
    pub max_guidance_weight: f32,
    /// Rows of the new chunk that are guided at all (clamped to what is left of the previous one).
    pub execution_horizon: usize,
}

impl Default for RtcConfig {
    fn default() -> Self {
        RtcConfig { schedule: RtcSchedule::Linear, max_guidance_weight: 10.0, execution_horizon: 10 }
    }
}

/// Where the robot is in the chunk the policy's previous step returned, for a step that should
/// continue it ([`crate::Policy::step_continuing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Continuation {
    /// Actions of the previous chunk executed when this observation was taken: the previous
    /// chunk from this row on is what is left of it. At or past its horizon nothing is.
    pub executed: usize,
    /// Actions of what is left that will still be executed while this step runs: the new chunk's
    /// first `inference_delay` rows are pinned to them (weight 1).
    pub inference_delay: usize,
}

/// The guidance weight of the denoise step at flow time `t` (1 = noise, 0 = data):
/// with `τ = 1 − t`, `c = t / τ`, `1/r² = (t² + τ²) / t²`, `g = min(c / r², max)`, computed in
/// f32 as lerobot does, an infinite `c` (τ = 0, the first step) becoming `max`.
pub fn guidance_weight(t: f32, max: f32) -> f32 {
    // torch's nan_to_num: NaN → 0, +∞ → max.
    let clean = |v: f32| {
        if v.is_nan() {
            0.0
        } else if v == f32::INFINITY {
            max
        } else {
            v
        }
    };
    let tau = 1.0 - t;
    let c = clean((1.0 - tau) / tau);
    let inv_r2 = ((1.0 - tau) * (1.0 - tau) + tau * tau) / ((1.0 - tau) * (1.0 - tau));
    clean(c * inv_r2).min(max)
}

/// The prefix weight of every row of the new chunk (`out.len()` rows), for `config` and a
/// previous chunk of `horizon` rows continued at `continuation` (lerobot's `get_prefix_weights`
/// with the execution horizon clamped to the rows left). Writes in place; no allocation.
pub fn prefix_weights(config: &RtcConfig, horizon: usize, continuation: Continuation, out: &mut [f32]) {
    out.fill(0.0);
    let left = horizon.saturating_sub(continuation.executed);
    if left == 0 {
        return;
    }
    let total = out.len();
    let end = config.execution_horizon.min(left);
    let start = continuation.inference_delay.min(end);
    match config.schedule {
        RtcSchedule::Zeros => out[..start.min(total)].fill(1.0),
        RtcSchedule::Ones => out[..end.min(total)].fill(1.0),
        RtcSchedule::Linear | RtcSchedule::Exp => {
            out[..start.min(total)].fill(1.0);
            // torch.linspace(1, 0, n + 2)[1:-1] over rows start..end, in f32.
            let n = end.min(total).saturating_sub(start);
            let step = -1.0 / (n + 1) as f32;
            for (i, w) in out[start..start + n].iter_mut().enumerate() {
                let k = i + 1;
                // torch fills the first half from the start and the second from the end.
                let lin = if k < (n + 2) / 2 { 1.0 + k as f32 * step } else { ((n + 1 - k) as f32) * -step };
                *w = match config.schedule {
                    RtcSchedule::Exp => lin * lin.exp_m1() / (std::f32::consts::E - 1.0),
                    _ => lin,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(schedule: RtcSchedule, horizon_cfg: usize, executed: usize, delay: usize) -> Vec<f32> {
        let config = RtcConfig { schedule, max_guidance_weight: 10.0, execution_horizon: horizon_cfg };
        let mut w = vec![f32::NAN; 10];
        prefix_weights(&config, 10, Continuation { executed, inference_delay: delay }, &mut w);
        w
    }

    #[test]
    fn schedules_match_lerobot() {
        // lerobot: get_prefix_weights(2, 6, 10) per schedule.
        assert_eq!(weights(RtcSchedule::Zeros, 6, 0, 2), [1., 1., 0., 0., 0., 0., 0., 0., 0., 0.]);
        assert_eq!(weights(RtcSchedule::Ones, 6, 0, 2), [1., 1., 1., 1., 1., 1., 0., 0., 0., 0.]);
        let lin = weights(RtcSchedule::Linear, 6, 0, 2);
        let want = [1., 1., 0.8, 0.6, 0.4, 0.2, 0., 0., 0., 0.];
        assert!(lin.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{lin:?}");
        let exp = weights(RtcSchedule::Exp, 6, 0, 2);
        for (e, l) in exp.iter().zip(&lin) {
            assert!((e - l * l.exp_m1() / (std::f32::consts::E - 1.0)).abs() < 1e-7);
        }
        assert!(exp[2] < lin[2] && exp[0] == 1.0);
    }

    #[test]
    fn horizon_is_clamped_to_what_is_left() {
        // 7 of 10 executed: 3 rows left, so the horizon of 6 becomes 3 and the delay of 5 too.
        assert_eq!(weights(RtcSchedule::Ones, 6, 7, 1), [1., 1., 1., 0., 0., 0., 0., 0., 0., 0.]);
        assert_eq!(weights(RtcSchedule::Linear, 6, 7, 5), [1., 1., 1., 0., 0., 0., 0., 0., 0., 0.]);
        assert!(weights(RtcSchedule::Ones, 6, 10, 1).iter().all(|&w| w == 0.0));
        assert!(weights(RtcSchedule::Ones, 6, 12, 1).iter().all(|&w| w == 0.0));
    }

    #[test]
    fn guidance_weight_is_clamped() {
        assert_eq!(guidance_weight(1.0, 10.0), 10.0);
        assert_eq!(guidance_weight(0.0, 10.0), 0.0);
        // t = 0.5: c = 1, 1/r² = 2.
        assert!((guidance_weight(0.5, 10.0) - 2.0).abs() < 1e-6);
        assert_eq!(guidance_weight(0.9, 5.0), 5.0);
    }
}

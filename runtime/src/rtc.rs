//! Real-time chunking (RTC): the next action chunk is sampled so that it continues the one the
//! robot is still executing, instead of jumping to an unrelated plan at the boundary. Two schemes,
//! each as lerobot 0.6.1 implements it for its model:
//!
//! **Guidance (Pi0.5; the `zeros`, `ones`, `linear` and `exp` schedules).** As
//! `lerobot/policies/rtc/modeling_rtc.py` (`RTCProcessor.denoise_step`, after Black et al.,
//! "Real-Time Execution of Action Chunking Flow Policies"), every Euler step of the sampler guides
//! its velocity towards what is left of the previous chunk:
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
//! **A frozen prefix with a velocity ramp (GR00T N1.7; the `ramp` schedule).** As lerobot's GR00T
//! path (`GrootPolicy._prepare_n1_7_rtc_inputs`, `GR00TN17ActionHead.get_action_with_features`),
//! there is no guidance: the sampler *starts* from the previous chunk. With `left` the rows of it
//! not yet executed, `overlap = min(left, execution horizon)` and
//! `frozen = min(inference delay, overlap)`:
//!
//! ```text
//! x₀[r] = prev[end − overlap + r]  for r < overlap (noise after)      x ← x + dt · s[r] · v
//! ```
//!
//! where `end` is the previous chunk's last row + 1 — lerobot takes the *last* `overlap` rows of
//! what is left, which are the next ones to execute only when no more than the horizon is left —
//! and the velocity strength `s` ([`ramp_strength`]) is 0 on the frozen rows (they stay as they
//! start), ramps up on the rest of the overlap and is 1 after. The plan
//! writes the prefix once ([`crate::plan::Op::RtcPrefix`]) and makes each Euler step with the row
//! strengths ([`crate::plan::Op::RtcEuler`]); the ramp's rate is the checkpoint's
//! `rtc_ramp_rate` (lerobot's default 6). lerobot switches this off for `use_relative_actions`
//! fine-tunes (its generic relative-action fallback), which FlashRT does not open; for the
//! checkpoints' own relative action groups it applies it, and so does FlashRT.
//!
//! The previous chunk is the policy's own: the plan keeps each step's normalized chunk on the
//! device, so the caller only says where the robot is in it ([`Continuation`]); nothing is
//! re-normalized or copied back in. As in lerobot, the previous chunk is what the policy returned:
//! its robot action columns, padded with zeros to the model's width.

/// How a chunk continues the previous one: a guidance schedule — how the prefix weights fall from
/// the frozen rows to the execution horizon (lerobot's `RTCAttentionSchedule`; Pi0.5) — or
/// GR00T N1.7's own scheme, `Ramp`. Each model takes only its own: a policy refuses the others.
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
    /// GR00T N1.7's scheme, not guidance: the chunk starts from the rest of the previous one up to
    /// the execution horizon, the first `inference_delay` rows frozen, the velocity of the others
    /// ramped up to 1 at the horizon ([`ramp_strength`]).
    Ramp,
}

impl RtcSchedule {
    pub fn name(self) -> &'static str {
        match self {
            RtcSchedule::Zeros => "zeros",
            RtcSchedule::Ones => "ones",
            RtcSchedule::Linear => "linear",
            RtcSchedule::Exp => "exp",
            RtcSchedule::Ramp => "ramp",
        }
    }

    pub fn parse(s: &str) -> Option<RtcSchedule> {
        [RtcSchedule::Zeros, RtcSchedule::Ones, RtcSchedule::Linear, RtcSchedule::Exp, RtcSchedule::Ramp]
            .into_iter()
            .find(|v| v.name().eq_ignore_ascii_case(s))
    }

    /// A guidance schedule (Pi0.5's), as opposed to GR00T's `Ramp`.
    pub fn guided(self) -> bool {
        self != RtcSchedule::Ramp
    }
}

/// RTC settings, fixed at open (lerobot's `RTCConfig`; its defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RtcConfig {
    /// Pi0.5 takes a guidance schedule, GR00T N1.7 `Ramp`.
    pub schedule: RtcSchedule,
    /// Upper bound of the guidance weight `g(t)` (it is infinite at the first denoise step).
    /// Guidance schedules only: `Ramp` has no guidance and does not read it.
    pub max_guidance_weight: f32,
    /// Rows of the new chunk that continue the previous one at all (clamped to what is left of
    /// it): guided rows, or under `Ramp` the rows that start from it.
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
    /// first `inference_delay` rows are pinned to them (weight 1). Under `Ramp` those rows are
    /// frozen at the rows the new chunk starts from: these same ones unless more than the
    /// execution horizon is left (lerobot takes the overlap from the end of what is left).
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
        // Not a guidance schedule: GR00T's rows get strengths instead (`ramp_strength`).
        RtcSchedule::Ramp => {}
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

/// GR00T N1.7's velocity strength of every row of the new chunk (`out.len()` rows) for a previous
/// chunk of `chunk_rows` rows continued at `continuation`, and where the new chunk starts from it:
/// `(first, rows)` — rows `0..rows` start as rows `first..first + rows` of the previous chunk
/// (`rows` 0: plain sampling, every strength 1). As lerobot: `overlap = min(left, execution
/// horizon)` taken from the end of what is left, `frozen = min(inference delay, overlap)`, strength
/// 0 on the frozen rows, then `ramp[1..=n]` on the `n` other overlap rows with
/// `ramp = 1 − exp(−rate · linspace(0, 1, n + 2))` divided by its last value, then 1. In f32 as
/// torch computes it. Writes in place; no allocation.
pub fn ramp_strength(config: &RtcConfig, chunk_rows: usize, continuation: Continuation, rate: f32, out: &mut [f32]) -> (usize, usize) {
    out.fill(1.0);
    let left = chunk_rows.saturating_sub(continuation.executed);
    let overlap = config.execution_horizon.min(left).min(out.len());
    let frozen = continuation.inference_delay.min(overlap);
    out[..frozen].fill(0.0);
    let n = overlap - frozen;
    // torch.linspace(0, 1, n + 2) in f32: the first half from the start, the rest from the end.
    let steps = n + 2;
    let step = 1.0 / (steps - 1) as f32;
    let t = |k: usize| if k < steps / 2 { step * k as f32 } else { 1.0 - step * (steps - 1 - k) as f32 };
    let ramp = |k: usize| 1.0 - (-rate * t(k)).exp();
    let last = ramp(steps - 1).max(1e-8);
    for (i, s) in out[frozen..overlap].iter_mut().enumerate() {
        *s = ramp(i + 1) / last;
    }
    (chunk_rows - overlap, overlap)
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

    fn ramp(horizon_cfg: usize, chunk_rows: usize, executed: usize, delay: usize, rate: f32) -> (Vec<f32>, (usize, usize)) {
        let config = RtcConfig { schedule: RtcSchedule::Ramp, max_guidance_weight: 10.0, execution_horizon: horizon_cfg };
        let mut s = vec![f32::NAN; 8];
        let prefix = ramp_strength(&config, chunk_rows, Continuation { executed, inference_delay: delay }, rate, &mut s);
        (s, prefix)
    }

    #[test]
    fn ramp_matches_lerobot() {
        // torch: r = 1 - exp(-rate * linspace(0, 1, n + 2)); (r / r[-1])[1:-1].
        let close = |got: &[f32], want: &[f32]| got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6);
        // 1 of 7 executed: 6 left, overlap 5 from the end of what is left (rows 2..7), 2 frozen.
        let (s, prefix) = ramp(5, 7, 1, 2, 6.0);
        assert_eq!(prefix, (2, 5));
        assert!(close(&s, &[0., 0., 0.7788003, 0.9525742, 0.9913483, 1., 1., 1.]), "{s:?}");
        let (s, prefix) = ramp(10, 6, 2, 0, 2.5);
        assert_eq!(prefix, (2, 4));
        assert!(close(&s, &[0.428_655_5, 0.688_648_2, 0.846_341_8, 0.941_987_8, 1., 1., 1., 1.]), "{s:?}");
        // A delay past the overlap freezes all of it; nothing left is plain sampling.
        assert_eq!(ramp(2, 6, 3, 5, 6.0), (vec![0., 0., 1., 1., 1., 1., 1., 1.], (4, 2)));
        assert_eq!(ramp(4, 6, 6, 1, 6.0), (vec![1.; 8], (6, 0)));
        assert_eq!(ramp(4, 6, 9, 1, 6.0), (vec![1.; 8], (6, 0)));
    }

    #[test]
    fn schedules_parse_by_name() {
        for s in [RtcSchedule::Zeros, RtcSchedule::Ones, RtcSchedule::Linear, RtcSchedule::Exp, RtcSchedule::Ramp] {
            assert_eq!(RtcSchedule::parse(&s.name().to_uppercase()), Some(s));
            assert_eq!(s.guided(), s != RtcSchedule::Ramp);
        }
        assert_eq!(RtcSchedule::parse("cosine"), None);
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

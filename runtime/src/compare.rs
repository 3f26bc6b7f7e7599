//! Two builds of one checkpoint (another precision, another backend) stepped on the same
//! observations with the same noise: how far apart their actions are. This is how FP8 is
//! checked against bf16 (issue 30), and a regression test on a robot's own recorded observations
//! (`flashrt compare`).

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::Serialize;

use crate::calibration::SYNTHETIC_PROMPTS;
use crate::error::{Error, Result};
use crate::image::PixelFormat;
use crate::observation_log::{ObservationLogReader, RecordedFrame, RecordedObservation};
use crate::policy::Policy;

/// How one observation's action chunks differ (the reference is the second policy).
#[derive(Clone, Debug, Serialize)]
pub struct ActionsDistance {
    /// The observation's index (its record index in a log).
    pub observation: usize,
    pub prompt: String,
    /// Cameras present in the observation.
    pub cameras: usize,
    /// Cosine of the two flattened chunks.
    pub cosine: f64,
    /// `‖a − b‖ / ‖b‖`.
    pub rel_l2: f64,
    pub max_abs: f64,
}

impl ActionsDistance {
    fn of(observation: usize, record: &RecordedObservation, a: &[f32], b: &[f32]) -> ActionsDistance {
        let (mut dot, mut aa, mut bb, mut diff, mut max_abs) = (0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (&x, &y) in a.iter().zip(b) {
            let (x, y) = (x as f64, y as f64);
            (dot, aa, bb) = (dot + x * y, aa + x * x, bb + y * y);
            diff += (x - y) * (x - y);
            max_abs = max_abs.max((x - y).abs());
        }
        // Two zero chunks are the same chunk; a NaN anywhere makes every measure NaN.
        let cosine = if aa == 0.0 && bb == 0.0 { 1.0 } else { dot / (aa.sqrt() * bb.sqrt()) };
        let rel_l2 = if bb == 0.0 { diff.sqrt() } else { (diff / bb).sqrt() };
        ActionsDistance {
            observation,
            prompt: record.prompt.clone(),
            cameras: record.cameras.iter().flatten().count(),
            cosine,
            rel_l2,
            max_abs,
        }
    }
}

/// Every observation's distance and the summary over them.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub observations: Vec<ActionsDistance>,
    pub mean_cosine: f64,
    pub worst_cosine: f64,
    pub mean_rel_l2: f64,
    pub worst_rel_l2: f64,
    pub max_abs: f64,
}

impl Comparison {
    fn of(observations: Vec<ActionsDistance>) -> Comparison {
        let n = observations.len().max(1) as f64;
        let over = |f: fn(&ActionsDistance) -> f64| observations.iter().map(f);
        // NaN-propagating folds: a chunk with a NaN must not hide behind f64::min/max.
        let worst = |values: Vec<f64>, pick: fn(f64, f64) -> bool| {
            values.into_iter().reduce(|w, v| {
                if v.is_nan() || w.is_nan() {
                    f64::NAN
                } else if pick(v, w) {
                    v
                } else {
                    w
                }
            })
        };
        Comparison {
            mean_cosine: over(|d| d.cosine).sum::<f64>() / n,
            worst_cosine: worst(over(|d| d.cosine).collect(), |v, w| v < w).unwrap_or(f64::NAN),
            mean_rel_l2: over(|d| d.rel_l2).sum::<f64>() / n,
            worst_rel_l2: worst(over(|d| d.rel_l2).collect(), |v, w| v > w).unwrap_or(f64::NAN),
            max_abs: worst(over(|d| d.max_abs).collect(), |v, w| v > w).unwrap_or(f64::NAN),
            observations,
        }
    }

    /// A line for the terminal.
    pub fn summary(&self) -> String {
        format!(
            "{} observations: cosine mean {:.6} worst {:.6}; rel-L2 mean {:.3e} worst {:.3e}; max |Δ| {:.3e}",
            self.observations.len(),
            self.mean_cosine,
            self.worst_cosine,
            self.mean_rel_l2,
            self.worst_rel_l2,
            self.max_abs
        )
    }
}

/// Steps `candidate` and `reference` on each record with the same noise (the record's, else
/// drawn from `seed`) and measures how far the candidate's actions are from the reference's.
/// The two policies must take the same observations (model, cameras, state width).
pub fn compare(candidate: &mut Policy, reference: &mut Policy, records: &[RecordedObservation], seed: u64) -> Result<Comparison> {
    let (info_a, info_b) = (candidate.info(), reference.info());
    if (info_a.model, info_a.cameras.len(), info_a.state_dim, candidate.actions_len())
        != (info_b.model, info_b.cameras.len(), info_b.state_dim, reference.actions_len())
    {
        return Err(Error::invalid(
            "compare",
            format!(
                "the policies differ: {} with {} cameras, state {}, {} actions against {} with {} cameras, state {}, {} actions",
                info_a.model,
                info_a.cameras.len(),
                info_a.state_dim,
                candidate.actions_len(),
                info_b.model,
                info_b.cameras.len(),
                info_b.state_dim,
                reference.actions_len()
            ),
        ));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut noise = vec![0.0f32; candidate.noise_len()];
    let (mut actions_a, mut actions_b) = (vec![0.0; candidate.actions_len()], vec![0.0; reference.actions_len()]);
    let mut distances = Vec::with_capacity(records.len());
    for (i, record) in records.iter().enumerate() {
        let at = |e: Error| Error::invalid(format!("observation {i}"), e.to_string());
        noise.iter_mut().for_each(|v| *v = StandardNormal.sample(&mut rng));
        let frames = record.frames();
        let observation =
            crate::policy::Observation { noise: Some(record.noise.as_deref().unwrap_or(&noise)), ..record.observation(&frames) };
        for (policy, actions) in [(&mut *candidate, &mut actions_a), (&mut *reference, &mut actions_b)] {
            policy.set_prompt(&record.prompt).map_err(at)?;
            policy.step(&observation, actions).map_err(at)?;
        }
        distances.push(ActionsDistance::of(i, record, &actions_a, &actions_b));
    }
    Ok(Comparison::of(distances))
}

/// `count` synthetic observations for `policy`: random 224×224 RGB frames on 1, 2, … of its
/// cameras in turn (the others missing), random states in [-1, 1], [`SYNTHETIC_PROMPTS`] in turn.
pub fn synthetic_observations(policy: &Policy, count: usize, seed: u64) -> Vec<RecordedObservation> {
    let (cameras, state_dim) = (policy.info().cameras.len(), policy.info().state_dim);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (width, height) = (224, 224);
    (0..count)
        .map(|i| {
            let present = 1 + i % cameras.max(1);
            RecordedObservation {
                time_ns: 0,
                prompt: SYNTHETIC_PROMPTS[i % SYNTHETIC_PROMPTS.len()].into(),
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

/// The first `count` records of an observation log that `policy` can step (all of them when
/// `count` is `None`).
pub fn log_observations(policy: &Policy, log: &Path, count: Option<usize>) -> Result<Vec<RecordedObservation>> {
    let reader = ObservationLogReader::open(log)?;
    reader.check_policy(&policy.info())?;
    let records: Vec<RecordedObservation> = reader.take(count.unwrap_or(usize::MAX)).collect::<Result<_>>()?;
    if records.is_empty() {
        return Err(Error::invalid(format!("observations {}", log.display()), "the log holds no observations"));
    }
    Ok(records)
}

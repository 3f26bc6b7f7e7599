//! Two builds of one checkpoint (another precision, another backend) stepped on the same
//! observations with the same noise: how far apart their actions are. This is how FP8 is
//! checked against bf16 (issue 30), and a regression test on a robot's own recorded observations
//! (`flashrt compare`).

use std::path::Path;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::observation_log::{ObservationLogReader, RecordedObservation};
use crate::policy::Policy;

/// How one observation's action chunks differ (the reference is the second policy).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
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
            let d = (x - y).abs();
            if d.is_nan() || d > max_abs {
                max_abs = d; // NaN-sticky: f64::max would drop a NaN
            }
        }
        // Two zero chunks are the same chunk; a NaN anywhere makes every measure NaN.
        let cosine = if aa == 0.0 && bb == 0.0 { 1.0 } else { dot / (aa * bb).sqrt() };
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
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
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
        let all = |f: fn(&ActionsDistance) -> f64| observations.iter().map(f);
        Comparison {
            mean_cosine: all(|d| d.cosine).sum::<f64>() / n,
            worst_cosine: worst(all(|d| d.cosine), |v, w| v < w),
            mean_rel_l2: all(|d| d.rel_l2).sum::<f64>() / n,
            worst_rel_l2: worst(all(|d| d.rel_l2), |v, w| v > w),
            max_abs: worst(all(|d| d.max_abs), |v, w| v > w),
            observations,
        }
    }

    /// The observations with each camera count, fewest cameras first: where one count is off and
    /// the others are not, a camera set is outside what the candidate was prepared for (an FP8
    /// calibration that never saw a missing camera, say).
    pub fn by_cameras(&self) -> Vec<(usize, Comparison)> {
        let mut counts: Vec<usize> = self.observations.iter().map(|o| o.cameras).collect();
        counts.sort_unstable();
        counts.dedup();
        let with = |n: usize| self.observations.iter().filter(|o| o.cameras == n).cloned().collect();
        counts.into_iter().map(|n| (n, Comparison::of(with(n)))).collect()
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

/// The worst of `values` by `worse(v, than)`; NaN when any is NaN (f64::min and max would hide
/// a chunk with a NaN) or there are none.
fn worst(values: impl Iterator<Item = f64>, worse: fn(f64, f64) -> bool) -> f64 {
    values
        .reduce(|w, v| {
            if v.is_nan() || w.is_nan() {
                f64::NAN
            } else if worse(v, w) {
                v
            } else {
                w
            }
        })
        .unwrap_or(f64::NAN)
}

/// Steps `candidate` and `reference` on each record with the same noise (the record's, else
/// drawn from `seed`) and measures how far the candidate's actions are from the reference's.
/// The two policies must take the same observations (model, cameras, state width).
pub fn compare(candidate: &mut Policy, reference: &mut Policy, records: &[RecordedObservation], seed: u64) -> Result<Comparison> {
    let takes = |p: &Policy| {
        let info = p.info();
        format!("{} with {} cameras, state {}, {} actions", info.model, info.cameras.len(), info.state_dim, p.actions_len())
    };
    if takes(candidate) != takes(reference) {
        return Err(Error::invalid("compare", format!("the policies differ: {} against {}", takes(candidate), takes(reference))));
    }
    let mut progress = Progress::new(2 * records.len());
    let candidate_actions = actions(candidate, records, seed, &mut progress.pass("compare: this build"))?;
    let reference_actions = actions(reference, records, seed, &mut progress.pass("compare: the reference"))?;
    Ok(distances(records, &candidate_actions, &reference_actions))
}

/// How far a run of [`actions`] passes has got, logged at info level with the time left at the
/// pace so far: calibrating or comparing a full-size model on the CPU takes minutes, and a silent
/// command that long looks hung. At most one line every [`Progress::EVERY`], and the last.
pub struct Progress {
    total: usize,
    done: usize,
    started: Instant,
    logged: Option<Instant>,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(2);

    /// For `total` observation steps over all passes.
    pub fn new(total: usize) -> Progress {
        Progress { total, done: 0, started: Instant::now(), logged: None }
    }

    /// The callback for one pass of [`actions`], named `what` in the log.
    pub fn pass<'a>(&'a mut self, what: &'a str) -> impl FnMut() + 'a {
        move || {
            self.done += 1;
            if self.done >= self.total || self.logged.is_none_or(|t| t.elapsed() >= Self::EVERY) {
                log::info!("{}", progress_line(what, self.done, self.total, self.started.elapsed()));
                self.logged = Some(Instant::now());
            }
        }
    }
}

/// `what` after `done` of `total` observation steps in `elapsed`, with the time left at that pace.
fn progress_line(what: &str, done: usize, total: usize, elapsed: Duration) -> String {
    let each = elapsed.as_secs_f64() / done.max(1) as f64;
    let left = each * total.saturating_sub(done) as f64;
    format!("{what}: {done} of {total} observation steps, {each:.1} s each, about {left:.0} s left")
}

/// Steps `policy` on each record (its prompt, frames and state) with the record's noise, else the
/// `i`-th draw from `seed` for record `i`: the same noise however often and on whichever policy
/// the records are stepped, calling `stepped` after each. Returns each record's action chunk.
pub fn actions(policy: &mut Policy, records: &[RecordedObservation], seed: u64, stepped: &mut dyn FnMut()) -> Result<Vec<Vec<f32>>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut noise = vec![0.0f32; policy.noise_len()];
    let mut chunks = Vec::with_capacity(records.len());
    for (i, record) in records.iter().enumerate() {
        let at = |e: Error| Error::invalid(format!("observation {i}"), e.to_string());
        noise.iter_mut().for_each(|v| *v = StandardNormal.sample(&mut rng));
        let frames = record.frames();
        let observation =
            crate::policy::Observation { noise: Some(record.noise.as_deref().unwrap_or(&noise)), ..record.observation(&frames) };
        let mut chunk = vec![0.0; policy.actions_len()];
        policy.set_prompt(&record.prompt).map_err(at)?;
        policy.step(&observation, &mut chunk).map_err(at)?;
        chunks.push(chunk);
        stepped();
    }
    Ok(chunks)
}

/// How far each record's `candidate` chunk is from its `reference` chunk ([`actions`] of two
/// builds, or of one build in two modes).
pub fn distances(records: &[RecordedObservation], candidate: &[Vec<f32>], reference: &[Vec<f32>]) -> Comparison {
    let each = records.iter().zip(candidate.iter().zip(reference)).enumerate();
    Comparison::of(each.map(|(i, (record, (a, b)))| ActionsDistance::of(i, record, a, b)).collect())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::PixelFormat;
    use crate::observation_log::RecordedFrame;

    fn record(cameras: usize) -> RecordedObservation {
        let frame = RecordedFrame { width: 1, height: 1, format: PixelFormat::Rgb8 as u8, data: vec![0; 3] };
        RecordedObservation { time_ns: 0, prompt: "p".into(), cameras: vec![Some(frame); cameras], state: vec![], noise: None }
    }

    #[test]
    fn distances_and_their_worst_and_a_nan_is_never_hidden() {
        let same = ActionsDistance::of(0, &record(2), &[1.0, 2.0], &[1.0, 2.0]);
        assert_eq!((same.cosine, same.rel_l2, same.max_abs, same.cameras), (1.0, 0.0, 0.0, 2));
        let scaled = ActionsDistance::of(1, &record(1), &[2.0, 0.0], &[1.0, 0.0]);
        assert_eq!((scaled.cosine, scaled.rel_l2, scaled.max_abs), (1.0, 1.0, 1.0));
        let turned = ActionsDistance::of(2, &record(1), &[0.0, 1.0], &[1.0, 0.0]);
        assert_eq!((turned.cosine, turned.rel_l2), (0.0, 2f64.sqrt()));
        let c = Comparison::of(vec![same.clone(), scaled, turned]);
        assert_eq!((c.worst_cosine, c.worst_rel_l2, c.max_abs, c.mean_cosine), (0.0, 2f64.sqrt(), 1.0, 2.0 / 3.0));
        let nan = ActionsDistance::of(3, &record(1), &[f32::NAN, 0.0], &[1.0, 0.0]);
        let c = Comparison::of(vec![same.clone(), nan]);
        assert!(c.worst_cosine.is_nan() && c.worst_rel_l2.is_nan() && c.max_abs.is_nan() && c.mean_cosine.is_nan(), "{}", c.summary());
    }

    #[test]
    fn progress_says_how_far_and_how_long_is_left() {
        assert_eq!(
            progress_line("calibration: input ranges", 3, 12, Duration::from_secs(30)),
            "calibration: input ranges: 3 of 12 observation steps, 10.0 s each, about 90 s left"
        );
        assert_eq!(
            progress_line("compare", 4, 4, Duration::from_millis(500)),
            "compare: 4 of 4 observation steps, 0.1 s each, about 0 s left"
        );
    }

    #[test]
    fn observations_grouped_by_camera_count() {
        let one = |i, a: [f32; 2]| ActionsDistance::of(i, &record(1), &a, &[1.0, 0.0]);
        let two = ActionsDistance::of(1, &record(2), &[1.0, 0.0], &[1.0, 0.0]);
        let c = Comparison::of(vec![one(0, [0.0, 1.0]), two, one(2, [1.0, 0.0])]);
        let groups: Vec<_> = c.by_cameras().into_iter().map(|(n, g)| (n, g.observations.len(), g.worst_cosine, g.mean_cosine)).collect();
        assert_eq!(groups, [(1, 2, 0.0, 0.5), (2, 1, 1.0, 1.0)]);
    }
}

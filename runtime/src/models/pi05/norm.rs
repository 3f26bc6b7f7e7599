//! Normalization statistics: state in, actions out.
//!
//! Sources, in order: lerobot's processor files next to the weights
//! (`policy_preprocessor*.safetensors` / `policy_postprocessor*.safetensors`, keys such as
//! `observation.state.q01`), then openpi's `norm_stats.json` (in the checkpoint directory or under
//! `assets/<robot>/`). With neither, both directions are the identity and a warning is logged.
//!
//! The epsilon follows the source: lerobot substitutes its eps (1e-8) only where `q99 == q01`;
//! openpi always adds 1e-6 to `q99 − q01`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};

const LEROBOT_EPS: f32 = 1e-8;
const OPENPI_EPS: f32 = 1e-6;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `x_n = 2·(x − q01)/(q99 − q01) − 1`.
    Quantile,
    /// `x_n = (x − mean)/(std + eps)`.
    MeanStd,
}

/// Statistics of one feature (state or action), one value per dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct FeatureStats {
    pub mode: Mode,
    /// q01 or mean.
    pub center: Vec<f32>,
    /// q99 − q01 (with the source's epsilon rule applied) or std.
    pub spread: Vec<f32>,
    /// Added to `spread` when normalizing (mean/std only).
    pub eps: f32,
}

impl FeatureStats {
    fn quantile(q01: Vec<f32>, q99: Vec<f32>, always_add: Option<f32>) -> Self {
        let spread = q01
            .iter()
            .zip(&q99)
            .map(|(lo, hi)| match always_add {
                Some(eps) => hi - lo + eps,
                None if hi == lo => LEROBOT_EPS,
                None => hi - lo,
            })
            .collect();
        FeatureStats { mode: Mode::Quantile, center: q01, spread, eps: 0.0 }
    }

    pub fn dim(&self) -> usize {
        self.center.len()
    }

    pub fn normalize(&self, i: usize, x: f32) -> f32 {
        match self.mode {
            Mode::Quantile => 2.0 * (x - self.center[i]) / self.spread[i] - 1.0,
            Mode::MeanStd => (x - self.center[i]) / (self.spread[i] + self.eps),
        }
    }

    /// The inverse as `x · scale + offset` per dimension (what the plan's `Affine` op applies).
    pub fn unnormalize_affine(&self) -> (Vec<f32>, Vec<f32>) {
        match self.mode {
            // (x + 1)·d/2 + q01
            Mode::Quantile => self.spread.iter().zip(&self.center).map(|(d, q)| (d / 2.0, d / 2.0 + q)).unzip(),
            Mode::MeanStd => (self.spread.clone(), self.center.clone()),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct NormStats {
    pub state: Option<FeatureStats>,
    pub action: Option<FeatureStats>,
    /// Where the statistics came from, for `inspect` and logs.
    pub source: Option<PathBuf>,
}

/// How lerobot's config maps feature types to modes (`normalization_mapping`), pi05's default.
#[derive(Clone, Copy, Debug)]
pub struct Modes {
    pub state: Mode,
    pub action: Mode,
}

impl Default for Modes {
    fn default() -> Self {
        Modes { state: Mode::Quantile, action: Mode::Quantile }
    }
}

impl NormStats {
    /// Looks for statistics beside the checkpoint at `dir`.
    pub fn find(dir: &Path, modes: Modes) -> Result<Self> {
        let mut lerobot: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| Error::Io { path: dir.into(), source })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                (name.starts_with("policy_preprocessor") || name.starts_with("policy_postprocessor")) && name.ends_with(".safetensors")
            })
            .collect();
        lerobot.sort();
        if !lerobot.is_empty() {
            return Self::from_lerobot(&lerobot, modes);
        }
        let mut candidates = vec![dir.join("norm_stats.json")];
        if let Ok(assets) = std::fs::read_dir(dir.join("assets")) {
            let mut robots: Vec<PathBuf> = assets.filter_map(|e| e.ok().map(|e| e.path().join("norm_stats.json"))).collect();
            robots.sort();
            candidates.extend(robots);
        }
        if let Some(path) = candidates.into_iter().find(|p| p.exists()) {
            return Self::from_openpi(&path);
        }
        log::warn!("no normalization statistics found beside {}: state and actions pass through unnormalized", dir.display());
        Ok(NormStats::default())
    }

    /// lerobot processor state files: keys `<feature>.<stat>`.
    pub fn from_lerobot(files: &[PathBuf], modes: Modes) -> Result<Self> {
        let mut values: BTreeMap<String, Vec<f32>> = BTreeMap::new();
        for file in files {
            let ckpt = Checkpoint::open(file)?;
            for name in ckpt.names() {
                let t = ckpt.get(name).expect("listed name exists");
                values.insert(name.to_string(), t.to_f32());
            }
            ckpt.reads_ok()?;
        }
        let source = files.first().cloned();
        let feature = |feature: &str, mode: Mode| -> Result<Option<FeatureStats>> {
            let get = |stat: &str| values.get(&format!("{feature}.{stat}")).cloned();
            let stats = match mode {
                Mode::Quantile => match (get("q01"), get("q99")) {
                    (Some(lo), Some(hi)) => Some(FeatureStats::quantile(lo, hi, None)),
                    _ => None,
                },
                Mode::MeanStd => match (get("mean"), get("std")) {
                    (Some(center), Some(spread)) => Some(FeatureStats { mode, center, spread, eps: LEROBOT_EPS }),
                    _ => None,
                },
            };
            if let Some(s) = &stats {
                check_lengths(&files[0], feature, s)?;
            }
            Ok(stats)
        };
        let stats = NormStats { state: feature("observation.state", modes.state)?, action: feature("action", modes.action)?, source };
        if stats.state.is_none() && stats.action.is_none() {
            log::warn!(
                "lerobot processor files {files:?} hold no {:?}/{:?} statistics for observation.state or action",
                modes.state,
                modes.action
            );
        }
        Ok(stats)
    }

    /// openpi `norm_stats.json`: `{"norm_stats": {"state": {"q01": [...], ...}, "actions": {...}}}`.
    pub fn from_openpi(path: &Path) -> Result<Self> {
        #[derive(serde::Deserialize)]
        struct File {
            norm_stats: BTreeMap<String, Stat>,
        }
        #[derive(serde::Deserialize)]
        struct Stat {
            q01: Option<Vec<f32>>,
            q99: Option<Vec<f32>>,
        }
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.into(), source })?;
        let file: File = serde_json::from_str(&text).map_err(|e| Error::checkpoint(path, format!("bad norm_stats.json: {e}")))?;
        let feature = |key: &str| -> Result<Option<FeatureStats>> {
            let Some(stat) = file.norm_stats.get(key) else { return Ok(None) };
            match (&stat.q01, &stat.q99) {
                (Some(lo), Some(hi)) => {
                    let s = FeatureStats::quantile(lo.clone(), hi.clone(), Some(OPENPI_EPS));
                    check_lengths(path, key, &s)?;
                    Ok(Some(s))
                }
                _ => Err(Error::checkpoint(path, format!("norm_stats.{key} lacks q01/q99 (pi05 normalizes with quantiles)"))),
            }
        };
        Ok(NormStats { state: feature("state")?, action: feature("actions")?, source: Some(path.to_path_buf()) })
    }
}

fn check_lengths(path: &Path, feature: &str, s: &FeatureStats) -> Result<()> {
    if s.center.len() != s.spread.len() || s.center.is_empty() {
        return Err(Error::checkpoint(
            path,
            format!("{feature}: statistics of different lengths ({} vs {})", s.center.len(), s.spread.len()),
        ));
    }
    if let Some(i) = s.center.iter().chain(&s.spread).position(|v| !v.is_finite()) {
        return Err(Error::checkpoint(path, format!("{feature}: non-finite statistic at index {}", i % s.center.len())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_round_trip_and_eps_rules() {
        let s = FeatureStats::quantile(vec![-2.0, 1.0], vec![2.0, 1.0], None);
        assert_eq!(s.normalize(0, 2.0), 1.0);
        assert_eq!(s.normalize(0, -2.0), -1.0);
        // q99 == q01: lerobot substitutes its eps instead of dividing by zero.
        assert!(s.normalize(1, 1.0).is_finite());
        let (scale, offset) = s.unnormalize_affine();
        for x in [-1.0f32, 0.3, 1.0] {
            let back = s.normalize(0, x * scale[0] + offset[0]);
            assert!((back - x).abs() < 1e-6);
        }
        let openpi = FeatureStats::quantile(vec![0.0], vec![1.0], Some(OPENPI_EPS));
        assert_eq!(openpi.spread[0], 1.0 + OPENPI_EPS);
    }

    #[test]
    fn openpi_file_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("norm_stats.json");
        std::fs::write(
            &path,
            r#"{"norm_stats": {"state": {"q01": [0, 1], "q99": [1, 3], "mean": [0, 0]}, "actions": {"q01": [0], "q99": [2]}}}"#,
        )
        .unwrap();
        let s = NormStats::find(dir.path(), Modes::default()).unwrap();
        assert_eq!(s.state.as_ref().unwrap().dim(), 2);
        assert_eq!(s.action.as_ref().unwrap().dim(), 1);
        std::fs::write(&path, r#"{"norm_stats": {"state": {"q01": [0, 1], "q99": [1]}}}"#).unwrap();
        let e = NormStats::find(dir.path(), Modes::default()).unwrap_err().to_string();
        assert!(e.contains("different lengths"), "{e}");
    }

    #[test]
    fn no_stats_is_identity() {
        let dir = tempfile::tempdir().unwrap();
        let s = NormStats::find(dir.path(), Modes::default()).unwrap();
        assert!(s.state.is_none() && s.action.is_none());
    }
}

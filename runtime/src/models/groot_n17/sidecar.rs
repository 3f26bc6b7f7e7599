//! The files a raw GR00T N1.7 checkpoint keeps beside its weights, and what inference does with
//! them (lerobot 0.6.1 `processor_groot.py`, spec 2d, 2f):
//!
//! - `processor_config.json` `processor_kwargs`: per embodiment tag the camera, state and action
//!   groups (`modality_configs`), and the processing switches;
//! - `statistics.json`: per tag and group the min/max/q01/q99 the state is normalized with and the
//!   actions are decoded with (`relative_action` per chunk step for relative groups);
//! - `embodiment_id.json`: tag → the slot of the embodiment-specific weights.
//!
//! The state is mapped to `[-1, 1]` by (q01, q99) (or (min, max)) and clipped; the model's action
//! chunk is decoded group by group, relative groups made absolute against the raw state (joint
//! groups by addition, end-effector groups in xyz+rot6d by composing poses in f64).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::models::ConfigJson;

/// lerobot's built-in tag → slot table, used when the checkpoint has no `embodiment_id.json`.
pub const BUILTIN_EMBODIMENTS: [(&str, usize); 13] = [
    ("oxe_droid_relative_eef_relative_joint", 24),
    ("xdof_relative_eef_relative_joint", 27),
    ("xdof_relative_eef_relative_joint_subtask", 27),
    ("real_g1_relative_eef_relative_joints", 25),
    ("real_r1_pro_sharpa_relative_eef", 26),
    ("real_r1_pro_sharpa_relative_eef_human", 26),
    ("real_r1_pro_sharpa_relative_eef_maxinsights", 26),
    ("real_r1_pro_sharpa_relative_eef_mecka", 26),
    ("unitree_g1_full_body_with_waist_height_nav_cmd", 25),
    ("simpler_env_google", 0),
    ("simpler_env_widowx", 1),
    ("libero_sim", 2),
    ("new_embodiment", 10),
];

fn yes() -> bool {
    true
}

/// `processor_config.json` `processor_kwargs`: the parts inference reads.
#[derive(Clone, Debug, Deserialize)]
pub struct ProcessorKwargs {
    #[serde(default)]
    pub modality_configs: BTreeMap<String, ModalityConfig>,
    #[serde(default)]
    pub use_percentiles: bool,
    #[serde(default)]
    pub use_relative_action: bool,
    #[serde(default = "yes")]
    pub clip_outliers: bool,
    #[serde(default = "yes")]
    pub formalize_language: bool,
    pub image_target_size: Option<[usize; 2]>,
    pub image_crop_size: Option<[usize; 2]>,
    pub shortest_image_edge: Option<usize>,
    pub crop_fraction: Option<f64>,
    #[serde(default)]
    pub use_albumentations: bool,
    #[serde(default)]
    pub letter_box_transform: bool,
    pub max_action_horizon: Option<usize>,
}

/// One embodiment's groups.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ModalityConfig {
    #[serde(default)]
    pub video: Modality,
    #[serde(default)]
    pub state: Modality,
    #[serde(default)]
    pub action: Modality,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Modality {
    #[serde(default)]
    pub modality_keys: Vec<String>,
    #[serde(default)]
    pub delta_indices: Vec<i64>,
    #[serde(default)]
    pub action_configs: Vec<Value>,
}

/// A statistic's (min, max) per column.
pub type Bounds = (Vec<f32>, Vec<f32>);

/// How one action group is decoded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decode {
    Absolute,
    /// Plus the raw state group starting at this state column.
    RelativeJoints {
        state_at: usize,
    },
    /// Composed with the raw end-effector pose (xyz + rot6d) starting at this state column.
    RelativeEef {
        state_at: usize,
    },
}

/// One action group: its columns in the model's action row and the statistics that decode it,
/// `steps` rows of `dim` (one row for absolute groups, one per chunk step for relative ones).
#[derive(Clone, Debug)]
pub struct ActionGroup {
    pub key: String,
    pub dim: usize,
    pub decode: Decode,
    steps: usize,
    min: Vec<f32>,
    max: Vec<f32>,
}

/// What the sidecar files say for one embodiment.
#[derive(Clone, Debug)]
pub struct Sidecars {
    pub tag: String,
    pub slot: usize,
    pub kwargs: ProcessorKwargs,
    pub modality: ModalityConfig,
    /// The state groups (key, width) in checkpoint order, and their normalization bounds.
    pub state_groups: Vec<(String, usize)>,
    state_min: Vec<f32>,
    state_max: Vec<f32>,
    pub action_groups: Vec<ActionGroup>,
    /// Chunk steps the decoded actions keep (`len(action.delta_indices)`).
    pub action_steps: usize,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    Ok(ConfigJson::read(path)?.map(|json| json.value))
}

/// The numbers of a statistic, flattened row by row, as f32 (what lerobot's tensors hold), and
/// its row count (1 for a vector).
fn numbers(value: &Value) -> Option<(Vec<f32>, usize)> {
    let rows = value.as_array()?;
    if rows.first().is_some_and(Value::is_array) {
        let flat: Option<Vec<f32>> =
            rows.iter().flat_map(|r| r.as_array().into_iter().flatten()).map(|v| v.as_f64().map(|x| x as f32)).collect();
        Some((flat?, rows.len()))
    } else {
        Some((rows.iter().map(|v| v.as_f64().map(|x| x as f32)).collect::<Option<Vec<f32>>>()?, 1))
    }
}

/// `"rep"` etc. of an action config as lerobot's `config_value` reads it (enums by value, any case).
fn field(config: &Value, name: &str) -> String {
    let text = config.get(name).map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())).unwrap_or_default().to_lowercase();
    if text == "xyz_rot6d" { "xyz+rot6d".into() } else { text }
}

impl Sidecars {
    /// Reads the three files in `dir` for embodiment `tag` (`None`: the checkpoint's only one).
    /// An unknown tag is an error that lists the known ones (lerobot maps it to slot 0
    /// silently); so are missing statistics (lerobot refuses those too, for a raw checkpoint).
    pub fn read(dir: &Path, tag: Option<&str>) -> Result<Sidecars> {
        let (mut all, active) = Sidecars::read_all(dir, tag)?;
        Ok(all.swap_remove(active))
    }

    /// [`Sidecars::read`] for `tag`, and every other embodiment the files describe in full (a
    /// slot, a modality config and statistics), in tag order: the embodiments a policy can
    /// switch between. Returns them and where `tag`'s is.
    pub fn read_all(dir: &Path, tag: Option<&str>) -> Result<(Vec<Sidecars>, usize)> {
        let config_path = dir.join("processor_config.json");
        let config =
            read_json(&config_path)?.ok_or_else(|| Error::checkpoint(dir, "missing processor_config.json (GR00T N1.7 sidecar)"))?;
        let kwargs: ProcessorKwargs = serde_json::from_value(config.get("processor_kwargs").cloned().unwrap_or(Value::Null))
            .map_err(|e| Error::checkpoint(&config_path, format!("bad processor_kwargs: {e}")))?;
        let tag = match tag {
            Some(tag) => tag,
            None => match kwargs.modality_configs.keys().collect::<Vec<_>>()[..] {
                [only] => only.as_str(),
                ref tags => return Err(Error::invalid("config.embodiment", format!("this checkpoint has embodiments {tags:?}: name one"))),
            },
        };

        let ids_path = dir.join("embodiment_id.json");
        let table: Vec<(String, usize)> = match read_json(&ids_path)? {
            Some(Value::Object(map)) => map.iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64()? as usize))).collect(),
            Some(_) => return Err(Error::checkpoint(&ids_path, "expected an object of tag: slot")),
            None => BUILTIN_EMBODIMENTS.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
        };
        let stats_path = dir.join("statistics.json");
        let all_stats = read_json(&stats_path)?;
        let embodiment = |tag: &str| -> Result<Sidecars> {
            let slot = table.iter().find(|(k, _)| k == tag).map(|&(_, v)| v).ok_or_else(|| {
                let known: Vec<&str> = table.iter().map(|(k, _)| k.as_str()).collect();
                Error::invalid("config.embodiment", format!("unknown embodiment tag {tag:?}; this checkpoint knows {}", known.join(", ")))
            })?;
            let modality = kwargs.modality_configs.get(tag).cloned().ok_or_else(|| {
                Error::checkpoint(
                    &config_path,
                    format!("no modality_configs for embodiment {tag:?} (it has {:?})", kwargs.modality_configs.keys().collect::<Vec<_>>()),
                )
            })?;
            let all = all_stats.as_ref().ok_or_else(|| Error::checkpoint(dir, "missing statistics.json (GR00T N1.7 sidecar)"))?;
            let stats = all.get(tag).ok_or_else(|| Error::checkpoint(&stats_path, format!("no statistics for embodiment {tag:?}")))?;
            Sidecars::from_stats(tag, slot, kwargs.clone(), modality, stats, &stats_path, &config_path)
        };
        let mut asked = Some(embodiment(tag)?);
        let mut all = Vec::new();
        let mut active = 0;
        for other in kwargs.modality_configs.keys() {
            if other == tag {
                active = all.len();
                all.extend(asked.take());
                continue;
            }
            match embodiment(other) {
                Ok(sidecars) => all.push(sidecars),
                Err(e) => log::debug!("embodiment {other:?} is not switchable: {e}"),
            }
        }
        Ok((all, active))
    }

    /// The groups of one embodiment from its statistics (`statistics.json[tag]`, or a lerobot
    /// pack step's `raw_stats`) and its modality config; `stats_path` and `config_path` name
    /// where they came from in errors.
    pub fn from_stats(
        tag: &str,
        slot: usize,
        kwargs: ProcessorKwargs,
        modality: ModalityConfig,
        stats: &Value,
        stats_path: &Path,
        config_path: &Path,
    ) -> Result<Sidecars> {
        let stat = |modality: &str, key: &str, name: &str| -> Result<(Vec<f32>, usize)> {
            stats
                .get(modality)
                .and_then(|m| m.get(key))
                .and_then(|k| k.get(name))
                .and_then(numbers)
                .ok_or_else(|| Error::checkpoint(stats_path, format!("{tag}.{modality}.{key}.{name}: missing or not numbers")))
        };
        let (lo, hi) = if kwargs.use_percentiles { ("q01", "q99") } else { ("min", "max") };

        let mut state_groups = Vec::new();
        let (mut state_min, mut state_max) = (Vec::new(), Vec::new());
        for key in &modality.state.modality_keys {
            let (min, _) = stat("state", key, lo)?;
            let (max, _) = stat("state", key, hi)?;
            if min.len() != max.len() {
                return Err(Error::checkpoint(stats_path, format!("{tag}.state.{key}: {lo} has {} values, {hi} {}", min.len(), max.len())));
            }
            state_groups.push((key.clone(), min.len()));
            state_min.extend(min);
            state_max.extend(max);
        }
        let state_at = |key: &str| -> Option<usize> {
            let i = state_groups.iter().position(|(k, _)| k == key)?;
            Some(state_groups[..i].iter().map(|(_, d)| d).sum())
        };

        let mut action_groups = Vec::new();
        for (i, key) in modality.action.modality_keys.iter().enumerate() {
            let config = modality.action.action_configs.get(i).cloned().unwrap_or(Value::Null);
            let relative = kwargs.use_relative_action && field(&config, "rep") == "relative";
            let ((min, steps), (max, _)) = if relative {
                (stat("relative_action", key, "min")?, stat("relative_action", key, "max")?)
            } else {
                (stat("action", key, lo)?, stat("action", key, hi)?)
            };
            let dim = min.len() / steps;
            let decode = if !relative {
                Decode::Absolute
            } else {
                let state_key = config.get("state_key").and_then(Value::as_str).unwrap_or(key);
                let at = state_at(state_key).ok_or_else(|| {
                    Error::checkpoint(
                        config_path,
                        format!("relative action group {key:?} refers to state group {state_key:?}, which the state lacks"),
                    )
                })?;
                match (field(&config, "type").as_str(), field(&config, "format").as_str()) {
                    ("non_eef", _) => Decode::RelativeJoints { state_at: at },
                    ("eef", "xyz+rot6d") if dim == 9 => Decode::RelativeEef { state_at: at },
                    (ty, format) => {
                        return Err(Error::checkpoint(
                            config_path,
                            format!("relative action group {key:?}: type {ty:?} format {format:?} ({dim} wide) is not supported"),
                        ));
                    }
                }
            };
            if max.len() != min.len() {
                return Err(Error::checkpoint(stats_path, format!("{tag}: action group {key:?} has min and max of different sizes")));
            }
            action_groups.push(ActionGroup { key: key.clone(), dim, decode, steps, min, max });
        }
        let action_steps = modality.action.delta_indices.len().max(1);
        Ok(Sidecars { tag: tag.to_string(), slot, kwargs, modality, state_groups, state_min, state_max, action_groups, action_steps })
    }

    /// One state group and one absolute action group, each with its own bounds: what a lerobot
    /// fine-tune normalizes and decodes with when the base checkpoint has no statistics for its
    /// embodiment (dataset statistics, `groot_action_unpack_unnormalize_v2`).
    pub fn flat(
        tag: &str,
        slot: usize,
        kwargs: ProcessorKwargs,
        cameras: Vec<String>,
        state: Bounds,
        action: Bounds,
        steps: usize,
    ) -> Sidecars {
        let modality = ModalityConfig { video: Modality { modality_keys: cameras, ..Modality::default() }, ..ModalityConfig::default() };
        let (dim, (min, max)) = (action.0.len(), action);
        Sidecars {
            tag: tag.to_string(),
            slot,
            kwargs,
            modality,
            state_groups: vec![("observation.state".into(), state.0.len())],
            state_min: state.0,
            state_max: state.1,
            action_groups: vec![ActionGroup { key: "action".into(), dim, decode: Decode::Absolute, steps: 1, min, max }],
            action_steps: steps,
        }
    }

    /// Replaces the state's normalization bounds (a lerobot pack step normalizes with the
    /// flattened statistics of its state file, not the grouped ones).
    pub fn set_state_bounds(&mut self, (min, max): Bounds) -> std::result::Result<(), String> {
        if min.len() != self.state_min.len() || max.len() != self.state_min.len() {
            return Err(format!("{} min / {} max values for a {}-wide state", min.len(), max.len(), self.state_min.len()));
        }
        (self.state_min, self.state_max) = (min, max);
        Ok(())
    }

    /// The raw state's width (the sum of the state groups).
    pub fn state_dim(&self) -> usize {
        self.state_min.len()
    }

    /// The decoded action's width (the sum of the action groups).
    pub fn action_dim(&self) -> usize {
        self.action_groups.iter().map(|g| g.dim).sum()
    }

    /// The model's state input from the raw state: `2 (x - min) / (max - min) - 1` per column in
    /// f32, 0 where max == min, clipped to [-1, 1] (`clip_outliers`); `out` past the state is 0.
    pub fn normalize_state(&self, raw: &[f32], out: &mut [f32]) {
        out.fill(0.0);
        for (i, (&x, o)) in raw.iter().zip(out.iter_mut()).enumerate() {
            let denom = self.state_max[i] - self.state_min[i];
            let y = if denom != 0.0 { 2.0 * (x - self.state_min[i]) / denom - 1.0 } else { 0.0 };
            *o = if self.kwargs.clip_outliers { y.clamp(-1.0, 1.0) } else { y };
        }
    }

    /// Decodes the model's normalized chunk (`steps × width` rows of `width` ≥ the groups' sum)
    /// into robot actions (`steps × action_dim`): per group `(clip(a, -1, 1) + 1) · 0.5 ·
    /// (max - min) + min` in f32, relative groups then made absolute against `raw_state`.
    /// Does not allocate.
    pub fn decode_actions(&self, normalized: &[f32], width: usize, raw_state: &[f32], out: &mut [f32]) {
        let out_width = self.action_dim();
        for (step, (row, out_row)) in normalized.chunks(width).zip(out.chunks_mut(out_width)).enumerate() {
            let mut at = 0;
            for g in &self.action_groups {
                let stats_row = if g.steps > 1 { step.min(g.steps - 1) } else { 0 };
                let (min, max) = (&g.min[stats_row * g.dim..][..g.dim], &g.max[stats_row * g.dim..][..g.dim]);
                let dst = &mut out_row[at..at + g.dim];
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = (row[at + j].clamp(-1.0, 1.0) + 1.0) * 0.5 * (max[j] - min[j]) + min[j];
                }
                match g.decode {
                    Decode::Absolute => {}
                    Decode::RelativeJoints { state_at } => dst.iter_mut().zip(&raw_state[state_at..]).for_each(|(d, s)| *d += s),
                    Decode::RelativeEef { state_at } => {
                        let pose = compose(&pose_from(&raw_state[state_at..state_at + 9]), &pose_from(dst));
                        for (d, v) in dst.iter_mut().zip(pose_to_xyz_rot6d(&pose)) {
                            *d = v as f32;
                        }
                    }
                }
                at += g.dim;
            }
        }
    }
}

type Pose = [[f64; 4]; 4];

/// xyz + rot6d (the first two rows of the rotation, Gram-Schmidt completed) as a homogeneous
/// transform, in f64 (lerobot `xyz_rot6d_to_homogeneous`).
fn pose_from(v: &[f32]) -> Pose {
    let v: [f64; 9] = std::array::from_fn(|i| v[i] as f64);
    let norm = |a: [f64; 3]| (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt();
    let r1 = [v[3], v[4], v[5]];
    let n1 = norm(r1);
    let r1 = r1.map(|x| x / n1);
    let r2 = [v[6], v[7], v[8]];
    let dot = r1[0] * r2[0] + r1[1] * r2[1] + r1[2] * r2[2];
    let r2 = [r2[0] - dot * r1[0], r2[1] - dot * r1[1], r2[2] - dot * r1[2]];
    let n2 = norm(r2);
    let r2 = r2.map(|x| x / n2);
    let r3 = [r1[1] * r2[2] - r1[2] * r2[1], r1[2] * r2[0] - r1[0] * r2[2], r1[0] * r2[1] - r1[1] * r2[0]];
    [[r1[0], r1[1], r1[2], v[0]], [r2[0], r2[1], r2[2], v[1]], [r3[0], r3[1], r3[2], v[2]], [0.0, 0.0, 0.0, 1.0]]
}

fn compose(a: &Pose, b: &Pose) -> Pose {
    std::array::from_fn(|i| std::array::from_fn(|j| (0..4).map(|k| a[i][k] * b[k][j]).sum()))
}

fn pose_to_xyz_rot6d(p: &Pose) -> [f64; 9] {
    [p[0][3], p[1][3], p[2][3], p[0][0], p[0][1], p[0][2], p[1][0], p[1][1], p[1][2]]
}

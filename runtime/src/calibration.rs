//! FP8 calibration: the static per-tensor scales of the FP8 products and the choice of which
//! products stay in higher precision, measured on observations and cached as human-readable JSON.
//!
//! Calibrating runs the policy on the CPU backend in f32 (the model's own activations, on any
//! machine, bit for bit the same on every one) over the given observations:
//! 1. every step records the largest input magnitude of each candidate product (a GEMM over a
//!    weight matrix, keyed by the weight's name: the action expert's products repeat every denoise
//!    step and share one scale);
//! 2. the first `measure_steps` observations then run again and each product is also computed as
//!    the FP8 path computes it (input and weight rounded through e4m3 with their scales, f32
//!    accumulation); a product whose output strays past `max_product_nmse` (normalized MSE against
//!    its f32 output) stays in bf16, and the JSON says so and why.
//!
//! The result is keyed by the checkpoint's content hash, the plan (its shape fields and a hash of
//! its whole description), the runtime version and the settings. A policy opened in FP8 refuses a
//! calibration whose key does not match, naming each field that differs: a stale cache is never
//! used silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::checkpoint::Checkpoint;
use crate::compare::{self, Comparison};
use crate::error::{Error, Result};
use crate::fp8::{self, ProductScales};
use crate::models::ModelInfo;
use crate::observation_log::RecordedObservation;
use crate::plan::{Op, Plan, WeightRole};
use crate::policy::Policy;

/// The `format` field of a calibration file.
pub const FORMAT: &str = "flashrt-fp8-calibration";
/// The layout version this runtime writes and reads.
pub const VERSION: u32 = 1;
/// The file `flashrt calibrate` writes beside the checkpoint, and an FP8 open reads by default.
pub const DEFAULT_FILE: &str = "flashrt_fp8_calibration.json";

/// The noise of observations without their own: each pass over an observation gets the same.
const NOISE_SEED: u64 = 0;

/// How a calibration is made; part of what it records.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CalibrationSettings {
    /// Observations whose activation ranges are taken.
    pub steps: usize,
    /// Of those, how many (the first) run again to measure each product's FP8 error.
    pub measure_steps: usize,
    /// A product whose FP8 output has a larger normalized MSE against f32 stays in bf16.
    pub max_product_nmse: f64,
    /// Products with fewer output or input features than this stay in bf16: too small for FP8
    /// to save time, and FP8 GEMMs want both a multiple of 16.
    pub min_product_features: usize,
    /// Products whose weight name starts with one of these stay in bf16; a `*` in one stands
    /// for any run of characters (`vision.*.fc2`). `None`: the model's default
    /// ([`crate::models::ModelKind::fp8_keep_bf16`]); the file records the list used.
    #[serde(default)]
    pub keep_bf16: Option<Vec<String>>,
    /// Where the observations came from (a log's hash and name, or the synthetic generator).
    pub observations: String,
}

impl Default for CalibrationSettings {
    fn default() -> Self {
        CalibrationSettings {
            steps: 8,
            measure_steps: 2,
            max_product_nmse: 5e-3,
            min_product_features: 256,
            keep_bf16: None,
            observations: String::new(),
        }
    }
}

/// Whether a file starting with `start` is a calibration (so not part of the checkpoint's hash,
/// whatever its name: writing one beside the checkpoint changes nothing).
fn is_calibration(start: &[u8]) -> bool {
    let head = String::from_utf8_lossy(&start[..start.len().min(64)]);
    head.trim_start().starts_with('{') && head.replace([' ', '\n'], "").contains(&format!("\"format\":\"{FORMAT}\""))
}

/// What a calibration is valid for. Every field must match the policy that uses it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CalibrationKey {
    /// [`Checkpoint::content_sha256`]: the weight files and the statistics, config and
    /// processor files beside them, byte for byte (calibration files left out).
    pub checkpoint_sha256: String,
    pub model: String,
    pub embodiment: Option<String>,
    pub cameras: usize,
    pub prompt_capacity: usize,
    pub denoise_steps: usize,
    pub horizon: usize,
    /// SHA-256 of the plan's full description (every op and shape): any other difference in the
    /// plan (real-time chunking, prompt buckets) shows here.
    pub plan_sha256: String,
    pub runtime_version: String,
}

impl CalibrationKey {
    /// The key of a policy with this checkpoint, plan and model.
    pub fn of(checkpoint: &Checkpoint, plan: &Plan, model: &ModelInfo) -> Result<Self> {
        Ok(CalibrationKey {
            checkpoint_sha256: checkpoint.content_sha256(&|_, start| is_calibration(start))?,
            model: model.kind.name().into(),
            embodiment: model.embodiment.clone(),
            cameras: model.cameras.len(),
            prompt_capacity: model.prompt_capacity,
            denoise_steps: model.denoise_steps,
            horizon: model.horizon,
            plan_sha256: format!("{:x}", Sha256::digest(plan.explain())),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
        })
    }

    /// Each field where `self` differs from `other`, as `field: ours ≠ theirs`.
    fn differences(&self, other: &CalibrationKey) -> Vec<String> {
        let (ours, theirs) = (serde_json::to_value(self), serde_json::to_value(other));
        let (Ok(serde_json::Value::Object(ours)), Ok(serde_json::Value::Object(theirs))) = (ours, theirs) else {
            unreachable!("a key serializes to an object")
        };
        ours.iter()
            .filter(|(field, value)| theirs.get(*field) != Some(value))
            .map(|(field, value)| format!("{field}: {value} ≠ {}", theirs[field]))
            .collect()
    }
}

/// The precision a product runs in.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ProductPrecision {
    Fp8,
    Bf16,
}

/// One weight's products: their scales, error and precision.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProductCalibration {
    pub precision: ProductPrecision,
    /// Why a product stays in bf16 (empty for FP8).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// The weight's `[out features, in features]`.
    pub shape: [usize; 2],
    /// GEMMs of the plan that read this weight (each denoise step's, each prompt bucket's).
    pub gemms: usize,
    pub activation_amax: f32,
    /// `activation_amax / 448`: inputs are quantized as `e4m3(x · (1 / scale))`.
    pub activation_scale: f32,
    pub weight_amax: f32,
    pub weight_scale: f32,
    /// Where only the gated activation after it reads the product's output
    /// ([`Plan::gated_output_weights`], at the model's FP8 row bound): the output's range, and
    /// `output_amax / 448`, with which the FP8 product stores it in e4m3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_amax: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_scale: Option<f32>,
    /// The FP8 product's normalized MSE against f32 over the measured steps (its output rounded
    /// through e4m3 too where it has an output scale).
    pub nmse: f64,
}

/// A calibration file's contents.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    pub format: String,
    pub version: u32,
    pub key: CalibrationKey,
    pub settings: CalibrationSettings,
    /// The observations were synthetic: the scales fit random inputs, not a robot's.
    pub synthetic: bool,
    pub created: String,
    /// Per weight name (the checkpoint's, or the runtime's name for a folded weight).
    pub products: BTreeMap<String, ProductCalibration>,
    /// The actions on the measured observations with the FP8 products (CPU emulation) against
    /// f32, the same noise for both (none when nothing was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actions: Option<Comparison>,
}

impl Calibration {
    /// Reads a calibration file, refusing another format or a newer version.
    pub fn load(path: &Path) -> Result<Calibration> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.into(), source })?;
        let refuse = |message: String| Error::Calibration { path: path.into(), message };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| refuse(format!("not JSON: {e}")))?;
        match (value.get("format").and_then(|f| f.as_str()), value.get("version").and_then(|v| v.as_u64())) {
            (Some(FORMAT), Some(v)) if v == VERSION as u64 => {}
            (Some(FORMAT), v) => return Err(refuse(format!("version {v:?}; this runtime reads version {VERSION}: recalibrate"))),
            (f, _) => return Err(refuse(format!("format {f:?} is not {FORMAT:?}"))),
        }
        serde_json::from_value(value).map_err(|e| refuse(format!("unreadable: {e}")))
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a calibration serializes");
        std::fs::write(path, text + "\n").map_err(|source| Error::Io { path: path.into(), source })
    }

    /// Refuses a calibration made for another checkpoint, plan or runtime, naming every field
    /// that differs and how to make a matching one.
    pub fn check(&self, path: &Path, key: &CalibrationKey) -> Result<()> {
        let differences = self.key.differences(key);
        if differences.is_empty() {
            return Ok(());
        }
        Err(Error::Calibration {
            path: path.into(),
            message: format!(
                "made for another policy ({}; calibration ≠ this policy): recalibrate with `flashrt calibrate` for this \
                 checkpoint and these options",
                differences.join(", ")
            ),
        })
    }

    /// The scales of each weight's products that run in FP8, by weight id of `plan`. An output
    /// scale counts only where the plan lets the product store its output in e4m3.
    pub fn product_scales(&self, path: &Path, plan: &Plan) -> Result<Vec<Option<ProductScales>>> {
        let gated = plan.gated_output_weights(0);
        let mut scales = vec![None; plan.weights.len()];
        for (name, product) in self.products.iter().filter(|(_, p)| p.precision == ProductPrecision::Fp8) {
            let id = plan
                .weights
                .iter()
                .position(|w| &w.name == name)
                .ok_or_else(|| Error::Calibration { path: path.into(), message: format!("product {name} is not a weight of this plan") })?;
            let output = product.output_scale.filter(|_| gated[id]);
            scales[id] = Some(ProductScales { activation: product.activation_scale, weight: product.weight_scale, output });
        }
        Ok(scales)
    }

    /// Products in FP8 and in bf16.
    pub fn counts(&self) -> (usize, usize) {
        let fp8 = self.products.values().filter(|p| p.precision == ProductPrecision::Fp8).count();
        (fp8, self.products.len() - fp8)
    }

    /// One line per product kept in bf16 with why, then the FP8 count: for `explain()`.
    pub fn describe(&self) -> String {
        let (fp8, bf16) = self.counts();
        let outputs = self.products.values().filter(|p| p.precision == ProductPrecision::Fp8 && p.output_scale.is_some()).count();
        let mut s = format!(
            "fp8: {fp8} weights' products in e4m3 with static per-tensor scales ({outputs} of them with their output stored in e4m3 \
             for the gated activation after it), {bf16} in bf16; calibrated over {} steps of {}{}\n",
            self.settings.steps,
            self.settings.observations,
            if self.synthetic {
                " -- SYNTHETIC: the scales fit random inputs, not your robot's; calibrate on recorded observations"
            } else {
                ""
            }
        );
        if let Some(actions) = &self.actions {
            s += &format!("  actions in FP8 against f32 (CPU emulation), {}\n", actions.summary());
        }
        for (name, p) in self.products.iter().filter(|(_, p)| p.precision == ProductPrecision::Bf16) {
            s += &format!("  bf16 {name}: {}\n", p.why);
        }
        s
    }
}

/// What a backend records of each candidate product while calibrating, by weight id.
#[derive(Clone, Debug)]
pub struct ProductProbe {
    /// Whether this weight's products are recorded.
    pub recorded: Vec<bool>,
    /// The largest input magnitude seen.
    pub activation_amax: Vec<f32>,
    /// Whether this weight's output range is recorded too (its products store their output in
    /// e4m3 when it runs in FP8), and the largest output magnitude seen.
    pub outputs: Vec<bool>,
    pub output_amax: Vec<f32>,
    /// The weight's largest magnitude (the backend fills it when the probe is installed).
    pub weight_amax: Vec<f32>,
    /// When set, each product with an input scale here is also computed in FP8 with it, and
    /// `error` and `energy` accumulate `Σ (fp8 − f32)²` and `Σ f32²` over its outputs.
    pub measure_scales: Option<Vec<Option<f32>>>,
    /// With `measure_scales`: the output scales of the products measured (or propagated) with
    /// their output rounded through e4m3.
    pub output_scales: Option<Vec<Option<f32>>>,
    pub error: Vec<f64>,
    pub energy: Vec<f64>,
    /// Instead of measuring: each product with an input scale in `measure_scales` is computed in
    /// FP8 and its output passed on, as the FP8 emulation does ([`crate::cpu::CpuBackend::with_fp8`]).
    pub propagate: bool,
}

impl ProductProbe {
    fn new(recorded: Vec<bool>, outputs: Vec<bool>) -> Self {
        let n = recorded.len();
        ProductProbe {
            recorded,
            activation_amax: vec![0.0; n],
            outputs,
            output_amax: vec![0.0; n],
            weight_amax: vec![0.0; n],
            measure_scales: None,
            output_scales: None,
            error: vec![0.0; n],
            energy: vec![0.0; n],
            propagate: false,
        }
    }
}

/// Whether `name` starts with `pattern`, each `*` in which stands for any run of characters.
/// Taking each piece at its first place leaves the most of `name` for the pieces after it.
fn starts_with_pattern(name: &str, pattern: &str) -> bool {
    let mut pieces = pattern.split('*');
    let Some(mut rest) = name.strip_prefix(pieces.next().unwrap_or_default()) else { return false };
    for piece in pieces {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// For each weight id: `None` when no GEMM reads it as a matrix, else why its products stay in
/// bf16 (empty for an FP8 candidate). A matrix an embodiment selection rewrites each step stays:
/// its whole table would have to be FP8.
fn product_exclusions(plan: &Plan, settings: &CalibrationSettings) -> Vec<Option<String>> {
    let selected = plan.selected_weights();
    let min = settings.min_product_features;
    let keep = settings.keep_bf16.as_deref().unwrap_or_default();
    let mut why = vec![None; plan.weights.len()];
    for op in &plan.ops {
        let Op::Gemm { w, .. } = *op else { continue };
        let WeightRole::Matrix { n, k } = plan.weights[w.0].role else { continue };
        let name = &plan.weights[w.0].name;
        why[w.0] = Some(if selected.contains(&w) {
            "selected per embodiment each step".into()
        } else if let Some(prefix) = keep.iter().find(|prefix| starts_with_pattern(name, prefix)) {
            format!("kept in bf16 (keep_bf16 \"{prefix}\")")
        } else if n < min || k < min {
            format!("[{n}, {k}]: fewer than {min} features, too small for FP8 to gain")
        } else if n % 16 != 0 || k % 16 != 0 {
            format!("[{n}, {k}]: FP8 GEMMs need multiples of 16")
        } else {
            String::new()
        });
    }
    why
}

/// Calibrates `policy` (opened on the CPU backend in f32) on the first `settings.steps` of
/// `records` (each with its prompt and, where it has one, its noise), measuring on the first
/// `settings.measure_steps`. `synthetic`: the observations are not the robot's (recorded in the
/// file, and warned about).
pub fn calibrate(
    policy: &mut Policy,
    settings: &CalibrationSettings,
    synthetic: bool,
    records: &[RecordedObservation],
) -> Result<Calibration> {
    if policy.info().precision != "f32" {
        return Err(Error::Backend(format!(
            "calibration runs on the CPU backend in f32; this policy computes in {} on {}: open one with backend CPU and precision \
             Auto or F32",
            policy.info().precision,
            policy.info().backend
        )));
    }
    if settings.steps == 0 || settings.measure_steps > settings.steps || records.len() < settings.steps {
        return Err(Error::invalid(
            "calibration steps",
            format!(
                "{} steps, {} measured, {} observations: need at least one step, no more measured than taken and an \
                 observation for each",
                settings.steps,
                settings.measure_steps,
                records.len()
            ),
        ));
    }
    let settings = &CalibrationSettings {
        keep_bf16: Some(
            settings
                .keep_bf16
                .clone()
                .unwrap_or_else(|| policy.model().kind.fp8_keep_bf16().iter().map(|prefix| prefix.to_string()).collect()),
        ),
        ..settings.clone()
    };
    let key = {
        let checkpoint = Checkpoint::open(policy.checkpoint_path())?;
        CalibrationKey::of(&checkpoint, policy.plan(), policy.model())?
    };
    let excluded = product_exclusions(policy.plan(), settings);
    let gated = policy.plan().gated_output_weights(policy.model().kind.fp8_min_rows());
    let outputs = excluded.iter().zip(&gated).map(|(why, &gated)| gated && why.as_deref() == Some("")).collect();
    // The input ranges over every step, then two passes over the measured ones (none without).
    let mut progress = compare::Progress::new(settings.steps + 2 * settings.measure_steps);
    policy.swap_product_probe(Some(ProductProbe::new(excluded.iter().map(Option::is_some).collect(), outputs)))?;
    let ranges = compare::actions(policy, &records[..settings.steps], NOISE_SEED, &mut progress.pass("calibration: input ranges"));
    let mut probe = policy.swap_product_probe(None)?.expect("the probe installed above");
    ranges?;

    let candidates = excluded.iter().map(|why| why.as_deref() == Some(""));
    probe.measure_scales = Some(candidates.zip(&probe.activation_amax).map(|(c, &amax)| c.then(|| fp8::scale_for(amax))).collect());
    probe.output_scales = Some(probe.outputs.iter().zip(&probe.output_amax).map(|(&o, &amax)| o.then(|| fp8::scale_for(amax))).collect());
    policy.swap_product_probe(Some(probe))?;
    let measured_records = &records[..settings.measure_steps];
    let measured = compare::actions(policy, measured_records, NOISE_SEED, &mut progress.pass("calibration: each product's FP8 error"));
    let mut probe = policy.swap_product_probe(None)?.expect("the probe installed above");
    let exact_actions = measured?;

    let plan = policy.plan();
    let mut gemms = vec![0usize; plan.weights.len()];
    for op in &plan.ops {
        if let Op::Gemm { w, .. } = op {
            gemms[w.0] += 1;
        }
    }
    let mut products = BTreeMap::new();
    for (id, decl) in plan.weights.iter().enumerate() {
        let (WeightRole::Matrix { n, k }, Some(excluded)) = (decl.role, &excluded[id]) else { continue };
        let nmse = if probe.energy[id] > 0.0 { probe.error[id] / probe.energy[id] } else { 0.0 };
        let (activation_amax, weight_amax) = (probe.activation_amax[id], probe.weight_amax[id]);
        let output_amax = probe.outputs[id].then_some(probe.output_amax[id]);
        let why = if !excluded.is_empty() {
            excluded.clone()
        } else if settings.measure_steps > 0 && nmse > settings.max_product_nmse {
            format!("FP8 output nmse {nmse:.2e} over {:.0e}", settings.max_product_nmse)
        } else {
            String::new()
        };
        products.insert(
            decl.name.clone(),
            ProductCalibration {
                precision: if why.is_empty() { ProductPrecision::Fp8 } else { ProductPrecision::Bf16 },
                why,
                shape: [n, k],
                gemms: gemms[id],
                activation_amax,
                activation_scale: fp8::scale_for(activation_amax),
                weight_amax,
                weight_scale: fp8::scale_for(weight_amax),
                output_amax,
                output_scale: output_amax.map(fp8::scale_for),
                nmse,
            },
        );
    }
    // The measured observations once more, each product chosen for FP8 computed as FP8 computes
    // it and passed on: how far the actions move, which no product's own error tells (their
    // errors compound differently by model).
    let actions = if measured_records.is_empty() {
        None
    } else {
        let fp8_chosen = plan.weights.iter().map(|w| products.get(&w.name).filter(|p| p.precision == ProductPrecision::Fp8));
        let fp8_chosen: Vec<Option<&ProductCalibration>> = fp8_chosen.collect();
        probe.measure_scales = Some(fp8_chosen.iter().map(|p| p.map(|p| p.activation_scale)).collect());
        probe.output_scales = Some(fp8_chosen.iter().map(|p| p.and_then(|p| p.output_scale)).collect());
        probe.propagate = true;
        policy.swap_product_probe(Some(probe))?;
        let fp8_actions = compare::actions(policy, measured_records, NOISE_SEED, &mut progress.pass("calibration: actions in FP8"));
        policy.swap_product_probe(None)?;
        Some(compare::distances(measured_records, &fp8_actions?, &exact_actions))
    };
    if let Some(actions) = actions.as_ref().filter(|a| !(a.worst_cosine >= 0.995 && a.worst_rel_l2 <= 5e-2)) {
        log::warn!(
            "FP8 moves the actions on the measured observations past cosine 0.995 or relative L2 5e-2 ({}): keep the products \
             that cause it in bf16 (--keep-bf16 PREFIX, e.g. one block of layers) and check with `flashrt compare`",
            actions.summary()
        );
    }
    Ok(Calibration {
        format: FORMAT.into(),
        version: VERSION,
        key,
        settings: settings.clone(),
        synthetic,
        created: crate::bench::utc_now(),
        products,
        actions,
    })
}

/// The calibration file of a policy: the configured one, else [`DEFAULT_FILE`] beside the
/// checkpoint (`checkpoint`: its file or directory).
pub fn file_for(configured: Option<&Path>, checkpoint: &Path) -> PathBuf {
    configured.map_or_else(|| crate::checkpoint::directory_of(checkpoint).join(DEFAULT_FILE), Path::to_path_buf)
}

/// What calibrating without the robot's own observations costs.
pub const SYNTHETIC_WARNING: &str = "calibrating FP8 on SYNTHETIC observations (random frames and states): the activation \
    scales fit random inputs, not your robot's; real activations outside these ranges clip and FP8 accuracy on the robot is \
    unknown. Record the robot's observations (`flashrt record`, the ROS 2 node's record_observations parameter or \
    frt_policy_record_start) and calibrate with them";

/// [`calibrate`] on `settings.steps` synthetic observations ([`crate::synthetic`]: random frames
/// on all, then fewer, of the cameras, random states, three prompts in turn), warning that they
/// are not the robot's.
pub fn calibrate_synthetic(policy: &mut Policy, settings: &CalibrationSettings, seed: u64) -> Result<Calibration> {
    log::warn!("{SYNTHETIC_WARNING}");
    let cameras = policy.info().cameras.len();
    let fewest = crate::synthetic::fewest_cameras(settings.steps, cameras);
    if fewest > 1 {
        // Pi0.5 on 3 camera slots calibrated with 2 steps: FP8's worst relative L2 on 1-camera
        // observations went past 5e-2 (bench/NOTES.md, FP8 section).
        log::warn!(
            "{} synthetic steps show {cameras} down to {fewest} cameras, never fewer: the inputs of more missing cameras are not \
             calibrated and may clip; pass --steps {cameras} or more",
            settings.steps
        );
    }
    let settings = CalibrationSettings { observations: crate::synthetic::describe(policy, seed), ..settings.clone() };
    let records = crate::synthetic::observations(policy, settings.steps, seed);
    calibrate(policy, &settings, true, &records)
}

/// [`calibrate`] on the first `settings.steps` observations of a recorded log (all of them when
/// it holds fewer, with a warning), each with its prompt and, where recorded, its noise. A log
/// recorded for another model, camera count or state width is refused.
pub fn calibrate_log(policy: &mut Policy, settings: &CalibrationSettings, log: &Path) -> Result<Calibration> {
    use crate::observation_log::ObservationLogReader;
    let reader = ObservationLogReader::open(log)?;
    reader.check_policy(&policy.info())?;
    let records: Vec<RecordedObservation> = reader.take(settings.steps).collect::<Result<_>>()?;
    let field = || format!("observations {}", log.display());
    if records.is_empty() {
        return Err(Error::invalid(field(), "the log holds no observations"));
    }
    if let Some(i) = records.iter().position(|r| r.prompt.trim().is_empty()) {
        return Err(Error::invalid(
            field(),
            format!("record {i} has no prompt text (recorded after a prompt given as token ids): calibration needs the task text"),
        ));
    }
    if records.len() < settings.steps {
        log::warn!("{} holds {} observations: calibrating on those, not {}", log.display(), records.len(), settings.steps);
    }
    let bytes = std::fs::read(log).map_err(|source| Error::Io { path: log.into(), source })?;
    let steps = records.len();
    let settings = CalibrationSettings {
        steps,
        measure_steps: settings.measure_steps.min(steps),
        observations: format!(
            "log {} (sha256 {:x}): its first {steps} observations",
            log.file_name().map_or_else(|| log.display().to_string(), |n| n.to_string_lossy().into_owned()),
            Sha256::digest(&bytes)
        ),
        ..settings.clone()
    };
    calibrate(policy, &settings, false, &records)
}

#[cfg(test)]
mod tests {
    use super::starts_with_pattern;

    #[test]
    fn keep_bf16_patterns_are_prefixes_with_wildcards() {
        assert!(starts_with_pattern("vision.12.fc2", "vision."));
        assert!(!starts_with_pattern("vision.12.fc2", "lm."));
        assert!(starts_with_pattern("vision.12.fc2", "vision.*.fc2"));
        assert!(starts_with_pattern("vision.12.fc2", "vision.*.fc"));
        assert!(!starts_with_pattern("vision.12.fc1", "vision.*.fc2"));
        assert!(starts_with_pattern("vision.1.fc2", "vision.1*"));
        assert!(!starts_with_pattern("vision.2.fc2", "vision.1*"));
        // A piece found early leaves room for the ones after it.
        assert!(starts_with_pattern("lm.1.fc1.fc2", "lm.*.fc*.fc2"));
        assert!(starts_with_pattern("anything", "*"));
    }

    /// Pi0.5's default keeps SigLIP's patch embedding, its first seven blocks whole and every
    /// block's output projection (the tiny fixture has too few blocks to show the rest in FP8).
    #[test]
    fn pi05_keeps_the_first_vision_blocks_and_every_blocks_out_proj() {
        let kept = |name: &str| crate::models::pi05::FP8_KEEP_BF16.iter().any(|p| starts_with_pattern(name, p));
        for block in 0..27 {
            for product in ["qkv", "out_proj", "fc1", "fc2"] {
                let name = format!("vision.{block}.{product}");
                assert_eq!(kept(&name), block < 7 || product == "out_proj", "{name}");
            }
        }
        assert!(kept("vision.patch_embedding"));
        assert!(!kept("lm.1.qkv*(1+input_norm)") && !kept("expert.0.down_proj") && !kept("projector"));
    }
}

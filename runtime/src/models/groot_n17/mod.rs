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

/// FP8 calibration keeps the backbone's language model in bf16 by default: on the full-size model
/// (synthetic weights, H100) its products in e4m3 move the actions to a worst cosine of 0.9926
/// against bf16 on 32 observations, where with it in bf16 the worst is 0.99886 (every other
/// product in FP8; `bench/results/h100-groot-2v-fp8-groups.json`).
pub const FP8_KEEP_BF16: &[&str] = &["backbone.model.model.language_model."];

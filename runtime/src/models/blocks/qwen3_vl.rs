//! Qwen3-VL's layers (transformers `modeling_qwen3_vl.py`): the vision block (pre-norm
//! LayerNorm, merged Q/K/V with 2D RoPE, attention within each image; LayerNorm, fc1, GELU
//! (tanh), fc2), the patch merger (2×2 patches into one token: LayerNorm, fc1, exact GELU, fc2)
//! and the text decoder layer (RMSNorm, Q/K/V, per-head q/k RMSNorm, M-RoPE, causal grouped-query
//! attention, O; RMSNorm, SwiGLU MLP).

use crate::plan::{Activation, BufId, Op, Plan, RopeAxes, View, WeightId};

/// A vision block's weights, `(weight, bias)` pairs.
pub struct VisionBlock {
    pub norm1: (WeightId, WeightId),
    pub qkv: (WeightId, WeightId),
    pub proj: (WeightId, WeightId),
    pub norm2: (WeightId, WeightId),
    pub fc1: (WeightId, WeightId),
    pub fc2: (WeightId, WeightId),
}

/// The vision tower's activations, one row per patch of every image: residual `x`, normed `h`,
/// merged `qkv`, the rotated keys `k` and values `v`, the attention output and the MLP's hidden
/// layer; `positions` holds each patch's (row, column) for the 2D RoPE.
pub struct VisionActivations {
    pub x: View,
    pub h: View,
    pub qkv: View,
    pub k: View,
    pub v: View,
    pub attn: View,
    pub mlp: View,
    pub positions: BufId,
}

/// Qwen3-VL's vision RoPE base.
const VISION_THETA: f32 = 10_000.0;

/// Appends one vision block: `heads` heads within each of `images` images, unmasked.
pub fn vision_block(plan: &mut Plan, w: &VisionBlock, a: &VisionActivations, heads: usize, images: usize, eps: f32) {
    let width = a.x.cols;
    let head_dim = width / heads;
    plan.push(Op::LayerNorm { x: a.x, out: a.h, affine: Some(w.norm1), modulation: None, eps });
    plan.push(Op::Gemm { a: a.h, w: w.qkv.0, bias: Some(w.qkv.1), out: a.qkv, accumulate: false });
    plan.push(Op::RopeQkv {
        qkv: a.qkv,
        heads,
        kv_heads: heads,
        head_dim,
        theta: VISION_THETA,
        axes: RopeAxes::Rows2d { slots: a.x.rows },
        positions: a.positions,
        position_offset: 0,
        k_cache: a.k,
        v_cache: a.v,
        cache_row: 0,
    });
    plan.push(Op::Attention {
        q: a.qkv.cols(0, width),
        k: a.k,
        v: a.v,
        out: a.attn,
        heads,
        kv_heads: heads,
        head_dim,
        groups: images,
        key_valid: None,
        query_valid: None,
        causal: None,
    });
    plan.push(Op::Gemm { a: a.attn, w: w.proj.0, bias: Some(w.proj.1), out: a.x, accumulate: true });
    plan.push(Op::LayerNorm { x: a.x, out: a.h, affine: Some(w.norm2), modulation: None, eps });
    plan.push(Op::Gemm { a: a.h, w: w.fc1.0, bias: Some(w.fc1.1), out: a.mlp, accumulate: false });
    plan.push(Op::Activation { x: a.mlp, kind: Activation::GeluTanh });
    plan.push(Op::Gemm { a: a.mlp, w: w.fc2.0, bias: Some(w.fc2.1), out: a.x, accumulate: true });
}

/// A patch merger's weights: the LayerNorm (over one patch, or over the 2×2 group for the
/// DeepStack mergers, `postshuffle`), fc1, fc2.
pub struct Merger {
    pub norm: (WeightId, WeightId),
    pub postshuffle: bool,
    pub fc1: (WeightId, WeightId),
    pub fc2: (WeightId, WeightId),
}

/// Appends a merger from the patches `x` (`[4n, width]`, 2×2 groups consecutive) into `out`
/// (`[n, out width]`), through `normed` (`[4n, width]`, seen as `[n, 4·width]`) and `hidden`.
pub fn merger(plan: &mut Plan, w: &Merger, x: View, normed: View, hidden: View, out: View, eps: f32) {
    let grouped = |v: View| View { rows: v.rows / 4, cols: 4 * v.cols, stride: 4 * v.stride, ..v };
    if w.postshuffle {
        plan.push(Op::LayerNorm { x: grouped(x), out: grouped(normed), affine: Some(w.norm), modulation: None, eps });
    } else {
        plan.push(Op::LayerNorm { x, out: normed, affine: Some(w.norm), modulation: None, eps });
    }
    plan.push(Op::Gemm { a: grouped(normed), w: w.fc1.0, bias: Some(w.fc1.1), out: hidden, accumulate: false });
    plan.push(Op::Activation { x: hidden, kind: Activation::GeluErf });
    plan.push(Op::Gemm { a: hidden, w: w.fc2.0, bias: Some(w.fc2.1), out, accumulate: false });
}

/// A text decoder layer's weights: the two RMSNorm weights, merged Q/K/V (no bias), the per-head
/// q/k norm weights, O, merged gate/up, down.
pub struct DecoderLayer {
    pub input_norm: WeightId,
    pub qkv: WeightId,
    pub q_norm: WeightId,
    pub k_norm: WeightId,
    pub o: WeightId,
    pub post_norm: WeightId,
    pub gate_up: WeightId,
    pub down: WeightId,
}

/// The decoder's activations, one row per sequence slot: residual `x`, normed `h`, `qkv`, the
/// layer's rotated keys and values, attention output, gate/up, MLP hidden.
pub struct DecoderActivations {
    pub x: View,
    pub h: View,
    pub qkv: View,
    pub k: View,
    pub v: View,
    pub attn: View,
    pub gate_up: View,
    pub mlp: View,
}

/// The decoder's attention geometry: `heads` query heads over `kv_heads` of `head_dim`, M-RoPE
/// (`theta`, `sections`) from `positions` (`[3, slots]`), keys masked by `valid` (f32).
#[derive(Clone, Copy)]
pub struct DecoderAttention {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub theta: f32,
    pub sections: [usize; 3],
    pub positions: BufId,
    pub valid: BufId,
}

/// Appends one text decoder layer; the residual `a.x` is updated in place.
pub fn decoder_layer(plan: &mut Plan, w: &DecoderLayer, a: &DecoderActivations, at: &DecoderAttention, eps: f32) {
    let (q_width, kv_width) = (at.heads * at.head_dim, at.kv_heads * at.head_dim);
    let slots = a.x.rows;
    plan.push(Op::RmsNorm { x: a.x, out: a.h, weight: Some(w.input_norm), eps });
    plan.push(Op::Gemm { a: a.h, w: w.qkv, bias: None, out: a.qkv, accumulate: false });
    let (q, k) = (a.qkv.cols(0, q_width), a.qkv.cols(q_width, kv_width));
    plan.push(Op::HeadRmsNorm { x: q, out: q, heads: at.heads, weight: w.q_norm, eps });
    plan.push(Op::HeadRmsNorm { x: k, out: k, heads: at.kv_heads, weight: w.k_norm, eps });
    plan.push(Op::RopeQkv {
        qkv: a.qkv,
        heads: at.heads,
        kv_heads: at.kv_heads,
        head_dim: at.head_dim,
        theta: at.theta,
        axes: RopeAxes::Interleaved { sections: at.sections, slots },
        positions: at.positions,
        position_offset: 0,
        k_cache: a.k,
        v_cache: a.v,
        cache_row: 0,
    });
    plan.push(Op::Attention {
        q,
        k: a.k,
        v: a.v,
        out: a.attn,
        heads: at.heads,
        kv_heads: at.kv_heads,
        head_dim: at.head_dim,
        groups: 1,
        key_valid: Some(at.valid),
        query_valid: None,
        causal: Some(0),
    });
    plan.push(Op::Gemm { a: a.attn, w: w.o, bias: None, out: a.x, accumulate: true });
    plan.push(Op::RmsNorm { x: a.x, out: a.h, weight: Some(w.post_norm), eps });
    plan.push(Op::Gemm { a: a.h, w: w.gate_up, bias: None, out: a.gate_up, accumulate: false });
    plan.push(Op::GatedActivation { gate_up: a.gate_up, out: a.mlp, kind: Activation::Silu });
    plan.push(Op::Gemm { a: a.mlp, w: w.down, bias: None, out: a.x, accumulate: true });
}

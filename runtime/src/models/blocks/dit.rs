//! diffusers' `BasicTransformerBlock` as GR00T uses it (its VL self-attention and its DiT):
//! a LayerNorm (affine, or adaptive with a timestep modulation), attention over the block's own
//! rows or over precomputed keys and values (cross-attention), residual; a LayerNorm, the
//! feed-forward (GELU tanh), residual. Q, K, V and the output all have biases.

use crate::plan::{Activation, BufId, Op, Plan, View, WeightId};

/// The first LayerNorm: affine, or without weights and modulated by `[scale | shift]`.
#[derive(Clone, Copy)]
pub enum Norm {
    Affine(WeightId, WeightId),
    Modulated(WeightId),
}

/// What the block attends over.
#[derive(Clone, Copy)]
pub enum Keys {
    /// Its own rows: merged Q/K/V `(weight, bias)` into `qkv` (`[rows, 3·width]`), keys masked
    /// by `valid` when given.
    Own { qkv_weights: (WeightId, WeightId), qkv: View, valid: Option<BufId> },
    /// Keys and values computed elsewhere (the VL embeddings'), masked by `valid`; the queries'
    /// `(weight, bias)` into `q`.
    Cross { q_weights: (WeightId, WeightId), q: View, k: View, v: View, valid: BufId },
}

/// One block's remaining weights: the output projection, the second LayerNorm (affine or
/// none), the feed-forward's two products.
pub struct Block {
    pub norm1: Norm,
    pub keys: Keys,
    pub out: (WeightId, WeightId),
    pub norm3: Option<(WeightId, WeightId)>,
    pub ff1: (WeightId, WeightId),
    pub ff2: (WeightId, WeightId),
}

/// Appends one block over the residual `x` (updated in place), through the normed rows `h`,
/// the attention output `attn` and the feed-forward's hidden layer `ff`.
#[allow(clippy::too_many_arguments)] // the block's buffers, one to one
pub fn block(plan: &mut Plan, w: &Block, x: View, h: View, attn: View, ff: View, heads: usize, eps: f32) {
    let width = x.cols;
    let (affine, modulation) = match w.norm1 {
        Norm::Affine(g, b) => (Some((g, b)), None),
        Norm::Modulated(m) => (None, Some(m)),
    };
    plan.push(Op::LayerNorm { x, out: h, affine, modulation, eps });
    let (q, k, v, valid) = match w.keys {
        Keys::Own { qkv_weights, qkv, valid } => {
            plan.push(Op::Gemm { a: h, w: qkv_weights.0, bias: Some(qkv_weights.1), out: qkv, accumulate: false });
            (qkv.cols(0, width), qkv.cols(width, width), qkv.cols(2 * width, width), valid)
        }
        Keys::Cross { q_weights, q, k, v, valid } => {
            plan.push(Op::Gemm { a: h, w: q_weights.0, bias: Some(q_weights.1), out: q, accumulate: false });
            (q, k, v, Some(valid))
        }
    };
    plan.push(Op::Attention {
        q,
        k,
        v,
        out: attn,
        heads,
        kv_heads: heads,
        head_dim: width / heads,
        groups: 1,
        key_valid: valid,
        query_valid: None,
        causal: None,
    });
    plan.push(Op::Gemm { a: attn, w: w.out.0, bias: Some(w.out.1), out: x, accumulate: true });
    plan.push(Op::LayerNorm { x, out: h, affine: w.norm3, modulation: None, eps });
    plan.push(Op::Gemm { a: h, w: w.ff1.0, bias: Some(w.ff1.1), out: ff, accumulate: false });
    plan.push(Op::Activation { x: ff, kind: Activation::GeluTanh });
    plan.push(Op::Gemm { a: ff, w: w.ff2.0, bias: Some(w.ff2.1), out: x, accumulate: true });
}

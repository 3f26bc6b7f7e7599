//! Gemma's decoder layer with multi-query attention over a K/V cache (PaliGemma's language model
//! and Pi0.5's action expert): RMSNorm, merged Q/K/V, RoPE into the cache, attention, O; RMSNorm,
//! gate/up, GeGLU (tanh), down. The RMSNorm's `(1 + w)` weights are folded into the product after
//! each norm by the model, so the norms here carry none.

use crate::plan::{Activation, BufId, Op, Plan, RopeAxes, View, WeightId};

/// Gemma's rotary base (`rope_theta` of PaliGemma's Gemma 2B and of the 300M action expert).
const ROPE_THETA: f32 = 10_000.0;

/// One layer's products in the plan. `q_heads` query heads in `qkv` (0 for a layer that only
/// fills the cache: the prefix's last layer, whose queries nothing reads) and, unless so, its
/// O, gate/up and down products.
pub struct DecoderLayer {
    pub qkv: WeightId,
    pub q_heads: usize,
    pub rest: Option<(WeightId, WeightId, WeightId)>,
}

/// How the layer is conditioned: plain RMSNorm with residuals added by the O and down products,
/// or Pi0.5's adaRMS, whose modulation (scale, shift, gate) per sublayer scales and shifts the
/// normed rows and gates the branch (`branch` holds each sublayer's output before its gate).
#[derive(Clone, Copy)]
pub enum Conditioning {
    Plain,
    Adaptive { attention: WeightId, mlp: WeightId, branch: View },
}

/// The layer's activations (one row per token): residual stream `x`, normed `h`, merged `qkv`
/// (its first `q_heads × head_dim` columns are the queries), attention output, gate/up and the
/// MLP's hidden layer.
pub struct Activations {
    pub x: View,
    pub h: View,
    pub qkv: View,
    pub attn: View,
    pub gate_up: View,
    pub mlp: View,
}

/// The layer's attention: `heads` query heads sharing one K/V head of `head_dim`, in the K/V
/// cache this layer writes its rows into from `first_row` on (its tokens' positions start at
/// `positions[first_row]`) and attends over: the cache's first `keys` rows whose `valid` flag is
/// set; with `mask_queries`, invalid query rows are left out too.
#[derive(Clone, Copy)]
pub struct CacheAttention {
    pub heads: usize,
    pub head_dim: usize,
    pub k: View,
    pub v: View,
    pub positions: BufId,
    pub valid: BufId,
    pub first_row: usize,
    pub keys: usize,
    pub mask_queries: bool,
}

/// Appends one decoder layer; the residual stream `a.x` is updated in place.
pub fn decoder_layer(plan: &mut Plan, w: &DecoderLayer, a: &Activations, cache: &CacheAttention, conditioning: Conditioning, eps: f32) {
    let (heads, head_dim) = (cache.heads, cache.head_dim);
    let norm = |plan: &mut Plan, modulation: Option<WeightId>| match modulation {
        Some(modulation) => plan.push(Op::AdaRmsNorm { x: a.x, out: a.h, modulation, eps }),
        None => plan.push(Op::RmsNorm { x: a.x, out: a.h, weight: None, eps }),
    };
    // A sublayer's output: added into the residual stream, or gated into it from the branch.
    let residual = |plan: &mut Plan, a_in: View, w_out: WeightId, modulation: Option<(WeightId, View)>| match modulation {
        Some((modulation, branch)) => {
            plan.push(Op::Gemm { a: a_in, w: w_out, bias: None, out: branch, accumulate: false });
            plan.push(Op::GatedResidual { x: a.x, y: branch, modulation });
        }
        None => plan.push(Op::Gemm { a: a_in, w: w_out, bias: None, out: a.x, accumulate: true }),
    };
    let (attention_mod, mlp_mod) = match conditioning {
        Conditioning::Plain => (None, None),
        Conditioning::Adaptive { attention, mlp, branch } => (Some((attention, branch)), Some((mlp, branch))),
    };
    let qkv = a.qkv.cols(0, (w.q_heads + 2) * head_dim);
    norm(plan, attention_mod.map(|m| m.0));
    plan.push(Op::Gemm { a: a.h, w: w.qkv, bias: None, out: qkv, accumulate: false });
    plan.push(Op::RopeQkv {
        qkv,
        heads: w.q_heads,
        kv_heads: 1,
        head_dim,
        theta: ROPE_THETA,
        axes: RopeAxes::Single,
        positions: cache.positions,
        position_offset: cache.first_row,
        k_cache: cache.k,
        v_cache: cache.v,
        cache_row: cache.first_row,
    });
    let Some((o, gate_up, down)) = w.rest else { return };
    plan.push(Op::Attention {
        q: a.qkv.cols(0, heads * head_dim),
        k: cache.k.rows(0, cache.keys),
        v: cache.v.rows(0, cache.keys),
        out: a.attn,
        heads,
        kv_heads: 1,
        head_dim,
        groups: 1,
        key_valid: Some(cache.valid),
        query_valid: cache.mask_queries.then_some(cache.valid),
        causal: None,
    });
    residual(plan, a.attn, o, attention_mod);
    norm(plan, mlp_mod.map(|m| m.0));
    plan.push(Op::Gemm { a: a.h, w: gate_up, bias: None, out: a.gate_up, accumulate: false });
    plan.push(Op::GatedActivation { gate_up: a.gate_up, out: a.mlp, kind: Activation::GeluTanh });
    residual(plan, a.mlp, down, mlp_mod);
}

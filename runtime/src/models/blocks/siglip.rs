//! SigLIP's vision encoder layer (Hugging Face `SiglipEncoderLayer`): pre-norm LayerNorm, self-
//! attention over each image's patches, residual; LayerNorm, fc1, GELU (tanh), fc2, residual.

use crate::plan::{Activation, Op, Plan, View, WeightId};

/// One layer's weights in the plan: `(weight, bias)` pairs; Q, K and V merged into one product.
pub struct EncoderLayer {
    pub norm1: (WeightId, WeightId),
    pub qkv: (WeightId, WeightId),
    pub out: (WeightId, WeightId),
    pub norm2: (WeightId, WeightId),
    pub fc1: (WeightId, WeightId),
    pub fc2: (WeightId, WeightId),
}

/// The tower's activations, one row per patch of every image: the residual stream `x` (width
/// columns), its normed copy `h`, the merged `qkv` (3 × width), the attention output and the MLP's
/// hidden layer.
pub struct Activations {
    pub x: View,
    pub h: View,
    pub qkv: View,
    pub attn: View,
    pub mlp: View,
}

/// Appends one encoder layer: `heads` heads of attention within each of the `images` images
/// (unmasked), the residual stream `a.x` updated in place.
pub fn encoder_layer(plan: &mut Plan, w: &EncoderLayer, a: &Activations, heads: usize, images: usize, eps: f32) {
    let width = a.x.cols;
    plan.push(Op::LayerNorm { x: a.x, out: a.h, affine: Some(w.norm1), modulation: None, eps });
    plan.push(Op::Gemm { a: a.h, w: w.qkv.0, bias: Some(w.qkv.1), out: a.qkv, accumulate: false });
    plan.push(Op::Attention {
        q: a.qkv.cols(0, width),
        k: a.qkv.cols(width, width),
        v: a.qkv.cols(2 * width, width),
        out: a.attn,
        heads,
        kv_heads: heads,
        head_dim: width / heads,
        groups: images,
        key_valid: None,
        query_valid: None,
        causal: None,
    });
    plan.push(Op::Gemm { a: a.attn, w: w.out.0, bias: Some(w.out.1), out: a.x, accumulate: true });
    plan.push(Op::LayerNorm { x: a.x, out: a.h, affine: Some(w.norm2), modulation: None, eps });
    plan.push(Op::Gemm { a: a.h, w: w.fc1.0, bias: Some(w.fc1.1), out: a.mlp, accumulate: false });
    plan.push(Op::Activation { x: a.mlp, kind: Activation::GeluTanh });
    plan.push(Op::Gemm { a: a.mlp, w: w.fc2.0, bias: Some(w.fc2.1), out: a.x, accumulate: true });
}

//! Where the plan's buffers live on the device: the element type of each buffer, their places in
//! one arena, and the scratch regions each stream's ops share.

use flashrt_kernels::{DevPtr, Dtype};

use crate::plan::{BufType, HostIo, Op, Plan};

/// Element type of a buffer on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Elem {
    F32,
    Bf16,
    I32,
    U8,
    /// FP8 weights (the products [`super::fp8`] chooses) and their quantized inputs.
    E4m3,
}

impl Elem {
    pub(super) fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::Bf16 => 2,
            Elem::U8 | Elem::E4m3 => 1,
        }
    }

    pub(super) fn dtype(self) -> Option<Dtype> {
        match self {
            Elem::F32 => Some(Dtype::F32),
            Elem::Bf16 => Some(Dtype::Bf16),
            Elem::E4m3 => Some(Dtype::E4m3),
            Elem::I32 | Elem::U8 => None,
        }
    }
}

impl From<Dtype> for Elem {
    fn from(d: Dtype) -> Elem {
        match d {
            Dtype::F32 => Elem::F32,
            Dtype::Bf16 => Elem::Bf16,
            Dtype::E4m3 => Elem::E4m3,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct DeviceBuf {
    pub(super) ptr: DevPtr,
    pub(super) elem: Elem,
    pub(super) len: usize,
}

/// Host inputs copied into the arena at the start of the step (all but the frames, which the
/// preprocessing reads in place: only the pixels it samples cross the bus).
pub(super) fn copied_input(b: &crate::plan::BufferDecl) -> bool {
    b.host == HostIo::Input && b.ty != BufType::U8
}

/// Chooses each buffer's element type from how the plan uses it (see the module docs).
pub(super) fn element_types(plan: &Plan) -> Vec<Elem> {
    let n = plan.buffers.len();
    let (mut wants_bf16, mut needs_f32) = (vec![false; n], vec![false; n]);
    for (i, b) in plan.buffers.iter().enumerate() {
        needs_f32[i] = b.host != HostIo::Internal;
    }
    for op in &plan.ops {
        match *op {
            Op::Gemm { a, out, accumulate, .. } => {
                wants_bf16[a.buf.0] = true;
                needs_f32[out.buf.0] |= accumulate;
            }
            Op::Attention { q, k, v, .. } => [q, k, v].iter().for_each(|v| wants_bf16[v.buf.0] = true),
            Op::RopeQkv { qkv, k_cache, v_cache, .. } => [qkv, k_cache, v_cache].iter().for_each(|v| wants_bf16[v.buf.0] = true),
            Op::Activation { x, .. } => wants_bf16[x.buf.0] = true,
            Op::GatedActivation { gate_up, out, .. } => [gate_up, out].iter().for_each(|v| wants_bf16[v.buf.0] = true),
            Op::ImagePatches { out, .. } | Op::QwenImagePatches { out, .. } => wants_bf16[out.buf.0] = true,
            Op::GatedResidual { x, .. } | Op::AddTable { x, .. } => needs_f32[x.buf.0] = true,
            Op::Positions { valid, .. } => needs_f32[valid.0] = true,
            // The guided Euler step keeps x, dt·v and the previous chunk in f32 (rtc_guide_f32).
            Op::RtcGuide { x, step, prev, .. } => [x, step, prev].iter().for_each(|v| needs_f32[v.buf.0] = true),
            // GR00T's chunk, its prefix and the Euler step stay f32 (rtc_prefix_f32, rtc_euler_f32).
            Op::RtcPrefix { x, prev, .. } => [x, prev].iter().for_each(|v| needs_f32[v.buf.0] = true),
            Op::RtcEuler { x, step, .. } => [x, step].iter().for_each(|v| needs_f32[v.buf.0] = true),
            _ => {}
        }
    }
    plan.buffers
        .iter()
        .enumerate()
        .map(|(i, b)| match b.ty {
            BufType::F32 if wants_bf16[i] && !needs_f32[i] => Elem::Bf16,
            BufType::F32 => Elem::F32,
            BufType::I32 => Elem::I32,
            BufType::U8 => Elem::U8,
        })
        .collect()
}

/// Byte offsets of sub-allocations in one arena, each 256-byte aligned.
#[derive(Default)]
pub(super) struct Layout {
    pub(super) bytes: usize,
}

impl Layout {
    pub(super) fn take(&mut self, bytes: usize) -> usize {
        let at = self.bytes.next_multiple_of(256);
        self.bytes = at + bytes;
        at
    }
}

/// Scratch regions shared by the ops of one stream, which run one after another (each stream
/// has its own set).
pub(super) struct Scratch {
    /// f32 attention scores `[heads, rows, keys]` of the largest attention (per group).
    pub(super) scores: DevPtr,
    /// bf16 probabilities, same shape.
    pub(super) probs: DevPtr,
    /// bf16 copy of an f32 GEMM input.
    pub(super) shadow: DevPtr,
    /// e4m3 copy of an FP8 product's input.
    pub(super) fp8_input: DevPtr,
    /// The same for an FP8 product whose input another FP8 product writes: that product reads
    /// its own input from one of the two regions and writes into the other.
    pub(super) fp8_product_output: DevPtr,
    /// Split partial outputs (f32) and (max, sum) pairs of the fused attention.
    pub(super) attention_o: DevPtr,
    pub(super) attention_ml: DevPtr,
    pub(super) workspace: DevPtr,
    /// The grid barrier word of this stream's streamed MLPs (one runs at a time per stream).
    pub(super) grid_barrier: DevPtr,
}

/// Element counts of one stream's [`Scratch`] regions: the largest use among its ops.
#[derive(Clone, Copy, Default)]
pub(super) struct ScratchSizes {
    pub(super) scores: usize,
    pub(super) shadow: usize,
    pub(super) fp8_input: usize,
    pub(super) fp8_product_output: usize,
    pub(super) attention_o: usize,
    pub(super) attention_ml: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::WeightRole;

    #[test]
    fn residual_streams_stay_f32_and_gemm_inputs_go_bf16() {
        let mut plan = Plan::default();
        let x = plan.matrix("x", 4, 8);
        let h = plan.matrix("h", 4, 8);
        let y = plan.matrix("y", 4, 8);
        let w = plan.weight("w", WeightRole::Matrix { n: 8, k: 8 });
        plan.push(Op::RmsNorm { x, out: h, weight: None, eps: 1e-6 });
        plan.push(Op::Gemm { a: h, w, bias: None, out: x, accumulate: true });
        // `x` is also a GEMM input: it stays f32 (accumulated) and is converted before use.
        plan.push(Op::Gemm { a: x, w, bias: None, out: y, accumulate: false });
        let elems = element_types(&plan);
        assert_eq!(elems, vec![Elem::F32, Elem::Bf16, Elem::F32]);
    }
}

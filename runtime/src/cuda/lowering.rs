//! Lowering: each plan op becomes kernel launches and cuBLASLt products with resolved device
//! addresses, fused with its neighbours where [`super::fusion`] says so.

use std::collections::HashMap;
use std::ops::Range;

use flashrt_kernels::{
    AttentionArgs, DevPtr, Dtype, HEADS_ATTENTION_E4M3, HeadsAttentionArgs, Kernels, Mat, MultiAxis, QwenImageArgs, ROW_PRODUCT_MAX,
    RopeArgs,
};

use super::arena::{DeviceBuf, Elem, Scratch, copied_input};
use super::device::BlasLt;
use super::fp8::{Fp8Products, INVERSE_INPUT_SCALE_AT, INVERSE_OUTPUT_SCALE_AT};
use super::fusion::{AttentionLowering, Fusions};
use super::gemm::{Matmul, MatmulSpec, Operand};
use super::steps::{RopeRows, Schedule, Step};
use super::weights::{SELECTION_PIECE_BYTES, Selections, WeightPtrs};
use crate::error::{Error, Result};
use crate::fp8::ProductScales;
use crate::plan::{Accesses, Activation, BufId, Op, Plan, RopeAxes, RopeSpec, Section, Span, View, WeightId, WeightRole, sections_of};
use crate::qwen_image::Filter;

/// The lowered step: launches, their streams and cross-stream waits, where each plan phase
/// starts among them, and the products.
pub(super) struct Lowered {
    pub(super) steps: Vec<Step>,
    pub(super) schedule: Schedule,
    pub(super) phase_steps: Vec<(String, usize)>,
    pub(super) sections: Vec<Section>,
    pub(super) matmuls: Vec<Matmul>,
}

/// Turns plan ops into steps with resolved device addresses.
pub(super) struct Lowering<'a> {
    pub(super) plan: &'a Plan,
    pub(super) bufs: &'a [DeviceBuf],
    pub(super) lt: &'a BlasLt,
    pub(super) weights: &'a HashMap<(usize, Elem), DevPtr>,
    /// Each lane's scratch regions, and the RoPE tables (read-only, shared).
    pub(super) scratch: &'a [Scratch],
    pub(super) rope: &'a [(RopeSpec, (DevPtr, DevPtr))],
    pub(super) rope_rows: Option<RopeRows>,
    /// The lane of every plan op, and that of the op being lowered.
    pub(super) op_lanes: &'a [usize],
    /// The host-input copy table and its pieces (see [`copied_input`]).
    pub(super) host_inputs: (DevPtr, usize),
    pub(super) lane: usize,
    /// What the fusion passes decided: each attention op's kernel, the streamed MLPs, the early
    /// launches.
    pub(super) fusions: &'a Fusions,
    /// The SMs the streamed MLP's grid is sized for.
    pub(super) multiprocessors: usize,
    /// Working memory of the image ops that resample frames (`QwenImageSizes::scratch_bytes`).
    pub(super) image_scratch: DevPtr,
    /// The plan op being lowered.
    pub(super) op_index: usize,
    /// RoPE (loading its table rows first) and the gated residual norms right after a cuBLASLt
    /// product launched as its programmatic dependents (measured −0.11 ms on the H200;
    /// `Switches::early_launch`).
    pub(super) early_after_products: bool,
    /// The streamed MLPs' weights as that kernel reads them, by weight index and element type.
    pub(super) tiled: &'a WeightPtrs,
    /// The FP8 products with Hopper's fast accumulation, cuBLASLt's and the streamed kernels' (`Switches`).
    pub(super) fp8_fast_accumulation: bool,
    /// The FP8 products' weights: their scales and where the pair is on the device.
    pub(super) fp8: &'a HashMap<usize, (ProductScales, DevPtr)>,
    /// The streamed MLPs and products that run in FP8, with their scales.
    pub(super) fp8_streamed: &'a Fp8Products,
    pub(super) selections: &'a Selections,
    pub(super) steps: Vec<Step>,
    /// For each step: its lane, and what the plan ops it came from read and write.
    pub(super) step_lanes: Vec<usize>,
    pub(super) step_accesses: Vec<Accesses>,
    pub(super) phase_steps: Vec<(String, usize)>,
    /// The prompt bucket of each phase (as `phase_steps`).
    pub(super) phase_buckets: Vec<Option<usize>>,
    pub(super) matmuls: Vec<Matmul>,
    /// The streamed products whose output a gated residual norm lowered before them left zero.
    pub(super) zeroed_outputs: Vec<usize>,
}

impl Lowering<'_> {
    pub(super) fn scratch(&self) -> &Scratch {
        &self.scratch[self.lane]
    }

    /// Whether the step about to be lowered from the current op is launched as the programmatic
    /// dependent of a cuBLASLt product: it directly follows one on its stream and in its phase,
    /// and `early_after_products` is on.
    pub(super) fn early_after_product(&self) -> bool {
        self.early_after_products
            && self.plan.phase_starting_at(self.op_index).is_none()
            && self.step_lanes.last() == Some(&self.lane)
            && matches!(self.steps.last(), Some(Step::Gemm { .. }))
    }

    /// Marks the steps pushed since step `from` as running on `lane` with these accesses.
    pub(super) fn tag(&mut self, from: usize, lane: usize, accesses: Accesses) {
        for _ in from..self.steps.len() {
            self.step_lanes.push(lane);
            self.step_accesses.push(accesses.clone());
        }
    }

    /// Marks the steps pushed since step `from` as the lowering of `ops`: their lane and accesses.
    pub(super) fn tag_steps(&mut self, from: usize, ops: std::ops::Range<usize>) {
        let plan = self.plan;
        let mut accesses = Accesses::default();
        ops.clone().for_each(|i| accesses.extend(plan.ops[i].accesses(&plan.buffers)));
        self.tag(from, self.op_lanes[ops.start], accesses);
    }

    pub(super) fn buf(&self, id: BufId) -> DeviceBuf {
        self.bufs[id.0]
    }

    pub(super) fn ptr(&self, id: BufId) -> DevPtr {
        self.buf(id).ptr
    }

    pub(super) fn mat(&self, v: View) -> Result<Mat> {
        let b = self.buf(v.buf);
        let dtype = b.elem.dtype().ok_or_else(|| self.error(format!("buffer {} is not a float buffer", self.name(v.buf))))?;
        // Checked in every build: a plan is public data, and a view past its buffer would have a
        // kernel read or write device memory it does not own.
        if v.end() > b.len {
            return Err(self.error(format!("view ending at {} is past the end of {} ({} elements)", v.end(), self.name(v.buf), b.len)));
        }
        Ok(Mat { ptr: b.ptr + (v.offset * b.elem.size()) as u64, rows: v.rows, cols: v.cols, stride: v.stride, dtype })
    }

    pub(super) fn name(&self, id: BufId) -> &str {
        &self.plan.buffers[id.0].name
    }

    pub(super) fn weight(&self, id: WeightId, elem: Elem) -> DevPtr {
        self.weights[&(id.0, elem)]
    }

    pub(super) fn error(&self, message: String) -> Error {
        Error::Backend(format!("lowering the plan for CUDA: {message}"))
    }

    pub(super) fn lower(mut self) -> Result<Lowered> {
        let plan = self.plan;
        self.check_selected_weights()?;
        let (pieces, count) = self.host_inputs;
        if count > 0 {
            self.steps.push(Step::CopyHostInputs { pieces, count });
            let writes =
                plan.buffers.iter().enumerate().filter(|(_, b)| copied_input(b)).map(|(i, _)| Span::whole(BufId(i), &plan.buffers));
            self.tag(0, 0, Accesses { reads: Vec::new(), writes: writes.collect() });
        }
        let mut ops = plan.ops.iter().enumerate().peekable();
        while let Some((i, op)) = ops.next() {
            if let Some(phase) = plan.phase_starting_at(i) {
                // The host-input copy belongs to the first phase.
                let first = if self.phase_steps.is_empty() { 0 } else { self.steps.len() };
                let name = match phase.prompt_bucket {
                    Some(b) => format!("{} ({b} slots)", phase.name),
                    None => phase.name.clone(),
                };
                self.phase_steps.push((name, first));
                self.phase_buckets.push(phase.prompt_bucket);
            }
            (self.lane, self.op_index) = (self.op_lanes[i], i);
            let from = self.steps.len();
            // A run of weight selections by one index: one launch over all their pieces.
            if let Op::SelectWeight { index, .. } = *op {
                let mut end = i + 1;
                while matches!(plan.ops.get(end), Some(&Op::SelectWeight { index: next, .. }) if next == index)
                    && plan.phase_starting_at(end).is_none()
                {
                    ops.next();
                    end += 1;
                }
                self.select_weights(i..end, index)?;
                self.tag_steps(from, i..end);
                continue;
            }
            // Fusions at the denoise loop's step boundary: the gated
            // residual, its norm and a narrow product over the norm's rows; a product over a
            // narrow f32 input and the norm of its output. One row kernel each, same phase.
            if let Some(step) = self.step_boundary(i)? {
                let fused = match step {
                    Step::GatedResidualRmsNormProduct { .. } => 3,
                    _ => 2,
                };
                self.steps.push(step);
                for _ in 1..fused {
                    ops.next();
                }
                self.tag_steps(from, i..i + fused);
                continue;
            }
            // Fusion: a gated residual followed by the adaRMS norm of the same stream (same phase).
            if let (Op::GatedResidual { x, y, modulation }, Some((next, Op::AdaRmsNorm { x: nx, out, modulation: norm, eps }))) =
                (op, ops.peek())
            {
                if x == nx && plan.phase_starting_at(*next).is_none() {
                    let early = self.early_after_product();
                    let zeroed_for = self.fusions.zeroes_branch_for(i);
                    let step = Step::GatedResidualRmsNorm {
                        out: self.mat(*out)?,
                        out_scale: 1.0,
                        x: self.mat(*x)?,
                        y: self.mat(*y)?,
                        gate: self.weight(*modulation, Elem::F32),
                        norm: self.weight(*norm, Elem::F32),
                        eps: *eps,
                        zero_y: zeroed_for.is_some(),
                        early,
                    };
                    self.steps.push(step);
                    ops.next();
                    self.tag_steps(from, i..i + 2);
                    if let Some(product) = zeroed_for {
                        // It now writes the branch too: the cross-stream waits must see it.
                        self.step_accesses.last_mut().expect("just tagged").writes.push(y.span());
                        self.zeroed_outputs.push(product);
                    }
                    continue;
                }
            }
            // Fusion: the expert's MLP (product, GeGLU, product) as one streamed launch.
            if self.fusions.mlps.binary_search(&i).is_ok() {
                let (
                    Op::Gemm { a, w: w_gate_up, .. },
                    Some((_, Op::GatedActivation { out: hidden, .. })),
                    Some((_, Op::Gemm { w: w_down, out, .. })),
                ) = (op, ops.next(), ops.next())
                else {
                    return Err(self.error(format!("op {i} is not the first of a product, GeGLU, product sequence")));
                };
                let fp8 = self.fp8_streamed.streamed.get(&i).copied();
                let elem = if fp8.is_some() { Elem::E4m3 } else { Elem::Bf16 };
                let a = match fp8 {
                    Some(scales) if self.fusions.e4m3_mlps.binary_search(&i).is_ok() => {
                        self.e4m3_input(self.mat(*a)?, scales.gate_up.0, None, true)
                    }
                    _ => self.mat(*a)?,
                };
                self.steps.push(Step::StreamedMlp {
                    out: self.mat(*out)?,
                    hidden: self.mat(*hidden)?,
                    a,
                    w_gate_up: self.tiled[&(w_gate_up.0, elem)],
                    w_down: self.tiled[&(w_down.0, elem)],
                    fp8,
                    fast_accumulation: self.fp8_fast_accumulation,
                    barrier: self.scratch().grid_barrier,
                    multiprocessors: self.multiprocessors,
                    programmatic: self.fusions.early_mlps.binary_search(&i).is_ok(),
                });
                self.tag_steps(from, i..i + 3);
                continue;
            }
            // A few-row FP8 product as one streamed launch, a QKV product with its RoPE.
            if let (Op::Gemm { a, w, out, .. }, Some(scales)) = (op, self.fp8_streamed.streamed_products.get(&i)) {
                let programmatic = self.fusions.early_products.binary_search(&i).is_ok();
                if self.fusions.qkv_rope(i).is_some() {
                    let Some((_, rope)) = ops.next() else { unreachable!("`fusion::rope_after` found the RoPE op after it") };
                    let rope = self.rope_args(rope)?;
                    let a = self.e4m3_input(self.mat(*a)?, scales.activation, None, true);
                    self.steps.push(Step::StreamedQkvRope {
                        a,
                        w: self.tiled[&(w.0, Elem::E4m3)],
                        scales: (scales.activation, scales.weight),
                        fast_accumulation: self.fp8_fast_accumulation,
                        rope,
                        multiprocessors: self.multiprocessors,
                        programmatic,
                    });
                    self.tag_steps(from, i..i + 2);
                    continue;
                }
                let merge_fed = self.fusions.merge_fed(i);
                let a = if merge_fed { self.e4m3_input(self.mat(*a)?, scales.activation, None, true) } else { self.mat(*a)? };
                self.steps.push(Step::StreamedProduct {
                    out: self.mat(*out)?,
                    a,
                    w: self.tiled[&(w.0, Elem::E4m3)],
                    barrier: self.scratch().grid_barrier,
                    scales: (scales.activation, scales.weight),
                    fast_accumulation: self.fp8_fast_accumulation,
                    multiprocessors: self.multiprocessors,
                    programmatic: programmatic || merge_fed,
                    out_zeroed: self.zeroed_outputs.contains(&i),
                });
                self.tag_steps(from, i..i + 1);
                continue;
            }
            // Fusion: a product and the tanh GELU over its output (SigLIP's MLP) as cuBLASLt's
            // epilogue (CUBLASLT_EPILOGUE_GELU is the tanh approximation).
            if let (Op::Gemm { a, w, bias, out, accumulate: false }, Some((next, Op::Activation { x, kind: Activation::GeluTanh }))) =
                (op, ops.peek())
            {
                if x == out && plan.phase_starting_at(*next).is_none() {
                    self.gemm(*a, *w, *bias, *out, false, true)?;
                    ops.next();
                    self.tag_steps(from, i..i + 2);
                    continue;
                }
            }
            self.lower_op(op)?;
            self.tag_steps(from, i..i + 1);
        }
        let starts: Vec<(usize, Option<usize>)> = self.phase_steps.iter().map(|p| p.1).zip(self.phase_buckets.iter().copied()).collect();
        let sections = sections_of(&starts, self.steps.len());
        let ranges: Vec<Range<usize>> = sections.iter().map(|s| s.range.clone()).collect();
        let schedule = Schedule::new(self.step_lanes, &self.step_accesses, &ranges);
        Ok(Lowered { steps: self.steps, schedule, phase_steps: self.phase_steps, sections, matmuls: self.matmuls })
    }

    /// Selected weights are rewritten on the main stream, in place: the cross-stream waits follow
    /// buffers only, so every reader of one runs on the main stream too, and none of them is a
    /// streamed MLP (which reads a tiled copy).
    fn check_selected_weights(&self) -> Result<()> {
        let plan = self.plan;
        let selected = plan.selected_weights();
        for (i, op) in plan.ops.iter().enumerate() {
            let involved = matches!(op, Op::SelectWeight { .. }) || op.weights_read().any(|w| selected.contains(&w));
            if involved && self.op_lanes[i] != 0 {
                return Err(self.error(format!("op {i} ({}) selects or reads a selected weight on the second stream", op.name())));
            }
        }
        match selected.iter().find(|w| self.tiled.keys().any(|&(t, _)| t == w.0)) {
            Some(w) => Err(self.error(format!("selected weight {} is read tiled by a streamed MLP", plan.weights[w.0].name))),
            None => Ok(()),
        }
    }

    /// The selections of `ops` (consecutive [`Op::SelectWeight`]s by `index`) as one launch.
    fn select_weights(&mut self, ops: Range<usize>, index: BufId) -> Result<()> {
        let pieces = self.selections.pieces[&ops.start].start..self.selections.pieces[&(ops.end - 1)].end;
        // No piece: nothing reads these weights.
        let Some(memory) = self.selections.memory.as_ref().filter(|_| !pieces.is_empty()) else { return Ok(()) };
        // About 16 KB per block (4 words of 16 bytes per thread), at most 64 blocks per piece.
        let blocks_per_piece = self.selections.largest.div_ceil(256 * 16 * 4).clamp(1, 64);
        self.steps.push(Step::SelectWeights {
            pieces: memory.ptr + pieces.start as u64 * SELECTION_PIECE_BYTES,
            count: pieces.len(),
            blocks_per_piece,
            index: self.ptr(index),
        });
        Ok(())
    }

    /// The step-boundary fusion starting at op `i`, if its ops are there (in one phase) and the
    /// row kernels take their shapes.
    pub(super) fn step_boundary(&self, i: usize) -> Result<Option<Step>> {
        let plan = self.plan;
        let in_phase = |j: usize| j < plan.ops.len() && plan.phase_starting_at(j).is_none();
        // The row kernels read a bf16 weight: an FP8 product's exists only in e4m3.
        let bf16_product = |w: &WeightId| !self.fp8.contains_key(&w.0);
        let narrow_weight = |w: WeightId| match plan.weights[w.0].role {
            WeightRole::Matrix { n, k } => Some((n, k)),
            _ => None,
        };
        match &plan.ops[i..] {
            [
                Op::GatedResidual { x, y, modulation },
                Op::AdaRmsNorm { x: nx, out, modulation: norm, eps },
                Op::Gemm { a, w, bias, out: acc, accumulate },
                ..,
            ] if nx == x && a == out && in_phase(i + 1) && in_phase(i + 2) && acc.cols <= ROW_PRODUCT_MAX && bf16_product(w) => {
                let (x_mat, y_mat, out_mat, acc_mat) = (self.mat(*x)?, self.mat(*y)?, self.mat(*out)?, self.mat(*acc)?);
                // (A narrow product is never a fused MLP's, whose weights may exist only tiled.)
                let (gate, norm, w_ptr) = (self.weight(*modulation, Elem::F32), self.weight(*norm, Elem::F32), self.weight(*w, Elem::Bf16));
                let fits = narrow_weight(*w) == Some((acc.cols, x.cols))
                    && Kernels::gated_residual_rms_norm_product_fits(&out_mat, &x_mat, &y_mat, &[gate, norm, w_ptr], &acc_mat);
                Ok(fits.then(|| Step::GatedResidualRmsNormProduct {
                    out: out_mat,
                    x: x_mat,
                    y: y_mat,
                    gate,
                    norm,
                    eps: *eps,
                    w: w_ptr,
                    bias: bias.map(|b| self.weight(b, Elem::F32)),
                    acc: acc_mat,
                    accumulate: *accumulate,
                }))
            }
            [Op::Gemm { a, w, bias, out: x, accumulate: false }, norm, ..]
                if in_phase(i + 1) && a.cols <= ROW_PRODUCT_MAX && bf16_product(w) =>
            {
                let (nx, out, modulation, eps) = match *norm {
                    Op::AdaRmsNorm { x: nx, out, modulation, eps } => (nx, out, Some(self.weight(modulation, Elem::F32)), eps),
                    Op::RmsNorm { x: nx, out, weight: None, eps } => (nx, out, None, eps),
                    _ => return Ok(None),
                };
                let (a_mat, x_mat, out_mat, w_ptr) = (self.mat(*a)?, self.mat(*x)?, self.mat(out)?, self.weight(*w, Elem::Bf16));
                if nx != *x || [a_mat.dtype, x_mat.dtype] != [Dtype::F32; 2] {
                    return Ok(None);
                }
                // An f32 product's bias is uploaded as f32.
                let bias = bias.map(|b| self.weight(b, Elem::F32));
                let fits = narrow_weight(*w) == Some((x.cols, a.cols))
                    && Kernels::product_rms_norm_fits(&out_mat, &x_mat, &a_mat, &[w_ptr, bias.unwrap_or(0), modulation.unwrap_or(0)]);
                Ok(fits.then_some(Step::ProductRmsNorm { out: out_mat, x: x_mat, a: a_mat, w: w_ptr, bias, modulation, eps }))
            }
            _ => Ok(None),
        }
    }

    pub(super) fn lower_op(&mut self, op: &Op) -> Result<()> {
        let step = match *op {
            Op::ImagePatches { camera, frames, frame_stride, frame_info, size, patch, out } => Step::ImagePatches {
                out: self.mat(out)?,
                frames: self.ptr(frames),
                frame_stride,
                frame_info: self.ptr(frame_info),
                camera,
                size,
                patch,
            },
            Op::Gemm { a, w, bias, out, accumulate } => return self.gemm(a, w, bias, out, accumulate, false),
            Op::AddTable { x, table, table_rows } => Step::AddTable { x: self.mat(x)?, table: self.weight(table, Elem::F32), table_rows },
            Op::LayerNorm { x, out, affine, modulation, eps } => Step::LayerNorm {
                out: self.mat(out)?,
                out_scale: 1.0,
                x: self.mat(x)?,
                affine: affine.map(|(gamma, beta)| (self.weight(gamma, Elem::F32), self.weight(beta, Elem::F32))),
                modulation: modulation.map(|m| self.weight(m, Elem::F32)),
                eps,
            },
            Op::RmsNorm { x, out, weight, eps } => Step::RmsNorm {
                out: self.mat(out)?,
                out_scale: 1.0,
                x: self.mat(x)?,
                heads: 1,
                weight: weight.map(|w| self.weight(w, Elem::F32)),
                modulation: None,
                eps,
            },
            Op::HeadRmsNorm { x, out, heads, weight, eps } => Step::RmsNorm {
                out: self.mat(out)?,
                out_scale: 1.0,
                x: self.mat(x)?,
                heads,
                weight: Some(self.weight(weight, Elem::F32)),
                modulation: None,
                eps,
            },
            Op::AdaRmsNorm { x, out, modulation, eps } => Step::RmsNorm {
                out: self.mat(out)?,
                out_scale: 1.0,
                x: self.mat(x)?,
                heads: 1,
                weight: None,
                modulation: Some(self.weight(modulation, Elem::F32)),
                eps,
            },
            Op::GatedResidual { x, y, modulation } => {
                Step::GatedResidual { x: self.mat(x)?, y: self.mat(y)?, modulation: self.weight(modulation, Elem::F32) }
            }
            Op::Activation { x, kind } => Step::Activation { x: self.mat(x)?, kind },
            Op::GatedActivation { gate_up, out, kind } => {
                let (gate_up, in_scale) = self.gate_up_e4m3(self.mat(gate_up)?);
                Step::GatedActivation { out: self.mat(out)?, out_scale: 1.0, gate_up, in_scale, kind }
            }
            Op::Embed { tokens, table, scale, out } => {
                let WeightRole::Embedding { vocab, width } = self.plan.weights[table.0].role else {
                    return Err(self.error(format!("embed table {} is not an embedding", self.plan.weights[table.0].name)));
                };
                if width != out.cols {
                    return Err(self.error(format!("embedding width {width} for a {}-wide output", out.cols)));
                }
                Step::Embed { out: self.mat(out)?, tokens: self.ptr(tokens), table: self.weight(table, Elem::Bf16), vocab, scale }
            }
            Op::Positions { frame_info, cameras, tokens_per_image, token_mask, prompt_len, suffix, valid, positions } => Step::Positions {
                valid: self.ptr(valid),
                positions: self.ptr(positions),
                frame_info: self.ptr(frame_info),
                cameras,
                tokens_per_image,
                token_mask: self.ptr(token_mask),
                prompt_len,
                suffix,
                rope_rows: self.rope_rows.filter(|r| r.positions == positions),
            },
            Op::RopeQkv { .. } => {
                let rope = self.rope_args(op)?;
                Step::Rope(RopeArgs { early: rope.multi_axis.is_none() && self.early_after_product(), ..rope })
            }
            Op::Attention { q, k, v, out, heads, kv_heads, head_dim, groups, key_valid, query_valid, causal } => {
                return self.attention(q, k, v, out, [heads, kv_heads, head_dim, groups], key_valid, query_valid, causal);
            }
            Op::Copy { src, dst } => Step::Copy { dst: self.mat(dst)?, src: self.mat(src)? },
            Op::ScatterRows { src, index, dst, accumulate } => {
                Step::ScatterRows { dst: self.mat(dst)?, src: self.mat(src)?, index: self.ptr(index), accumulate }
            }
            Op::QwenImagePatches { camera, frames, frame_stride, frame_info, max_width, max_height, image, out } => {
                if self.lane != 0 {
                    return Err(self.error("qwen_image_patches shares one scratch region: it runs on the main stream only".into()));
                }
                Step::QwenImagePatches(QwenImageArgs {
                    out: self.mat(out)?,
                    frames: self.ptr(frames),
                    frame_stride,
                    frame_info: self.ptr(frame_info),
                    camera,
                    max_width,
                    max_height,
                    edge: image.edge,
                    target: image.target,
                    crop_fraction: image.crop_fraction,
                    letterbox: image.letterbox,
                    patch: image.patch,
                    area: image.filter == Filter::Cv2Area,
                    scratch: self.image_scratch,
                })
            }
            Op::Affine { x, scale, offset, out } => Step::Affine {
                out: self.mat(out)?,
                x: self.mat(x)?,
                scale: self.weight(scale, Elem::F32),
                offset: self.weight(offset, Elem::F32),
            },
            Op::RtcGuide { x, step, prev, weights, shift, cols, t, dt, guidance } => Step::RtcGuide {
                x: self.mat(x)?,
                step: self.mat(step)?,
                prev: self.mat(prev)?,
                weights: self.ptr(weights),
                shift: self.ptr(shift),
                prefix_cols: cols,
                scalars: (t, dt, guidance),
            },
            Op::RtcPrefix { x, prev, prefix, cols } => {
                Step::RtcPrefix { x: self.mat(x)?, prev: self.mat(prev)?, prefix: self.ptr(prefix), prefix_cols: cols }
            }
            Op::RtcEuler { x, step, strength } => Step::RtcEuler { x: self.mat(x)?, step: self.mat(step)?, strength: self.ptr(strength) },
            Op::PromptBucket { token_mask } => {
                Step::PromptBucket { token_mask: self.ptr(token_mask), prompt_len: self.buf(token_mask).len }
            }
            Op::SelectWeight { .. } => unreachable!("weight selections are lowered in runs (`lower`)"),
        };
        self.steps.push(step);
        Ok(())
    }

    /// Adds a product; if cuBLASLt has no batched algorithm for it, one product per batch entry.
    pub(super) fn matmul(&mut self, spec: MatmulSpec) -> Result<()> {
        let lt = self.lt.0;
        match Matmul::new(lt, spec) {
            Ok(m) => {
                self.steps.push(Step::Gemm { matmul: self.matmuls.len(), workspace: self.scratch().workspace });
                self.matmuls.push(m);
            }
            Err(why) if spec.batch > 1 => {
                log::warn!("{why}; issuing the {} batch entries one by one", spec.batch);
                for i in 0..spec.batch {
                    let m = Matmul::new(lt, spec.entry(i)).map_err(|e| self.error(e))?;
                    self.steps.push(Step::Gemm { matmul: self.matmuls.len(), workspace: self.scratch().workspace });
                    self.matmuls.push(m);
                }
            }
            Err(why) => return Err(self.error(why)),
        }
        Ok(())
    }

    /// The RoPE op `op`'s arguments (launched plainly): the gathered table rows where the plan
    /// has them, else the tables and positions.
    fn rope_args(&self, op: &Op) -> Result<RopeArgs> {
        let Op::RopeQkv { qkv, heads, kv_heads, head_dim, theta, axes, positions, position_offset, k_cache, v_cache, cache_row } = *op
        else {
            return Err(self.error(format!("op {} ({}) is not a RoPE", self.op_index, op.name())));
        };
        let halves = matches!(axes, RopeAxes::Rows2d { .. });
        let Some(&(_, tables)) = self.rope.iter().find(|(spec, _)| spec.serves(theta, head_dim, halves)) else {
            unreachable!("a table per RoPE spec of the plan")
        };
        let multi_axis = match axes {
            RopeAxes::Single => None,
            RopeAxes::Interleaved { sections, slots } => Some(MultiAxis::Interleaved { slots, height: sections[1], width: sections[2] }),
            RopeAxes::Rows2d { slots } => Some(MultiAxis::Rows2d { slots }),
        };
        // The gathered rows exist only for a plan with one table (this one), single-axis.
        let rows = self.rope_rows.filter(|r| r.positions == positions && multi_axis.is_none());
        let (positions, (cos, sin)) = match rows {
            Some(r) => (None, r.rows),
            None => (Some(self.ptr(positions)), tables),
        };
        Ok(RopeArgs {
            qkv: self.mat(qkv)?,
            heads,
            kv_heads,
            head_dim,
            positions,
            position_offset,
            k_cache: self.mat(k_cache)?,
            v_cache: self.mat(v_cache)?,
            cache_row,
            cos,
            sin,
            early: false,
            multi_axis,
        })
    }

    /// The current FP8 product's input `a` in e4m3 with its calibrated scale (from f32 or bf16
    /// alike), in the lane's FP8 input scratch: with `from_producer` (a fusion pass found that
    /// nothing else reads `a`) written so by the norm, gated activation, attention (its split
    /// merge, or the heads kernel where it has an e4m3 form) or FP8 product (with its GELU, into
    /// the scratch region it does not read) just before when that step writes `a`, else quantized
    /// by a launch of its own. `scales_at`: a cuBLASLt product's device scales
    /// (`Fp8Products::upload_scales`), which a product before it needs to write e4m3.
    fn e4m3_input(&mut self, a: Mat, activation_scale: f32, scales_at: Option<DevPtr>, from_producer: bool) -> Mat {
        let quantized = Mat { ptr: self.scratch().fp8_input, rows: a.rows, cols: a.cols, stride: a.cols, dtype: Dtype::E4m3 };
        let inverse_scale = 1.0 / activation_scale;
        let from_product = from_producer && self.fusions.e4m3_from_products.binary_search(&self.op_index).is_ok();
        if let (true, Some(&Step::Gemm { matmul, .. }), Some(at)) = (from_product, self.steps.last(), scales_at) {
            // That product reads its own e4m3 input from one scratch region: it writes the other.
            let reads = self.matmuls[matmul].spec().b.ptr;
            let region = [self.scratch().fp8_input, self.scratch().fp8_product_output].into_iter().find(|&r| r != reads);
            let quantized = Mat { ptr: region.expect("two regions"), ..quantized };
            if self.writes_e4m3(matmul, a, quantized, at + INVERSE_INPUT_SCALE_AT) {
                return quantized;
            }
        }
        match self.steps.last_mut() {
            Some(
                Step::LayerNorm { out, out_scale, .. }
                | Step::RmsNorm { out, out_scale, .. }
                | Step::GatedResidualRmsNorm { out, out_scale, .. }
                | Step::GatedActivation { out, out_scale, .. },
            ) if from_producer && *out == a => (*out, *out_scale) = (quantized, inverse_scale),
            Some(Step::FusedAttention(args)) if from_producer && args.out == a && args.split.splits > 1 => {
                (args.out, args.out_scale) = (quantized, inverse_scale)
            }
            Some(Step::HeadsAttention(args)) if from_producer && args.out == a && HEADS_ATTENTION_E4M3.contains(&args.head_dim) => {
                (args.out, args.out_scale) = (quantized, inverse_scale)
            }
            _ => self.steps.push(Step::QuantizeE4m3 { dst: quantized, src: a, inverse_scale }),
        }
        quantized
    }

    /// Whether cuBLASLt product `matmul`, an FP8 one writing exactly `a`, now writes `quantized`
    /// instead, in e4m3, times the f32 at `d_scale` (its D scale: the inverse scale of the FP8
    /// input or output it writes). cuBLASLt may have no algorithm for that form; the product then
    /// stays as it was.
    fn writes_e4m3(&mut self, matmul: usize, a: Mat, quantized: Mat, d_scale: DevPtr) -> bool {
        let spec = *self.matmuls[matmul].spec();
        let writes_a =
            spec.d.ptr == a.ptr && spec.d.dtype == a.dtype && (spec.d.rows, spec.d.cols, spec.d.ld) == (a.cols, a.rows, a.stride);
        if spec.scales.is_none() || spec.beta != 0.0 || spec.batch != 1 || !writes_a {
            return false;
        }
        let d = Operand { ptr: quantized.ptr, dtype: Dtype::E4m3, ld: quantized.stride, ..spec.d };
        match Matmul::new(self.lt.0, MatmulSpec { d, d_scale: Some(d_scale), ..spec }) {
            Ok(m) => {
                self.matmuls[matmul] = m;
                true
            }
            Err(why) => {
                log::warn!("{why}: the product keeps its bf16 output");
                false
            }
        }
    }

    /// The gated activation's input `gate_up`, and the scale it is read with: where the op before
    /// is an FP8 product with an output scale (`ProductScales::output`, given only where that
    /// activation alone reads its output: `Plan::gated_output_weights`), its cuBLASLt product now
    /// writes it in e4m3 (times the inverse output scale) into the same memory, read times that
    /// scale; else as it was, times 1.
    fn gate_up_e4m3(&mut self, gate_up: Mat) -> (Mat, f32) {
        let previous = self.op_index.checked_sub(1).map(|i| &self.plan.ops[i]);
        let (Some(&Op::Gemm { w, .. }), Some(&Step::Gemm { matmul, .. })) = (previous, self.steps.last()) else {
            return (gate_up, 1.0);
        };
        let Some(&(ProductScales { output: Some(scale), .. }, at)) = self.fp8.get(&w.0) else { return (gate_up, 1.0) };
        let quantized = Mat { dtype: Dtype::E4m3, stride: gate_up.cols, ..gate_up };
        if self.writes_e4m3(matmul, gate_up, quantized, at + INVERSE_OUTPUT_SCALE_AT) {
            return (quantized, scale);
        }
        log::warn!("op {}: the gate/up product writes bf16 (the CPU emulation rounds it through e4m3)", self.op_index - 1);
        (gate_up, 1.0)
    }

    /// `out (+)= a · wᵀ (+ bias)`: see the column-major mapping in `gemm.rs`.
    pub(super) fn gemm(&mut self, a: View, w: WeightId, bias: Option<WeightId>, out: View, accumulate: bool, gelu: bool) -> Result<()> {
        let WeightRole::Matrix { n, k } = self.plan.weights[w.0].role else {
            return Err(self.error(format!("GEMM weight {} is not a matrix", self.plan.weights[w.0].name)));
        };
        if a.cols != k || out.cols != n || a.rows != out.rows {
            return Err(self.error(format!("GEMM {}x{} · [{n}, {k}]ᵀ into {}x{}", a.rows, a.cols, out.rows, out.cols)));
        }
        let mut a_mat = self.mat(a)?;
        let fp8 = self.fp8.get(&w.0).copied();
        if let Some((scales, at)) = fp8 {
            let from_producer = self.fusions.e4m3_producers.binary_search(&self.op_index).is_ok();
            a_mat = self.e4m3_input(a_mat, scales.activation, Some(at), from_producer);
        } else if a_mat.dtype == Dtype::F32 {
            let shadow = Mat { ptr: self.scratch().shadow, rows: a.rows, cols: a.cols, stride: a.cols, dtype: Dtype::Bf16 };
            self.steps.push(Step::Copy { dst: shadow, src: a_mat });
            a_mat = shadow;
        }
        let d = self.mat(out)?;
        let (w_elem, bias_elem) = if fp8.is_some() { (Elem::E4m3, Elem::Bf16) } else { (Elem::Bf16, Elem::from(d.dtype)) };
        let spec = MatmulSpec {
            a: Operand { ptr: self.weight(w, w_elem), dtype: a_mat.dtype, rows: k, cols: n, ld: k, transpose: true, batch_stride: 0 },
            b: Operand { ptr: a_mat.ptr, dtype: a_mat.dtype, rows: k, cols: a.rows, ld: a_mat.stride, transpose: false, batch_stride: 0 },
            d: Operand { ptr: d.ptr, dtype: d.dtype, rows: n, cols: out.rows, ld: d.stride, transpose: false, batch_stride: 0 },
            batch: 1,
            alpha: 1.0,
            beta: if accumulate { 1.0 } else { 0.0 },
            bias: bias.map(|b| self.weight(b, bias_elem)),
            gelu,
            scales: fp8.map(|(_, at)| at),
            d_scale: None,
            fast_accumulation: self.fp8_fast_accumulation,
        };
        self.matmul(spec)
    }

    /// Softmax attention as two batched cuBLASLt products around the masked softmax kernel, one
    /// group (camera) at a time: `S_h = Q_h Kᵀ / √d` (f32), `P = softmax(S)` (bf16),
    /// `O_h = P_h V` written into head h's columns of `out`. Heads batch with stride `head_dim`;
    /// with one K/V head (multi-query) K and V are broadcast (batch stride 0). Queries marked
    /// invalid get zero probabilities, hence a zero output row, as on the CPU.
    #[allow(clippy::too_many_arguments)] // the op's own fields, one to one
    pub(super) fn attention(
        &mut self,
        q: View,
        k: View,
        v: View,
        out: View,
        [heads, kv_heads, head_dim, groups]: [usize; 4],
        key_valid: Option<BufId>,
        query_valid: Option<BufId>,
        causal: Option<usize>,
    ) -> Result<()> {
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(self.error(format!("{heads} query heads over {kv_heads} K/V heads: the K/V heads must divide the query heads")));
        }
        let (qs, ks, vs) = (self.mat(q)?, self.mat(k)?, self.mat(v)?);
        if [qs.dtype, ks.dtype, vs.dtype] != [Dtype::Bf16; 3] {
            return Err(self.error(format!("attention operands must be bf16, got {:?}/{:?}/{:?}", qs.dtype, ks.dtype, vs.dtype)));
        }
        match self.fusions.attention(self.op_index) {
            AttentionLowering::ActionTokens(split) => {
                self.steps.push(Step::FusedAttention(AttentionArgs {
                    q: qs,
                    k: ks,
                    v: vs,
                    out: self.mat(out)?,
                    out_scale: 1.0,
                    heads,
                    key_valid: key_valid.map(|b| self.ptr(b)),
                    query_valid: query_valid.map(|b| self.ptr(b)),
                    split,
                    partial_o: self.scratch().attention_o,
                    partial_ml: self.scratch().attention_ml,
                    keys_ready: self
                        .fusions
                        .early_attentions
                        .binary_search_by_key(&self.op_index, |e| e.0)
                        .ok()
                        .map(|e| self.fusions.early_attentions[e].1),
                }));
                return Ok(());
            }
            AttentionLowering::Heads => {
                self.steps.push(Step::HeadsAttention(HeadsAttentionArgs {
                    out: self.mat(out)?,
                    q: qs,
                    k: ks,
                    v: vs,
                    heads,
                    kv_heads,
                    head_dim,
                    groups,
                    key_valid: key_valid.map(|b| self.ptr(b)),
                    query_valid: query_valid.map(|b| self.ptr(b)),
                    causal,
                    out_scale: 1.0,
                }));
                return Ok(());
            }
            AttentionLowering::Products => {}
        }
        // The general path: per group, scores = Q·Kᵀ and out = P·V as batched cuBLASLt products
        // around the masked softmax. One batch over all heads when each has its own K/V head;
        // otherwise one batch per K/V head over the query heads that share it (grouped-query; a
        // single batch for multi-query).
        let (rows, keys) = (q.rows / groups, k.rows / groups);
        let (batches, per_batch, kv_stride) = if kv_heads == heads { (1, heads, head_dim) } else { (kv_heads, heads / kv_heads, 0) };
        let bf16 = |elements: usize| (elements * 2) as u64;
        for g in 0..groups {
            let (qg, kg, vg, og) = (
                self.mat(q.rows(g * rows, rows))?,
                self.mat(k.rows(g * keys, keys))?,
                self.mat(v.rows(g * keys, keys))?,
                self.mat(out.rows(g * rows, rows))?,
            );
            let (scores, probs) = (self.scratch().scores, self.scratch().probs);
            // Batch `b` takes query heads `b·per_batch..` and (grouped) K/V head `b`; scores and
            // probabilities are `[head][query][key]` either way.
            for b in 0..batches {
                let head0 = b * per_batch;
                self.matmul(MatmulSpec {
                    a: Operand {
                        ptr: kg.ptr + bf16(b * head_dim),
                        dtype: Dtype::Bf16,
                        rows: head_dim,
                        cols: keys,
                        ld: kg.stride,
                        transpose: true,
                        batch_stride: kv_stride,
                    },
                    b: Operand {
                        ptr: qg.ptr + bf16(head0 * head_dim),
                        dtype: Dtype::Bf16,
                        rows: head_dim,
                        cols: rows,
                        ld: qg.stride,
                        transpose: false,
                        batch_stride: head_dim,
                    },
                    d: Operand {
                        ptr: scores + (head0 * rows * keys * 4) as u64,
                        dtype: Dtype::F32,
                        rows: keys,
                        cols: rows,
                        ld: keys,
                        transpose: false,
                        batch_stride: rows * keys,
                    },
                    batch: per_batch,
                    alpha: 1.0 / (head_dim as f32).sqrt(),
                    beta: 0.0,
                    bias: None,
                    gelu: false,
                    scales: None,
                    d_scale: None,
                    fast_accumulation: false,
                })?;
            }
            let key_valid = key_valid.map(|b| self.ptr(b) + (g * keys * 4) as u64);
            let query_valid = query_valid.map(|b| self.ptr(b) + (g * rows * 4) as u64);
            self.steps.push(Step::Softmax { p: probs, s: scores, rows: heads * rows, queries: rows, keys, key_valid, query_valid, causal });
            for b in 0..batches {
                let head0 = b * per_batch;
                self.matmul(MatmulSpec {
                    a: Operand {
                        ptr: vg.ptr + bf16(b * head_dim),
                        dtype: Dtype::Bf16,
                        rows: head_dim,
                        cols: keys,
                        ld: vg.stride,
                        transpose: false,
                        batch_stride: kv_stride,
                    },
                    b: Operand {
                        ptr: probs + bf16(head0 * rows * keys),
                        dtype: Dtype::Bf16,
                        rows: keys,
                        cols: rows,
                        ld: keys,
                        transpose: false,
                        batch_stride: rows * keys,
                    },
                    d: Operand {
                        ptr: og.ptr + (head0 * head_dim * og.dtype.size()) as u64,
                        dtype: og.dtype,
                        rows: head_dim,
                        cols: rows,
                        ld: og.stride,
                        transpose: false,
                        batch_stride: head_dim,
                    },
                    batch: per_batch,
                    alpha: 1.0,
                    beta: 0.0,
                    bias: None,
                    gelu: false,
                    scales: None,
                    d_scale: None,
                    fast_accumulation: false,
                })?;
            }
        }
        Ok(())
    }
}

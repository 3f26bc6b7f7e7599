//! The lowered step on its streams: enqueuing it eagerly (the warm-up) or into the CUDA graph that
//! every step launches, its prompt buckets as conditional nodes.

use std::cell::Cell;
use std::ops::Range;

use cudarc::driver::{result, sys};
use flashrt_kernels::{Kernels, MAX_PROMPT_BUCKETS};

use super::device::{BlasLt, CapturedGraph, Event, Graph, Stream, capture_if, check, conditional_handle};
use super::gemm::Matmul;
use super::steps::{Schedule, Step};
use crate::error::{Error, Result};
use crate::plan::{Activation, Section};

/// The lowered step and everything that enqueues it: the kernels, the products, both streams and
/// the events between them.
pub(super) struct Launcher {
    /// The main stream (highest priority: it carries the critical path), and the second one a
    /// concurrent phase runs on (lowest priority), forked from and joined back into the main one.
    pub(super) stream: Stream,
    pub(super) side: Stream,
    pub(super) fork: Event,
    pub(super) join: Event,
    pub(super) lt: BlasLt,
    pub(super) kernels: Kernels,
    pub(super) steps: Vec<Step>,
    /// `(phase name, first step)` for each plan phase, in order.
    pub(super) phase_steps: Vec<(String, usize)>,
    /// The steps as runs with the same prompt bucket (`None`: every step runs them).
    pub(super) sections: Vec<Section>,
    /// The plan's prompt buckets (slot counts), ascending.
    pub(super) prompt_buckets: Vec<usize>,
    /// The IF-node handles of the prompt buckets while the step's graph is captured (zero
    /// otherwise: `Step::PromptBucket` launches only into that graph).
    pub(super) bucket_handles: Cell<[u64; MAX_PROMPT_BUCKETS]>,
    pub(super) matmuls: Vec<Matmul>,
    /// The main stream's cuBLASLt workspace (GEMM tuning runs there).
    pub(super) workspace: flashrt_kernels::DevPtr,
    pub(super) schedule: Schedule,
    /// The events of the cross-stream waits ([`Schedule::event_of`]).
    pub(super) events: Vec<Event>,
    /// The context the conditional nodes are created in (owned by the backend).
    pub(super) ctx: sys::CUcontext,
}

impl Launcher {
    pub(super) fn synchronize(&self, what: &str) -> Result<()> {
        // SAFETY: the stream belongs to this launcher.
        check(what, unsafe { result::stream::synchronize(self.stream.0) })
    }

    /// Enqueues every step eagerly, every prompt bucket's included (the warm-up: each kernel and
    /// product runs once before capture).
    pub(super) fn issue_all(&self) -> Result<()> {
        self.sections.iter().try_for_each(|s| self.issue_steps(s.range.clone()))
    }

    /// Enqueues `steps` (eagerly, or into a graph under capture) on their lanes' streams, each
    /// after the events of its cross-stream waits. If some run on the second stream, it forks from
    /// the main one first and joins it at the end (a capture must end with every stream joined).
    pub(super) fn issue_steps(&self, steps: Range<usize>) -> Result<()> {
        let concurrent = self.schedule.concurrent(steps.clone());
        if concurrent {
            self.fork.record(self.stream.0)?;
            self.fork.wait(self.side.0)?;
        }
        for i in steps {
            let stream = if self.schedule.lanes[i] == 0 { self.stream.0 } else { self.side.0 };
            for &j in &self.schedule.waits[i] {
                self.events[self.schedule.event_of[j].expect("a waited-for step has an event")].wait(stream)?;
            }
            // SAFETY: every pointer in a step was resolved at lowering time into this backend's
            // arena, weights or pinned buffers, all alive as long as `self`.
            unsafe { self.issue(&self.steps[i], stream) }?;
            if let Some(e) = self.schedule.event_of[i] {
                self.events[e].record(stream)?;
            }
        }
        if concurrent {
            self.join.record(self.side.0)?;
            self.join.wait(self.stream.0)?;
        }
        Ok(())
    }

    /// Captures the step's graph. With prompt buckets, each bucket's steps become the body of an
    /// IF node that `Step::PromptBucket` switches on for the bucket the prompt needs; if the
    /// driver has no conditional nodes (before CUDA 12.3), every step computes the whole prompt.
    pub(super) fn capture(&self) -> Result<Graph> {
        let Some(&full) = self.prompt_buckets.last() else {
            return Graph::capture(self.stream.0, || self.issue_all());
        };
        let bucketed = self.capture_bucketed();
        self.bucket_handles.set([0; MAX_PROMPT_BUCKETS]);
        bucketed.or_else(|e| {
            log::warn!("prompt buckets off, every step computes all {full} prompt slots: {e}");
            Graph::capture(self.stream.0, || {
                self.sections
                    .iter()
                    .filter(|s| s.prompt_bucket.is_none_or(|b| b == full))
                    .try_for_each(|s| self.issue_steps(s.range.clone()))
            })
        })
    }

    pub(super) fn capture_bucketed(&self) -> Result<Graph> {
        let bodies: Vec<CapturedGraph> = self
            .sections
            .iter()
            .filter(|s| s.prompt_bucket.is_some())
            .map(|s| CapturedGraph::capture(self.stream.0, || self.issue_steps(s.range.clone())))
            .collect::<Result<_>>()?;
        if bodies.len() != self.prompt_buckets.len() || bodies.len() > MAX_PROMPT_BUCKETS {
            return Err(Error::Backend(format!("{} bucket sections for buckets {:?}", bodies.len(), self.prompt_buckets)));
        }
        let graph = Graph::capture(self.stream.0, || {
            let mut handles = [0; MAX_PROMPT_BUCKETS];
            for h in &mut handles[..bodies.len()] {
                *h = conditional_handle(self.stream.0, self.ctx)?;
            }
            self.bucket_handles.set(handles);
            let mut bodies = bodies.iter().zip(handles);
            for s in &self.sections {
                match s.prompt_bucket {
                    None => self.issue_steps(s.range.clone())?,
                    Some(_) => {
                        let (body, handle) = bodies.next().expect("one body per bucket");
                        capture_if(self.stream.0, self.ctx, handle, body)?;
                    }
                }
            }
            Ok(())
        })?;
        log::info!("prompt buckets {:?}: each one's phases as a conditional body", self.prompt_buckets);
        Ok(graph)
    }

    /// Enqueues one step on stream `s`.
    pub(super) unsafe fn issue(&self, step: &Step, s: sys::CUstream) -> Result<()> {
        let k = &self.kernels;
        // SAFETY (whole block): see `issue_all`.
        let r = unsafe {
            match *step {
                Step::Gemm { matmul, workspace } => return self.matmuls[matmul].launch(self.lt.0, workspace, s).map_err(Error::Backend),
                Step::Copy { dst, src } => k.copy(dst, src, s),
                Step::QuantizeE4m3 { dst, src, inverse_scale } => k.quantize_e4m3(dst, src, inverse_scale, s),
                Step::QwenImagePatches(ref args) => k.qwen_image_patches(args, s),
                Step::ScatterRows { dst, src, index, accumulate } => k.scatter_rows(dst, src, index, accumulate, s),
                Step::CopyHostInputs { pieces, count } => k.copy_host_inputs(pieces, count, s),
                Step::SelectWeights { pieces, count, blocks_per_piece, index } => {
                    k.select_weights(pieces, count, blocks_per_piece, index, s)
                }
                Step::ImagePatches { out, frames, frame_stride, frame_info, camera, size, patch } => {
                    k.image_patches(out, frames, frame_stride, frame_info, camera, size, patch, s)
                }
                Step::AddTable { x, table, table_rows } => k.add_table(x, table, table_rows, s),
                Step::LayerNorm { out, out_scale, x, affine, modulation, eps } => {
                    k.layer_norm(out, out_scale, x, affine, modulation, eps, s)
                }
                Step::RmsNorm { out, out_scale, x, heads, weight, modulation, eps } => {
                    k.rms_norm(out, out_scale, x, heads, weight, modulation, eps, s)
                }
                Step::GatedResidual { x, y, modulation } => k.gated_residual(x, y, modulation, s),
                Step::GatedResidualRmsNorm { out, out_scale, x, y, gate, norm, eps, zero_y, early } => {
                    k.gated_residual_rms_norm(out, x, y, gate, norm, eps, out_scale, zero_y, early, s)
                }
                Step::GatedResidualRmsNormProduct { out, x, y, gate, norm, eps, w, bias, acc, accumulate } => {
                    k.gated_residual_rms_norm_product((out, x, y), gate, norm, eps, w, bias, (acc, accumulate), s)
                }
                Step::ProductRmsNorm { out, x, a, w, bias, modulation, eps } => k.product_rms_norm(out, x, a, w, bias, modulation, eps, s),
                Step::Activation { x, kind } => k.activation(x, activation_code(kind), s),
                Step::GatedActivation { out, out_scale, gate_up, in_scale, kind } => {
                    k.gated_activation(out, out_scale, gate_up, in_scale, activation_code(kind), s)
                }
                Step::StreamedMlp { out, hidden, a, w_gate_up, w_down, barrier, fp8, fast_accumulation, multiprocessors, programmatic } => {
                    k.mlp_stream(out, hidden, a, w_gate_up, w_down, barrier, fp8, fast_accumulation, multiprocessors, programmatic, s)
                }
                Step::StreamedProduct { out, a, w, barrier, scales, fast_accumulation, multiprocessors, programmatic, out_zeroed } => {
                    k.product_stream(out, a, w, barrier, scales, fast_accumulation, multiprocessors, programmatic, out_zeroed, s)
                }
                Step::StreamedQkvRope { a, w, scales, fast_accumulation, ref rope, multiprocessors, programmatic } => {
                    k.qkv_rope_stream(a, w, scales, fast_accumulation, rope, multiprocessors, programmatic, s)
                }
                Step::Embed { out, tokens, table, vocab, scale } => k.embed(out, tokens, table, vocab, scale, s),
                Step::Positions { valid, positions, frame_info, cameras, tokens_per_image, token_mask, prompt_len, suffix, rope_rows } => k
                    .positions(valid, positions, frame_info, cameras, tokens_per_image, token_mask, prompt_len, suffix, s)
                    .and_then(|_| match rope_rows {
                        Some(r) => k.rope_rows_gather(r.rows.0, r.rows.1, positions, r.slots, r.tables.0, r.tables.1, r.half, s),
                        None => Ok(()),
                    }),
                Step::Rope(ref args) => k.rope_qkv(args, s),
                Step::FusedAttention(ref args) => k.attention_mq256(args, s),
                Step::HeadsAttention(ref args) => k.attention_heads(args, s),
                Step::Softmax { p, s: scores, rows, queries, keys, key_valid, query_valid, causal } => {
                    k.softmax_rows(p, scores, (rows, queries, keys), key_valid, query_valid, causal, s)
                }
                Step::Affine { out, x, scale, offset } => k.affine(out, x, scale, offset, s),
                Step::RtcGuide { x, step, prev, weights, shift, prefix_cols, scalars } => {
                    k.rtc_guide(x, step, prev, weights, shift, prefix_cols, scalars, s)
                }
                Step::RtcPrefix { x, prev, prefix, prefix_cols } => k.rtc_prefix(x, prev, prefix, prefix_cols, s),
                Step::RtcEuler { x, step, strength } => k.rtc_euler(x, step, strength, s),
                Step::PromptBucket { token_mask, prompt_len } => {
                    let buckets = &self.prompt_buckets;
                    let handles = self.bucket_handles.get();
                    if handles[0] == 0 {
                        return Ok(());
                    }
                    k.prompt_bucket(token_mask, prompt_len, buckets, &handles[..buckets.len()], s)
                }
            }
        };
        r.map_err(|e| Error::Backend(e.to_string()))
    }
}

/// The kernels' code of an activation (`ACT_*` in elementwise.cu).
fn activation_code(kind: Activation) -> i32 {
    match kind {
        Activation::GeluTanh => 0,
        Activation::GeluErf => 1,
        Activation::Silu => 2,
        Activation::Relu => 3,
    }
}

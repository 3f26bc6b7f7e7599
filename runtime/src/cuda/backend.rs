//! The CUDA backend: executes the same [`Plan`] as the CPU backend, in bf16 with f32
//! accumulation, as ONE captured CUDA graph per step.
//!
//! At open: kernels are compiled (or read from the cubin cache) for the device, weights are
//! uploaded once through pinned staging (GEMM matrices and the embedding in bf16, vectors in f32),
//! every activation gets a fixed place in one device arena, each plan op is lowered to kernel
//! launches and cuBLASLt products whose descriptors and algorithms are chosen here, the lowered
//! step runs once eagerly (warm-up: lazy module loads, cuBLASLt kernel selection) and is then
//! captured into a graph. The host buffers live in mapped pinned memory: the kernels write the
//! actions there and read the frames there; the other host inputs are copied into the arena by
//! one kernel at the start of the step (no copy nodes).
//! `run` is one graph launch and one stream synchronisation: no allocation, no driver call that
//! depends on the data. A plan's prompt buckets become conditional (IF) nodes of that graph,
//! switched on the device by the prompt's token mask (`CudaBackend::capture`).
//!
//! Element types: a plan buffer lives in bf16 when it feeds a GEMM, attention or an element-wise
//! op between GEMMs, and in f32 when it is a residual stream (accumulated into), a host buffer or
//! a flag vector. A buffer that is both (the action state `x_t`: accumulated by the Euler step,
//! read by `action_in_proj`) stays f32 and is converted into a bf16 shadow before the GEMM.
//!
//! Lowering fuses adjacent ops where the result is the same: a gated residual and the next
//! adaRMS norm of the same stream (one kernel), a product and the GELU over its output
//! (cuBLASLt's GELU epilogue), few-query multi-query attention (one flash-attention kernel) and
//! SigLIP's per-camera attention (one kernel per layer).
//!
//! Camera frames in particular are not copied: the preprocessing kernel reads the caller's staged
//! u8 pixels straight from mapped pinned memory, so only the pixels it samples cross the bus,
//! whatever the configured maximum frame size.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{result, sys};
use flashrt_kernels::{AttentionArgs, AttentionSplit, DevPtr, Dtype, Kernels, MAX_PROMPT_BUCKETS, Mat, ROW_PRODUCT_MAX, RopeArgs};

use super::device::{
    BlasLt, CapturedGraph, Context, DeviceMemory, Event, Graph, Pinned, Stream, capture_if, check, conditional_handle, time_replays,
};
use super::gemm::{Matmul, MatmulSpec, Operand, WORKSPACE_BYTES};
use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::plan::{Accesses, BufId, BufType, HostIo, Op, Plan, Section, Span, View, WeightId, WeightRole, cross_lane_waits, sections_of};
use crate::weights::WeightData;

/// Open-time options of the CUDA backend.
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    pub device: usize,
    /// Kernel cache directory; default `$XDG_CACHE_HOME/flashrt/kernels`.
    pub kernel_cache_dir: Option<PathBuf>,
}

/// Element type of a buffer on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Elem {
    F32,
    Bf16,
    I32,
    U8,
}

impl Elem {
    fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::Bf16 => 2,
            Elem::U8 => 1,
        }
    }

    fn dtype(self) -> Option<Dtype> {
        match self {
            Elem::F32 => Some(Dtype::F32),
            Elem::Bf16 => Some(Dtype::Bf16),
            Elem::I32 | Elem::U8 => None,
        }
    }
}

impl From<Dtype> for Elem {
    fn from(d: Dtype) -> Elem {
        match d {
            Dtype::F32 => Elem::F32,
            Dtype::Bf16 => Elem::Bf16,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct DeviceBuf {
    ptr: DevPtr,
    elem: Elem,
    len: usize,
}

/// Host inputs copied into the arena at the start of the step (all but the frames, which the
/// preprocessing reads in place: only the pixels it samples cross the bus).
fn copied_input(b: &crate::plan::BufferDecl) -> bool {
    b.host == HostIo::Input && b.ty != BufType::U8
}

/// One enqueued operation of the lowered step.
enum Step {
    /// `count` (destination, source, bytes) pieces from the table at `pieces`.
    CopyHostInputs {
        pieces: DevPtr,
        count: usize,
    },
    /// Product `matmul` of the lowered step, with the cuBLASLt workspace of its stream.
    Gemm {
        matmul: usize,
        workspace: DevPtr,
    },
    Copy {
        dst: Mat,
        src: Mat,
    },
    ImagePatches {
        out: Mat,
        frames: DevPtr,
        frame_stride: usize,
        frame_info: DevPtr,
        camera: usize,
        size: usize,
        patch: usize,
    },
    AddTable {
        x: Mat,
        table: DevPtr,
        table_rows: usize,
    },
    LayerNorm {
        out: Mat,
        x: Mat,
        gamma: DevPtr,
        beta: DevPtr,
        eps: f32,
    },
    RmsNorm {
        out: Mat,
        x: Mat,
        modulation: Option<DevPtr>,
        eps: f32,
    },
    GatedResidual {
        x: Mat,
        y: Mat,
        modulation: DevPtr,
    },
    GatedResidualRmsNorm {
        out: Mat,
        x: Mat,
        y: Mat,
        gate: DevPtr,
        norm: DevPtr,
        eps: f32,
        /// Launched as a programmatic dependent of the step before it (a cuBLASLt product).
        early: bool,
    },
    /// The end of an Euler step: the gated residual and its norm, then the narrow product
    /// (action-out, Euler update) over the norm's rows, in one launch.
    GatedResidualRmsNormProduct {
        out: Mat,
        x: Mat,
        y: Mat,
        gate: DevPtr,
        norm: DevPtr,
        eps: f32,
        w: DevPtr,
        bias: Option<DevPtr>,
        acc: Mat,
        accumulate: bool,
    },
    /// The start of an Euler step: the product over a narrow f32 input (action-in) into `x`,
    /// then the norm of its rows, in one launch.
    ProductRmsNorm {
        out: Mat,
        x: Mat,
        a: Mat,
        w: DevPtr,
        bias: Option<DevPtr>,
        modulation: Option<DevPtr>,
        eps: f32,
    },
    GeluTanh {
        x: Mat,
    },
    GeluTanhMul {
        out: Mat,
        gate_up: Mat,
    },
    /// A few-row MLP (gate/up product, GeGLU, down product) in one launch (see
    /// `Kernels::mlp_stream`), its weights tiled at open.
    StreamedMlp {
        out: Mat,
        hidden: Mat,
        a: Mat,
        w_gate_up: DevPtr,
        w_down: DevPtr,
        barrier: DevPtr,
        multiprocessors: usize,
        /// Launched as a programmatic dependent of the norm step before it (see `mlps_after_their_norm`).
        programmatic: bool,
    },
    Embed {
        out: Mat,
        tokens: DevPtr,
        table: DevPtr,
        vocab: usize,
        scale: f32,
    },
    Positions {
        valid: DevPtr,
        positions: DevPtr,
        frame_info: DevPtr,
        cameras: usize,
        tokens_per_image: usize,
        token_mask: DevPtr,
        prompt_len: usize,
        suffix: usize,
        /// Where the positions' RoPE table rows are gathered right after (see [`RopeRows`]).
        rope_rows: Option<RopeRows>,
    },
    Rope(RopeArgs),
    /// Multi-query attention of few queries in one kernel (see `Kernels::attention_mq256`).
    FusedAttention(AttentionArgs),
    /// SigLIP's per-camera attention in one kernel (see `Kernels::attention_mh72`).
    VisionAttention {
        out: Mat,
        q: Mat,
        k: Mat,
        v: Mat,
        heads: usize,
        groups: usize,
    },
    Softmax {
        p: DevPtr,
        s: DevPtr,
        rows: usize,
        queries: usize,
        keys: usize,
        key_valid: Option<DevPtr>,
        query_valid: Option<DevPtr>,
    },
    Affine {
        out: Mat,
        x: Mat,
        scale: DevPtr,
        offset: DevPtr,
    },
    /// Sets the conditional handles of the prompt buckets' IF nodes (only inside the step's graph).
    PromptBucket {
        token_mask: DevPtr,
        prompt_len: usize,
    },
}

/// How an attention op runs on the GPU. Decided once per op by [`AttentionLowering::of`], which
/// both the arena's scratch sizing and the lowering ask, so the two cannot disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AttentionLowering {
    /// [`Kernels::attention_mq256`] with this key split: multi-query, head dimension 256, one
    /// group, few queries (the 50 action tokens). Measured on the H200 (bench/NOTES.md): it beats
    /// the two products around the softmax there; for the 712-token prefix it does not yet.
    ActionTokens(AttentionSplit),
    /// [`Kernels::attention_mh72`]: SigLIP's shape (head dimension 72, one K/V head per query
    /// head, at most 256 keys per camera group), unmasked. One launch per layer instead of three
    /// per camera (bench/NOTES.md item 15).
    Vision,
    /// Two batched cuBLASLt products around the masked softmax kernel, per group.
    Products,
}

impl AttentionLowering {
    /// `fused`: the device runs the fused kernels and they are not switched off.
    #[allow(clippy::too_many_arguments)] // the op's own fields, one to one
    fn of(
        queries: usize,
        keys: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        groups: usize,
        masked: bool,
        fused: bool,
        multiprocessors: usize,
    ) -> AttentionLowering {
        if fused && queries <= 64 && kv_heads == 1 && head_dim == 256 && groups == 1 {
            AttentionLowering::ActionTokens(Kernels::attention_split(queries * heads, keys, multiprocessors))
        } else if fused && head_dim == 72 && kv_heads == heads && keys / groups <= flashrt_kernels::VISION_MAX_KEYS && !masked {
            AttentionLowering::Vision
        } else {
            AttentionLowering::Products
        }
    }
}

/// A diagnostic switch from the environment: set and not "0".
fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v != "0")
}

/// Chooses each buffer's element type from how the plan uses it (see the module docs).
fn element_types(plan: &Plan) -> Vec<Elem> {
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
            Op::GeluTanh { x } => wants_bf16[x.buf.0] = true,
            Op::GeluTanhMul { gate_up, out } => [gate_up, out].iter().for_each(|v| wants_bf16[v.buf.0] = true),
            Op::ImagePatches { out, .. } => wants_bf16[out.buf.0] = true,
            Op::GatedResidual { x, .. } | Op::AddTable { x, .. } => needs_f32[x.buf.0] = true,
            Op::Positions { valid, .. } => needs_f32[valid.0] = true,
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
struct Layout {
    bytes: usize,
}

impl Layout {
    fn take(&mut self, bytes: usize) -> usize {
        let at = self.bytes.next_multiple_of(256);
        self.bytes = at + bytes;
        at
    }
}

/// Scratch regions shared by the ops of one stream, which run one after another (each stream
/// has its own set).
struct Scratch {
    /// f32 attention scores `[heads, rows, keys]` of the largest attention (per group).
    scores: DevPtr,
    /// bf16 probabilities, same shape.
    probs: DevPtr,
    /// bf16 copy of an f32 GEMM input.
    shadow: DevPtr,
    /// Split partial outputs (f32) and (max, sum) pairs of the fused attention.
    attention_o: DevPtr,
    attention_ml: DevPtr,
    workspace: DevPtr,
    /// The grid barrier word of this stream's streamed MLPs (one runs at a time per stream).
    grid_barrier: DevPtr,
}

/// Element counts of one stream's [`Scratch`] regions: the largest use among its ops.
#[derive(Clone, Copy, Default)]
struct ScratchSizes {
    scores: usize,
    shadow: usize,
    attention_o: usize,
    attention_ml: usize,
}

/// The streams the step runs on: the main one, and the one a concurrent phase takes.
const LANES: usize = 2;

/// Which stream ("lane") each lowered step runs on and what it waits for first: for a step,
/// the steps of other lanes it must follow (see [`cross_lane_waits`]).
struct Schedule {
    lanes: Vec<usize>,
    waits: Vec<Vec<usize>>,
    /// For each step that another lane waits for, the index of the event recorded after it.
    event_of: Vec<Option<usize>>,
}

impl Schedule {
    /// Waits are computed within each of `sections` (step ranges): a prompt bucket's steps run as
    /// one conditional body, which can only follow everything before it as a whole.
    fn new(lanes: Vec<usize>, accesses: &[Accesses], sections: &[Range<usize>]) -> Schedule {
        let mut waits = vec![Vec::new(); lanes.len()];
        for r in sections {
            for (i, w) in cross_lane_waits(&lanes[r.clone()], &accesses[r.clone()]).into_iter().enumerate() {
                waits[r.start + i] = w.into_iter().map(|j| j + r.start).collect();
            }
        }
        let mut event_of = vec![None; lanes.len()];
        let mut events = 0;
        for &j in waits.iter().flatten() {
            if event_of[j].is_none() {
                event_of[j] = Some(events);
                events += 1;
            }
        }
        Schedule { lanes, waits, event_of }
    }

    fn events(&self) -> usize {
        self.event_of.iter().flatten().count()
    }

    fn concurrent(&self, steps: Range<usize>) -> bool {
        self.lanes[steps].iter().any(|&l| l != 0)
    }
}

pub struct CudaBackend {
    plan: Plan,
    device_name: String,
    /// The whole step; `None` only while opening.
    graph: Option<Graph>,
    /// Steps run so far, and where FRT_PROFILE asks the profile to go (taken when written).
    runs: usize,
    profile: Option<PathBuf>,
    /// The main stream (highest priority: it carries the critical path), and the second one a
    /// concurrent phase runs on (lowest priority), forked from and joined back into the main one.
    stream: Stream,
    side: Stream,
    fork: Event,
    join: Event,
    lt: BlasLt,
    steps: Vec<Step>,
    /// `(phase name, first step)` for each plan phase, in order.
    phase_steps: Vec<(String, usize)>,
    /// The steps as runs with the same prompt bucket (`None`: every step runs them).
    sections: Vec<Section>,
    /// The IF-node handles of the prompt buckets while the step's graph is captured (zero
    /// otherwise: `Step::PromptBucket` launches only into that graph).
    bucket_handles: Cell<[u64; MAX_PROMPT_BUCKETS]>,
    matmuls: Vec<Matmul>,
    kernels: Kernels,
    bufs: Vec<DeviceBuf>,
    /// Pinned host copies of the plan's host-I/O buffers (`None` for internal buffers).
    host: Vec<Option<Pinned>>,
    /// The main stream's cuBLASLt workspace (GEMM tuning runs there).
    workspace: DevPtr,
    schedule: Schedule,
    /// The events of the cross-stream waits ([`Schedule::event_of`]).
    events: Vec<Event>,
    arena: DeviceMemory,
    weights: DeviceMemory,
    /// Tiled copies of weights the streamed MLPs share with cuBLASLt products (see
    /// [`mlp_weight_tiling`]).
    tiled_weights: Option<DeviceMemory>,
    /// Declared last: dropped after every resource that lives in the context.
    ctx: Context,
}

// SAFETY: the backend exclusively owns every handle and pointer it holds (driver handles, pinned
// host memory, the graph). Driver objects may be used from any thread with the context current,
// which every entry point that calls the driver ensures; host views go through `&mut self`.
unsafe impl Send for CudaBackend {}

/// The RoPE tables and, once per step, their rows for every slot of the sequence
/// (`Kernels::rope_rows_gather`), which the step's RoPE launches then read without first waiting
/// for a position (bench/NOTES.md item 43).
#[derive(Clone, Copy, Debug)]
struct RopeRows {
    /// The plan's one positions buffer, whose slots the rows follow.
    positions: BufId,
    tables: (DevPtr, DevPtr),
    rows: (DevPtr, DevPtr),
    slots: usize,
    half: usize,
}

/// FRT_PROFILE profiles after this many steps (a diagnostic mode: it allocates and takes seconds).
const PROFILE_AFTER_RUNS: usize = 5;

/// Bytes of one pinned staging buffer for the weight upload (two alternate).
const STAGE_BYTES: usize = 64 << 20;

impl CudaBackend {
    /// Whether the device holds buffer `name` in bf16 (else f32, i32 or u8): the per-op checks
    /// hold bf16 and f32 buffers to their own tolerance tiers.
    pub fn holds_bf16(&self, name: &str) -> Option<bool> {
        self.plan.find_buffer(name).map(|id| self.bufs[id.0].elem == Elem::Bf16)
    }

    pub fn new(plan: Plan, weights: Vec<WeightData>, checkpoint: Arc<Checkpoint>, opts: &CudaOptions) -> Result<CudaBackend> {
        let device_name = super::probe(opts.device).map_err(Error::Backend)?;
        let ctx = Context::new(opts.device)?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = flashrt_kernels::device_arch(major, minor, !env_flag("FRT_NO_WGMMA"));
        let board = crate::board::BoardProfile::for_compute_capability(major, minor);
        if let Some(board) = board {
            log::info!("board profile {} ({}): {:?} precision", board.name, board.description, board.precision);
            if board.precision != crate::backend::Precision::Bf16 {
                log::info!("the CUDA backend computes in bf16; {:?} weights are not implemented yet", board.precision);
            }
        }
        let cache = opts.kernel_cache_dir.clone().or_else(flashrt_kernels::default_cache_dir);
        let started = std::time::Instant::now();
        let cubins = flashrt_kernels::load_or_compile(&arch, cache.as_deref()).map_err(|e| Error::Backend(e.to_string()))?;
        let kernels = Kernels::load(&cubins).map_err(|e| Error::Backend(e.to_string()))?;
        log::info!("CUDA backend on {device_name} ({arch}): kernels ready in {:.2?}", started.elapsed());

        let (lowest, highest) = Stream::priorities()?;
        let (stream, side) = (Stream::with_priority(highest)?, Stream::with_priority(lowest)?);
        let lt = BlasLt::new()?;

        // Arena: every buffer but the frames and the outputs, then the scratch regions. Those two
        // stay in mapped pinned memory, read and written there by the kernels; the other host
        // inputs get device copies, made by one kernel at the start of the step (bench/NOTES.md
        // item 63: four copy nodes cost ~17 µs, and kernels whose every block reads the same
        // host lines ~20-30 µs more each).
        let elems = element_types(&plan);
        let mut layout = Layout::default();
        let offsets: Vec<Option<usize>> = plan
            .buffers
            .iter()
            .zip(&elems)
            .map(|(b, e)| (b.host == HostIo::Internal || copied_input(b)).then(|| layout.take(b.len * e.size())))
            .collect();
        let (mut rope_positions, mut head_dim) = (0, 2);
        let mut positions_bufs = Vec::new();
        let fused_attention = kernels.has_fused_attention() && !env_flag("FRT_NO_FUSED_ATTENTION");
        let multiprocessors = ctx.multiprocessors()?;
        // Concurrent phases take the second stream (FRT_NO_OVERLAP=1: everything on one stream).
        let op_lanes: Vec<usize> =
            if env_flag("FRT_NO_OVERLAP") { vec![0; plan.ops.len()] } else { plan.concurrent_ops().into_iter().map(usize::from).collect() };
        // The expert's MLPs as one launch each where the device runs it (FRT_NO_FUSED_MLP=1: off).
        let mlps = if env_flag("FRT_NO_FUSED_MLP") {
            Vec::new()
        } else {
            // Not on the second stream: beside the prefix's products its launches would wait for
            // every SM at once (bench/NOTES.md item 52).
            fused_mlps(&plan, &elems, |first, rows, width, hidden| {
                op_lanes[first] == 0 && kernels.mlp_stream_splits(rows, width, hidden, multiprocessors).is_some()
            })
        };
        // Each fused MLP right after the norm that writes its A starts under that norm, streaming
        // its first weights meanwhile (FRT_NO_EARLY_MLP=1: off).
        let early_mlps = if env_flag("FRT_NO_EARLY_MLP") { Vec::new() } else { mlps_after_their_norm(&plan, &mlps, &op_lanes) };
        // Each of the expert's attentions right after its RoPE kernel starts under it, loading
        // the keys RoPE does not write meanwhile (FRT_NO_EARLY_ATTENTION=1: off).
        let early_attentions = if env_flag("FRT_NO_EARLY_ATTENTION") { Vec::new() } else { attentions_after_their_rope(&plan, &op_lanes) };
        let mut sizes = [ScratchSizes::default(); LANES];
        for (op, &lane) in plan.ops.iter().zip(&op_lanes) {
            let size = &mut sizes[lane];
            match *op {
                Op::Attention { q, k, heads, kv_heads, head_dim, groups, key_valid, query_valid, .. } => {
                    let masked = key_valid.is_some() || query_valid.is_some();
                    match AttentionLowering::of(q.rows, k.rows, heads, kv_heads, head_dim, groups, masked, fused_attention, multiprocessors)
                    {
                        AttentionLowering::ActionTokens(split) => {
                            let (o, ml) = split.partial_lens;
                            (size.attention_o, size.attention_ml) = (size.attention_o.max(o), size.attention_ml.max(ml));
                        }
                        AttentionLowering::Vision => {}
                        AttentionLowering::Products => size.scores = size.scores.max(heads * (q.rows / groups) * (k.rows / groups)),
                    }
                }
                Op::Gemm { a, .. } if elems[a.buf.0] == Elem::F32 => size.shadow = size.shadow.max(a.rows * a.cols),
                Op::RopeQkv { k_cache, head_dim: hd, .. } => {
                    rope_positions = rope_positions.max(k_cache.rows);
                    head_dim = hd;
                }
                Op::Positions { positions, .. } => positions_bufs.push(positions),
                _ => {}
            }
        }
        let half = head_dim / 2;
        // A second stream with no ops gets no scratch (only the cuBLASLt workspace is unsized).
        let used_lanes = op_lanes.iter().max().map_or(1, |l| l + 1);
        let scratch_at: Vec<[usize; 7]> = sizes[..used_lanes]
            .iter()
            .map(|size| {
                [
                    layout.take(size.scores * 4),
                    layout.take(size.scores * 2),
                    layout.take(size.shadow * 2),
                    layout.take(size.attention_o * 4),
                    layout.take(size.attention_ml * 4),
                    layout.take(WORKSPACE_BYTES),
                    layout.take(4),
                ]
            })
            .collect();
        let rope_at = [layout.take(rope_positions * half * 4), layout.take(rope_positions * half * 4)];
        // Gathered rows need whole 16-byte groups (rope_rows_gather) and one positions buffer;
        // else RoPE reads the positions itself.
        let gathered = match positions_bufs[..] {
            [positions] if half % 4 == 0 && rope_positions > 0 => Some((positions, plan.buffers[positions.0].len)),
            _ => None,
        };
        let rows_len = gathered.map_or(0, |(_, slots)| slots * half * 4);
        let rope_rows_at = [layout.take(rows_len), layout.take(rows_len)];
        // (destination, source, bytes) of each copied host input, for `copy_host_inputs`.
        let copied_inputs = plan.buffers.iter().filter(|b| copied_input(b)).count();
        let input_table_at = layout.take(copied_inputs * 3 * 8);
        let arena = DeviceMemory::new(layout.bytes, "activations")?;
        // SAFETY: zeroes the whole fresh allocation, so the warm-up never reads garbage.
        check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(arena.ptr, 0, arena.bytes) }.result())?;
        let at = |off: usize| arena.ptr + off as u64;
        let scratch: Vec<Scratch> = scratch_at
            .iter()
            .map(|o| Scratch {
                scores: at(o[0]),
                probs: at(o[1]),
                shadow: at(o[2]),
                attention_o: at(o[3]),
                attention_ml: at(o[4]),
                workspace: at(o[5]),
                grid_barrier: at(o[6]),
            })
            .collect();
        let rope = (at(rope_at[0]), at(rope_at[1]));
        let rope_rows = gathered.map(|(positions, slots)| RopeRows {
            positions,
            tables: rope,
            rows: (at(rope_rows_at[0]), at(rope_rows_at[1])),
            slots,
            half,
        });
        let (cos, sin) = crate::cpu::rope_tables(rope_positions, head_dim);
        // SAFETY: both regions were sized for these tables above.
        unsafe {
            check("uploading RoPE tables", result::memcpy_htod_sync(rope.0, &cos))?;
            check("uploading RoPE tables", result::memcpy_htod_sync(rope.1, &sin))?;
        }

        let mut host: Vec<Option<Pinned>> = Vec::with_capacity(plan.buffers.len());
        let mut bufs = Vec::with_capacity(plan.buffers.len());
        for ((b, &elem), off) in plan.buffers.iter().zip(&elems).zip(&offsets) {
            let pinned = match b.host {
                HostIo::Internal => None,
                _ => Some(Pinned::new(b.len * elem.size(), &b.name)?),
            };
            let ptr = match (off, &pinned) {
                (Some(off), _) => at(*off),
                (None, Some(p)) => p.device,
                (None, None) => unreachable!("only host buffers live outside the arena"),
            };
            bufs.push(DeviceBuf { ptr, elem, len: b.len });
            host.push(pinned);
        }
        let input_table: Vec<u64> = plan
            .buffers
            .iter()
            .zip(bufs.iter().zip(&host))
            .filter(|(b, _)| copied_input(b))
            .flat_map(|(b, (buf, pinned))| {
                [buf.ptr, pinned.as_ref().expect("host inputs are pinned").device, (b.len * buf.elem.size()) as u64]
            })
            .collect();
        let host_inputs = (at(input_table_at), copied_inputs);
        if copied_inputs > 0 {
            // SAFETY: the region was sized for this table above.
            check("uploading the host-input table", unsafe { result::memcpy_htod_sync(host_inputs.0, &input_table) })?;
        }

        let uploaded = upload_weights(&plan, weights, &checkpoint, &elems, stream.0)?;
        let (tiled_memory, tiled) = retile_mlp_weights(&kernels, &plan, &mlps, &uploaded.ptrs, stream.0)?;
        if let Some(board) = board {
            let used = (uploaded.memory.bytes + tiled_memory.as_ref().map_or(0, |m| m.bytes) + arena.bytes) as u64;
            if let Some(warning) = board.budget_warning(used, ctx.total_memory()? as u64) {
                log::warn!("{warning}");
            }
        }
        let mut backend = CudaBackend {
            device_name: format!("{device_name} ({arch})"),
            stream,
            side,
            fork: Event::ordering()?,
            join: Event::ordering()?,
            lt,
            graph: None,
            runs: 0,
            profile: None,
            steps: Vec::new(),
            phase_steps: Vec::new(),
            sections: Vec::new(),
            bucket_handles: Cell::new([0; MAX_PROMPT_BUCKETS]),
            matmuls: Vec::new(),
            kernels,
            bufs,
            host,
            workspace: scratch[0].workspace,
            schedule: Schedule::new(Vec::new(), &[], &[]),
            events: Vec::new(),
            arena,
            weights: uploaded.memory,
            tiled_weights: tiled_memory,
            ctx,
            plan,
        };
        let lowering = Lowering {
            backend: &backend,
            weights: &uploaded.ptrs,
            scratch: &scratch,
            rope,
            rope_rows,
            op_lanes: &op_lanes,
            host_inputs,
            lane: 0,
            fused_attention,
            multiprocessors,
            mlps: &mlps,
            early_mlps: &early_mlps,
            early_attentions: &early_attentions,
            op_index: 0,
            early_after_products: !env_flag("FRT_NO_EARLY_AFTER_PRODUCTS"),
            tiled: &tiled,
            steps: Vec::new(),
            step_lanes: Vec::new(),
            step_accesses: Vec::new(),
            phase_steps: Vec::new(),
            phase_buckets: Vec::new(),
            matmuls: Vec::new(),
        };
        let Lowered { steps, schedule, phase_steps, sections, matmuls } = lowering.lower()?;
        backend.events = (0..schedule.events()).map(|_| Event::ordering()).collect::<Result<_>>()?;
        if schedule.concurrent(0..steps.len()) {
            log::info!(
                "{} of {} launches on a second stream, {} cross-stream waits",
                schedule.lanes.iter().filter(|&&l| l != 0).count(),
                steps.len(),
                schedule.waits.iter().flatten().count()
            );
        }
        (backend.steps, backend.schedule, backend.phase_steps, backend.sections, backend.matmuls) =
            (steps, schedule, phase_steps, sections, matmuls);
        let started = std::time::Instant::now();
        backend.tune_gemms()?;
        log::info!("GEMM algorithms timed in {:.2?}", started.elapsed());
        let started = std::time::Instant::now();
        backend.issue_all()?;
        backend.synchronize("warm-up")?;
        backend.graph = Some(backend.capture()?);
        backend.synchronize("graph upload")?;
        log::info!(
            "CUDA graph of {} ops ({} launches, {} GEMMs) captured in {:.2?}; {:.1} MiB weights, {:.1} MiB activations",
            backend.plan.ops.len(),
            backend.steps.len(),
            backend.matmuls.len(),
            started.elapsed(),
            backend.weight_bytes() as f64 / (1 << 20) as f64,
            backend.arena.bytes as f64 / (1 << 20) as f64
        );
        backend.profile = std::env::var_os("FRT_PROFILE").map(PathBuf::from);
        Ok(backend)
    }

    fn synchronize(&self, what: &str) -> Result<()> {
        // SAFETY: the stream belongs to this backend.
        check(what, unsafe { result::stream::synchronize(self.stream.0) })
    }

    /// Picks, for every distinct GEMM shape, the fastest of cuBLASLt's candidate algorithms
    /// (the heuristic's first choice is not always the fastest for the small-M products of the
    /// denoise loop). Each candidate is timed on all products of that shape in plan order, as a
    /// graph: the weights stream from memory as in a real step. (Timing one product replayed
    /// back to back keeps its weights in L2 and measured gains that a step never saw.) Runs
    /// before the warm-up: the products overwrite only buffers that every step rewrites before
    /// reading.
    fn tune_gemms(&mut self) -> Result<()> {
        let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, m) in self.matmuls.iter().enumerate() {
            groups.entry(m.shape_key()).or_default().push(i);
        }
        let mut saved = 0.0;
        for members in groups.values() {
            let candidates = self.matmuls[members[0]].candidates();
            if candidates < 2 {
                continue;
            }
            let mut times = Vec::with_capacity(candidates);
            for c in 0..candidates {
                members.iter().for_each(|&m| self.matmuls[m].choose(c));
                let this = &*self;
                let graph = Graph::capture(this.stream.0, || {
                    members.iter().try_for_each(|&m| {
                        // SAFETY: as in `issue_all`.
                        unsafe { this.issue(&Step::Gemm { matmul: m, workspace: this.workspace }, this.stream.0) }
                    })
                });
                // A candidate that cannot run here is skipped, not fatal.
                times.push(graph.and_then(|g| time_replays(&g, this.stream.0, 3)).unwrap_or_else(|e| {
                    log::debug!("GEMM candidate {c} of {}: {e}", this.matmuls[members[0]].label());
                    f32::INFINITY
                }));
            }
            let best = (0..candidates).min_by(|&a, &b| times[a].total_cmp(&times[b])).unwrap_or(0);
            log::debug!("GEMM {} x{}: candidates {times:.4?} ms, best {best}", self.matmuls[members[0]].label(), members.len());
            if times[0].is_finite() {
                saved += times[0] - times[best];
            }
            members.iter().for_each(|&m| self.matmuls[m].choose(best));
        }
        log::info!("GEMM tuning: {} shapes, {saved:.3} ms per step faster than cuBLASLt's first choices", groups.len());
        self.synchronize("GEMM tuning")
    }

    /// Times every phase of the plan as its own graph (and its GEMMs alone), writes the table to
    /// `path` as JSON and logs it: the per-phase breakdown behind the benchmark (FRT_PROFILE, run
    /// after [`PROFILE_AFTER_RUNS`] steps so that real frames, prompt and state are in place:
    /// absent cameras and masked rows make several kernels cheaper).
    fn profile_phases(&self, path: &Path) -> Result<()> {
        const REPS: usize = 20;
        // These steps alone, captured as a graph and replayed.
        let time = |steps: &[&Step]| -> Result<f32> {
            // SAFETY: as in `issue_all`.
            // One stream: a phase's own time, without the overlap of the concurrent one.
            let graph = Graph::capture(self.stream.0, || steps.iter().try_for_each(|s| unsafe { self.issue(s, self.stream.0) }))?;
            time_replays(&graph, self.stream.0, REPS)
        };
        let phases = || {
            self.phase_steps.iter().enumerate().map(|(i, (name, first))| {
                let end = self.phase_steps.get(i + 1).map_or(self.steps.len(), |p| p.1);
                (name.as_str(), *first..end)
            })
        };
        let mut rows = Vec::new();
        for (name, range) in phases() {
            let gemms: Vec<&Step> = self.steps[range.clone()].iter().filter(|s| matches!(s, Step::Gemm { .. })).collect();
            let all: Vec<&Step> = self.steps[range.clone()].iter().collect();
            let (total, gemm) = (time(&all)?, if gemms.is_empty() { 0.0 } else { time(&gemms)? });
            log::info!(
                "phase {name:16} {total:8.3} ms: {:4} GEMMs {gemm:8.3} ms alone, {:4} other launches",
                gemms.len(),
                range.len() - gemms.len()
            );
            rows.push(serde_json::json!({"phase": name, "ms": total, "gemm_ms": gemm, "gemms": gemms.len(), "other_launches": range.len() - gemms.len()}));
        }
        // Where each phase's time goes: the launches of one kind (one kernel, or one GEMM
        // shape) of a phase, alone as a graph. The denoise steps are pooled.
        let mut kinds = Vec::new();
        for (name, range) in phases() {
            let phase = if name.starts_with("denoise") { "denoise" } else { name };
            for step in &self.steps[range] {
                let kind = self.step_kind(step);
                match kinds.iter_mut().find(|(p, k, _): &&mut (&str, String, Vec<&Step>)| *p == phase && *k == kind) {
                    Some((_, _, steps)) => steps.push(step),
                    None => kinds.push((phase, kind, vec![step])),
                }
            }
        }
        let mut by_kind = Vec::new();
        for (phase, kind, steps) in &kinds {
            let ms = time(steps)?;
            log::info!("  {phase:8} {kind:44} {:5} launches {ms:8.3} ms, {:6.2} us each", steps.len(), ms * 1e3 / steps.len() as f32);
            by_kind.push(serde_json::json!({"phase": phase, "kind": kind, "launches": steps.len(), "ms": ms}));
        }
        let graph = self.graph.as_ref().expect("captured");
        let whole = time_replays(graph, self.stream.0, REPS)?;
        // What a step pays on the host around the GPU time: the launch call itself, and launch
        // to synchronisation (as `run` does) one step at a time, without back-to-back overlap.
        let (mut launch_call, mut launch_to_sync) = (0.0, 0.0);
        for _ in 0..REPS {
            let t = std::time::Instant::now();
            graph.launch(self.stream.0)?;
            launch_call += t.elapsed().as_secs_f64() * 1e3 / REPS as f64;
            self.synchronize("profile")?;
            launch_to_sync += t.elapsed().as_secs_f64() * 1e3 / REPS as f64;
        }
        log::info!(
            "whole graph {whole:.3} ms per back-to-back replay; one step: launch call {launch_call:.3} ms, launch to sync {launch_to_sync:.3} ms"
        );
        let json = serde_json::json!({
            "device": self.device_name,
            "whole_graph_ms": whole,
            "launch_call_ms": launch_call,
            "launch_to_sync_ms": launch_to_sync,
            "phases": rows,
            "by_kind": by_kind,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json).expect("json")).map_err(|source| Error::Io { path: path.into(), source })
    }

    /// Device memory of the weights, tiled copies included.
    fn weight_bytes(&self) -> usize {
        self.weights.bytes + self.tiled_weights.as_ref().map_or(0, |m| m.bytes)
    }

    /// A step's kernel (or cuBLASLt product shape), for the profile.
    fn step_kind(&self, step: &Step) -> String {
        match step {
            Step::Gemm { matmul, .. } => format!("cublaslt {}", self.matmuls[*matmul].label()),
            Step::Copy { .. } => "copy".into(),
            Step::ImagePatches { .. } => "image_patches".into(),
            Step::AddTable { .. } => "add_table".into(),
            Step::LayerNorm { .. } => "layer_norm".into(),
            Step::RmsNorm { modulation, .. } => if modulation.is_some() { "ada_rms_norm" } else { "rms_norm" }.into(),
            Step::GatedResidual { .. } => "gated_residual".into(),
            Step::GatedResidualRmsNorm { .. } => "gated_residual_rms_norm".into(),
            Step::GatedResidualRmsNormProduct { .. } => "gated_residual_rms_norm_product".into(),
            Step::ProductRmsNorm { .. } => "product_rms_norm".into(),
            Step::GeluTanh { .. } => "gelu_tanh".into(),
            Step::GeluTanhMul { .. } => "gelu_tanh_mul".into(),
            Step::StreamedMlp { .. } => "mlp_stream".into(),
            Step::Embed { .. } => "embed".into(),
            Step::Positions { .. } => "positions".into(),
            Step::Rope(_) => "rope_qkv".into(),
            Step::FusedAttention(a) => format!("attention_mq256 {}x{} over {} keys", a.q.rows, a.heads, a.k.rows),
            Step::VisionAttention { q, k, heads, groups, .. } => {
                format!("attention_mh72 {}x{} over {} keys, {groups} groups", q.rows / groups, heads, k.rows / groups)
            }
            Step::Softmax { rows, keys, .. } => format!("softmax {rows}x{keys}"),
            Step::Affine { .. } => "affine".into(),
            Step::PromptBucket { .. } => "prompt_bucket".into(),
            Step::CopyHostInputs { .. } => "copy host inputs".into(),
        }
    }

    /// Enqueues every step eagerly, every prompt bucket's included (the warm-up: each kernel and
    /// product runs once before capture).
    fn issue_all(&self) -> Result<()> {
        self.sections.iter().try_for_each(|s| self.issue_steps(s.range.clone()))
    }

    /// Enqueues `steps` (eagerly, or into a graph under capture) on their lanes' streams, each
    /// after the events of its cross-stream waits. If some run on the second stream, it forks from
    /// the main one first and joins it at the end (a capture must end with every stream joined).
    fn issue_steps(&self, steps: Range<usize>) -> Result<()> {
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
    fn capture(&self) -> Result<Graph> {
        let Some(&full) = self.plan.prompt_buckets.last() else {
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

    fn capture_bucketed(&self) -> Result<Graph> {
        let bodies: Vec<CapturedGraph> = self
            .sections
            .iter()
            .filter(|s| s.prompt_bucket.is_some())
            .map(|s| CapturedGraph::capture(self.stream.0, || self.issue_steps(s.range.clone())))
            .collect::<Result<_>>()?;
        if bodies.len() != self.plan.prompt_buckets.len() || bodies.len() > MAX_PROMPT_BUCKETS {
            return Err(Error::Backend(format!("{} bucket sections for buckets {:?}", bodies.len(), self.plan.prompt_buckets)));
        }
        let graph = Graph::capture(self.stream.0, || {
            let mut handles = [0; MAX_PROMPT_BUCKETS];
            for h in &mut handles[..bodies.len()] {
                *h = conditional_handle(self.stream.0, self.ctx.ctx)?;
            }
            self.bucket_handles.set(handles);
            let mut bodies = bodies.iter().zip(handles);
            for s in &self.sections {
                match s.prompt_bucket {
                    None => self.issue_steps(s.range.clone())?,
                    Some(_) => {
                        let (body, handle) = bodies.next().expect("one body per bucket");
                        capture_if(self.stream.0, self.ctx.ctx, handle, body)?;
                    }
                }
            }
            Ok(())
        })?;
        log::info!("prompt buckets {:?}: each one's phases as a conditional body", self.plan.prompt_buckets);
        Ok(graph)
    }

    /// Enqueues one step on stream `s`.
    unsafe fn issue(&self, step: &Step, s: sys::CUstream) -> Result<()> {
        let k = &self.kernels;
        // SAFETY (whole block): see `issue_all`.
        let r = unsafe {
            match *step {
                Step::Gemm { matmul, workspace } => return self.matmuls[matmul].launch(self.lt.0, workspace, s).map_err(Error::Backend),
                Step::Copy { dst, src } => k.copy(dst, src, s),
                Step::CopyHostInputs { pieces, count } => k.copy_host_inputs(pieces, count, s),
                Step::ImagePatches { out, frames, frame_stride, frame_info, camera, size, patch } => {
                    k.image_patches(out, frames, frame_stride, frame_info, camera, size, patch, s)
                }
                Step::AddTable { x, table, table_rows } => k.add_table(x, table, table_rows, s),
                Step::LayerNorm { out, x, gamma, beta, eps } => k.layer_norm(out, x, gamma, beta, eps, s),
                Step::RmsNorm { out, x, modulation, eps } => k.rms_norm(out, x, modulation, eps, s),
                Step::GatedResidual { x, y, modulation } => k.gated_residual(x, y, modulation, s),
                Step::GatedResidualRmsNorm { out, x, y, gate, norm, eps, early } => {
                    k.gated_residual_rms_norm(out, x, y, gate, norm, eps, early, s)
                }
                Step::GatedResidualRmsNormProduct { out, x, y, gate, norm, eps, w, bias, acc, accumulate } => {
                    k.gated_residual_rms_norm_product((out, x, y), gate, norm, eps, w, bias, (acc, accumulate), s)
                }
                Step::ProductRmsNorm { out, x, a, w, bias, modulation, eps } => k.product_rms_norm(out, x, a, w, bias, modulation, eps, s),
                Step::GeluTanh { x } => k.gelu_tanh(x, s),
                Step::GeluTanhMul { out, gate_up } => k.gelu_tanh_mul(out, gate_up, s),
                Step::StreamedMlp { out, hidden, a, w_gate_up, w_down, barrier, multiprocessors, programmatic } => {
                    k.mlp_stream(out, hidden, a, w_gate_up, w_down, barrier, multiprocessors, programmatic, s)
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
                Step::VisionAttention { out, q, k: keys, v, heads, groups } => k.attention_mh72(out, q, keys, v, heads, groups, s),
                Step::Softmax { p, s: scores, rows, queries, keys, key_valid, query_valid } => {
                    k.softmax_rows(p, scores, rows, queries, keys, key_valid, query_valid, s)
                }
                Step::Affine { out, x, scale, offset } => k.affine(out, x, scale, offset, s),
                Step::PromptBucket { token_mask, prompt_len } => {
                    let buckets = &self.plan.prompt_buckets;
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

    fn host_buffer(&self, id: BufId) -> &Pinned {
        self.host[id.0].as_ref().unwrap_or_else(|| unreachable!("buffer {} is not a host buffer", self.plan.buffers[id.0].name))
    }

    fn host_buffer_mut(&mut self, id: BufId) -> &mut Pinned {
        let name = &self.plan.buffers[id.0].name;
        self.host[id.0].as_mut().unwrap_or_else(|| unreachable!("buffer {name} is not a host buffer"))
    }
}

/// Uploaded weights: one device allocation and each (weight, element type) pair's address.
struct UploadedWeights {
    memory: DeviceMemory,
    ptrs: HashMap<(usize, Elem), DevPtr>,
}

/// Which element type each use of a weight needs: GEMM matrices and the embedding in bf16,
/// biases in the type of their GEMM's output, every other vector in f32.
fn weight_uses(plan: &Plan, elems: &[Elem]) -> Vec<(usize, Elem)> {
    let mut uses = Vec::new();
    for op in &plan.ops {
        match *op {
            Op::Gemm { w, bias, out, .. } => {
                uses.push((w.0, Elem::Bf16));
                if let Some(b) = bias {
                    uses.push((b.0, elems[out.buf.0]));
                }
            }
            Op::Embed { table, .. } => uses.push((table.0, Elem::Bf16)),
            Op::AddTable { table, .. } => uses.push((table.0, Elem::F32)),
            Op::LayerNorm { gamma, beta, .. } => uses.extend([(gamma.0, Elem::F32), (beta.0, Elem::F32)]),
            Op::AdaRmsNorm { modulation, .. } | Op::GatedResidual { modulation, .. } => uses.push((modulation.0, Elem::F32)),
            Op::Affine { scale, offset, .. } => uses.extend([(scale.0, Elem::F32), (offset.0, Elem::F32)]),
            _ => {}
        }
    }
    uses.sort_unstable_by_key(|&(w, e)| (w, e.size()));
    uses.dedup();
    uses
}

/// Runs `f` over `0..n` split into contiguous ranges across the host's cores (weights are
/// converted at open; on a 16-core host this keeps bf16 conversion off the cold-start path).
fn parallel_ranges(n: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    let threads = if n < (1 << 20) { 1 } else { std::thread::available_parallelism().map_or(1, |t| t.get()).min(16) };
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let range = (t * per).min(n)..((t + 1) * per).min(n);
            let f = &f;
            s.spawn(move || f(range));
        }
    });
}

/// The MLPs the lowering runs as one [`Kernels::mlp_stream`] launch (bench/NOTES.md item 52): the
/// index of each first op of a gate/up product (bf16 in, no bias), the GeGLU over its output and
/// the down product over that (f32 out, overwritten), in one phase, where `runs(first op, rows,
/// width, hidden)` (the device runs the shape there). The fused kernel never writes the gate/up
/// output, so an MLP whose gate/up output some later op reads (before anything writes that
/// buffer again) is not fused.
fn fused_mlps(plan: &Plan, elems: &[Elem], runs: impl Fn(usize, usize, usize, usize) -> bool) -> Vec<usize> {
    let starts_phase = |i: usize| plan.phase_starting_at(i).is_some();
    let matrix = |w: WeightId| match plan.weights[w.0].role {
        WeightRole::Matrix { n, k } => Some((n, k)),
        _ => None,
    };
    let fits = |i: usize| -> Option<BufId> {
        let [
            Op::Gemm { a, w: w_gate_up, bias: None, out: gate_up, accumulate: false },
            Op::GeluTanhMul { gate_up: g, out: hidden },
            Op::Gemm { a: h, w: w_down, bias: None, out, accumulate: false },
        ] = plan.ops.get(i..i + 3)?
        else {
            return None;
        };
        let (rows, width, hid) = (a.rows, a.cols, hidden.cols);
        let shapes = matrix(*w_gate_up) == Some((2 * hid, width))
            && matrix(*w_down) == Some((width, hid))
            && g == gate_up
            && h == hidden
            && (hidden.rows, out.rows, out.cols) == (rows, rows, width);
        let types = [elems[a.buf.0], elems[hidden.buf.0], elems[out.buf.0]] == [Elem::Bf16, Elem::Bf16, Elem::F32];
        (shapes && types && !starts_phase(i + 1) && !starts_phase(i + 2) && runs(i, rows, width, hid)).then_some(gate_up.buf)
    };
    let candidates: Vec<(usize, BufId)> = (0..plan.ops.len()).filter_map(|i| fits(i).map(|g| (i, g))).collect();
    let firsts: Vec<usize> = candidates.iter().map(|c| c.0).collect();
    // Walking on from the MLP past other fused ones (which read nothing of it outside their own
    // kernel): the first op to touch the buffer must write it. Unfusing another MLP only turns
    // its product into such a write, so one pass decides.
    let unread = |&(i, g): &(usize, BufId)| {
        let mut j = i + 3;
        while j < plan.ops.len() {
            if firsts.contains(&j) {
                j += 3;
                continue;
            }
            let accesses = plan.ops[j].accesses(&plan.buffers);
            if accesses.reads.iter().any(|span| span.buf == g) {
                return false;
            }
            if accesses.writes.iter().any(|span| span.buf == g) {
                return true;
            }
            j += 1;
        }
        true
    };
    candidates.iter().filter(|c| unread(c)).map(|c| c.0).collect()
}

/// The fused MLPs (of `mlps`) that directly follow, on the same stream and in the same phase, the
/// RMS norm writing their whole A: launched as its programmatic dependent, each streams its first
/// weight stages while the norm runs (bench/NOTES.md item 56).
fn mlps_after_their_norm(plan: &Plan, mlps: &[usize], op_lanes: &[usize]) -> Vec<usize> {
    mlps.iter()
        .copied()
        .filter(|&i| {
            let (Some(norm), Op::Gemm { a, .. }) = (i.checked_sub(1).map(|j| &plan.ops[j]), &plan.ops[i]) else {
                return false;
            };
            let out = match norm {
                Op::RmsNorm { out, .. } | Op::AdaRmsNorm { out, .. } => out,
                _ => return false,
            };
            out == a && op_lanes[i - 1] == op_lanes[i] && plan.phase_starting_at(i).is_none()
        })
        .collect()
}

/// The attentions that directly follow, on the main stream and in the same phase, the RoPE op
/// writing their queries, each with how many leading keys of its K and V that op does not write:
/// launched as RoPE's programmatic dependent, the action tokens' attention loads those keys while
/// RoPE runs (bench/NOTES.md item 72). Ascending by op. (On the second stream an attention also
/// waits for the prefix's cache rows, and the lowering keeps that stream's launches plain.)
fn attentions_after_their_rope(plan: &Plan, op_lanes: &[usize]) -> Vec<(usize, usize)> {
    (1..plan.ops.len())
        .filter_map(|i| {
            let (Op::RopeQkv { qkv, .. }, Op::Attention { q, k, v, key_valid, .. }) = (&plan.ops[i - 1], &plan.ops[i]) else {
                return None;
            };
            if q.buf != qkv.buf || op_lanes[i - 1] != 0 || op_lanes[i] != 0 || plan.phase_starting_at(i).is_some() {
                return None;
            }
            let writes = plan.ops[i - 1].accesses(&plan.buffers).writes;
            let written = |s: Span| writes.iter().any(|w| w.overlaps(&s));
            if key_valid.is_some_and(|b| written(Span::whole(b, &plan.buffers))) {
                return None;
            }
            let first_written = |view: View| (0..view.rows).find(|&r| written(view.rows(r, 1).span())).unwrap_or(view.rows);
            Some((i, first_written(*k).min(first_written(*v))))
        })
        .collect()
}

/// The weights of the fused MLPs as [`Kernels::mlp_stream`] reads them: (weight, the gate/up
/// pairing's half or 0 for down, whether in place). A weight that also serves an unfused product
/// (the expert's in the first denoise step, which runs beside the prefix on cuBLASLt) is tiled
/// into a copy; the others replace their row-major form.
fn mlp_weight_tiling(plan: &Plan, mlps: &[usize]) -> Vec<(WeightId, usize, bool)> {
    let mut tiled = Vec::new();
    for &i in mlps {
        if let (Op::Gemm { w: w_gate_up, .. }, Op::GeluTanhMul { out: hidden, .. }, Op::Gemm { w: w_down, .. }) =
            (&plan.ops[i], &plan.ops[i + 1], &plan.ops[i + 2])
        {
            tiled.extend([(*w_gate_up, hidden.cols), (*w_down, 0)]);
        }
    }
    tiled.sort_unstable_by_key(|(w, _)| w.0);
    tiled.dedup();
    let fused_op = |j: usize| mlps.iter().any(|&i| (i..i + 3).contains(&j));
    let unfused: Vec<WeightId> = plan
        .ops
        .iter()
        .enumerate()
        .filter_map(|(j, op)| match op {
            Op::Gemm { w, .. } if !fused_op(j) => Some(*w),
            _ => None,
        })
        .collect();
    tiled.into_iter().map(|(w, paired_half)| (w, paired_half, !unfused.contains(&w))).collect()
}

/// Tiles the fused MLPs' weights for [`Kernels::mlp_stream`] once, at open (see
/// [`mlp_weight_tiling`]): in place through a staging copy, or into one allocation of copies.
/// Returns that allocation (if any) and each tiled weight's address.
fn retile_mlp_weights(
    kernels: &Kernels,
    plan: &Plan,
    mlps: &[usize],
    ptrs: &HashMap<(usize, Elem), DevPtr>,
    stream: sys::CUstream,
) -> Result<(Option<DeviceMemory>, HashMap<usize, DevPtr>)> {
    let tiling = mlp_weight_tiling(plan, mlps);
    let numel = |w: WeightId| match plan.weights[w.0].role {
        WeightRole::Matrix { n, k } => n * k,
        _ => 0,
    };
    let mut layout = Layout::default();
    let copy_at: Vec<Option<usize>> = tiling.iter().map(|&(w, _, in_place)| (!in_place).then(|| layout.take(numel(w) * 2))).collect();
    let copies = if layout.bytes > 0 { Some(DeviceMemory::new(layout.bytes, "tiled MLP weights")?) } else { None };
    let staging_elems = tiling.iter().filter(|t| t.2).map(|t| numel(t.0)).max().unwrap_or(0);
    let staging = if staging_elems > 0 { Some(DeviceMemory::new(staging_elems * 2, "weight tiling")?) } else { None };
    let mut tiled = HashMap::with_capacity(tiling.len());
    for (&(w, paired_half, _), &at) in tiling.iter().zip(&copy_at) {
        let WeightRole::Matrix { n, k } = plan.weights[w.0].role else { continue };
        let plain = ptrs[&(w.0, Elem::Bf16)];
        // SAFETY: every region holds n · k bf16; the stream orders each copy before its tiling and
        // that tiling before the staging buffer's next copy.
        let dst = unsafe {
            match (at, &copies, &staging) {
                (Some(off), Some(copies), _) => {
                    let dst = copies.ptr + off as u64;
                    kernels.retile_weight(dst, plain, n, k, paired_half, stream).map_err(|e| Error::Backend(e.to_string()))?;
                    dst
                }
                (_, _, Some(staging)) => {
                    check("weight tiling copy", sys::cuMemcpyDtoDAsync_v2(staging.ptr, plain, n * k * 2, stream).result())?;
                    kernels.retile_weight(plain, staging.ptr, n, k, paired_half, stream).map_err(|e| Error::Backend(e.to_string()))?;
                    plain
                }
                _ => unreachable!("sized above for every tiled weight"),
            }
        };
        tiled.insert(w.0, dst);
    }
    if !tiling.is_empty() {
        // SAFETY: the stream belongs to the caller's backend; the staging buffer outlives its work.
        check("weight tiling", unsafe { result::stream::synchronize(stream) })?;
        let copied = copies.as_ref().map_or(0, |c| c.bytes);
        log::info!(
            "{} few-row MLPs run as one streamed launch each ({} weights tiled, {:.1} MiB of them as copies)",
            mlps.len(),
            tiling.len(),
            copied as f64 / (1 << 20) as f64
        );
    }
    Ok((copies, tiled))
}

/// Converts and uploads every used weight through two alternating pinned staging buffers.
fn upload_weights(plan: &Plan, data: Vec<WeightData>, ckpt: &Checkpoint, elems: &[Elem], stream: sys::CUstream) -> Result<UploadedWeights> {
    let uses = weight_uses(plan, elems);
    let numel = |w: usize| match plan.weights[w].role {
        WeightRole::Matrix { n, k } => n * k,
        WeightRole::Embedding { vocab, width } => vocab * width,
        WeightRole::Vector => data[w].len(ckpt),
    };
    let mut layout = Layout::default();
    let offsets: Vec<usize> = uses.iter().map(|&(w, e)| layout.take(numel(w) * e.size())).collect();
    let memory = DeviceMemory::new(layout.bytes, "weights")?;
    let mut stages = [Pinned::new(STAGE_BYTES, "weight staging")?, Pinned::new(STAGE_BYTES, "weight staging")?];
    let events = [(); 2].map(|_| result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING));
    let events = [check("cuEventCreate", events[0])?, check("cuEventCreate", events[1])?];
    let mut used = [false; 2];
    let mut scratch_f32: Vec<f32> = Vec::new();
    let mut turn = 0;
    let mut ptrs = HashMap::with_capacity(uses.len());
    let started = std::time::Instant::now();
    let upload = (|| -> Result<()> {
        for (&(w, elem), &off) in uses.iter().zip(&offsets) {
            let total = numel(w);
            let dst = memory.ptr + off as u64;
            ptrs.insert((w, elem), dst);
            let per_chunk = STAGE_BYTES / elem.size();
            for start in (0..total).step_by(per_chunk) {
                let count = per_chunk.min(total - start);
                let slot = turn % 2;
                turn += 1;
                if used[slot] {
                    // SAFETY: the event was recorded after the previous copy out of this stage.
                    check("cuEventSynchronize", unsafe { result::event::synchronize(events[slot]) })?;
                }
                // Checkpoint-backed weights are read (and folded) from the mapping chunk by chunk.
                let values: &[f32] = match &data[w] {
                    WeightData::Dense(v) => &v[start..start + count],
                    lazy => {
                        scratch_f32.resize(count, 0.0);
                        let chunks = SyncSlice(scratch_f32.as_mut_ptr());
                        parallel_ranges(count, |r| {
                            // SAFETY: ranges are disjoint, inside `scratch_f32`.
                            let out = unsafe { std::slice::from_raw_parts_mut(chunks.at(r.start), r.len()) };
                            lazy.read_into(ckpt, start + r.start, out);
                        });
                        &scratch_f32
                    }
                };
                let stage = &mut stages[slot];
                match elem {
                    Elem::Bf16 => {
                        let out = SyncSlice(stage.as_mut_slice::<u16>().as_mut_ptr());
                        parallel_ranges(count, |r| {
                            // SAFETY: disjoint ranges inside the stage (count ≤ its capacity).
                            let o = unsafe { std::slice::from_raw_parts_mut(out.at(r.start), r.len()) };
                            o.iter_mut().zip(&values[r]).for_each(|(o, v)| *o = half::bf16::from_f32(*v).to_bits());
                        });
                    }
                    _ => stage.as_mut_slice::<f32>()[..count].copy_from_slice(values),
                }
                // SAFETY: the stage holds `count` converted values; the event marks when the copy
                // has read them, before the stage is refilled.
                unsafe {
                    check(
                        "weight upload",
                        sys::cuMemcpyHtoDAsync_v2(
                            dst + (start * elem.size()) as u64,
                            stage.host as *const c_void,
                            count * elem.size(),
                            stream,
                        )
                        .result(),
                    )?;
                    check("cuEventRecord", result::event::record(events[slot], stream))?;
                }
                used[slot] = true;
            }
        }
        // SAFETY: the stream belongs to the caller's backend.
        check("weight upload", unsafe { result::stream::synchronize(stream) })
    })();
    for e in events {
        // SAFETY: created above, destroyed once after the stream is idle (or failed).
        let _ = unsafe { result::event::destroy(e) };
    }
    upload?;
    log::info!("uploaded {:.1} MiB of weights in {:.2?}", memory.bytes as f64 / (1 << 20) as f64, started.elapsed());
    Ok(UploadedWeights { memory, ptrs })
}

/// A raw pointer that scoped threads may share; each thread writes a disjoint range.
#[derive(Clone, Copy)]
struct SyncSlice<T>(*mut T);
// SAFETY: used only to hand disjoint sub-ranges of one buffer to scoped threads.
unsafe impl<T> Sync for SyncSlice<T> {}
unsafe impl<T> Send for SyncSlice<T> {}
impl<T> SyncSlice<T> {
    fn at(self, i: usize) -> *mut T {
        // SAFETY: callers stay within the buffer this pointer was taken from.
        unsafe { self.0.add(i) }
    }
}

/// The lowered step: launches, their streams and cross-stream waits, where each plan phase
/// starts among them, and the products.
struct Lowered {
    steps: Vec<Step>,
    schedule: Schedule,
    phase_steps: Vec<(String, usize)>,
    sections: Vec<Section>,
    matmuls: Vec<Matmul>,
}

/// Turns plan ops into steps with resolved device addresses.
struct Lowering<'a> {
    backend: &'a CudaBackend,
    weights: &'a HashMap<(usize, Elem), DevPtr>,
    /// Each lane's scratch regions, and the RoPE tables (read-only, shared).
    scratch: &'a [Scratch],
    rope: (DevPtr, DevPtr),
    rope_rows: Option<RopeRows>,
    /// The lane of every plan op, and that of the op being lowered.
    op_lanes: &'a [usize],
    /// The host-input copy table and its pieces (see [`copied_input`]).
    host_inputs: (DevPtr, usize),
    lane: usize,
    /// Lower few-query multi-query attention to `Kernels::attention_mq256` (off with
    /// FRT_NO_FUSED_ATTENTION=1), sized for this many SMs.
    fused_attention: bool,
    multiprocessors: usize,
    /// The first ops of the MLPs lowered as one streamed launch ([`fused_mlps`]), ascending, and
    /// those of them launched as programmatic dependents of their norm ([`mlps_after_their_norm`]).
    mlps: &'a [usize],
    early_mlps: &'a [usize],
    /// The attentions launched as programmatic dependents of their RoPE kernel, with the keys it
    /// does not write ([`attentions_after_their_rope`]), and the plan op being lowered.
    early_attentions: &'a [(usize, usize)],
    op_index: usize,
    /// RoPE (loading its table rows first) and the gated residual norms right after a cuBLASLt
    /// product launched as its programmatic dependents (bench/NOTES.md item 72;
    /// FRT_NO_EARLY_AFTER_PRODUCTS=1: off).
    early_after_products: bool,
    /// The streamed MLPs' weights as that kernel reads them, by weight index.
    tiled: &'a HashMap<usize, DevPtr>,
    steps: Vec<Step>,
    /// For each step: its lane, and what the plan ops it came from read and write.
    step_lanes: Vec<usize>,
    step_accesses: Vec<Accesses>,
    phase_steps: Vec<(String, usize)>,
    /// The prompt bucket of each phase (as `phase_steps`).
    phase_buckets: Vec<Option<usize>>,
    matmuls: Vec<Matmul>,
}

impl Lowering<'_> {
    fn scratch(&self) -> &Scratch {
        &self.scratch[self.lane]
    }

    /// Whether the step about to be lowered from the current op is launched as the programmatic
    /// dependent of a cuBLASLt product: it directly follows one on its stream and in its phase,
    /// and `early_after_products` is on.
    fn early_after_product(&self) -> bool {
        self.early_after_products
            && self.backend.plan.phase_starting_at(self.op_index).is_none()
            && self.step_lanes.last() == Some(&self.lane)
            && matches!(self.steps.last(), Some(Step::Gemm { .. }))
    }

    /// Marks the steps pushed since step `from` as running on `lane` with these accesses.
    fn tag(&mut self, from: usize, lane: usize, accesses: Accesses) {
        for _ in from..self.steps.len() {
            self.step_lanes.push(lane);
            self.step_accesses.push(accesses.clone());
        }
    }

    /// Marks the steps pushed since step `from` as the lowering of `ops`: their lane and accesses.
    fn tag_steps(&mut self, from: usize, ops: std::ops::Range<usize>) {
        let plan = &self.backend.plan;
        let mut accesses = Accesses::default();
        ops.clone().for_each(|i| accesses.extend(plan.ops[i].accesses(&plan.buffers)));
        self.tag(from, self.op_lanes[ops.start], accesses);
    }

    fn buf(&self, id: BufId) -> DeviceBuf {
        self.backend.bufs[id.0]
    }

    fn ptr(&self, id: BufId) -> DevPtr {
        self.buf(id).ptr
    }

    fn mat(&self, v: View) -> Result<Mat> {
        let b = self.buf(v.buf);
        let dtype = b.elem.dtype().ok_or_else(|| self.error(format!("buffer {} is not a float buffer", self.name(v.buf))))?;
        // Checked in every build: a plan is public data, and a view past its buffer would have a
        // kernel read or write device memory it does not own.
        if v.end() > b.len {
            return Err(self.error(format!("view ending at {} is past the end of {} ({} elements)", v.end(), self.name(v.buf), b.len)));
        }
        Ok(Mat { ptr: b.ptr + (v.offset * b.elem.size()) as u64, rows: v.rows, cols: v.cols, stride: v.stride, dtype })
    }

    fn name(&self, id: BufId) -> &str {
        &self.backend.plan.buffers[id.0].name
    }

    fn weight(&self, id: WeightId, elem: Elem) -> DevPtr {
        self.weights[&(id.0, elem)]
    }

    fn error(&self, message: String) -> Error {
        Error::Backend(format!("lowering the plan for CUDA: {message}"))
    }

    fn lower(mut self) -> Result<Lowered> {
        let plan = &self.backend.plan;
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
            // Fusions at the denoise loop's step boundary (bench/NOTES.md item 66): the gated
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
                    let step = Step::GatedResidualRmsNorm {
                        out: self.mat(*out)?,
                        x: self.mat(*x)?,
                        y: self.mat(*y)?,
                        gate: self.weight(*modulation, Elem::F32),
                        norm: self.weight(*norm, Elem::F32),
                        eps: *eps,
                        early,
                    };
                    self.steps.push(step);
                    ops.next();
                    self.tag_steps(from, i..i + 2);
                    continue;
                }
            }
            // Fusion: the expert's MLP (product, GeGLU, product) as one streamed launch.
            if self.mlps.binary_search(&i).is_ok() {
                let (
                    Op::Gemm { a, w: w_gate_up, .. },
                    Some((_, Op::GeluTanhMul { out: hidden, .. })),
                    Some((_, Op::Gemm { w: w_down, out, .. })),
                ) = (op, ops.next(), ops.next())
                else {
                    return Err(self.error(format!("op {i} is not the first of a product, GeGLU, product sequence")));
                };
                self.steps.push(Step::StreamedMlp {
                    out: self.mat(*out)?,
                    hidden: self.mat(*hidden)?,
                    a: self.mat(*a)?,
                    w_gate_up: self.tiled[&w_gate_up.0],
                    w_down: self.tiled[&w_down.0],
                    barrier: self.scratch().grid_barrier,
                    multiprocessors: self.multiprocessors,
                    programmatic: self.early_mlps.binary_search(&i).is_ok(),
                });
                self.tag_steps(from, i..i + 3);
                continue;
            }
            // Fusion: a product and the GELU over its output (SigLIP's MLP) as cuBLASLt's epilogue.
            if let (Op::Gemm { a, w, bias, out, accumulate: false }, Some((next, Op::GeluTanh { x }))) = (op, ops.peek()) {
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

    /// The step-boundary fusion starting at op `i`, if its ops are there (in one phase) and the
    /// row kernels take their shapes.
    fn step_boundary(&self, i: usize) -> Result<Option<Step>> {
        let plan = &self.backend.plan;
        let in_phase = |j: usize| j < plan.ops.len() && plan.phase_starting_at(j).is_none();
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
            ] if nx == x && a == out && in_phase(i + 1) && in_phase(i + 2) && acc.cols <= ROW_PRODUCT_MAX => {
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
            [Op::Gemm { a, w, bias, out: x, accumulate: false }, norm, ..] if in_phase(i + 1) && a.cols <= ROW_PRODUCT_MAX => {
                let (nx, out, modulation, eps) = match *norm {
                    Op::AdaRmsNorm { x: nx, out, modulation, eps } => (nx, out, Some(self.weight(modulation, Elem::F32)), eps),
                    Op::RmsNorm { x: nx, out, eps } => (nx, out, None, eps),
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

    fn lower_op(&mut self, op: &Op) -> Result<()> {
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
            Op::LayerNorm { x, out, gamma, beta, eps } => Step::LayerNorm {
                out: self.mat(out)?,
                x: self.mat(x)?,
                gamma: self.weight(gamma, Elem::F32),
                beta: self.weight(beta, Elem::F32),
                eps,
            },
            Op::RmsNorm { x, out, eps } => Step::RmsNorm { out: self.mat(out)?, x: self.mat(x)?, modulation: None, eps },
            Op::AdaRmsNorm { x, out, modulation, eps } => {
                Step::RmsNorm { out: self.mat(out)?, x: self.mat(x)?, modulation: Some(self.weight(modulation, Elem::F32)), eps }
            }
            Op::GatedResidual { x, y, modulation } => {
                Step::GatedResidual { x: self.mat(x)?, y: self.mat(y)?, modulation: self.weight(modulation, Elem::F32) }
            }
            Op::GeluTanh { x } => Step::GeluTanh { x: self.mat(x)? },
            Op::GeluTanhMul { gate_up, out } => Step::GeluTanhMul { out: self.mat(out)?, gate_up: self.mat(gate_up)? },
            Op::Embed { tokens, table, scale, out } => {
                let WeightRole::Embedding { vocab, width } = self.backend.plan.weights[table.0].role else {
                    return Err(self.error(format!("embed table {} is not an embedding", self.backend.plan.weights[table.0].name)));
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
            Op::RopeQkv { qkv, heads, head_dim, positions, position_offset, k_cache, v_cache, cache_row } => {
                let rows = self.rope_rows.filter(|r| r.positions == positions && r.half == head_dim / 2);
                let (positions, (cos, sin)) = match rows {
                    Some(r) => (None, r.rows),
                    None => (Some(self.ptr(positions)), self.rope),
                };
                Step::Rope(RopeArgs {
                    qkv: self.mat(qkv)?,
                    heads,
                    head_dim,
                    positions,
                    position_offset,
                    k_cache: self.mat(k_cache)?,
                    v_cache: self.mat(v_cache)?,
                    cache_row,
                    cos,
                    sin,
                    early: self.early_after_product(),
                })
            }
            Op::Attention { q, k, v, out, heads, kv_heads, head_dim, groups, key_valid, query_valid } => {
                return self.attention(q, k, v, out, heads, kv_heads, head_dim, groups, key_valid, query_valid);
            }
            Op::Copy { src, dst } => Step::Copy { dst: self.mat(dst)?, src: self.mat(src)? },
            Op::Affine { x, scale, offset, out } => Step::Affine {
                out: self.mat(out)?,
                x: self.mat(x)?,
                scale: self.weight(scale, Elem::F32),
                offset: self.weight(offset, Elem::F32),
            },
            Op::PromptBucket { token_mask } => {
                Step::PromptBucket { token_mask: self.ptr(token_mask), prompt_len: self.buf(token_mask).len }
            }
        };
        self.steps.push(step);
        Ok(())
    }

    /// Adds a product; if cuBLASLt has no batched algorithm for it, one product per batch entry.
    fn matmul(&mut self, spec: MatmulSpec) -> Result<()> {
        let lt = self.backend.lt.0;
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

    /// `out (+)= a · wᵀ (+ bias)`: see the column-major mapping in `gemm.rs`.
    fn gemm(&mut self, a: View, w: WeightId, bias: Option<WeightId>, out: View, accumulate: bool, gelu: bool) -> Result<()> {
        let WeightRole::Matrix { n, k } = self.backend.plan.weights[w.0].role else {
            return Err(self.error(format!("GEMM weight {} is not a matrix", self.backend.plan.weights[w.0].name)));
        };
        if a.cols != k || out.cols != n || a.rows != out.rows {
            return Err(self.error(format!("GEMM {}x{} · [{n}, {k}]ᵀ into {}x{}", a.rows, a.cols, out.rows, out.cols)));
        }
        let mut a_mat = self.mat(a)?;
        if a_mat.dtype == Dtype::F32 {
            let shadow = Mat { ptr: self.scratch().shadow, rows: a.rows, cols: a.cols, stride: a.cols, dtype: Dtype::Bf16 };
            self.steps.push(Step::Copy { dst: shadow, src: a_mat });
            a_mat = shadow;
        }
        let d = self.mat(out)?;
        let spec = MatmulSpec {
            a: Operand { ptr: self.weight(w, Elem::Bf16), dtype: Dtype::Bf16, rows: k, cols: n, ld: k, transpose: true, batch_stride: 0 },
            b: Operand { ptr: a_mat.ptr, dtype: Dtype::Bf16, rows: k, cols: a.rows, ld: a_mat.stride, transpose: false, batch_stride: 0 },
            d: Operand { ptr: d.ptr, dtype: d.dtype, rows: n, cols: out.rows, ld: d.stride, transpose: false, batch_stride: 0 },
            batch: 1,
            alpha: 1.0,
            beta: if accumulate { 1.0 } else { 0.0 },
            bias: bias.map(|b| self.weight(b, Elem::from(d.dtype))),
            gelu,
        };
        self.matmul(spec)
    }

    /// Softmax attention as two batched cuBLASLt products around the masked softmax kernel, one
    /// group (camera) at a time: `S_h = Q_h Kᵀ / √d` (f32), `P = softmax(S)` (bf16),
    /// `O_h = P_h V` written into head h's columns of `out`. Heads batch with stride `head_dim`;
    /// with one K/V head (multi-query) K and V are broadcast (batch stride 0). Queries marked
    /// invalid get zero probabilities, hence a zero output row, as on the CPU.
    #[allow(clippy::too_many_arguments)] // the op's own fields, one to one
    fn attention(
        &mut self,
        q: View,
        k: View,
        v: View,
        out: View,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        groups: usize,
        key_valid: Option<BufId>,
        query_valid: Option<BufId>,
    ) -> Result<()> {
        let kv_stride = if kv_heads == heads {
            head_dim
        } else if kv_heads == 1 {
            0
        } else {
            return Err(
                self.error(format!("{heads} query heads over {kv_heads} K/V heads: only multi-head and multi-query attention are lowered"))
            );
        };
        let (qs, ks, vs) = (self.mat(q)?, self.mat(k)?, self.mat(v)?);
        if [qs.dtype, ks.dtype, vs.dtype] != [Dtype::Bf16; 3] {
            return Err(self.error(format!("attention operands must be bf16, got {:?}/{:?}/{:?}", qs.dtype, ks.dtype, vs.dtype)));
        }
        let masked = key_valid.is_some() || query_valid.is_some();
        match AttentionLowering::of(q.rows, k.rows, heads, kv_heads, head_dim, groups, masked, self.fused_attention, self.multiprocessors) {
            AttentionLowering::ActionTokens(split) => {
                self.steps.push(Step::FusedAttention(AttentionArgs {
                    q: qs,
                    k: ks,
                    v: vs,
                    out: self.mat(out)?,
                    heads,
                    key_valid: key_valid.map(|b| self.ptr(b)),
                    query_valid: query_valid.map(|b| self.ptr(b)),
                    split,
                    partial_o: self.scratch().attention_o,
                    partial_ml: self.scratch().attention_ml,
                    keys_ready: self
                        .early_attentions
                        .binary_search_by_key(&self.op_index, |e| e.0)
                        .ok()
                        .map(|e| self.early_attentions[e].1),
                }));
                return Ok(());
            }
            AttentionLowering::Vision => {
                self.steps.push(Step::VisionAttention { out: self.mat(out)?, q: qs, k: ks, v: vs, heads, groups });
                return Ok(());
            }
            AttentionLowering::Products => {}
        }
        let (rows, keys) = (q.rows / groups, k.rows / groups);
        for g in 0..groups {
            let (qg, kg, vg, og) = (
                self.mat(q.rows(g * rows, rows))?,
                self.mat(k.rows(g * keys, keys))?,
                self.mat(v.rows(g * keys, keys))?,
                self.mat(out.rows(g * rows, rows))?,
            );
            let (scores, probs) = (self.scratch().scores, self.scratch().probs);
            self.matmul(MatmulSpec {
                a: Operand {
                    ptr: kg.ptr,
                    dtype: Dtype::Bf16,
                    rows: head_dim,
                    cols: keys,
                    ld: kg.stride,
                    transpose: true,
                    batch_stride: kv_stride,
                },
                b: Operand {
                    ptr: qg.ptr,
                    dtype: Dtype::Bf16,
                    rows: head_dim,
                    cols: rows,
                    ld: qg.stride,
                    transpose: false,
                    batch_stride: head_dim,
                },
                d: Operand {
                    ptr: scores,
                    dtype: Dtype::F32,
                    rows: keys,
                    cols: rows,
                    ld: keys,
                    transpose: false,
                    batch_stride: rows * keys,
                },
                batch: heads,
                alpha: 1.0 / (head_dim as f32).sqrt(),
                beta: 0.0,
                bias: None,
                gelu: false,
            })?;
            let key_valid = key_valid.map(|b| self.ptr(b) + (g * keys * 4) as u64);
            let query_valid = query_valid.map(|b| self.ptr(b) + (g * rows * 4) as u64);
            self.steps.push(Step::Softmax { p: probs, s: scores, rows: heads * rows, queries: rows, keys, key_valid, query_valid });
            self.matmul(MatmulSpec {
                a: Operand {
                    ptr: vg.ptr,
                    dtype: Dtype::Bf16,
                    rows: head_dim,
                    cols: keys,
                    ld: vg.stride,
                    transpose: false,
                    batch_stride: kv_stride,
                },
                b: Operand {
                    ptr: probs,
                    dtype: Dtype::Bf16,
                    rows: keys,
                    cols: rows,
                    ld: keys,
                    transpose: false,
                    batch_stride: rows * keys,
                },
                d: Operand {
                    ptr: og.ptr,
                    dtype: og.dtype,
                    rows: head_dim,
                    cols: rows,
                    ld: og.stride,
                    transpose: false,
                    batch_stride: head_dim,
                },
                batch: heads,
                alpha: 1.0,
                beta: 0.0,
                bias: None,
                gelu: false,
            })?;
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_name(&self) -> String {
        self.device_name.clone()
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn memory_bytes(&self) -> usize {
        self.arena.bytes + self.weight_bytes()
    }

    fn input_u8(&mut self, id: BufId) -> &mut [u8] {
        self.host_buffer_mut(id).as_mut_slice()
    }

    fn input_i32(&mut self, id: BufId) -> &mut [i32] {
        self.host_buffer_mut(id).as_mut_slice()
    }

    fn input_f32(&mut self, id: BufId) -> &mut [f32] {
        self.host_buffer_mut(id).as_mut_slice()
    }

    fn run(&mut self) -> Result<()> {
        self.ctx.make_current()?;
        // Host inputs are not touched while the graph runs: `&mut self` until the sync returns.
        let graph = self.graph.as_ref().expect("captured at open");
        graph.launch(self.stream.0)?;
        self.synchronize("step")?;
        self.runs += 1;
        if self.runs == PROFILE_AFTER_RUNS {
            if let Some(path) = self.profile.take() {
                self.profile_phases(&path)?;
            }
        }
        Ok(())
    }

    fn output_f32(&self, id: BufId) -> &[f32] {
        self.host_buffer(id).as_slice()
    }

    fn read_buffer(&self, name: &str) -> Option<Vec<f32>> {
        let id = self.plan.find_buffer(name)?;
        let b = self.bufs[id.0];
        self.ctx.make_current().ok()?;
        // SAFETY: the buffer holds `len` elements of `elem`; the stream is idle between steps.
        unsafe {
            match b.elem {
                Elem::F32 => {
                    let mut out = vec![0f32; b.len];
                    result::memcpy_dtoh_sync(&mut out, b.ptr).ok()?;
                    Some(out)
                }
                Elem::Bf16 => {
                    let mut raw = vec![0u16; b.len];
                    result::memcpy_dtoh_sync(&mut raw, b.ptr).ok()?;
                    Some(raw.into_iter().map(|v| half::bf16::from_bits(v).to_f32()).collect())
                }
                Elem::I32 | Elem::U8 => None,
            }
        }
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // The fields release themselves in declaration order (graph, stream, handle, matmuls,
        // kernels, memory, the context last); they need the context current and the GPU idle.
        if self.ctx.make_current().is_ok() {
            let _ = self.synchronize("teardown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_streams_stay_f32_and_gemm_inputs_go_bf16() {
        let mut plan = Plan::default();
        let x = plan.matrix("x", 4, 8);
        let h = plan.matrix("h", 4, 8);
        let y = plan.matrix("y", 4, 8);
        let w = plan.weight("w", WeightRole::Matrix { n: 8, k: 8 });
        plan.push(Op::RmsNorm { x, out: h, eps: 1e-6 });
        plan.push(Op::Gemm { a: h, w, bias: None, out: x, accumulate: true });
        // `x` is also a GEMM input: it stays f32 (accumulated) and is converted before use.
        plan.push(Op::Gemm { a: x, w, bias: None, out: y, accumulate: false });
        let elems = element_types(&plan);
        assert_eq!(elems, vec![Elem::F32, Elem::Bf16, Elem::F32]);
    }

    /// The expert's MLP shape in small: a → gate/up → GeGLU → down, `out` read by a residual
    /// (so f32); `extra` adds what must rule the fusion out.
    fn mlp_plan(extra: impl FnOnce(&mut Plan, WeightId, View)) -> (Plan, usize) {
        let mut plan = Plan::default();
        let (x, a, gate_up, hidden, out) = (
            plan.matrix("x", 4, 64),
            plan.matrix("a", 4, 64),
            plan.matrix("gate_up", 4, 256),
            plan.matrix("hidden", 4, 128),
            plan.matrix("out", 4, 64),
        );
        let (w_gate_up, w_down) =
            (plan.weight("gate_up", WeightRole::Matrix { n: 256, k: 64 }), plan.weight("down", WeightRole::Matrix { n: 64, k: 128 }));
        let modulation = plan.weight("modulation", WeightRole::Vector);
        plan.push(Op::RmsNorm { x, out: a, eps: 1e-6 });
        let first = plan.ops.len();
        plan.push(Op::Gemm { a, w: w_gate_up, bias: None, out: gate_up, accumulate: false });
        plan.push(Op::GeluTanhMul { gate_up, out: hidden });
        plan.push(Op::Gemm { a: hidden, w: w_down, bias: None, out, accumulate: false });
        plan.push(Op::GatedResidual { x, y: out, modulation });
        extra(&mut plan, w_down, gate_up);
        (plan, first)
    }

    #[test]
    fn the_expert_mlp_fuses_only_where_nothing_else_needs_its_parts() {
        let fused = |plan: &Plan, runs: bool| fused_mlps(plan, &element_types(plan), |_, _, _, _| runs);
        let (plan, first) = mlp_plan(|_, _, _| {});
        assert_eq!(fused(&plan, true), vec![first]);
        let (w_gate_up, w_down) = (WeightId(0), WeightId(1));
        assert_eq!(mlp_weight_tiling(&plan, &[first]), vec![(w_gate_up, 128, true), (w_down, 0, true)]);
        // The kernel cannot run the shape or on that stream.
        assert_eq!(fused(&plan, false), Vec::<usize>::new());
        // The down weight serves another product too: fused, with a tiled copy of it.
        let (plan, _) = mlp_plan(|plan, w_down, _| {
            let (h, y) = (plan.matrix("h2", 4, 128), plan.matrix("y2", 4, 64));
            plan.push(Op::Gemm { a: h, w: w_down, bias: None, out: y, accumulate: false });
        });
        assert_eq!(fused(&plan, true), vec![first]);
        assert_eq!(mlp_weight_tiling(&plan, &[first]), vec![(w_gate_up, 128, true), (w_down, 0, false)]);
        // Another op reads the gate/up output the fused kernel never writes.
        let (plan, _) = mlp_plan(|plan, _, gate_up| plan.push(Op::GeluTanh { x: gate_up }));
        assert!(fused(&plan, true).is_empty());
        // An unfused MLP after it (as on the second stream) writes the buffer before its GeGLU reads it.
        let mut second = 0;
        let (plan, first) = mlp_plan(|plan, _, gate_up| {
            let (a, hidden, out) = (plan.matrix("a2", 4, 64), plan.matrix("hidden2", 4, 128), plan.matrix("out2", 4, 64));
            let (w1, w2) =
                (plan.weight("gate_up2", WeightRole::Matrix { n: 256, k: 64 }), plan.weight("down2", WeightRole::Matrix { n: 64, k: 128 }));
            second = plan.ops.len();
            plan.push(Op::Gemm { a, w: w1, bias: None, out: gate_up, accumulate: false });
            plan.push(Op::GeluTanhMul { gate_up, out: hidden });
            plan.push(Op::Gemm { a: hidden, w: w2, bias: None, out, accumulate: false });
        });
        assert_eq!(fused_mlps(&plan, &element_types(&plan), |i, _, _, _| i == first), vec![first]);
        assert_eq!(fused_mlps(&plan, &element_types(&plan), |i, _, _, _| i == second), vec![second]);
        assert_eq!(fused(&plan, true), vec![first, second]);
        // A phase starting inside the sequence.
        let mut plan = Plan::default();
        let (a, gate_up, hidden, out) =
            (plan.matrix("a", 4, 64), plan.matrix("gate_up", 4, 256), plan.matrix("hidden", 4, 128), plan.matrix("out", 4, 64));
        let (w1, w2) =
            (plan.weight("gate_up", WeightRole::Matrix { n: 256, k: 64 }), plan.weight("down", WeightRole::Matrix { n: 64, k: 128 }));
        plan.push(Op::Gemm { a, w: w1, bias: None, out: gate_up, accumulate: false });
        plan.push(Op::GeluTanhMul { gate_up, out: hidden });
        plan.phase("next");
        plan.push(Op::Gemm { a: hidden, w: w2, bias: None, out, accumulate: false });
        assert!(fused(&plan, true).is_empty());
    }

    #[test]
    fn a_fused_mlp_starts_early_only_right_after_the_norm_of_its_a() {
        let (plan, first) = mlp_plan(|_, _, _| {});
        let lanes = vec![0; plan.ops.len()];
        assert_eq!(mlps_after_their_norm(&plan, &[first], &lanes), vec![first]);
        // Not across streams, nor into a phase, nor after anything but an RMS norm of the whole A.
        let mut other_lane = lanes.clone();
        other_lane[first - 1] = 1;
        assert!(mlps_after_their_norm(&plan, &[first], &other_lane).is_empty());
        let mut phased = plan.clone();
        phased.phase("mlp");
        phased.phases.last_mut().unwrap().first_op = first;
        assert!(mlps_after_their_norm(&phased, &[first], &lanes).is_empty());
        let mut copied = plan.clone();
        let Op::RmsNorm { x, out, .. } = copied.ops[first - 1] else { panic!("mlp_plan has the norm before the MLP") };
        copied.ops[first - 1] = Op::Copy { src: x, dst: out };
        assert!(mlps_after_their_norm(&copied, &[first], &lanes).is_empty());
        let mut partial = plan.clone();
        if let Op::RmsNorm { out, .. } = &mut partial.ops[first - 1] {
            *out = out.cols(0, 32);
        }
        assert!(mlps_after_their_norm(&partial, &[first], &lanes).is_empty());
    }

    #[test]
    fn an_attention_starts_early_only_right_after_its_rope_and_before_the_rows_rope_writes() {
        // Four action tokens, two query heads of 8, over 12 cached keys and their own 4 (rows 12-15).
        let mut plan = Plan::default();
        let qkv = plan.matrix("qkv", 4, 4 * 8);
        let (positions, valid) = (plan.buffer("positions", BufType::I32, 16), plan.buffer("valid", BufType::F32, 16));
        let (k_cache, v_cache, out) = (plan.matrix("k", 16, 8), plan.matrix("v", 16, 8), plan.matrix("out", 4, 16));
        plan.push(Op::RopeQkv { qkv, heads: 2, head_dim: 8, positions, position_offset: 12, k_cache, v_cache, cache_row: 12 });
        let attention = Op::Attention {
            q: qkv.cols(0, 16),
            k: k_cache,
            v: v_cache,
            out,
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
            groups: 1,
            key_valid: Some(valid),
            query_valid: None,
        };
        plan.push(attention);
        let lanes = vec![0; plan.ops.len()];
        assert_eq!(attentions_after_their_rope(&plan, &lanes), vec![(1, 12)]);
        // A V cache that RoPE fills from an earlier row bounds the keys too.
        let mut early_v = plan.clone();
        if let Op::Attention { v, .. } = &mut early_v.ops[1] {
            *v = v_cache.rows(4, 12);
        }
        assert_eq!(attentions_after_their_rope(&early_v, &lanes), vec![(1, 8)]);
        // Not on the second stream, nor into a phase, nor after another op, nor when RoPE writes
        // the key mask or another buffer holds the queries.
        assert!(attentions_after_their_rope(&plan, &[0, 1]).is_empty());
        assert!(attentions_after_their_rope(&plan, &[1, 1]).is_empty());
        let mut phased = plan.clone();
        phased.phase("attention");
        phased.phases.last_mut().unwrap().first_op = 1;
        assert!(attentions_after_their_rope(&phased, &lanes).is_empty());
        let mut copied = plan.clone();
        copied.ops[0] = Op::Copy { src: out, dst: out };
        assert!(attentions_after_their_rope(&copied, &lanes).is_empty());
        let mut masked_by_cache = plan.clone();
        let cache_buf = k_cache.buf;
        if let Op::Attention { key_valid, .. } = &mut masked_by_cache.ops[1] {
            *key_valid = Some(cache_buf);
        }
        assert!(attentions_after_their_rope(&masked_by_cache, &lanes).is_empty());
        let mut other_q = plan.clone();
        if let Op::Attention { q, .. } = &mut other_q.ops[1] {
            *q = out;
        }
        assert!(attentions_after_their_rope(&other_q, &lanes).is_empty());
    }

    #[test]
    fn each_pi05_attention_gets_its_kernel() {
        use AttentionLowering::{ActionTokens, Products, Vision};
        let of = |queries, keys, heads, kv_heads, head_dim, groups, masked, fused| {
            AttentionLowering::of(queries, keys, heads, kv_heads, head_dim, groups, masked, fused, 132)
        };
        // The 50 action tokens over a 2-camera prefix and themselves: split over about 132 blocks.
        match of(50, 762, 8, 1, 256, 1, true, true) {
            ActionTokens(split) => {
                assert!(split.splits > 1 && split.splits * split.keys_per_split >= 762, "{split:?}");
                assert_eq!(split.partial_lens, (split.splits * 400 * 256, split.splits * 400 * 2));
            }
            other => panic!("action tokens lowered as {other:?}"),
        }
        // SigLIP, two cameras of 256 tokens; masked or too many keys per camera falls back.
        assert_eq!(of(512, 512, 16, 16, 72, 2, false, true), Vision);
        assert_eq!(of(512, 512, 16, 16, 72, 2, true, true), Products);
        let too_many = flashrt_kernels::VISION_MAX_KEYS + 1;
        assert_eq!(of(too_many, too_many, 16, 16, 72, 1, false, true), Products);
        // The 712-token prefix keeps the products, and everything does with the fused kernels off.
        assert_eq!(of(712, 712, 8, 1, 256, 1, true, true), Products);
        assert_eq!(of(50, 762, 8, 1, 256, 1, true, false), Products);
        assert_eq!(of(512, 512, 16, 16, 72, 2, false, false), Products);
    }
}

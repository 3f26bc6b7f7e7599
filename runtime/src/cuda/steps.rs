//! The lowered step: every kernel launch and product with its device addresses resolved at
//! open, and the schedule that puts them on streams with their cross-stream waits.

use std::ops::Range;

use flashrt_kernels::{AttentionArgs, DevPtr, HeadsAttentionArgs, Mat, MlpFp8Scales, QwenImageArgs, RopeArgs};

use crate::plan::{Accesses, Activation, BufId, cross_lane_waits};

/// One enqueued operation of the lowered step.
pub(super) enum Step {
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
    /// An FP8 product's input in e4m3: `dst = e4m3(src · inverse_scale)`.
    QuantizeE4m3 {
        dst: Mat,
        src: Mat,
        inverse_scale: f32,
    },
    QwenImagePatches(QwenImageArgs),
    ScatterRows {
        dst: Mat,
        src: Mat,
        index: DevPtr,
        accumulate: bool,
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
    /// Here and in `RmsNorm`, `GatedResidualRmsNorm` and `GatedActivation`: `out` is in e4m3
    /// when it is an FP8 product's input (`fusion::e4m3_producers`, `fusion::rope_after`), each
    /// value times `out_scale` (that product's inverse input scale; 1 otherwise) before it is
    /// stored.
    LayerNorm {
        out: Mat,
        out_scale: f32,
        x: Mat,
        affine: Option<(DevPtr, DevPtr)>,
        modulation: Option<DevPtr>,
        eps: f32,
    },
    /// Each row's `heads` equal column slices normalised separately (1: the whole row).
    RmsNorm {
        out: Mat,
        out_scale: f32,
        x: Mat,
        heads: usize,
        weight: Option<DevPtr>,
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
        out_scale: f32,
        x: Mat,
        y: Mat,
        gate: DevPtr,
        norm: DevPtr,
        eps: f32,
        /// Leaves `y` zero once read, for the streamed product that writes it next
        /// (`fusion::zeroing_readers`).
        zero_y: bool,
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
    Activation {
        x: Mat,
        kind: Activation,
    },
    /// `gate_up` in e4m3, read times `in_scale`, where the FP8 product before it stores its
    /// output so (`ProductScales::output`); else bf16 and 1.
    GatedActivation {
        out: Mat,
        out_scale: f32,
        gate_up: Mat,
        in_scale: f32,
        kind: Activation,
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
        /// In FP8 (e4m3 weights and activations) with these scales, else bf16.
        fp8: Option<MlpFp8Scales>,
        /// FP8: all of K summed in the MMA's accumulator (`Switches::fp8_fast_accumulation`).
        fast_accumulation: bool,
        multiprocessors: usize,
        /// Launched as a programmatic dependent of the norm step before it (see `after_their_norm`).
        programmatic: bool,
    },
    /// A few-row FP8 product `out = a · wᵀ` as one streamed launch (`Kernels::product_stream`),
    /// its weight tiled in e4m3 at open.
    StreamedProduct {
        out: Mat,
        a: Mat,
        w: DevPtr,
        barrier: DevPtr,
        /// Its (input, weight) scales.
        scales: (f32, f32),
        /// All of K summed in the MMA's accumulator (`Switches::fp8_fast_accumulation`).
        fast_accumulation: bool,
        multiprocessors: usize,
        /// Launched as a programmatic dependent of the norm step before it.
        programmatic: bool,
        /// `out` holds zeros when it starts (the step that read it last left them), so its K
        /// splits add into it without zeroing it and a grid barrier first.
        out_zeroed: bool,
    },
    /// A few-row QKV product in FP8 and its RoPE as one streamed launch
    /// (`Kernels::qkv_rope_stream`): `a` in e4m3, the weight tiled in e4m3 with each head's
    /// halves paired, `rope` what the RoPE op writes.
    StreamedQkvRope {
        a: Mat,
        w: DevPtr,
        /// Its (input, weight) scales.
        scales: (f32, f32),
        /// All of K summed in the MMA's accumulator (`Switches::fp8_fast_accumulation`).
        fast_accumulation: bool,
        rope: RopeArgs,
        multiprocessors: usize,
        /// Launched as a programmatic dependent of the norm step before it.
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
    /// Attention of a head dimension over a few hundred keys per group in one kernel (see
    /// `Kernels::attention_heads`).
    HeadsAttention(HeadsAttentionArgs),
    Softmax {
        p: DevPtr,
        s: DevPtr,
        rows: usize,
        queries: usize,
        keys: usize,
        key_valid: Option<DevPtr>,
        query_valid: Option<DevPtr>,
        causal: Option<usize>,
    },
    Affine {
        out: Mat,
        x: Mat,
        scale: DevPtr,
        offset: DevPtr,
    },
    RtcGuide {
        x: Mat,
        step: Mat,
        prev: Mat,
        weights: DevPtr,
        shift: DevPtr,
        prefix_cols: usize,
        /// Flow time, Euler step and guidance weight of this denoise step.
        scalars: (f32, f32, f32),
    },
    RtcPrefix {
        x: Mat,
        prev: Mat,
        prefix: DevPtr,
        prefix_cols: usize,
    },
    RtcEuler {
        x: Mat,
        step: Mat,
        strength: DevPtr,
    },
    /// Copies the selected entries of stacked weights into the weights the products read (see
    /// `Kernels::select_weights`): `count` pieces at `pieces`, the entry in the i32 at `index`.
    SelectWeights {
        pieces: DevPtr,
        count: usize,
        blocks_per_piece: usize,
        index: DevPtr,
    },
    /// Sets the conditional handles of the prompt buckets' IF nodes (only inside the step's graph).
    PromptBucket {
        token_mask: DevPtr,
        prompt_len: usize,
    },
}

/// The streams the step runs on: the main one, and the one a concurrent phase takes.
pub(super) const LANES: usize = 2;

/// Which stream ("lane") each lowered step runs on and what it waits for first: for a step,
/// the steps of other lanes it must follow (see [`cross_lane_waits`]).
pub(super) struct Schedule {
    pub(super) lanes: Vec<usize>,
    pub(super) waits: Vec<Vec<usize>>,
    /// For each step that another lane waits for, the index of the event recorded after it.
    pub(super) event_of: Vec<Option<usize>>,
}

impl Schedule {
    /// Waits are computed within each of `sections` (step ranges): a prompt bucket's steps run as
    /// one conditional body, which can only follow everything before it as a whole.
    pub(super) fn new(lanes: Vec<usize>, accesses: &[Accesses], sections: &[Range<usize>]) -> Schedule {
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

    pub(super) fn events(&self) -> usize {
        self.event_of.iter().flatten().count()
    }

    pub(super) fn concurrent(&self, steps: Range<usize>) -> bool {
        self.lanes[steps].iter().any(|&l| l != 0)
    }
}

/// The RoPE tables and, once per step, their rows for every slot of the sequence
/// (`Kernels::rope_rows_gather`), which the step's RoPE launches then read without first waiting
/// for a position.
#[derive(Clone, Copy, Debug)]
pub(super) struct RopeRows {
    /// The plan's one positions buffer, whose slots the rows follow.
    pub(super) positions: BufId,
    pub(super) tables: (DevPtr, DevPtr),
    pub(super) rows: (DevPtr, DevPtr),
    pub(super) slots: usize,
    pub(super) half: usize,
}

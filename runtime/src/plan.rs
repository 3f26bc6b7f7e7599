//! The static execution plan: an ordered list of typed ops over arena buffers, built once at open
//! and sized for the largest inputs. Every backend executes the same plan, so a model is described
//! exactly once (in its model file). Variable quantities — prompt length, which cameras are present,
//! frame sizes — are values in buffers, never plan shapes: the plan never changes after open.

use std::fmt::Write as _;

use crate::qwen_image::QwenImage;

/// Index of a buffer in [`Plan::buffers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(pub usize);

/// Index of a weight in the model's weight list (see [`Plan::weights`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightId(pub usize);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufType {
    F32,
    I32,
    U8,
}

/// Whether the host writes a buffer before each run (inputs) or reads it after (outputs). The CUDA
/// backend keeps exactly these in mapped pinned host memory (and copies the small inputs to the
/// device at the start of each run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostIo {
    Internal,
    Input,
    Output,
}

#[derive(Clone, Debug)]
pub struct BufferDecl {
    pub name: String,
    pub ty: BufType,
    pub len: usize,
    pub host: HostIo,
}

/// How a weight is used, so a backend can store it in the layout that op wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightRole {
    /// `[n, k]` matrix, the right-hand side of a GEMM (`out = a · wᵀ`).
    Matrix { n: usize, k: usize },
    /// Any vector or table read element-wise.
    Vector,
    /// A token-embedding table `[vocab, width]` from which rows are gathered.
    Embedding { vocab: usize, width: usize },
    /// `entries` matrices `[n, k]` back to back, one of which an [`Op::SelectWeight`] copies
    /// into a [`WeightRole::Matrix`] weight.
    MatrixStack { entries: usize, n: usize, k: usize },
}

#[derive(Clone, Debug)]
pub struct WeightDecl {
    pub name: String,
    pub role: WeightRole,
}

/// A row-major 2-D window into an f32 buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    pub buf: BufId,
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl View {
    /// Columns `[start, start + cols)` of this view.
    pub fn cols(self, start: usize, cols: usize) -> View {
        assert!(start + cols <= self.cols, "column window past the view");
        View { offset: self.offset + start, cols, ..self }
    }

    /// Rows `[start, start + rows)` of this view.
    pub fn rows(self, start: usize, rows: usize) -> View {
        assert!(start + rows <= self.rows, "row window past the view");
        View { offset: self.offset + start * self.stride, rows, ..self }
    }

    /// One past the last element touched.
    pub fn end(&self) -> usize {
        if self.rows == 0 { self.offset } else { self.offset + (self.rows - 1) * self.stride + self.cols }
    }

    /// The elements from the view's first to its last (a column window spans the rows between).
    pub fn span(&self) -> Span {
        Span { buf: self.buf, start: self.offset, end: self.end() }
    }
}

/// A contiguous element range of one buffer that an op reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub buf: BufId,
    pub start: usize,
    pub end: usize,
}

impl Span {
    /// All of buffer `buf` (`buffers`: the plan's).
    pub fn whole(buf: BufId, buffers: &[BufferDecl]) -> Span {
        Span { buf, start: 0, end: buffers[buf.0].len }
    }

    pub fn overlaps(&self, other: &Span) -> bool {
        self.buf == other.buf && self.start < other.end && other.start < self.end
    }
}

/// What an op reads and what it writes, for ordering ops that run concurrently.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accesses {
    pub reads: Vec<Span>,
    pub writes: Vec<Span>,
}

impl Accesses {
    /// Whether running `self` and `other` in either order could give different results: one
    /// writes what the other reads or writes.
    pub fn conflicts(&self, other: &Accesses) -> bool {
        let hits = |a: &[Span], b: &[Span]| a.iter().any(|x| b.iter().any(|y| x.overlaps(y)));
        hits(&self.writes, &other.writes) || hits(&self.writes, &other.reads) || hits(&self.reads, &other.writes)
    }

    pub fn extend(&mut self, other: Accesses) {
        self.reads.extend(other.reads);
        self.writes.extend(other.writes);
    }
}

/// Orders ops spread over in-order queues ("lanes", e.g. CUDA streams) so that they compute what
/// running them in sequence would. For each op (`lanes[i]`, `accesses[i]`, in plan order): the
/// latest earlier op of every other lane it conflicts with (one writes what the other reads or
/// writes), unless its lane already waited for that op or a later one of that lane. Ops of one
/// lane run in order, so waiting for the latest conflicting op of another lane covers every
/// earlier one there.
pub fn cross_lane_waits(lanes: &[usize], accesses: &[Accesses]) -> Vec<Vec<usize>> {
    let lane_count = lanes.iter().max().map_or(1, |l| l + 1);
    // waited[a][b]: the latest step of lane b that lane a has waited for.
    let mut waited: Vec<Vec<Option<usize>>> = vec![vec![None; lane_count]; lane_count];
    let mut by_lane: Vec<Vec<usize>> = vec![Vec::new(); lane_count];
    let mut waits = vec![Vec::new(); lanes.len()];
    for (i, &lane) in lanes.iter().enumerate() {
        for other in (0..lane_count).filter(|&o| o != lane) {
            let covered = waited[lane][other];
            let hit =
                by_lane[other].iter().rev().take_while(|&&j| covered.is_none_or(|c| j > c)).find(|&&j| accesses[i].conflicts(&accesses[j]));
            if let Some(&j) = hit {
                waits[i].push(j);
                waited[lane][other] = Some(j);
            }
        }
        by_lane[lane].push(i);
    }
    waits
}

/// Runs of `0..len` with the same bucket, given where each phase starts and its bucket (in
/// order): what comes before the first phase runs unconditionally. Empty runs are dropped.
pub fn sections_of(phase_starts: &[(usize, Option<usize>)], len: usize) -> Vec<Section> {
    let starts: Vec<(usize, Option<usize>)> = [(0, None)].into_iter().chain(phase_starts.iter().copied()).collect();
    let mut out: Vec<Section> = Vec::new();
    for (k, &(first, prompt_bucket)) in starts.iter().enumerate() {
        let end = starts.get(k + 1).map_or(len, |s| s.0);
        match out.last_mut() {
            Some(last) if last.prompt_bucket == prompt_bucket => last.range.end = end,
            _ => out.push(Section { range: first..end, prompt_bucket }),
        }
    }
    out.retain(|s| !s.range.is_empty());
    out
}

/// Per-camera frame metadata written by the host each step into an I32 buffer, 4 values per
/// camera: `[present, width, height, pixel format]` (format codes of [`crate::image::PixelFormat`]).
pub const FRAME_INFO_FIELDS: usize = 4;

/// An element-wise activation function, alone ([`Op::Activation`]) or as the gate of a gated
/// linear unit ([`Op::GatedActivation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// GELU with the tanh approximation (Gemma, SigLIP).
    GeluTanh,
    /// Exact GELU, `x · Φ(x)` with the error function.
    GeluErf,
    /// `x · sigmoid(x)` (SwiGLU's gate: Qwen3, Llama).
    Silu,
    Relu,
}

impl Activation {
    pub const ALL: [Activation; 4] = [Activation::GeluTanh, Activation::GeluErf, Activation::Silu, Activation::Relu];

    /// Its name alone and as a gate, as `explain()` prints them.
    pub fn name(self) -> &'static str {
        match self {
            Activation::GeluTanh => "gelu_tanh",
            Activation::GeluErf => "gelu_erf",
            Activation::Silu => "silu",
            Activation::Relu => "relu",
        }
    }

    pub fn gated_name(self) -> &'static str {
        match self {
            Activation::GeluTanh => "gelu_tanh_mul",
            Activation::GeluErf => "gelu_erf_mul",
            Activation::Silu => "silu_mul",
            Activation::Relu => "relu_mul",
        }
    }
}

#[derive(Clone, Debug)]
pub enum Op {
    /// Resize-with-pad a staged u8 frame to `size`×`size`, map to [-1, 1] and cut it into
    /// `patch`×`patch` patches: `out` is `[(size/patch)², 3·patch·patch]` in (channel, y, x) order,
    /// the layout of a flattened conv weight. A camera marked absent yields a black (-1) image.
    ImagePatches { camera: usize, frames: BufId, frame_stride: usize, frame_info: BufId, size: usize, patch: usize, out: View },
    /// GR00T N1.7's image of a staged frame ([`QwenImage`]: square resize, centre crop, resize,
    /// each bicubic with antialiasing), as the Qwen2-VL processor's pixel values: `out` is
    /// `[patch rows, 3·2·patch²]` in merge order. Frames up to `max_width × max_height`. A camera
    /// marked absent yields a black (-1) image.
    QwenImagePatches {
        camera: usize,
        frames: BufId,
        frame_stride: usize,
        frame_info: BufId,
        max_width: usize,
        max_height: usize,
        image: QwenImage,
        out: View,
    },
    /// `out (+)= a · wᵀ + bias`. With `accumulate`, the product is added to `out` (residuals, Euler step).
    Gemm { a: View, w: WeightId, bias: Option<WeightId>, out: View, accumulate: bool },
    /// `x += table` row by row (`table` is `[x.rows, x.cols]`, repeated every `table_rows` rows).
    AddTable { x: View, table: WeightId, table_rows: usize },
    /// LayerNorm over each row: `out = (x − mean) / sqrt(var + eps)`, then `· gamma + beta` with
    /// `affine = Some((gamma, beta))`, then `· (1 + scale) + shift` with an adaptive
    /// `modulation = [scale | shift | ...]` (AdaLN, as DiT blocks condition on the timestep).
    LayerNorm { x: View, out: View, affine: Option<(WeightId, WeightId)>, modulation: Option<WeightId>, eps: f32 },
    /// RMS normalisation over each row, `out = x / sqrt(mean(x²) + eps)`, times `weight` when
    /// given (Qwen3's RMSNorm). Gemma's `(1 + w)` scale is folded into the next GEMM's weight at
    /// load instead (no weight here).
    RmsNorm { x: View, out: View, weight: Option<WeightId>, eps: f32 },
    /// RMS normalisation of each of the `heads` equal column slices of every row separately
    /// (`x` is `[rows, heads·head_dim]`), times the `weight` (head_dim wide) the heads share:
    /// Qwen3's q_norm / k_norm, applied per head before RoPE.
    HeadRmsNorm { x: View, out: View, heads: usize, weight: WeightId, eps: f32 },
    /// Adaptive RMS norm: `out = rms(x) · (1 + scale) + shift` with `modulation = [scale | shift | gate]`
    /// precomputed at load for this denoise step and layer.
    AdaRmsNorm { x: View, out: View, modulation: WeightId, eps: f32 },
    /// `x += y ⊙ gate`, gate = the third third of an adaRMS modulation vector.
    GatedResidual { x: View, y: View, modulation: WeightId },
    /// In place `x = kind(x)`.
    Activation { x: View, kind: Activation },
    /// `out = kind(gate) ⊙ up` where `gate_up = [gate | up]` column halves (GeGLU with
    /// [`Activation::GeluTanh`], SwiGLU with [`Activation::Silu`]).
    GatedActivation { gate_up: View, out: View, kind: Activation },
    /// Gather token embeddings: `out[i] = table[tokens[i]] · scale`.
    Embed { tokens: BufId, table: WeightId, scale: f32, out: View },
    /// Validity and RoPE positions of the `prefix + suffix` sequence: the prefix is
    /// `cameras × tokens_per_image` image slots (valid when the camera is present) followed by the
    /// prompt slots (`token_mask`); positions are `cumsum(valid) − 1`; the `suffix` slots are always
    /// valid and numbered after the last valid prefix position.
    Positions {
        frame_info: BufId,
        cameras: usize,
        tokens_per_image: usize,
        token_mask: BufId,
        prompt_len: usize,
        suffix: usize,
        valid: BufId,
        positions: BufId,
    },
    /// Rotary embedding (split-half, as transformers' `rotate_half`) with base `theta` of the q
    /// heads in place and of the k heads, written together with the v heads into rows
    /// `cache_row..` of the layer's K/V cache. `qkv` is `[rows, (heads + 2·kv_heads)·head_dim]`
    /// (q heads, k heads, v heads); the caches are `[slots, kv_heads·head_dim]`. `axes` says which
    /// position of its row each rotation pair turns by.
    RopeQkv {
        qkv: View,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        theta: f32,
        axes: RopeAxes,
        positions: BufId,
        position_offset: usize,
        k_cache: View,
        v_cache: View,
        cache_row: usize,
    },
    /// Softmax attention. `q` is `[rows, heads·head_dim]`, `k`/`v` are `[keys, kv_heads·head_dim]`;
    /// `kv_heads` divides `heads` (grouped-query: query head `h` reads K/V head
    /// `h / (heads / kv_heads)`). Rows are split into `groups` equal blocks that see only their own
    /// block of keys (the cameras of the vision tower); `key_valid` (f32, 1 = valid) masks keys
    /// when present; `causal: Some(offset)` lets row `r` of a block see only its keys `0..=r +
    /// offset` (decoder self-attention: 0; rows appended after `offset` cached keys: `offset`).
    /// Rows with `query_valid[row] == 0` may be skipped (their output is never read).
    Attention {
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
        causal: Option<usize>,
    },
    /// Copies `src` into `dst` (same shape).
    Copy { src: View, dst: View },
    /// Row `i` of `src` into row `index[i]` of `dst` (i32 indices, one per `src` row), added to
    /// it when `accumulate`: image embeddings into the prompt's image slots.
    ScatterRows { src: View, index: BufId, dst: View, accumulate: bool },
    /// `out[r, c] = x[r, c] · scale[c] + offset[c]` for the robot's action columns.
    Affine { x: View, scale: WeightId, offset: WeightId, out: View },
    /// One Euler step of the sampler under real-time chunking guidance ([`crate::rtc`]): with
    /// `v = step / dt` (`step` holds `dt · v`, the output projection with `dt` folded in),
    /// `x ← x + dt · (v − guidance · weights[r] · (p − (x − t · v)))` where
    /// `p = prev[r + shift[0], c]`, or 0 for rows past `prev`'s end and columns from `cols` on.
    /// `weights` (f32, one per row) and `shift` (i32) are host inputs written every step.
    RtcGuide { x: View, step: View, prev: View, weights: BufId, shift: BufId, cols: usize, t: f32, dt: f32, guidance: f32 },
    /// The start of GR00T N1.7's real-time chunking ([`crate::rtc`]): rows `r < prefix[1]` of `x`
    /// become row `prefix[0] + r` of `prev` in their first `cols` columns and 0 in the others (as
    /// lerobot pads the previous chunk's robot columns); the other rows stay. `prefix` (i32 `[2]`)
    /// is a host input written every step.
    RtcPrefix { x: View, prev: View, prefix: BufId, cols: usize },
    /// An Euler step with a velocity strength per row (GR00T N1.7's real-time chunking):
    /// `x[r] += strength[r] · step[r]`, `step` holding `dt · v` (the decoder's last product with
    /// `dt` folded in); `strength` (f32, one per row) is a host input written every step.
    RtcEuler { x: View, step: View, strength: BufId },
    /// Copies entry `index[0]` (an i32 host input, clamped to `0..entries`) of the stacked
    /// `table` into the weight `dst`, which the ops after it read: weights chosen per step by a
    /// value in a buffer, as GR00T's embodiment-specific ones, without rebuilding the plan. A
    /// [`WeightRole::Matrix`] `dst` takes a [`WeightRole::MatrixStack`] table, a vector one a
    /// vector of `entries` back to back. The cross-stream ordering follows buffers, not weights:
    /// the op and every reader of `dst` belong to phases that are not concurrent.
    SelectWeight { index: BufId, entries: usize, table: WeightId, dst: WeightId },
    /// Picks which of the plan's prompt buckets ([`Plan::prompt_buckets`]) the phases that follow
    /// run: the smallest that holds the last valid slot of `token_mask` ([`Plan::bucket_for`]).
    PromptBucket { token_mask: BufId },
}

/// Which position each rotation pair of an [`Op::RopeQkv`] head turns by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeAxes {
    /// Every pair by its row's position, `positions[position_offset + row]`.
    Single,
    /// Qwen3-VL's interleaved multimodal RoPE: `positions` holds three rows of `slots` (temporal,
    /// height, width); pair `j` turns by the height position when `j % 3 == 1` and
    /// `j < 3·sections[1]`, by the width position when `j % 3 == 2` and `j < 3·sections[2]`,
    /// else by the temporal one.
    Interleaved { sections: [usize; 3], slots: usize },
    /// Qwen3-VL's vision RoPE: `positions` holds two rows of `slots` (patch row, patch column);
    /// the first half of the pairs turns by the row, the second by the column, each half with
    /// the frequencies of a head half as wide.
    Rows2d { slots: usize },
}

impl RopeAxes {
    /// The row of `positions` pair `j` of `half` turns by.
    pub fn axis(&self, j: usize, half: usize) -> usize {
        match *self {
            RopeAxes::Single => 0,
            RopeAxes::Interleaved { sections, .. } if j % 3 == 1 && j < 3 * sections[1] => 1,
            RopeAxes::Interleaved { sections, .. } if j % 3 == 2 && j < 3 * sections[2] => 2,
            RopeAxes::Interleaved { .. } => 0,
            RopeAxes::Rows2d { .. } => (j >= half / 2) as usize,
        }
    }

    /// Where row `row`'s position on `axis` is in the positions buffer.
    pub fn index(&self, axis: usize, position_offset: usize, row: usize) -> usize {
        match *self {
            RopeAxes::Single => position_offset + row,
            RopeAxes::Interleaved { slots, .. } | RopeAxes::Rows2d { slots } => axis * slots + position_offset + row,
        }
    }
}

/// One RoPE table of a plan: the rotary base and head dimension some [`Op::RopeQkv`] ops share,
/// for positions `0..positions` (the most rows of their caches). Backends build one per spec.
/// `halves`: the frequencies of [`RopeAxes::Rows2d`] (each half of the pairs those of a head
/// half as wide).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    pub head_dim: usize,
    pub positions: usize,
    pub halves: bool,
}

impl RopeSpec {
    pub fn serves(&self, theta: f32, head_dim: usize, halves: bool) -> bool {
        self.theta == theta && self.head_dim == head_dim && self.halves == halves
    }

    /// `cos` and `sin` of every angle, `[position][head_dim / 2]`, as transformers computes them
    /// (inverse frequencies in f32, angle = position · inverse frequency in f32).
    pub fn tables(&self) -> (Vec<f32>, Vec<f32>) {
        let half = self.head_dim / 2;
        let (mut cos, mut sin) = (vec![0.0; self.positions * half], vec![0.0; self.positions * half]);
        // Vision RoPE: pair j uses frequency j mod half/2 of a head of half/2 pairs.
        let (pairs, dim) = if self.halves { (half / 2, half) } else { (half, self.head_dim) };
        for pos in 0..self.positions {
            for j in 0..half {
                let inv_freq = (1.0 / (self.theta as f64).powf(2.0 * (j % pairs) as f64 / dim as f64)) as f32;
                let angle = (pos as f32 * inv_freq) as f64;
                cos[pos * half + j] = angle.cos() as f32;
                sin[pos * half + j] = angle.sin() as f32;
            }
        }
        (cos, sin)
    }
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::ImagePatches { .. } => "image_patches",
            Op::QwenImagePatches { .. } => "qwen_image_patches",
            Op::Gemm { .. } => "gemm",
            Op::AddTable { .. } => "add_table",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::AdaRmsNorm { .. } => "ada_rms_norm",
            Op::HeadRmsNorm { .. } => "head_rms_norm",
            Op::GatedResidual { .. } => "gated_residual",
            Op::Activation { kind, .. } => kind.name(),
            Op::GatedActivation { kind, .. } => kind.gated_name(),
            Op::Embed { .. } => "embed",
            Op::Positions { .. } => "positions",
            Op::RopeQkv { .. } => "rope_qkv",
            Op::Attention { .. } => "attention",
            Op::Copy { .. } => "copy",
            Op::ScatterRows { .. } => "scatter_rows",
            Op::Affine { .. } => "affine",
            Op::RtcGuide { .. } => "rtc_guide",
            Op::RtcPrefix { .. } => "rtc_prefix",
            Op::RtcEuler { .. } => "rtc_euler",
            Op::PromptBucket { .. } => "prompt_bucket",
            Op::SelectWeight { .. } => "select_weight",
        }
    }

    /// The buffer ranges the op reads and writes (`buffers`: the plan's, for whole-buffer uses).
    pub fn accesses(&self, buffers: &[BufferDecl]) -> Accesses {
        let whole = |b: BufId| Span::whole(b, buffers);
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        match *self {
            Op::ImagePatches { camera, frames, frame_stride, frame_info, out, .. }
            | Op::QwenImagePatches { camera, frames, frame_stride, frame_info, out, .. } => {
                reads.extend([Span { buf: frames, start: camera * frame_stride, end: (camera + 1) * frame_stride }, whole(frame_info)]);
                writes.push(out.span());
            }
            Op::Gemm { a, out, accumulate, .. } => {
                reads.push(a.span());
                if accumulate {
                    reads.push(out.span());
                }
                writes.push(out.span());
            }
            Op::AddTable { x, .. } | Op::Activation { x, .. } => {
                reads.push(x.span());
                writes.push(x.span());
            }
            Op::LayerNorm { x, out, .. }
            | Op::RmsNorm { x, out, .. }
            | Op::AdaRmsNorm { x, out, .. }
            | Op::HeadRmsNorm { x, out, .. }
            | Op::Affine { x, out, .. } => {
                reads.push(x.span());
                writes.push(out.span());
            }
            Op::GatedResidual { x, y, .. } => {
                reads.extend([x.span(), y.span()]);
                writes.push(x.span());
            }
            Op::GatedActivation { gate_up, out, .. } => {
                reads.push(gate_up.span());
                writes.push(out.span());
            }
            Op::Embed { tokens, out, .. } => {
                reads.push(whole(tokens));
                writes.push(out.span());
            }
            Op::Positions { frame_info, token_mask, valid, positions, .. } => {
                reads.extend([whole(frame_info), whole(token_mask)]);
                writes.extend([whole(valid), whole(positions)]);
            }
            Op::RopeQkv { qkv, positions, k_cache, v_cache, cache_row, .. } => {
                reads.extend([qkv.span(), whole(positions)]);
                // Only the rows this op fills: the action tokens' rows of a layer's cache do not
                // touch the prefix rows that other ops read.
                writes.extend([qkv.span(), k_cache.rows(cache_row, qkv.rows).span(), v_cache.rows(cache_row, qkv.rows).span()]);
            }
            Op::Attention { q, k, v, out, key_valid, query_valid, .. } => {
                reads.extend([q.span(), k.span(), v.span()]);
                reads.extend(key_valid.into_iter().chain(query_valid).map(whole));
                writes.push(out.span());
            }
            Op::Copy { src, dst } => {
                reads.push(src.span());
                writes.push(dst.span());
            }
            Op::ScatterRows { src, index, dst, accumulate } => {
                reads.extend([src.span(), whole(index)]);
                if accumulate {
                    reads.push(dst.span());
                }
                writes.push(dst.span());
            }
            Op::RtcGuide { x, step, prev, weights, shift, .. } => {
                reads.extend([x.span(), step.span(), prev.span(), whole(weights), whole(shift)]);
                writes.push(x.span());
            }
            Op::RtcPrefix { x, prev, prefix, .. } => {
                reads.extend([prev.span(), whole(prefix)]);
                writes.push(x.span());
            }
            Op::RtcEuler { x, step, strength } => {
                reads.extend([x.span(), step.span(), whole(strength)]);
                writes.push(x.span());
            }
            Op::PromptBucket { token_mask } => reads.push(whole(token_mask)),
            // It writes a weight, which no span covers (see the op).
            Op::SelectWeight { index, .. } => reads.push(whole(index)),
        }
        Accesses { reads, writes }
    }

    /// The weights the op reads (an [`Op::SelectWeight`] reads its table and writes `dst`).
    pub fn weights_read(&self) -> impl Iterator<Item = WeightId> {
        let read = match *self {
            Op::Gemm { w, bias, .. } => [Some(w), bias, None],
            Op::AddTable { table, .. } | Op::Embed { table, .. } | Op::SelectWeight { table, .. } => [Some(table), None, None],
            Op::LayerNorm { affine, modulation, .. } => [affine.map(|a| a.0), affine.map(|a| a.1), modulation],
            Op::RmsNorm { weight, .. } => [weight, None, None],
            Op::HeadRmsNorm { weight, .. } => [Some(weight), None, None],
            Op::AdaRmsNorm { modulation, .. } | Op::GatedResidual { modulation, .. } => [Some(modulation), None, None],
            Op::Affine { scale, offset, .. } => [Some(scale), Some(offset), None],
            Op::ImagePatches { .. }
            | Op::QwenImagePatches { .. }
            | Op::Activation { .. }
            | Op::GatedActivation { .. }
            | Op::Positions { .. }
            | Op::RopeQkv { .. }
            | Op::Attention { .. }
            | Op::Copy { .. }
            | Op::ScatterRows { .. }
            | Op::RtcGuide { .. }
            | Op::RtcPrefix { .. }
            | Op::RtcEuler { .. }
            | Op::PromptBucket { .. } => [None; 3],
        };
        read.into_iter().flatten()
    }

    /// Multiply-add count ×2 for the op at its planned (maximum) shapes.
    pub fn flops(&self) -> u64 {
        match self {
            Op::Gemm { a, out, .. } => 2 * (a.rows * a.cols * out.cols) as u64,
            Op::Attention { q, k, heads, head_dim, groups, .. } => 4 * (q.rows * (k.rows / groups) * heads * head_dim) as u64,
            _ => 0,
        }
    }
}

/// A labelled section of the plan (e.g. "vision", "denoise step 3"), for `explain` and profiling.
#[derive(Clone, Debug)]
pub struct Phase {
    pub name: String,
    pub first_op: usize,
    /// The phase may run beside the others, ordered against their ops only by the buffers they
    /// share (see [`Op::accesses`]): a GPU backend gives it a second stream.
    pub concurrent: bool,
    /// `Some(n)`: the phase computes its part for the first `n` prompt slots only, one of several
    /// alternatives of which a step runs those of a single bucket (see [`Plan::prompt_buckets`]).
    pub prompt_bucket: Option<usize>,
}

/// A run of consecutive phases with the same [`Phase::prompt_bucket`]: what a backend runs
/// unconditionally (`None`) or only when that bucket is picked. `range` indexes the plan's ops
/// (or, in a backend, the steps it lowered them to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub range: std::ops::Range<usize>,
    pub prompt_bucket: Option<usize>,
}

#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub buffers: Vec<BufferDecl>,
    pub weights: Vec<WeightDecl>,
    pub ops: Vec<Op>,
    pub phases: Vec<Phase>,
    /// Notes on folding and fusion decisions, printed by `explain`.
    pub notes: Vec<String>,
    /// Prompt slot counts, ascending, the last the whole capacity (empty: no buckets). The
    /// phases that depend on the prompt's length exist once per bucket; each step runs only those
    /// of the smallest bucket that holds its last valid slot (picked by [`Op::PromptBucket`]), so
    /// a short prompt costs less than a full one without changing the plan. Slots past the bucket
    /// are masked (`valid` is 0 there), so what they hold from earlier steps is never read.
    pub prompt_buckets: Vec<usize>,
}

impl Plan {
    /// The RoPE tables the plan's [`Op::RopeQkv`] ops read, one per (θ, head dimension,
    /// frequency layout), in order of first use.
    pub fn rope_specs(&self) -> Vec<RopeSpec> {
        let mut specs: Vec<RopeSpec> = Vec::new();
        for op in &self.ops {
            if let Op::RopeQkv { theta, head_dim, axes, k_cache, .. } = *op {
                let halves = matches!(axes, RopeAxes::Rows2d { .. });
                match specs.iter_mut().find(|s| s.serves(theta, head_dim, halves)) {
                    Some(s) => s.positions = s.positions.max(k_cache.rows),
                    None => specs.push(RopeSpec { theta, head_dim, positions: k_cache.rows, halves }),
                }
            }
        }
        specs
    }

    pub fn buffer(&mut self, name: impl Into<String>, ty: BufType, len: usize) -> BufId {
        self.host_buffer(name, ty, len, HostIo::Internal)
    }

    /// A buffer the host writes before (`Input`) or reads after (`Output`) each run.
    pub fn host_buffer(&mut self, name: impl Into<String>, ty: BufType, len: usize, host: HostIo) -> BufId {
        self.buffers.push(BufferDecl { name: name.into(), ty, len, host });
        BufId(self.buffers.len() - 1)
    }

    /// A new f32 buffer of `rows × cols`, returned as a view over all of it.
    pub fn matrix(&mut self, name: impl Into<String>, rows: usize, cols: usize) -> View {
        let buf = self.buffer(name, BufType::F32, rows * cols);
        View { buf, offset: 0, rows, cols, stride: cols }
    }

    pub fn find_buffer(&self, name: &str) -> Option<BufId> {
        self.buffers.iter().position(|b| b.name == name).map(BufId)
    }

    /// The weights an [`Op::SelectWeight`] rewrites (GR00T's per-embodiment ones).
    pub fn selected_weights(&self) -> Vec<WeightId> {
        self.ops
            .iter()
            .filter_map(|op| match *op {
                Op::SelectWeight { dst, .. } => Some(dst),
                _ => None,
            })
            .collect()
    }

    /// For each weight id: whether every product over it (at least one) writes, over at least
    /// `min_rows` rows, without accumulating or a bias, a gate/up output that only the gated
    /// activation right after it reads: into a buffer that nothing else reads (every reader of it
    /// is a gated activation reading exactly what the product right before it wrote). Such a
    /// product may store its output in e4m3 for that activation (an FP8 product with a
    /// calibrated output scale).
    pub fn gated_output_weights(&self, min_rows: usize) -> Vec<bool> {
        let paired = |j: usize| match (j.checked_sub(1).map(|i| &self.ops[i]), self.ops.get(j)) {
            (Some(Op::Gemm { out, .. }), Some(Op::GatedActivation { gate_up, .. })) => out == gate_up,
            _ => false,
        };
        let mut dedicated = vec![true; self.buffers.len()];
        for (j, op) in self.ops.iter().enumerate() {
            if !paired(j) {
                op.accesses(&self.buffers).reads.iter().for_each(|span| dedicated[span.buf.0] = false);
            }
        }
        let mut gated = vec![None; self.weights.len()];
        for (i, op) in self.ops.iter().enumerate() {
            let Op::Gemm { w, out, bias, accumulate, .. } = *op else { continue };
            let ok = paired(i + 1) && dedicated[out.buf.0] && bias.is_none() && !accumulate && out.rows >= min_rows;
            gated[w.0] = Some(gated[w.0].unwrap_or(true) && ok);
        }
        gated.into_iter().map(|g| g == Some(true)).collect()
    }

    pub fn weight(&mut self, name: impl Into<String>, role: WeightRole) -> WeightId {
        self.weights.push(WeightDecl { name: name.into(), role });
        WeightId(self.weights.len() - 1)
    }

    pub fn phase(&mut self, name: impl Into<String>) {
        self.bucket_phase(name, false, None);
    }

    /// A phase that may run beside the others (see [`Phase::concurrent`]).
    pub fn concurrent_phase(&mut self, name: impl Into<String>) {
        self.bucket_phase(name, true, None);
    }

    /// A phase of one prompt bucket (see [`Phase::prompt_bucket`]), concurrent or not.
    pub fn bucket_phase(&mut self, name: impl Into<String>, concurrent: bool, prompt_bucket: Option<usize>) {
        self.phases.push(Phase { name: name.into(), first_op: self.ops.len(), concurrent, prompt_bucket });
    }

    /// The phase that starts at op `op`, if one does (fusions never reach across a phase start).
    pub fn phase_starting_at(&self, op: usize) -> Option<&Phase> {
        self.phases.iter().find(|p| p.first_op == op)
    }

    /// The bucket a step whose last valid prompt slot is `last_valid` runs: the smallest of
    /// [`Plan::prompt_buckets`] above it (the first when no slot is valid); `None` without buckets.
    pub fn bucket_for(&self, last_valid: Option<usize>) -> Option<usize> {
        let needed = last_valid.map_or(0, |l| l + 1);
        self.prompt_buckets.iter().copied().find(|&b| b >= needed).or(self.prompt_buckets.last().copied())
    }

    /// The plan as runs of phases with the same prompt bucket, in order (ops before the first
    /// phase, or of a plan without phases, run unconditionally).
    pub fn sections(&self) -> Vec<Section> {
        let starts: Vec<(usize, Option<usize>)> = self.phases.iter().map(|p| (p.first_op, p.prompt_bucket)).collect();
        sections_of(&starts, self.ops.len())
    }

    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    pub fn arena_bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.len * if b.ty == BufType::U8 { 1 } else { 4 }).sum()
    }

    /// FLOPs of one step that runs prompt bucket `bucket` (`None`: the whole capacity): the
    /// phases of the other buckets are alternatives to it.
    pub fn flops(&self, bucket: Option<usize>) -> u64 {
        let bucket = bucket.or(self.prompt_buckets.last().copied());
        let sections = self.sections().into_iter().filter(|s| s.prompt_bucket.is_none() || s.prompt_bucket == bucket);
        sections.map(|s| self.ops[s.range].iter().map(Op::flops).sum::<u64>()).sum()
    }

    /// Ops of each phase as index ranges.
    pub fn phase_ranges(&self) -> Vec<(&str, std::ops::Range<usize>)> {
        let mut out = Vec::with_capacity(self.phases.len());
        for (i, p) in self.phases.iter().enumerate() {
            let end = self.phases.get(i + 1).map_or(self.ops.len(), |n| n.first_op);
            out.push((p.name.as_str(), p.first_op..end));
        }
        out
    }

    /// For every op, whether it belongs to a concurrent phase.
    pub fn concurrent_ops(&self) -> Vec<bool> {
        let mut out = vec![false; self.ops.len()];
        for (p, (_, range)) in self.phases.iter().zip(self.phase_ranges()) {
            out[range].iter_mut().for_each(|c| *c = p.concurrent);
        }
        out
    }

    /// Human-readable plan: buffers, then every op with its shapes, grouped by phase.
    pub fn explain(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "plan: {} ops, {} buffers ({:.1} MiB arena), {} weights, {:.3} GFLOP per step",
            self.ops.len(),
            self.buffers.len(),
            self.arena_bytes() as f64 / (1 << 20) as f64,
            self.weights.len(),
            self.flops(None) as f64 / 1e9
        );
        for note in &self.notes {
            let _ = writeln!(s, "note: {note}");
        }
        if !self.prompt_buckets.is_empty() {
            let _ = writeln!(s, "prompt buckets: {:?} slots (each step runs the smallest that holds its prompt)", self.prompt_buckets);
        }
        let _ = writeln!(s, "buffers:");
        for (i, b) in self.buffers.iter().enumerate() {
            let io = match b.host {
                HostIo::Internal => "",
                HostIo::Input => " (host input)",
                HostIo::Output => " (host output)",
            };
            let _ = writeln!(s, "  #{i:<3} {:<24} {:?} x {}{io}", b.name, b.ty, b.len);
        }
        for (p, (phase, range)) in self.phases.iter().zip(self.phase_ranges()) {
            let flops: u64 = self.ops[range.clone()].iter().map(Op::flops).sum();
            let concurrent = if p.concurrent { " (concurrent)" } else { "" };
            let bucket = p.prompt_bucket.map(|b| format!(" (prompt bucket: first {b} slots)")).unwrap_or_default();
            let _ = writeln!(s, "phase {phase}{concurrent}{bucket}: {} ops, {:.3} GFLOP", range.len(), flops as f64 / 1e9);
            for i in range {
                let _ = writeln!(s, "  {i:>5} {}", self.describe(&self.ops[i]));
            }
        }
        s
    }

    fn describe(&self, op: &Op) -> String {
        let v = |v: &View| format!("{}[{}x{}]", self.buffers[v.buf.0].name, v.rows, v.cols);
        let w = |w: &WeightId| self.weights[w.0].name.clone();
        match op {
            Op::Gemm { a, w: wt, bias, out, accumulate } => format!(
                "gemm {} = {} x {}ᵀ{}{}",
                v(out),
                v(a),
                w(wt),
                bias.map(|b| format!(" + {}", w(&b))).unwrap_or_default(),
                if *accumulate { " (accumulate)" } else { "" }
            ),
            Op::Attention { q, k, heads, kv_heads, head_dim, groups, key_valid, causal, .. } => format!(
                "attention q={} k={} heads={heads}/{kv_heads}x{head_dim} groups={groups}{}{}",
                v(q),
                v(k),
                if key_valid.is_some() { " masked" } else { "" },
                causal.map(|o| format!(" causal+{o}")).unwrap_or_default()
            ),
            Op::AdaRmsNorm { x, modulation, .. } => format!("ada_rms_norm {} mod={}", v(x), w(modulation)),
            Op::HeadRmsNorm { x, out, heads, weight, .. } => {
                format!("head_rms_norm {} -> {} per {heads} heads x {}", v(x), v(out), w(weight))
            }
            Op::GatedResidual { x, y, modulation } => format!("gated_residual {} += {} * gate({})", v(x), v(y), w(modulation)),
            Op::LayerNorm { x, out, .. } | Op::RmsNorm { x, out, .. } => format!("{} {} -> {}", op.name(), v(x), v(out)),
            Op::GatedActivation { gate_up, out, kind } => format!("{} {} -> {}", kind.gated_name(), v(gate_up), v(out)),
            Op::Copy { src, dst } => format!("copy {} -> {}", v(src), v(dst)),
            Op::ScatterRows { src, index, dst, accumulate } => {
                format!(
                    "scatter_rows {} -> {} at rows {}{}",
                    v(src),
                    v(dst),
                    self.buffers[index.0].name,
                    if *accumulate { " (added)" } else { "" }
                )
            }
            Op::RopeQkv { qkv, k_cache, cache_row, .. } => format!("rope_qkv {} -> {} @row {cache_row}", v(qkv), v(k_cache)),
            Op::ImagePatches { camera, out, .. } => format!("image_patches camera {camera} -> {}", v(out)),
            Op::QwenImagePatches { camera, image, out, .. } => {
                format!(
                    "qwen_image_patches camera {camera} ({}² crop {:.3} -> {}²) -> {}",
                    image.edge,
                    image.crop_fraction,
                    image.target,
                    v(out)
                )
            }
            Op::Embed { out, scale, .. } => format!("embed -> {} x {scale}", v(out)),
            Op::AddTable { x, table, .. } => format!("add_table {} += {}", v(x), w(table)),
            Op::Activation { x, kind } => format!("{} {}", kind.name(), v(x)),
            Op::Positions { .. } => "positions (validity mask, RoPE positions)".to_string(),
            Op::Affine { x, out, .. } => format!("affine {} -> {}", v(x), v(out)),
            Op::RtcGuide { x, step, prev, cols, t, guidance, .. } => {
                format!("rtc_guide {} += {} guided to {} (first {cols} columns) t={t} g={guidance}", v(x), v(step), v(prev))
            }
            Op::RtcPrefix { x, prev, prefix, cols } => {
                format!("rtc_prefix {} rows from {} (first {cols} columns) at {}", v(x), v(prev), self.buffers[prefix.0].name)
            }
            Op::RtcEuler { x, step, strength } => {
                format!("rtc_euler {} += {} x {} per row", v(x), v(step), self.buffers[strength.0].name)
            }
            Op::PromptBucket { token_mask } => {
                format!("prompt_bucket of {}: one of {:?} slots", self.buffers[token_mask.0].name, self.prompt_buckets)
            }
            Op::SelectWeight { index, entries, table, dst } => {
                format!("select_weight {} = {}[{} of {entries}]", w(dst), w(table), self.buffers[index.0].name)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rope_writes_only_its_own_cache_rows() {
        let mut plan = Plan::default();
        let qkv = plan.matrix("qkv", 4, 3 * 8);
        let positions = plan.buffer("positions", BufType::I32, 16);
        let (k_cache, v_cache) = (plan.matrix("k", 16, 8), plan.matrix("v", 16, 8));
        let rope = Op::RopeQkv {
            qkv,
            heads: 1,
            kv_heads: 1,
            head_dim: 8,
            theta: 1e4,
            axes: RopeAxes::Single,
            positions,
            position_offset: 12,
            k_cache,
            v_cache,
            cache_row: 12,
        };
        let attention_of_rows = |rows: usize| Op::Attention {
            q: qkv.cols(0, 8),
            k: k_cache.rows(0, rows),
            v: v_cache.rows(0, rows),
            out: qkv.cols(0, 8),
            heads: 1,
            kv_heads: 1,
            head_dim: 8,
            groups: 1,
            key_valid: None,
            query_valid: None,
            causal: None,
        };
        let writes = rope.accesses(&plan.buffers).writes;
        assert!(writes.contains(&Span { buf: k_cache.buf, start: 12 * 8, end: 16 * 8 }), "{writes:?}");
        // An attention over the first 12 cache rows does not depend on this RoPE's cache writes;
        // one over 13 does.
        let rope = Accesses { reads: vec![], writes: writes.into_iter().filter(|w| w.buf != qkv.buf).collect() };
        assert!(!rope.conflicts(&attention_of_rows(12).accesses(&plan.buffers)));
        assert!(rope.conflicts(&attention_of_rows(13).accesses(&plan.buffers)));
    }

    /// A product may store its output in e4m3 only where the gated activation right after it
    /// is its output's one reader, it neither accumulates nor adds a bias, it has enough rows,
    /// and every other product over the same weight qualifies too.
    #[test]
    fn gated_outputs_are_products_whose_only_reader_is_the_next_gated_activation() {
        let mut plan = Plan::default();
        let (x, hidden) = (plan.matrix("x", 256, 64), plan.matrix("hidden", 256, 64));
        let bias = plan.weight("bias", WeightRole::Vector);
        let case = |plan: &mut Plan, name: &str, bias: Option<WeightId>, accumulate: bool| {
            let w = plan.weight(name, WeightRole::Matrix { n: 128, k: 64 });
            let gate_up = plan.matrix(format!("{name}.gate_up"), 256, 128);
            plan.push(Op::Gemm { a: x, w, bias, out: gate_up, accumulate });
            plan.push(Op::GatedActivation { gate_up, out: hidden, kind: Activation::GeluTanh });
            (w, gate_up)
        };
        let (only, _) = case(&mut plan, "only", None, false);
        let (read_later, gate_up) = case(&mut plan, "read_later", None, false);
        let reader = plan.weight("reader", WeightRole::Matrix { n: 64, k: 64 });
        plan.push(Op::Gemm { a: gate_up.cols(0, 64), w: reader, bias: None, out: hidden, accumulate: false });
        let (biased, _) = case(&mut plan, "biased", Some(bias), false);
        let (accumulating, _) = case(&mut plan, "accumulating", None, true);
        // A second product over the same weight whose output no gated activation reads.
        let (shared, _) = case(&mut plan, "shared", None, false);
        let other = plan.matrix("other", 256, 128);
        plan.push(Op::Gemm { a: x, w: shared, bias: None, out: other, accumulate: false });
        let gated = plan.gated_output_weights(128);
        let of = |w: WeightId| gated[w.0];
        assert!(of(only), "the gated activation alone reads it");
        assert!(!of(read_later) && !of(biased) && !of(accumulating) && !of(shared) && !of(bias));
        assert!(!plan.gated_output_weights(257)[only.0], "fewer rows than the bound");
    }

    #[test]
    fn sections_cover_every_op_once() {
        let runs = |starts: &[(usize, Option<usize>)], len: usize| -> Vec<(std::ops::Range<usize>, Option<usize>)> {
            sections_of(starts, len).into_iter().map(|s| (s.range, s.prompt_bucket)).collect()
        };
        assert_eq!(runs(&[], 5), [(0..5, None)], "a plan without phases runs everything");
        assert_eq!(
            runs(&[(2, None), (4, Some(32)), (6, Some(32)), (7, Some(64)), (9, None)], 10),
            [(0..4, None), (4..7, Some(32)), (7..9, Some(64)), (9..10, None)]
        );
        assert_eq!(runs(&[(0, Some(32)), (3, None)], 3), [(0..3, Some(32))], "empty runs are dropped");
    }

    /// Ops over 3 small buffers on 2 or 3 lanes, each reading and writing one random range.
    fn ops() -> impl Strategy<Value = Vec<(usize, Accesses)>> {
        let span = (0..3usize, 0..8usize, 1..4usize).prop_map(|(b, start, len)| Span { buf: BufId(b), start, end: start + len });
        prop::collection::vec((0..3usize, span.clone(), span), 1..40)
            .prop_map(|ops| ops.into_iter().map(|(lane, r, w)| (lane, Accesses { reads: vec![r], writes: vec![w] })).collect())
    }

    proptest! {
        /// Every conflicting pair on different lanes is ordered: the later op's lane has, at or
        /// before it, waited for that op or a later one of its lane. Every wait is needed.
        #[test]
        fn cross_lane_waits_order_every_conflict(ops in ops()) {
            let (lanes, accesses): (Vec<usize>, Vec<Accesses>) = ops.into_iter().unzip();
            let waits = cross_lane_waits(&lanes, &accesses);
            for i in 0..lanes.len() {
                for &w in &waits[i] {
                    prop_assert!(w < i && lanes[w] != lanes[i] && accesses[i].conflicts(&accesses[w]));
                }
                for j in (0..i).filter(|&j| lanes[j] != lanes[i] && accesses[i].conflicts(&accesses[j])) {
                    let ordered = (0..=i).filter(|&k| lanes[k] == lanes[i]).flat_map(|k| &waits[k]).any(|&w| lanes[w] == lanes[j] && w >= j);
                    prop_assert!(ordered, "op {i} (lane {}) is not ordered after op {j} (lane {})", lanes[i], lanes[j]);
                }
            }
        }
    }
}

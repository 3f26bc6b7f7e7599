//! The static execution plan: an ordered list of typed ops over arena buffers, built once at open
//! and sized for the largest inputs. Every backend executes the same plan, so a model is described
//! exactly once (in its model file). Variable quantities — prompt length, which cameras are present,
//! frame sizes — are values in buffers, never plan shapes: the plan never changes after open.

use std::fmt::Write as _;

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

/// Whether the host writes a buffer before each run (inputs) or reads it after (outputs). A GPU
/// backend keeps pinned host copies of exactly these and copies them inside its graph.
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
}

/// Per-camera frame metadata written by the host each step into an I32 buffer, 4 values per
/// camera: `[present, width, height, pixel format]` (format codes of [`crate::image::PixelFormat`]).
pub const FRAME_INFO_FIELDS: usize = 4;

#[derive(Clone, Debug)]
pub enum Op {
    /// Resize-with-pad a staged u8 frame to `size`×`size`, map to [-1, 1] and cut it into
    /// `patch`×`patch` patches: `out` is `[(size/patch)², 3·patch·patch]` in (channel, y, x) order,
    /// the layout of a flattened conv weight. A camera marked absent yields a black (-1) image.
    ImagePatches { camera: usize, frames: BufId, frame_stride: usize, frame_info: BufId, size: usize, patch: usize, out: View },
    /// `out (+)= a · wᵀ + bias`. With `accumulate`, the product is added to `out` (residuals, Euler step).
    Gemm { a: View, w: WeightId, bias: Option<WeightId>, out: View, accumulate: bool },
    /// `x += table` row by row (`table` is `[x.rows, x.cols]`, repeated every `table_rows` rows).
    AddTable { x: View, table: WeightId, table_rows: usize },
    /// LayerNorm over each row: `out = (x − mean) / sqrt(var + eps) · gamma + beta`.
    LayerNorm { x: View, out: View, gamma: WeightId, beta: WeightId, eps: f32 },
    /// RMS normalisation over each row, `out = x / sqrt(mean(x²) + eps)`; any `(1 + w)` scale has
    /// been folded into the next GEMM's weight at load.
    RmsNorm { x: View, out: View, eps: f32 },
    /// Adaptive RMS norm: `out = rms(x) · (1 + scale) + shift` with `modulation = [scale | shift | gate]`
    /// precomputed at load for this denoise step and layer.
    AdaRmsNorm { x: View, out: View, modulation: WeightId, eps: f32 },
    /// `x += y ⊙ gate`, gate = the third third of an adaRMS modulation vector.
    GatedResidual { x: View, y: View, modulation: WeightId },
    /// In place `x = gelu_tanh(x)`.
    GeluTanh { x: View },
    /// `out = gelu_tanh(gate) ⊙ up` where `gate_up = [gate | up]` column halves.
    GeluTanhMul { gate_up: View, out: View },
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
    /// Rotary embedding (split-half) of the q heads in place and of k, written together with v into
    /// rows `cache_row..` of the layer's K/V cache. `qkv` is `[rows, (heads + 2)·head_dim]`.
    RopeQkv {
        qkv: View,
        heads: usize,
        head_dim: usize,
        positions: BufId,
        position_offset: usize,
        k_cache: View,
        v_cache: View,
        cache_row: usize,
    },
    /// Softmax attention. `q` is `[rows, heads·head_dim]`, `k`/`v` are `[keys, kv_heads·head_dim]`.
    /// Rows are split into `groups` equal blocks that see only their own block of keys (the
    /// cameras of the vision tower); `key_valid` (f32, 1 = valid) masks keys when present.
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
    },
    /// Copies `src` into `dst` (same shape).
    Copy { src: View, dst: View },
    /// `out[r, c] = x[r, c] · scale[c] + offset[c]` for the robot's action columns.
    Affine { x: View, scale: WeightId, offset: WeightId, out: View },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::ImagePatches { .. } => "image_patches",
            Op::Gemm { .. } => "gemm",
            Op::AddTable { .. } => "add_table",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::AdaRmsNorm { .. } => "ada_rms_norm",
            Op::GatedResidual { .. } => "gated_residual",
            Op::GeluTanh { .. } => "gelu_tanh",
            Op::GeluTanhMul { .. } => "gelu_tanh_mul",
            Op::Embed { .. } => "embed",
            Op::Positions { .. } => "positions",
            Op::RopeQkv { .. } => "rope_qkv",
            Op::Attention { .. } => "attention",
            Op::Copy { .. } => "copy",
            Op::Affine { .. } => "affine",
        }
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
}

#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub buffers: Vec<BufferDecl>,
    pub weights: Vec<WeightDecl>,
    pub ops: Vec<Op>,
    pub phases: Vec<Phase>,
    /// Notes on folding and fusion decisions, printed by `explain`.
    pub notes: Vec<String>,
}

impl Plan {
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

    pub fn weight(&mut self, name: impl Into<String>, role: WeightRole) -> WeightId {
        self.weights.push(WeightDecl { name: name.into(), role });
        WeightId(self.weights.len() - 1)
    }

    pub fn phase(&mut self, name: impl Into<String>) {
        self.phases.push(Phase { name: name.into(), first_op: self.ops.len() });
    }

    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    pub fn arena_bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.len * if b.ty == BufType::U8 { 1 } else { 4 }).sum()
    }

    pub fn flops(&self) -> u64 {
        self.ops.iter().map(Op::flops).sum()
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
            self.flops() as f64 / 1e9
        );
        for note in &self.notes {
            let _ = writeln!(s, "note: {note}");
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
        for (phase, range) in self.phase_ranges() {
            let flops: u64 = self.ops[range.clone()].iter().map(Op::flops).sum();
            let _ = writeln!(s, "phase {phase}: {} ops, {:.3} GFLOP", range.len(), flops as f64 / 1e9);
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
            Op::Attention { q, k, heads, kv_heads, head_dim, groups, key_valid, .. } => format!(
                "attention q={} k={} heads={heads}/{kv_heads}x{head_dim} groups={groups}{}",
                v(q),
                v(k),
                if key_valid.is_some() { " masked" } else { "" }
            ),
            Op::AdaRmsNorm { x, modulation, .. } => format!("ada_rms_norm {} mod={}", v(x), w(modulation)),
            Op::GatedResidual { x, y, modulation } => format!("gated_residual {} += {} * gate({})", v(x), v(y), w(modulation)),
            Op::LayerNorm { x, out, .. } | Op::RmsNorm { x, out, .. } => format!("{} {} -> {}", op.name(), v(x), v(out)),
            Op::GeluTanhMul { gate_up, out } => format!("gelu_tanh_mul {} -> {}", v(gate_up), v(out)),
            Op::Copy { src, dst } => format!("copy {} -> {}", v(src), v(dst)),
            Op::RopeQkv { qkv, k_cache, cache_row, .. } => format!("rope_qkv {} -> {} @row {cache_row}", v(qkv), v(k_cache)),
            Op::ImagePatches { camera, out, .. } => format!("image_patches camera {camera} -> {}", v(out)),
            Op::Embed { out, scale, .. } => format!("embed -> {} x {scale}", v(out)),
            Op::AddTable { x, table, .. } => format!("add_table {} += {}", v(x), w(table)),
            Op::GeluTanh { x } => format!("gelu_tanh {}", v(x)),
            Op::Positions { .. } => "positions (validity mask, RoPE positions)".to_string(),
            Op::Affine { x, out, .. } => format!("affine {} -> {}", v(x), v(out)),
        }
    }
}

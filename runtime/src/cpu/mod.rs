//! The CPU reference backend: executes a [`Plan`] in f32, simply and obviously right. It is the
//! oracle of every test and the backend of boards without a GPU. After construction nothing here
//! allocates: buffers, packed weights, RoPE tables and scratch space are all sized from the plan.

mod gemm;

use std::sync::Arc;

use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::image::{self, PixelFormat};
use crate::models::pi05::WeightData;
use crate::plan::{BufId, BufType, FRAME_INFO_FIELDS, Op, Plan, Section, View, WeightId, WeightRole};
use gemm::{PackedMatrix, Strided};

pub use gemm::select_kernel;

enum Weight {
    Packed(PackedMatrix),
    Vector(Vec<f32>),
    /// Rows gathered from the checkpoint mapping on use (the table can be 2 GB in f32).
    Embedding {
        name: String,
        width: usize,
        vocab: usize,
    },
}

enum Buffer {
    F32(Vec<f32>),
    I32(Vec<i32>),
    U8(Vec<u8>),
}

pub struct CpuBackend {
    plan: Plan,
    buffers: Vec<Buffer>,
    weights: Vec<Weight>,
    checkpoint: Arc<Checkpoint>,
    gemm: fn(&[f32], Strided, &PackedMatrix, &mut [f32], Strided, bool),
    kernel_name: &'static str,
    attend: AttendFn,
    /// `cos`/`sin` of every RoPE angle for positions `0..rope_positions`: `[pos][head_dim / 2]`.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    rope_half: usize,
    /// Attention scratch: transposed queries and scores of one query row.
    scores: Vec<f32>,
    /// The plan's runs of phases by prompt bucket, and the bucket this step runs (set by
    /// `Op::PromptBucket`).
    sections: Vec<Section>,
    bucket: Option<usize>,
}

impl CpuBackend {
    pub fn new(plan: Plan, weights: Vec<WeightData>, checkpoint: Arc<Checkpoint>) -> Self {
        let buffers = plan
            .buffers
            .iter()
            .map(|b| match b.ty {
                BufType::F32 => Buffer::F32(vec![0.0; b.len]),
                BufType::I32 => Buffer::I32(vec![0; b.len]),
                BufType::U8 => Buffer::U8(vec![0; b.len]),
            })
            .collect();
        let weights = plan
            .weights
            .iter()
            .zip(weights)
            .map(|(decl, data)| match (decl.role, data) {
                (WeightRole::Embedding { vocab, width }, WeightData::Checkpoint(name)) => Weight::Embedding { name, width, vocab },
                (WeightRole::Matrix { n, k }, data) => Weight::Packed(PackedMatrix::pack(&data.into_vec(&checkpoint), n, k)),
                (_, data) => Weight::Vector(data.into_vec(&checkpoint)),
            })
            .collect();

        let mut scratch = 1;
        let mut rope_positions = 0;
        let mut head_dim = 2;
        for op in &plan.ops {
            match op {
                Op::Attention { k, groups, heads, kv_heads, head_dim, .. } => {
                    let per_kv = heads / kv_heads;
                    assert!(per_kv <= 16, "the CPU attention handles up to 16 query heads per K/V head");
                    scratch = scratch.max(16 * (head_dim + k.rows / groups));
                }
                Op::RopeQkv { k_cache, head_dim: hd, .. } => {
                    rope_positions = rope_positions.max(k_cache.rows);
                    head_dim = *hd;
                }
                _ => {}
            }
        }
        // Positions never exceed the number of sequence slots (cumsum of validity).
        let half = head_dim / 2;
        let (rope_cos, rope_sin) = rope_tables(rope_positions, head_dim);
        CpuBackend {
            buffers,
            weights,
            checkpoint,
            gemm: select_kernel().0,
            kernel_name: select_kernel().1,
            attend: select_attend(),
            rope_cos,
            rope_sin,
            rope_half: half,
            scores: vec![0.0; scratch],
            sections: plan.sections(),
            bucket: None,
            plan,
        }
    }

    fn weight_bytes(&self) -> usize {
        let weights: usize = self
            .weights
            .iter()
            .map(|w| match w {
                Weight::Packed(p) => p.bytes(),
                Weight::Vector(v) => v.len() * 4,
                Weight::Embedding { .. } => 0,
            })
            .sum();
        weights
    }

    fn f32(&self, id: BufId) -> &[f32] {
        match &self.buffers[id.0] {
            Buffer::F32(v) => v,
            _ => unreachable!("buffer {} is not f32", self.plan.buffers[id.0].name),
        }
    }

    fn f32_mut(&mut self, id: BufId) -> &mut [f32] {
        match &mut self.buffers[id.0] {
            Buffer::F32(v) => v,
            _ => unreachable!("buffer {} is not f32", self.plan.buffers[id.0].name),
        }
    }

    fn i32_mut(&mut self, id: BufId) -> &mut [i32] {
        match &mut self.buffers[id.0] {
            Buffer::I32(v) => v,
            _ => unreachable!("buffer {} is not i32", self.plan.buffers[id.0].name),
        }
    }

    fn u8_mut(&mut self, id: BufId) -> &mut [u8] {
        match &mut self.buffers[id.0] {
            Buffer::U8(v) => v,
            _ => unreachable!("buffer {} is not u8", self.plan.buffers[id.0].name),
        }
    }

    fn i32(&self, id: BufId) -> &[i32] {
        match &self.buffers[id.0] {
            Buffer::I32(v) => v,
            _ => unreachable!("buffer {} is not i32", self.plan.buffers[id.0].name),
        }
    }

    fn vector(&self, id: WeightId) -> &[f32] {
        match &self.weights[id.0] {
            Weight::Vector(v) => v,
            _ => unreachable!("weight {} is not a vector", self.plan.weights[id.0].name),
        }
    }

    /// Runs the ops in `range`.
    pub fn run_ops(&mut self, range: std::ops::Range<usize>) {
        for i in range {
            // Ops are plain data; cloning one releases the borrow of the plan (no allocation).
            let op = self.plan.ops[i].clone();
            self.execute(&op);
        }
    }

    /// Moves a buffer out so an op can write it while reading others; an empty Vec takes its
    /// place, which does not allocate. The op puts it back.
    fn take(&mut self, id: BufId) -> Buffer {
        std::mem::replace(&mut self.buffers[id.0], Buffer::F32(Vec::new()))
    }

    /// Lends out the destination buffer so the op can read other buffers while writing it.
    fn with_out<R>(&mut self, id: BufId, f: impl FnOnce(&Self, &mut [f32]) -> R) -> R {
        let Buffer::F32(mut out) = self.take(id) else { unreachable!("buffer {} is not f32", self.plan.buffers[id.0].name) };
        let r = f(self, &mut out);
        self.buffers[id.0] = Buffer::F32(out);
        r
    }

    fn execute(&mut self, op: &Op) {
        match *op {
            Op::ImagePatches { camera, frames, frame_stride, frame_info, size, patch, out } => {
                let info: [i32; FRAME_INFO_FIELDS] =
                    self.i32(frame_info)[camera * FRAME_INFO_FIELDS..][..FRAME_INFO_FIELDS].try_into().expect("4 fields");
                let Buffer::U8(staged) = self.take(frames) else { unreachable!("frames are u8") };
                let format = PixelFormat::from_code(info[3] as u32).unwrap_or(PixelFormat::Rgb8);
                let frame =
                    (info[0] != 0).then(|| (&staged[camera * frame_stride..][..frame_stride], info[1] as usize, info[2] as usize, format));
                image::patchify(frame, size, patch, &mut self.f32_mut(out.buf)[out.offset..], out.stride);
                self.buffers[frames.0] = Buffer::U8(staged);
            }
            Op::Gemm { a, w, bias, out, accumulate } => {
                let gemm = self.gemm;
                self.with_out(out.buf, |this, dst| {
                    let Weight::Packed(pw) = &this.weights[w.0] else { unreachable!("gemm weight is packed") };
                    debug_assert!(pw.k == a.cols && pw.n == out.cols, "gemm shapes");
                    let src = this.f32(a.buf);
                    gemm(
                        src,
                        Strided { offset: a.offset, rows: a.rows, stride: a.stride },
                        pw,
                        dst,
                        Strided { offset: out.offset, rows: out.rows, stride: out.stride },
                        accumulate,
                    );
                    if let Some(b) = bias {
                        let b = this.vector(b);
                        for_rows(dst, out, |row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
                    }
                });
            }
            Op::AddTable { x, table, table_rows } => {
                self.with_out(x.buf, |this, dst| {
                    let t = this.vector(table);
                    let mut r = 0;
                    for_rows(dst, x, |row| {
                        let trow = &t[(r % table_rows) * x.cols..][..x.cols];
                        row.iter_mut().zip(trow).for_each(|(o, v)| *o += v);
                        r += 1;
                    });
                });
            }
            Op::LayerNorm { x, out, gamma, beta, eps } => {
                self.with_out(out.buf, |this, dst| {
                    let (g, b, src) = (this.vector(gamma), this.vector(beta), this.f32(x.buf));
                    for r in 0..x.rows {
                        let xi = &src[x.offset + r * x.stride..][..x.cols];
                        let mean = xi.iter().sum::<f32>() / x.cols as f32;
                        let var = xi.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / x.cols as f32;
                        let inv = 1.0 / (var + eps).sqrt();
                        let o = &mut dst[out.offset + r * out.stride..][..x.cols];
                        for c in 0..x.cols {
                            o[c] = (xi[c] - mean) * inv * g[c] + b[c];
                        }
                    }
                });
            }
            Op::RmsNorm { x, out, eps } => self.rms_norm(x, out, eps, None),
            Op::AdaRmsNorm { x, out, modulation, eps } => self.rms_norm(x, out, eps, Some(modulation)),
            Op::GatedResidual { x, y, modulation } => {
                self.with_out(x.buf, |this, dst| {
                    let gate = &this.vector(modulation)[2 * x.cols..][..x.cols];
                    let src = this.f32(y.buf);
                    let mut r = 0;
                    for_rows(dst, x, |row| {
                        let yr = &src[y.offset + r * y.stride..][..x.cols];
                        for c in 0..x.cols {
                            row[c] += yr[c] * gate[c];
                        }
                        r += 1;
                    });
                });
            }
            Op::GeluTanh { x } => {
                let buf = self.f32_mut(x.buf);
                for_rows(buf, x, |row| row.iter_mut().for_each(|v| *v = gelu_tanh(*v)));
            }
            Op::GeluTanhMul { gate_up, out } => {
                self.with_out(out.buf, |this, dst| {
                    let src = this.f32(gate_up.buf);
                    let f = out.cols;
                    let mut r = 0;
                    for_rows(dst, out, |row| {
                        let gu = &src[gate_up.offset + r * gate_up.stride..][..2 * f];
                        for c in 0..f {
                            row[c] = gelu_tanh(gu[c]) * gu[f + c];
                        }
                        r += 1;
                    });
                });
            }
            Op::Embed { tokens, table, scale, out } => {
                let Buffer::F32(mut dst) = self.take(out.buf) else { unreachable!("embed output is f32") };
                let Weight::Embedding { ref name, width, vocab } = self.weights[table.0] else { unreachable!("embed table") };
                let tensor = self.checkpoint.get(name).unwrap_or_else(|| unreachable!("embedding {name} checked at open"));
                for (r, &id) in self.i32(tokens).iter().enumerate().take(out.rows) {
                    let id = id.clamp(0, vocab as i32 - 1) as usize;
                    let row = &mut dst[out.offset + r * out.stride..][..width];
                    tensor.read_f32_into(id * width, row);
                    row.iter_mut().for_each(|v| *v *= scale);
                }
                self.buffers[out.buf.0] = Buffer::F32(dst);
            }
            Op::Positions { frame_info, cameras, tokens_per_image, token_mask, prompt_len, suffix, valid, positions } => {
                let mut count = 0i32;
                for slot in 0..cameras * tokens_per_image + prompt_len + suffix {
                    let is_valid = if slot < cameras * tokens_per_image {
                        self.i32(frame_info)[(slot / tokens_per_image) * FRAME_INFO_FIELDS] != 0
                    } else if slot < cameras * tokens_per_image + prompt_len {
                        self.i32(token_mask)[slot - cameras * tokens_per_image] != 0
                    } else {
                        true
                    };
                    count += is_valid as i32;
                    self.f32_mut(valid)[slot] = if is_valid { 1.0 } else { 0.0 };
                    // cumsum − 1: an invalid slot shares the position of the previous valid one.
                    self.i32_mut(positions)[slot] = count - 1;
                }
            }
            Op::RopeQkv { qkv, heads, head_dim, positions, position_offset, k_cache, v_cache, cache_row } => {
                let half = head_dim / 2;
                debug_assert_eq!(half, self.rope_half, "one RoPE table per plan");
                let Buffer::F32(mut kc) = self.take(k_cache.buf) else { unreachable!("k cache is f32") };
                let Buffer::F32(mut vc) = self.take(v_cache.buf) else { unreachable!("v cache is f32") };
                let Buffer::F32(mut rows) = self.take(qkv.buf) else { unreachable!("qkv is f32") };
                for r in 0..qkv.rows {
                    let pos = self.i32(positions)[position_offset + r].max(0) as usize;
                    let (cos, sin) = (&self.rope_cos[pos * half..][..half], &self.rope_sin[pos * half..][..half]);
                    let row = &mut rows[qkv.offset + r * qkv.stride..][..(heads + 2) * head_dim];
                    for h in 0..heads {
                        rotate(&mut row[h * head_dim..][..head_dim], cos, sin);
                    }
                    let k = &mut kc[k_cache.offset + (cache_row + r) * k_cache.stride..][..head_dim];
                    k.copy_from_slice(&row[heads * head_dim..][..head_dim]);
                    rotate(k, cos, sin);
                    vc[v_cache.offset + (cache_row + r) * v_cache.stride..][..head_dim].copy_from_slice(&row[(heads + 1) * head_dim..]);
                }
                self.buffers[k_cache.buf.0] = Buffer::F32(kc);
                self.buffers[v_cache.buf.0] = Buffer::F32(vc);
                self.buffers[qkv.buf.0] = Buffer::F32(rows);
            }
            Op::Attention { q, k, v, out, heads, kv_heads, head_dim, groups, key_valid, query_valid } => {
                self.attention(q, k, v, out, heads, kv_heads, head_dim, groups, key_valid, query_valid)
            }
            Op::Copy { src, dst } => {
                self.with_out(dst.buf, |this, d| {
                    let s = this.f32(src.buf);
                    let mut r = 0;
                    for_rows(d, dst, |row| {
                        row.copy_from_slice(&s[src.offset + r * src.stride..][..src.cols]);
                        r += 1;
                    });
                });
            }
            Op::PromptBucket { token_mask } => {
                let last_valid = self.i32(token_mask).iter().rposition(|&m| m != 0);
                self.bucket = self.plan.bucket_for(last_valid);
            }
            Op::Affine { x, scale, offset, out } => {
                self.with_out(out.buf, |this, d| {
                    let (s, o, src) = (this.vector(scale), this.vector(offset), this.f32(x.buf));
                    let mut r = 0;
                    for_rows(d, out, |row| {
                        let xr = &src[x.offset + r * x.stride..][..x.cols];
                        for c in 0..out.cols {
                            row[c] = xr[c] * s[c] + o[c];
                        }
                        r += 1;
                    });
                });
            }
        }
    }

    fn rms_norm(&mut self, x: View, out: View, eps: f32, modulation: Option<WeightId>) {
        self.with_out(out.buf, |this, dst| {
            let src = this.f32(x.buf);
            let m = modulation.map(|m| this.vector(m));
            for r in 0..x.rows {
                let xi = &src[x.offset + r * x.stride..][..x.cols];
                let var = xi.iter().map(|v| v * v).sum::<f32>() / x.cols as f32;
                let inv = 1.0 / (var + eps).sqrt();
                let o = &mut dst[out.offset + r * out.stride..][..x.cols];
                match m {
                    None => o.iter_mut().zip(xi).for_each(|(o, v)| *o = v * inv),
                    Some(m) => {
                        let (scale, shift) = (&m[..x.cols], &m[x.cols..2 * x.cols]);
                        for c in 0..x.cols {
                            o[c] = xi[c] * inv * (1.0 + scale[c]) + shift[c];
                        }
                    }
                }
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
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
    ) {
        let mut scratch = std::mem::take(&mut self.scores);
        let attend = self.attend;
        let per_kv = heads / kv_heads;
        self.with_out(out.buf, |this, dst| {
            let (qb, kb, vb) = (this.f32(q.buf), this.f32(k.buf), this.f32(v.buf));
            let key_valid = key_valid.map(|b| this.f32(b));
            let query_valid = query_valid.map(|b| this.f32(b));
            let (q_per_group, k_per_group) = (q.rows / groups, k.rows / groups);
            for g in 0..groups {
                let keys = g * k_per_group..(g + 1) * k_per_group;
                for qi in g * q_per_group..(g + 1) * q_per_group {
                    let o_row = &mut dst[out.offset + qi * out.stride..][..heads * head_dim];
                    // An invalid query's output is never read (its slot is masked as a key everywhere).
                    if query_valid.is_some_and(|m| m[qi] == 0.0) {
                        o_row.fill(0.0);
                        continue;
                    }
                    for kvh in 0..kv_heads {
                        let heads_of_kv = kvh * per_kv..(kvh + 1) * per_kv;
                        let group = QueryGroup {
                            q: &qb[q.offset + qi * q.stride + heads_of_kv.start * head_dim..][..per_kv * head_dim],
                            k: &kb[k.offset + kvh * head_dim..],
                            v: &vb[v.offset + kvh * head_dim..],
                            head_dim,
                            k_stride: k.stride,
                            v_stride: v.stride,
                            keys: keys.clone(),
                            key_valid,
                        };
                        attend(&group, &mut scratch, &mut o_row[heads_of_kv.start * head_dim..][..per_kv * head_dim]);
                    }
                }
            }
        });
        self.scores = scratch;
    }
}

/// The query heads that share one K/V head (all 8 under multi-query attention), one query row.
struct QueryGroup<'a> {
    /// `[heads, head_dim]`.
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    head_dim: usize,
    k_stride: usize,
    v_stride: usize,
    keys: std::ops::Range<usize>,
    key_valid: Option<&'a [f32]>,
}

type AttendFn = fn(&QueryGroup, &mut [f32], &mut [f32]);

/// The attention inner loop, compiled for AVX2+FMA where available (like the GEMM kernel).
fn select_attend() -> AttendFn {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return |g, s, o| {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            unsafe { attend_avx2(g, s, o) }
        };
    }
    attend_generic
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn attend_avx2(group: &QueryGroup, scratch: &mut [f32], out: &mut [f32]) {
    attend_generic(group, scratch, out)
}

/// `softmax(q·kᵀ/√d)·v` in f32 for every head of the group over the valid keys.
#[inline(always)]
fn attend_generic(group: &QueryGroup, scratch: &mut [f32], out: &mut [f32]) {
    match group.q.len() / group.head_dim {
        1 => attend_lanes::<1>(group, scratch, out),
        2..=8 => attend_lanes::<8>(group, scratch, out),
        _ => attend_lanes::<16>(group, scratch, out),
    }
}

/// `L` lanes hold the group's heads (padded): scores are `[key][L]`, so each key row is loaded
/// once for all heads and the loops vectorise across heads without horizontal sums, even for
/// short heads. With one head (`L = 1`) the dot products run along `head_dim` instead.
/// `scratch` holds `head_dim·L` transposed queries, then `keys·L` scores.
#[inline(always)]
fn attend_lanes<const L: usize>(group: &QueryGroup, scratch: &mut [f32], out: &mut [f32]) {
    let d = group.head_dim;
    let (qt, rest) = scratch.split_at_mut(d * L);
    let scores = &mut rest[..group.keys.len() * L];
    let scale = 1.0 / (d as f32).sqrt();
    qt.fill(0.0);
    for (i, q) in group.q.iter().enumerate() {
        qt[(i % d) * L + i / d] = q * scale;
    }
    let valid = |key: usize| group.key_valid.is_none_or(|m| m[key] != 0.0);
    let mut max = [f32::NEG_INFINITY; L];
    // Scores of KEYS_AT_ONCE keys per pass over the query: their accumulations are independent
    // chains the core overlaps (one key's is a chain of `head_dim` dependent multiply-adds). Each
    // score is summed over the dimensions in order, as one key at a time would.
    const KEYS_AT_ONCE: usize = 4;
    let key_row = |key: usize| &group.k[key * group.k_stride..][..d];
    let (first, count) = (group.keys.start, group.keys.len());
    let whole = if L == 1 { 0 } else { count / KEYS_AT_ONCE * KEYS_AT_ONCE };
    for (block, s) in scores[..whole * L].chunks_exact_mut(KEYS_AT_ONCE * L).enumerate() {
        let key0 = first + block * KEYS_AT_ONCE;
        let rows: [&[f32]; KEYS_AT_ONCE] = std::array::from_fn(|j| key_row(key0 + j));
        let mut acc = [[0.0f32; L]; KEYS_AT_ONCE];
        for (dim, q) in qt.chunks_exact(L).enumerate() {
            for j in 0..KEYS_AT_ONCE {
                let kv = rows[j][dim];
                for l in 0..L {
                    acc[j][l] += q[l] * kv;
                }
            }
        }
        for (j, s) in s.chunks_exact_mut(L).enumerate() {
            if valid(key0 + j) {
                for l in 0..L {
                    max[l] = max[l].max(acc[j][l]);
                }
                s.copy_from_slice(&acc[j]);
            }
        }
    }
    for (s, key) in scores[whole * L..].chunks_exact_mut(L).zip(first + whole..group.keys.end) {
        if !valid(key) {
            continue;
        }
        let krow = key_row(key);
        let mut acc = [0.0f32; L];
        if L == 1 {
            acc[0] = dot(&qt[..d], krow);
        } else {
            for (q, &kv) in qt.chunks_exact(L).zip(krow) {
                for l in 0..L {
                    acc[l] += q[l] * kv;
                }
            }
        }
        for l in 0..L {
            max[l] = max[l].max(acc[l]);
        }
        s.copy_from_slice(&acc);
    }
    let mut sum = [0.0f32; L];
    for (s, key) in scores.chunks_exact_mut(L).zip(group.keys.clone()) {
        if valid(key) {
            for l in 0..L {
                s[l] = exp_nonpositive(s[l] - max[l]);
                sum[l] += s[l];
            }
        }
    }
    out.fill(0.0);
    for (s, key) in scores.chunks_exact(L).zip(group.keys.clone()) {
        if !valid(key) {
            continue;
        }
        let vr = &group.v[key * group.v_stride..][..d];
        for (l, o) in out.chunks_exact_mut(d).enumerate() {
            let w = s[l] / sum[l];
            o.iter_mut().zip(vr).for_each(|(o, v)| *o += w * v);
        }
    }
}

/// `e^x` for `x ≤ 0` (softmax arguments) within 2 ulp, branch-free so that it vectorises across
/// the head lanes (libm's `expf` is a call per element). Cody–Waite range reduction
/// `x = n·ln2 + r`, a degree-6 polynomial for `e^r` on |r| ≤ ln2/2, and `2^n` built in the exponent
/// bits; arguments below −87 flush to 0 (the padded lanes hold −∞).
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (0.166_666_67 + r * (0.041_666_5 + r * (0.008_333_9 + r * 0.001_393_6)))));
    p * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums let the compiler vectorise without reassociating a single chain.
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `cos` and `sin` of every RoPE angle for positions `0..positions`, `[pos][head_dim / 2]`; the
/// CUDA backend uploads the same tables.
pub fn rope_tables(positions: usize, head_dim: usize) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let mut cos = vec![0.0; positions * half];
    let mut sin = vec![0.0; positions * half];
    for pos in 0..positions {
        for j in 0..half {
            // transformers' Gemma rotary: inv_freq in f32, angle = pos · inv_freq in f32.
            let inv_freq = (1.0 / 10000f64.powf(2.0 * j as f64 / head_dim as f64)) as f32;
            let angle = (pos as f32 * inv_freq) as f64;
            cos[pos * half + j] = angle.cos() as f32;
            sin[pos * half + j] = angle.sin() as f32;
        }
    }
    (cos, sin)
}

/// Applies `f` to each row of `view` inside `buf`.
fn for_rows(buf: &mut [f32], view: View, mut f: impl FnMut(&mut [f32])) {
    for r in 0..view.rows {
        f(&mut buf[view.offset + r * view.stride..][..view.cols]);
    }
}

/// Split-half rotary embedding: `[a·cos − b·sin, b·cos + a·sin]`.
impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_name(&self) -> String {
        format!("CPU ({}, {} kernel)", std::env::consts::ARCH, self.kernel_name)
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn memory_bytes(&self) -> usize {
        self.weight_bytes() + self.plan.arena_bytes()
    }

    fn input_u8(&mut self, id: BufId) -> &mut [u8] {
        self.u8_mut(id)
    }

    fn input_i32(&mut self, id: BufId) -> &mut [i32] {
        self.i32_mut(id)
    }

    fn input_f32(&mut self, id: BufId) -> &mut [f32] {
        self.f32_mut(id)
    }

    fn run(&mut self) -> Result<()> {
        for i in 0..self.sections.len() {
            let Section { range, prompt_bucket } = self.sections[i].clone();
            if prompt_bucket.is_none() || prompt_bucket == self.bucket {
                self.run_ops(range);
            }
        }
        Ok(())
    }

    fn output_f32(&self, id: BufId) -> &[f32] {
        self.f32(id)
    }

    fn read_buffer(&self, name: &str) -> Option<Vec<f32>> {
        let id = self.plan.find_buffer(name)?;
        matches!(self.buffers[id.0], Buffer::F32(_)).then(|| self.f32(id).to_vec())
    }
}

fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (a, b) = x.split_at_mut(half);
    for j in 0..half {
        let (x1, x2) = (a[j], b[j]);
        a[j] = x1 * cos[j] - x2 * sin[j];
        b[j] = x2 * cos[j] + x1 * sin[j];
    }
}

pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive per-head attention in f64 over the valid keys.
    fn reference(group: &QueryGroup) -> Vec<f32> {
        let d = group.head_dim;
        let valid: Vec<usize> = group.keys.clone().filter(|&k| group.key_valid.is_none_or(|m| m[k] != 0.0)).collect();
        let mut out = Vec::new();
        for q in group.q.chunks_exact(d) {
            let scores: Vec<f64> = valid
                .iter()
                .map(|&k| q.iter().zip(&group.k[k * group.k_stride..][..d]).map(|(a, b)| (a * b) as f64).sum::<f64>() / (d as f64).sqrt())
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            out.extend(
                (0..d).map(|c| {
                    valid.iter().zip(&weights).map(|(&k, w)| w / sum * group.v[k * group.v_stride + c] as f64).sum::<f64>() as f32
                }),
            );
        }
        out
    }

    #[test]
    fn attention_matches_a_naive_reference() {
        // Key counts around the 4-key blocks, masked keys inside and outside blocks, head groups
        // of every lane width (1, ≤ 8, ≤ 16), both attention kernels.
        let mut seed = 1u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32 * 2.0 - 1.0
        };
        for (heads, d) in [(1, 72), (3, 16), (8, 16), (12, 4)] {
            for keys in [1, 3, 4, 5, 8, 13] {
                let stride = d + 3;
                let (k, v): (Vec<f32>, Vec<f32>) = (0..(keys + 2) * stride).map(|_| (next(), next())).unzip();
                let q: Vec<f32> = (0..heads * d).map(|_| next()).collect();
                let mask: Vec<f32> = (0..keys + 2).map(|i| if i % 3 == 1 && i != 2 { 0.0 } else { 1.0 }).collect();
                for key_valid in [None, Some(mask.as_slice())] {
                    let group =
                        QueryGroup { q: &q, k: &k, v: &v, head_dim: d, k_stride: stride, v_stride: stride, keys: 2..keys + 2, key_valid };
                    let want = reference(&group);
                    for attend in [select_attend(), attend_generic as AttendFn] {
                        let mut scratch = vec![0.0; 16 * (d + keys)];
                        let mut got = vec![f32::NAN; heads * d];
                        attend(&group, &mut scratch, &mut got);
                        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                        assert!(worst < 1e-5, "{heads} heads × {d}, {keys} keys, mask {}: max error {worst:e}", key_valid.is_some());
                    }
                }
            }
        }
    }

    #[test]
    fn fast_exp_matches_libm() {
        let mut worst = 0.0f32;
        for i in 0..=200_000 {
            let x = -88.0 * i as f32 / 200_000.0;
            let (got, want) = (super::exp_nonpositive(x), x.exp());
            if want > 1e-30 {
                worst = worst.max((got - want).abs() / want);
            }
        }
        assert!(worst < 5e-7, "relative error {worst:e}");
        assert_eq!(super::exp_nonpositive(f32::NEG_INFINITY), super::exp_nonpositive(-87.0));
        assert!(super::exp_nonpositive(f32::NEG_INFINITY) < 2e-38);
    }
}

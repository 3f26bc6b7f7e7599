//! The CPU reference backend: executes a [`Plan`] in f32, simply and obviously right. It is the
//! oracle of every test and the backend of boards without a GPU. After construction nothing here
//! allocates: buffers, packed weights, RoPE tables and scratch space are all sized from the plan.

mod attention;
mod gemm;
mod pool;

use std::ops::Range;

use crate::backend::Backend;
use crate::calibration::ProductProbe;
use crate::checkpoint::{Checkpoint, DType};
use crate::error::{Error, Result};
use crate::fp8::{self, ProductScales};
use crate::image::{self, PixelFormat};
use crate::plan::{Activation, BufId, BufType, FRAME_INFO_FIELDS, Op, Plan, RopeAxes, RopeSpec, Section, View, WeightId, WeightRole};
use crate::weights::WeightData;
use attention::{KeysValues, Packed, Queries};
use gemm::{MR, PackedMatrix, Strided};
use pool::{Parts, Pool, row_blocks};

pub use gemm::select_kernel;
pub use pool::MAX_THREADS;

enum Weight {
    Packed(PackedMatrix),
    /// The entries of a [`WeightRole::MatrixStack`], each packed as the matrix it is copied into.
    PackedStack(Vec<PackedMatrix>),
    Vector(Vec<f32>),
    /// The token table as stored in the checkpoint (bf16 or f32), copied at open so that no step
    /// reads the file's mapping; rows convert to f32 when gathered (the table is 2 GB in f32 at
    /// full size).
    Embedding {
        bytes: Vec<u8>,
        dtype: DType,
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
    gemm: fn(&[f32], Strided, &PackedMatrix, &mut [f32], Strided, bool),
    kernel_name: &'static str,
    attend: attention::AttendFn,
    /// Splits GEMMs and attention by rows; one part per thread.
    pool: Pool,
    /// Each RoPE table of the plan with its `cos`/`sin` of every angle, `[pos][head_dim / 2]`.
    rope: Vec<(RopeSpec, Vec<f32>, Vec<f32>)>,
    /// The valid keys and values of the K/V head being attended to.
    packed_kv: Packed,
    /// Attention scores, one block per thread.
    scores: Vec<Vec<f32>>,
    /// The plan's runs of phases by prompt bucket, and the bucket this step runs (set by
    /// `Op::PromptBucket`).
    sections: Vec<Section>,
    bucket: Option<usize>,
    /// Working memory of the image ops that resample frames (`QwenImage::patches`).
    image_scratch: Vec<u8>,
    /// [`Backend::fail_next_run`] was called.
    fail_next_run: bool,
    /// FP8 emulation ([`CpuBackend::with_fp8`]): the scales of each weight's products that run in
    /// FP8 (its input's, and its output's where it stores that in e4m3), by weight id (empty: none
    /// do), and the rounded copy of a product's input.
    fp8_scales: Vec<Option<ProductScales>>,
    fp8_input: Vec<f32>,
    /// Calibrating: what each product's inputs and FP8 error are ([`Backend::swap_product_probe`]).
    probe: Option<ProductProbe>,
}

impl CpuBackend {
    /// `threads`: how many threads (this one included) split each GEMM and attention. Every
    /// weight is read out of `checkpoint` here: after `new` nothing reads its files, so they may
    /// be replaced or rewritten while the backend runs.
    pub fn new(plan: Plan, weights: Vec<WeightData>, checkpoint: &Checkpoint, threads: usize) -> Result<Self> {
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
                (WeightRole::Embedding { vocab, width }, WeightData::Checkpoint(name)) => {
                    let t = checkpoint.get(&name).unwrap_or_else(|| unreachable!("embedding {name} checked at open"));
                    Ok(Weight::Embedding { bytes: t.read_bytes(), dtype: t.dtype, width, vocab })
                }
                (WeightRole::Matrix { n, k }, data) => Ok(Weight::Packed(PackedMatrix::pack(&data.into_vec(checkpoint), n, k))),
                (WeightRole::MatrixStack { entries, n, k }, data) => {
                    let values = data.into_vec(checkpoint);
                    if values.len() != entries * n * k || entries == 0 {
                        return Err(Error::Backend(format!(
                            "weight {}: {} values for a stack of {entries} matrices [{n}, {k}]",
                            decl.name,
                            values.len()
                        )));
                    }
                    Ok(Weight::PackedStack(values.chunks(n * k).map(|m| PackedMatrix::pack(m, n, k)).collect()))
                }
                (_, data) => Ok(Weight::Vector(data.into_vec(checkpoint))),
            })
            .collect::<Result<Vec<Weight>>>()?;
        for op in &plan.ops {
            if let Op::SelectWeight { entries, table, dst, .. } = *op {
                let fits = match (&weights[dst.0], &weights[table.0]) {
                    (Weight::Packed(d), Weight::PackedStack(stack)) => stack.len() == entries && (stack[0].n, stack[0].k) == (d.n, d.k),
                    (Weight::Vector(d), Weight::Vector(stack)) => entries > 0 && stack.len() == entries * d.len(),
                    _ => false,
                };
                if !fits {
                    let name = |w: WeightId| &plan.weights[w.0].name;
                    return Err(Error::Backend(format!("select_weight: {} is not a table of {entries} of {}", name(table), name(dst))));
                }
            }
        }

        let (mut scores, mut max_keys, mut max_head_dim) = (0, 0, 0);
        for op in &plan.ops {
            if let Op::Attention { k, groups, heads, kv_heads, head_dim, .. } = op {
                scores = scores.max(attention::scratch_len(k.rows / groups, heads / kv_heads));
                max_keys = max_keys.max(k.rows / groups);
                max_head_dim = max_head_dim.max(*head_dim);
            }
        }
        // Positions never exceed the number of sequence slots (cumsum of validity).
        let rope = plan
            .rope_specs()
            .into_iter()
            .map(|spec| {
                let (cos, sin) = spec.tables();
                (spec, cos, sin)
            })
            .collect();
        let image_scratch = plan
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::QwenImagePatches { max_width, max_height, image, .. } => Some(image.scratch_len(*max_width, *max_height)),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let pool = Pool::new(threads).map_err(|e| Error::Backend(format!("cannot start {threads} CPU threads: {e}")))?;
        Ok(CpuBackend {
            buffers,
            weights,
            gemm: select_kernel().0,
            kernel_name: select_kernel().1,
            attend: attention::select(),
            rope,
            packed_kv: Packed::with_capacity(max_keys, max_head_dim),
            scores: (0..pool.threads()).map(|_| vec![0.0; scores]).collect(),
            pool,
            sections: plan.sections(),
            bucket: None,
            image_scratch: vec![0; image_scratch],
            fail_next_run: false,
            fp8_scales: Vec::new(),
            fp8_input: Vec::new(),
            probe: None,
            plan,
        })
    }

    /// Emulates the FP8 path of a GPU: the products of each weight with scales in `scales` (by
    /// weight id) read their weight rounded through e4m3 with its per-tensor weight scale and
    /// their input rounded with the activation scale, then accumulate in f32 as the FP8 tensor
    /// cores do. Every other op stays in f32. The reference for FP8 on the GPU (which takes the
    /// same scales), and a way to see a calibration's effect on actions without one.
    pub fn with_fp8(mut self, scales: &[Option<ProductScales>]) -> Self {
        let mut input_len = 0;
        for op in &self.plan.ops {
            if let Op::Gemm { a, w, .. } = *op
                && scales[w.0].is_some()
            {
                input_len = input_len.max(a.rows * a.cols);
            }
        }
        for (weight, scales) in self.weights.iter_mut().zip(scales) {
            if let (Weight::Packed(matrix), Some(scales)) = (weight, scales) {
                fp8::round_trip_all(matrix.values_mut(), scales.weight);
            }
        }
        self.fp8_input = vec![0.0; input_len];
        self.fp8_scales = scales.to_vec();
        self
    }

    /// Calibrating: records the range of product `w`'s input `a` and, when measuring, adds the
    /// error of the product computed in FP8 against f32.
    fn probe_product(&mut self, a: View, w: WeightId) {
        let Some(probe) = self.probe.as_mut().filter(|p| p.recorded[w.0] && !p.propagate) else { return };
        let Weight::Packed(weight) = &self.weights[w.0] else { unreachable!("gemm weight is packed") };
        let src = match &self.buffers[a.buf.0] {
            Buffer::F32(v) => v.as_slice(),
            _ => unreachable!("gemm input is f32"),
        };
        let mut input: Vec<f32> = (0..a.rows).flat_map(|r| src[a.offset + r * a.stride..][..a.cols].iter().copied()).collect();
        probe.activation_amax[w.0] = probe.activation_amax[w.0].max(fp8::amax(&input));
        let Some(scale) = probe.measure_scales.as_ref().and_then(|s| s[w.0]) else { return };
        let weight_scale = fp8::scale_for(probe.weight_amax[w.0]);
        // Both products on every thread, as the step's own: on a many-core machine a measured
        // step would otherwise take tens of plain ones.
        let a = View { offset: 0, stride: a.cols, ..a };
        let out = View { cols: weight.n, stride: weight.n, ..a };
        let mut exact = vec![0.0; a.rows * weight.n];
        self.product(&input, a, weight, &mut exact, out, false, None);
        let mut rounded = weight.clone();
        self.round_trip(rounded.values_mut(), weight_scale);
        self.round_trip(&mut input, scale);
        let mut fp8_out = vec![0.0; exact.len()];
        self.product(&input, a, &rounded, &mut fp8_out, out, false, None);
        if let Some(output_scale) = self.probe.as_ref().and_then(|p| p.output_scales.as_ref()?[w.0]) {
            self.round_trip(&mut fp8_out, output_scale);
        }
        let probe = self.probe.as_mut().expect("checked above");
        probe.error[w.0] += exact.iter().zip(&fp8_out).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>();
        probe.energy[w.0] += exact.iter().map(|&x| (x as f64).powi(2)).sum::<f64>();
    }

    /// After product `w` wrote `out`: calibrating, its range where the probe records it; in FP8,
    /// `out` rounded through e4m3 where the product stores it so (an output scale).
    fn product_output(&mut self, w: WeightId, out: View) {
        let probe = self.probe.as_ref();
        let propagated = probe.filter(|p| p.propagate).and_then(|p| p.output_scales.as_ref()?[w.0]);
        let scale = propagated.or(self.fp8_scales.get(w.0).copied().flatten().and_then(|s| s.output));
        let record = probe.is_some_and(|p| p.outputs[w.0] && !p.propagate);
        if (scale.is_none() && !record) || out.rows == 0 {
            return;
        }
        let mut buffer = std::mem::replace(&mut self.buffers[out.buf.0], Buffer::F32(Vec::new()));
        let Buffer::F32(values) = &mut buffer else { unreachable!("gemm output is f32") };
        let rows = &mut values[out.offset..][..(out.rows - 1) * out.stride + out.cols];
        if let Some(probe) = self.probe.as_mut().filter(|_| record) {
            let amax = rows.chunks(out.stride).fold(0.0f32, |m, row| m.max(fp8::amax(&row[..out.cols])));
            probe.output_amax[w.0] = probe.output_amax[w.0].max(amax);
        }
        match scale {
            Some(scale) if out.stride == out.cols => self.round_trip(rows, scale),
            Some(scale) => rows.chunks_mut(out.stride).for_each(|row| fp8::round_trip_all(&mut row[..out.cols], scale)),
            None => {}
        }
        self.buffers[out.buf.0] = buffer;
    }

    /// [`fp8::round_trip_all`] split over the pool's threads (calibration rounds whole weights).
    fn round_trip(&self, values: &mut [f32], scale: f32) {
        const MIN_PART: usize = 1 << 16;
        let parts = (values.len() / MIN_PART).clamp(1, self.pool.threads());
        let blocks = row_blocks(0..values.len(), parts, 1);
        let values = Parts::new(values, blocks[..parts].iter().cloned());
        self.pool.run(parts, &|i| fp8::round_trip_all(values.take(i), scale));
    }

    /// `dst[out] (+)= src[a] · wᵀ (+ bias)`, the rows split over the pool's threads.
    #[allow(clippy::too_many_arguments)] // one product's operands
    fn product(&self, src: &[f32], a: View, w: &PackedMatrix, dst: &mut [f32], out: View, accumulate: bool, bias: Option<&[f32]>) {
        let (gemm, parts) = (self.gemm, self.parts_for(a.rows, a.cols * out.cols));
        let blocks = row_blocks(0..a.rows, parts, MR);
        let dst = Parts::new(dst, blocks[..parts].iter().map(|r| rows_span(out, r.clone())));
        self.pool.run(parts, &|i| {
            let rows = blocks[i].clone();
            let part = dst.take(i);
            let local = View { offset: 0, rows: rows.len(), ..out };
            let a_rows = Strided { offset: a.offset + rows.start * a.stride, rows: rows.len(), stride: a.stride };
            gemm(src, a_rows, w, part, Strided { offset: 0, rows: rows.len(), stride: out.stride }, accumulate);
            if let Some(b) = bias {
                for_rows(part, local, |row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
            }
        });
    }

    /// How many threads share `rows` rows of `work` multiply-adds each: one below the size at
    /// which handing out parts costs more than it saves, and never a part under one tile.
    fn parts_for(&self, rows: usize, work_per_row: usize) -> usize {
        const MIN_WORK_PER_PART: usize = 1 << 16;
        (rows * work_per_row / MIN_WORK_PER_PART).min(rows / MR).clamp(1, self.pool.threads())
    }

    fn weight_bytes(&self) -> usize {
        let weights: usize = self
            .weights
            .iter()
            .map(|w| match w {
                Weight::Packed(p) => p.bytes(),
                Weight::PackedStack(s) => s.iter().map(PackedMatrix::bytes).sum(),
                Weight::Vector(v) => v.len() * 4,
                Weight::Embedding { bytes, .. } => bytes.len(),
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
                // Each thread writes its own patch rows.
                let per_side = size / patch;
                let parts = self.pool.threads().min(per_side);
                let blocks = row_blocks(0..per_side, parts, 1);
                self.with_out(out.buf, |this, dst| {
                    let dst = Parts::new(dst, blocks[..parts].iter().map(|r| rows_span(out, r.start * per_side..r.end * per_side)));
                    this.pool.run(parts, &|i| image::patchify(frame, size, patch, blocks[i].clone(), dst.take(i), out.stride));
                });
                self.buffers[frames.0] = Buffer::U8(staged);
            }
            Op::QwenImagePatches { camera, frames, frame_stride, frame_info, image, out, .. } => {
                let info: [i32; FRAME_INFO_FIELDS] =
                    self.i32(frame_info)[camera * FRAME_INFO_FIELDS..][..FRAME_INFO_FIELDS].try_into().expect("4 fields");
                let Buffer::U8(staged) = self.take(frames) else { unreachable!("frames are u8") };
                let mut scratch = std::mem::take(&mut self.image_scratch);
                self.with_out(out.buf, |_, dst| {
                    let dst = &mut dst[out.offset..];
                    if info[0] == 0 {
                        for_rows(dst, View { offset: 0, ..out }, |row| row.fill(-1.0));
                        return;
                    }
                    let format = PixelFormat::from_code(info[3] as u32).unwrap_or(PixelFormat::Rgb8);
                    let (width, height) = (info[1] as usize, info[2] as usize);
                    // Staged frames are packed rows (see `IoSpec::stage_frames`).
                    let frame = &staged[camera * frame_stride..][..frame_stride];
                    image.patches(frame, width, height, width * format.bytes_per_pixel(), format, &mut scratch, dst, out.stride);
                });
                self.image_scratch = scratch;
                self.buffers[frames.0] = Buffer::U8(staged);
            }
            Op::Gemm { a, w, bias, out, accumulate } => {
                if self.probe.is_some() {
                    self.probe_product(a, w);
                }
                // FP8 emulation: the product reads its input rounded through e4m3 (and its weight,
                // rounded at `with_fp8`, or here while a calibration probe propagates FP8).
                let propagated = self.probe.as_ref().filter(|p| p.propagate).and_then(|p| {
                    let scale = p.measure_scales.as_ref()?[w.0]?;
                    Some((scale, fp8::scale_for(p.weight_amax[w.0])))
                });
                let input_scale = propagated.map(|(input, _)| input).or(self.fp8_scales.get(w.0).copied().flatten().map(|s| s.activation));
                let mut rounded = std::mem::take(&mut self.fp8_input);
                if let Some(scale) = input_scale {
                    let src = self.f32(a.buf);
                    rounded.resize(rounded.len().max(a.rows * a.cols), 0.0);
                    for (r, row) in rounded.chunks_exact_mut(a.cols).take(a.rows).enumerate() {
                        row.copy_from_slice(&src[a.offset + r * a.stride..][..a.cols]);
                        fp8::round_trip_all(row, scale);
                    }
                }
                let rounded_weight = propagated.map(|(_, weight_scale)| {
                    let Weight::Packed(pw) = &self.weights[w.0] else { unreachable!("gemm weight is packed") };
                    let mut copy = pw.clone();
                    self.round_trip(copy.values_mut(), weight_scale);
                    copy
                });
                let a = if input_scale.is_some() { View { offset: 0, stride: a.cols, ..a } } else { a };
                self.with_out(out.buf, |this, dst| {
                    let Weight::Packed(pw) = &this.weights[w.0] else { unreachable!("gemm weight is packed") };
                    let pw = rounded_weight.as_ref().unwrap_or(pw);
                    debug_assert!(pw.k == a.cols && pw.n == out.cols, "gemm shapes");
                    let src = if input_scale.is_some() { &rounded[..] } else { this.f32(a.buf) };
                    this.product(src, a, pw, dst, out, accumulate, bias.map(|b| this.vector(b)));
                });
                self.fp8_input = rounded;
                self.product_output(w, out);
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
            Op::LayerNorm { x, out, affine, modulation, eps } => {
                self.with_out(out.buf, |this, dst| {
                    let src = this.f32(x.buf);
                    let affine = affine.map(|(g, b)| (this.vector(g), this.vector(b)));
                    let modulation = modulation.map(|m| this.vector(m));
                    for r in 0..x.rows {
                        let xi = &src[x.offset + r * x.stride..][..x.cols];
                        let mean = xi.iter().sum::<f32>() / x.cols as f32;
                        let var = xi.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / x.cols as f32;
                        let inv = 1.0 / (var + eps).sqrt();
                        let o = &mut dst[out.offset + r * out.stride..][..x.cols];
                        for c in 0..x.cols {
                            o[c] = (xi[c] - mean) * inv;
                            if let Some((g, b)) = affine {
                                o[c] = o[c] * g[c] + b[c];
                            }
                            if let Some(m) = modulation {
                                o[c] = o[c] * (1.0 + m[c]) + m[x.cols + c];
                            }
                        }
                    }
                });
            }
            Op::RmsNorm { x, out, weight, eps } => self.rms_norm(x, out, eps, weight, None),
            Op::AdaRmsNorm { x, out, modulation, eps } => self.rms_norm(x, out, eps, None, Some(modulation)),
            Op::HeadRmsNorm { x, out, heads, weight, eps } => {
                // Each head's slice as its own row: the same arithmetic as RmsNorm with a weight.
                let d = x.cols / heads;
                for h in 0..heads {
                    let slice = |v: View| View { offset: v.offset + h * d, cols: d, ..v };
                    self.rms_norm(slice(x), slice(out), eps, Some(weight), None);
                }
            }
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
            Op::Activation { x, kind } => {
                let buf = self.f32_mut(x.buf);
                for_rows(buf, x, |row| row.iter_mut().for_each(|v| *v = activate(kind, *v)));
            }
            Op::GatedActivation { gate_up, out, kind } => {
                self.with_out(out.buf, |this, dst| {
                    let src = this.f32(gate_up.buf);
                    let f = out.cols;
                    let mut r = 0;
                    for_rows(dst, out, |row| {
                        let gu = &src[gate_up.offset + r * gate_up.stride..][..2 * f];
                        for c in 0..f {
                            row[c] = activate(kind, gu[c]) * gu[f + c];
                        }
                        r += 1;
                    });
                });
            }
            Op::Embed { tokens, table, scale, out } => {
                let Buffer::F32(mut dst) = self.take(out.buf) else { unreachable!("embed output is f32") };
                let Weight::Embedding { ref bytes, dtype, width, vocab } = self.weights[table.0] else { unreachable!("embed table") };
                let row_bytes = width * dtype.size();
                for (r, &id) in self.i32(tokens).iter().enumerate().take(out.rows) {
                    let id = id.clamp(0, vocab as i32 - 1) as usize;
                    let row = &mut dst[out.offset + r * out.stride..][..width];
                    dtype.convert(&bytes[id * row_bytes..][..row_bytes], row);
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
            Op::RopeQkv { qkv, heads, kv_heads, head_dim, theta, axes, positions, position_offset, k_cache, v_cache, cache_row } => {
                let half = head_dim / 2;
                let Buffer::F32(mut kc) = self.take(k_cache.buf) else { unreachable!("k cache is f32") };
                let Buffer::F32(mut vc) = self.take(v_cache.buf) else { unreachable!("v cache is f32") };
                let Buffer::F32(mut rows) = self.take(qkv.buf) else { unreachable!("qkv is f32") };
                let halves = matches!(axes, RopeAxes::Rows2d { .. });
                let (_, cos_table, sin_table) =
                    self.rope.iter().find(|(spec, ..)| spec.serves(theta, head_dim, halves)).expect("a table per RoPE spec of the plan");
                let kv_width = kv_heads * head_dim;
                // This row's cos and sin per pair: a table row, or gathered per pair from the row's
                // position on that pair's axis (into scratch sized for the widest head).
                let (mut cos_row, mut sin_row) = ([0f32; MAX_ROPE_PAIRS], [0f32; MAX_ROPE_PAIRS]);
                for r in 0..qkv.rows {
                    let position = |axis: usize| self.i32(positions)[axes.index(axis, position_offset, r)].max(0) as usize;
                    let (cos, sin) = if axes == RopeAxes::Single {
                        let pos = position(0);
                        (&cos_table[pos * half..][..half], &sin_table[pos * half..][..half])
                    } else {
                        for j in 0..half {
                            let at = position(axes.axis(j, half)) * half + j;
                            (cos_row[j], sin_row[j]) = (cos_table[at], sin_table[at]);
                        }
                        (&cos_row[..half], &sin_row[..half])
                    };
                    let row = &mut rows[qkv.offset + r * qkv.stride..][..heads * head_dim + 2 * kv_width];
                    for h in 0..heads {
                        rotate(&mut row[h * head_dim..][..head_dim], cos, sin);
                    }
                    let k = &mut kc[k_cache.offset + (cache_row + r) * k_cache.stride..][..kv_width];
                    k.copy_from_slice(&row[heads * head_dim..][..kv_width]);
                    for kh in k.chunks_exact_mut(head_dim) {
                        rotate(kh, cos, sin);
                    }
                    vc[v_cache.offset + (cache_row + r) * v_cache.stride..][..kv_width]
                        .copy_from_slice(&row[heads * head_dim + kv_width..]);
                }
                self.buffers[k_cache.buf.0] = Buffer::F32(kc);
                self.buffers[v_cache.buf.0] = Buffer::F32(vc);
                self.buffers[qkv.buf.0] = Buffer::F32(rows);
            }
            Op::Attention { q, k, v, out, heads, kv_heads, head_dim, groups, key_valid, query_valid, causal } => {
                self.attention(q, k, v, out, [heads, kv_heads, head_dim, groups], key_valid, query_valid, causal)
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
            Op::ScatterRows { src, index, dst, accumulate } => {
                self.with_out(dst.buf, |this, d| {
                    let (s, index) = (this.f32(src.buf), this.i32(index));
                    for (r, &at) in index[..src.rows].iter().enumerate() {
                        let from = &s[src.offset + r * src.stride..][..src.cols];
                        let to = &mut d[dst.offset + at as usize * dst.stride..][..dst.cols];
                        if accumulate {
                            to.iter_mut().zip(from).for_each(|(t, f)| *t += f);
                        } else {
                            to.copy_from_slice(from);
                        }
                    }
                });
            }
            Op::SelectWeight { index, entries, table, dst } => {
                let entry = (self.i32(index)[0].max(0) as usize).min(entries.saturating_sub(1));
                // Lent out (an empty vector takes its place, which does not allocate).
                let mut live = std::mem::replace(&mut self.weights[dst.0], Weight::Vector(Vec::new()));
                match (&mut live, &self.weights[table.0]) {
                    (Weight::Packed(d), Weight::PackedStack(stack)) => d.copy_from(&stack[entry]),
                    (Weight::Vector(d), Weight::Vector(stack)) => {
                        let len = d.len();
                        d.copy_from_slice(&stack[entry * len..][..len]);
                    }
                    _ => unreachable!("select_weight into {} from a table of another kind", self.plan.weights[dst.0].name),
                }
                self.weights[dst.0] = live;
            }
            Op::PromptBucket { token_mask } => {
                let last_valid = self.i32(token_mask).iter().rposition(|&m| m != 0);
                self.bucket = self.plan.bucket_for(last_valid);
            }
            Op::RtcGuide { x, step, prev, weights, shift, cols, t, dt, guidance } => {
                self.with_out(x.buf, |this, d| {
                    let (u, p, w) = (this.f32(step.buf), this.f32(prev.buf), this.f32(weights));
                    let shift = this.i32(shift)[0].max(0) as usize;
                    for r in 0..x.rows {
                        let xr = &mut d[x.offset + r * x.stride..][..x.cols];
                        let ur = &u[step.offset + r * step.stride..][..x.cols];
                        let pr = (r + shift < prev.rows).then(|| &p[prev.offset + (r + shift) * prev.stride..][..cols]);
                        for c in 0..x.cols {
                            let v = ur[c] / dt;
                            let target = pr.map_or(0.0, |pr| if c < cols { pr[c] } else { 0.0 });
                            let correction = (target - (xr[c] - t * v)) * w[r];
                            xr[c] += dt * (v - guidance * correction);
                        }
                    }
                });
            }
            Op::RtcPrefix { x, prev, prefix, cols } => {
                self.with_out(x.buf, |this, d| {
                    let (p, at) = (this.f32(prev.buf), this.i32(prefix));
                    let (first, rows) = (at[0].max(0) as usize, at[1].max(0) as usize);
                    for r in 0..rows.min(x.rows).min(prev.rows.saturating_sub(first)) {
                        let xr = &mut d[x.offset + r * x.stride..][..x.cols];
                        let pr = &p[prev.offset + (first + r) * prev.stride..][..cols];
                        xr[..cols].copy_from_slice(pr);
                        xr[cols..].fill(0.0);
                    }
                });
            }
            Op::RtcEuler { x, step, strength } => {
                self.with_out(x.buf, |this, d| {
                    let (u, s) = (this.f32(step.buf), this.f32(strength));
                    for r in 0..x.rows {
                        let xr = &mut d[x.offset + r * x.stride..][..x.cols];
                        let ur = &u[step.offset + r * step.stride..][..x.cols];
                        xr.iter_mut().zip(ur).for_each(|(x, u)| *x += s[r] * u);
                    }
                });
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

    /// `out` may be `x` itself (Qwen3's q/k norms run in place): each row's statistics are taken
    /// before any of it is written, and each value is read before it is overwritten.
    fn rms_norm(&mut self, x: View, out: View, eps: f32, weight: Option<WeightId>, modulation: Option<WeightId>) {
        let in_place = x == out;
        self.with_out(out.buf, |this, dst| {
            let src = (!in_place).then(|| this.f32(x.buf));
            let (w, m) = (weight.map(|w| this.vector(w)), modulation.map(|m| this.vector(m)));
            for r in 0..x.rows {
                let (xo, oo) = (x.offset + r * x.stride, out.offset + r * out.stride);
                let var = src.unwrap_or(dst)[xo..][..x.cols].iter().map(|v| v * v).sum::<f32>() / x.cols as f32;
                let inv = 1.0 / (var + eps).sqrt();
                for c in 0..x.cols {
                    let v = src.map_or(dst[xo + c], |s| s[xo + c]);
                    dst[oo + c] = match (w, m) {
                        (None, None) => v * inv,
                        (Some(w), _) => v * inv * w[c],
                        (None, Some(m)) => v * inv * (1.0 + m[c]) + m[x.cols + c],
                    };
                }
            }
        });
    }

    /// Per group and K/V head: the valid keys packed once, then the query rows split across the
    /// threads, each with its own score block.
    #[allow(clippy::too_many_arguments)] // the op's fields
    fn attention(
        &mut self,
        q: View,
        k: View,
        v: View,
        out: View,
        [heads, kv_heads, head_dim, groups]: [usize; 4],
        key_valid: Option<BufId>,
        query_valid: Option<BufId>,
        causal: Option<usize>,
    ) {
        let mut packed = std::mem::take(&mut self.packed_kv);
        let mut scores = std::mem::take(&mut self.scores);
        let attend = self.attend;
        let per_kv = heads / kv_heads;
        let (q_per_group, k_per_group) = (q.rows / groups, k.rows / groups);
        self.with_out(out.buf, |this, dst| {
            let (qb, kb, vb) = (this.f32(q.buf), this.f32(k.buf), this.f32(v.buf));
            let key_valid = key_valid.map(|b| this.f32(b));
            let queries = Queries {
                q: qb,
                q_stride: q.stride,
                q_col: 0,
                heads_per_kv: per_kv,
                query_valid: query_valid.map(|b| this.f32(b)),
                first: 0,
                causal,
            };
            for g in 0..groups {
                for kvh in 0..kv_heads {
                    packed.pack(&KeysValues {
                        k: &kb[k.offset + kvh * head_dim..],
                        v: &vb[v.offset + kvh * head_dim..],
                        k_stride: k.stride,
                        v_stride: v.stride,
                        head_dim,
                        keys: g * k_per_group..(g + 1) * k_per_group,
                        key_valid,
                    });
                    let queries = Queries { q: &qb[q.offset..], q_col: kvh * per_kv * head_dim, first: g * q_per_group, ..queries };
                    let parts = this.parts_for(q_per_group, packed.keys() * heads * head_dim / kv_heads);
                    let blocks = row_blocks(g * q_per_group..(g + 1) * q_per_group, parts, 1);
                    let dst = Parts::new(&mut *dst, blocks[..parts].iter().map(|r| rows_span(out, r.clone())));
                    let scratch = Parts::new(&mut scores[..], (0..parts).map(|i| i..i + 1));
                    let packed = &packed;
                    this.pool.run(parts, &|i| {
                        attend(
                            &queries,
                            blocks[i].clone(),
                            packed,
                            dst.take(i),
                            out.stride,
                            kvh * per_kv * head_dim,
                            &mut scratch.take(i)[0],
                        );
                    });
                }
            }
        });
        self.packed_kv = packed;
        self.scores = scores;
    }
}

/// The span of `buf` that rows `rows` of `view` occupy (empty at the first row's start when
/// there are none).
fn rows_span(view: View, rows: Range<usize>) -> Range<usize> {
    let start = view.offset + rows.start * view.stride;
    if rows.is_empty() { start..start } else { start..view.offset + (rows.end - 1) * view.stride + view.cols }
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
        let threads = self.pool.threads();
        format!("CPU ({}, {} kernel, {threads} thread{})", std::env::consts::ARCH, self.kernel_name, if threads == 1 { "" } else { "s" })
    }

    fn lowering(&self) -> String {
        let fp8 = self.fp8_scales.iter().flatten().count();
        let outputs = self.fp8_scales.iter().flatten().filter(|s| s.output.is_some()).count();
        let emulation = if fp8 > 0 {
            format!(
                "  FP8 emulation: the products of {fp8} weights read e4m3-rounded weights and inputs (per-tensor scales), f32 \
                 accumulation; {outputs} of them with their output rounded through e4m3 for the gated activation after it\n"
            )
        } else {
            String::new()
        };
        format!(
            "  every op as the plan has it, in f32; GEMMs, attention and image patches split by rows over {} thread(s)\n{emulation}",
            self.pool.threads()
        )
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
        if std::mem::take(&mut self.fail_next_run) {
            return Err(Error::Backend("injected fault (Backend::fail_next_run) after the step ran".into()));
        }
        Ok(())
    }

    fn fail_next_run(&mut self) {
        self.fail_next_run = true;
    }

    fn output_f32(&self, id: BufId) -> &[f32] {
        self.f32(id)
    }

    fn read_buffer(&self, name: &str) -> Option<Vec<f32>> {
        let id = self.plan.find_buffer(name)?;
        matches!(self.buffers[id.0], Buffer::F32(_)).then(|| self.f32(id).to_vec())
    }

    fn swap_product_probe(&mut self, probe: Option<ProductProbe>) -> Result<Option<ProductProbe>> {
        let mut probe = probe;
        if let Some(p) = probe.as_mut() {
            for (id, weight) in self.weights.iter().enumerate() {
                if let (Weight::Packed(matrix), true) = (weight, p.recorded[id]) {
                    p.weight_amax[id] = fp8::amax(matrix.values());
                }
            }
        }
        Ok(std::mem::replace(&mut self.probe, probe))
    }

    fn run_traced(&mut self, after_phase: &mut dyn FnMut(&str, &dyn Backend)) -> Result<()> {
        let first = self.plan.phases.first().map_or(self.plan.ops.len(), |p| p.first_op);
        self.run_ops(0..first);
        // The bucket is picked by an op of an earlier phase, so it is read phase by phase.
        for i in 0..self.plan.phases.len() {
            let phase = &self.plan.phases[i];
            let end = self.plan.phases.get(i + 1).map_or(self.plan.ops.len(), |n| n.first_op);
            if phase.prompt_bucket.is_some() && phase.prompt_bucket != self.bucket {
                continue;
            }
            let (start, name) = (phase.first_op, phase.name.clone());
            self.run_ops(start..end);
            after_phase(&name, self);
        }
        Ok(())
    }
}

/// The most rotation pairs a head may have (head dimension 512).
const MAX_ROPE_PAIRS: usize = 256;

fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (a, b) = x.split_at_mut(half);
    for j in 0..half {
        let (x1, x2) = (a[j], b[j]);
        a[j] = x1 * cos[j] - x2 * sin[j];
        b[j] = x2 * cos[j] + x1 * sin[j];
    }
}

/// `kind(x)` in f32, as PyTorch computes it (`gelu(approximate="tanh")`, `gelu`, `silu`, `relu`).
pub fn activate(kind: Activation, x: f32) -> f32 {
    match kind {
        Activation::GeluTanh => {
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
        }
        Activation::GeluErf => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::Relu => x.max(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint for plans whose weights are all dense: one tensor nothing reads.
    fn unused_checkpoint() -> (tempfile::TempDir, Checkpoint) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("unused.safetensors");
        let zero = 0f32.to_le_bytes();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &zero).unwrap();
        safetensors::serialize_to_file([("unused", view)], None, &path).unwrap();
        let ckpt = Checkpoint::open(&path).unwrap();
        (dir, ckpt)
    }

    #[test]
    fn activations_match_their_f64_definitions() {
        let reference = |kind: Activation, x: f64| match kind {
            Activation::GeluTanh => 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh()),
            Activation::GeluErf => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::Relu => x.max(0.0),
        };
        for kind in Activation::ALL {
            for i in -400..=400 {
                let x = i as f32 / 40.0;
                let (got, want) = (activate(kind, x) as f64, reference(kind, x as f64));
                assert!((got - want).abs() <= 1e-6 * (1.0 + want.abs()), "{kind:?}({x}) = {got}, want {want}");
            }
        }
        // The two GELUs differ (by up to ~1e-3): a plan that picks the wrong one is caught.
        assert!((activate(Activation::GeluTanh, -1.5) - activate(Activation::GeluErf, -1.5)).abs() > 1e-4);
    }

    #[test]
    fn rope_rotates_every_head_with_its_base() {
        use crate::plan::HostIo;
        let (rows, heads, kv_heads, hd, theta) = (3, 4, 2, 8, 1e6f32);
        let width = (heads + 2 * kv_heads) * hd;
        let mut plan = Plan::default();
        let host = plan.host_buffer("qkv.host", BufType::F32, rows * width, HostIo::Input);
        let qkv = View { buf: host, offset: 0, rows, cols: width, stride: width };
        let positions = plan.host_buffer("positions", BufType::I32, rows + 1, HostIo::Input);
        let (k_cache, v_cache) = (plan.matrix("k", rows + 1, kv_heads * hd), plan.matrix("v", rows + 1, kv_heads * hd));
        plan.push(Op::RopeQkv {
            qkv,
            heads,
            kv_heads,
            head_dim: hd,
            theta,
            axes: RopeAxes::Single,
            positions,
            position_offset: 1,
            k_cache,
            v_cache,
            cache_row: 1,
        });
        let (_dir, ckpt) = unused_checkpoint();
        let mut cpu = CpuBackend::new(plan, vec![], &ckpt, 1).unwrap();
        let values: Vec<f32> = (0..rows * width).map(|i| ((i * 29 % 31) as f32 - 15.0) / 8.0).collect();
        let pos = [0, 2, 3, 1]; // inside the table: positions never exceed the slots
        cpu.input_f32(host).copy_from_slice(&values);
        cpu.input_i32(positions).copy_from_slice(&pos);
        cpu.run().unwrap();
        let (q_out, k_out, v_out) = (cpu.read_buffer("qkv.host").unwrap(), cpu.read_buffer("k").unwrap(), cpu.read_buffer("v").unwrap());
        let rotate = |x: &[f32], p: i32| -> Vec<f64> {
            let half = hd / 2;
            let angle = |j: usize| p as f64 * (theta as f64).powf(-2.0 * j as f64 / hd as f64);
            let (a, b) = x.split_at(half);
            let lo = (0..half).map(|j| a[j] as f64 * angle(j).cos() - b[j] as f64 * angle(j).sin());
            lo.chain((0..half).map(|j| b[j] as f64 * angle(j).cos() + a[j] as f64 * angle(j).sin())).collect()
        };
        let close = |got: &[f32], want: &[f64], what: &str| {
            for (g, w) in got.iter().zip(want) {
                assert!((*g as f64 - w).abs() < 1e-4, "{what}: {g} vs {w}");
            }
        };
        for r in 0..rows {
            let row = &values[r * width..][..width];
            let p = pos[1 + r];
            for h in 0..heads {
                close(&q_out[r * width + h * hd..][..hd], &rotate(&row[h * hd..][..hd], p), "q head");
            }
            for kh in 0..kv_heads {
                let k_row = &k_out[(1 + r) * kv_heads * hd + kh * hd..][..hd];
                close(k_row, &rotate(&row[(heads + kh) * hd..][..hd], p), "k head");
                let v_row = &v_out[(1 + r) * kv_heads * hd + kh * hd..][..hd];
                assert_eq!(v_row, &row[(heads + kv_heads + kh) * hd..][..hd], "v head copied");
            }
        }
    }

    #[test]
    fn multi_axis_rope_turns_each_pair_by_its_axis() {
        use crate::plan::HostIo;
        // Qwen3-VL's text M-RoPE (sections of 6/5/5 pairs of a 32-wide head) and its vision
        // RoPE (row, column halves), against the definitions in f64.
        let (rows, heads, kv_heads, hd, theta) = (5, 2, 1, 32, 5e6f32);
        let width = (heads + 2 * kv_heads) * hd;
        for axes in [RopeAxes::Interleaved { sections: [6, 5, 5], slots: rows }, RopeAxes::Rows2d { slots: rows }] {
            let mut plan = Plan::default();
            let host = plan.host_buffer("qkv.host", BufType::F32, rows * width, HostIo::Input);
            let qkv = View { buf: host, offset: 0, rows, cols: width, stride: width };
            let axis_count = if matches!(axes, RopeAxes::Rows2d { .. }) { 2 } else { 3 };
            let positions = plan.host_buffer("positions", BufType::I32, axis_count * rows, HostIo::Input);
            let (k_cache, v_cache) = (plan.matrix("k", rows, kv_heads * hd), plan.matrix("v", rows, kv_heads * hd));
            plan.push(Op::RopeQkv {
                qkv,
                heads,
                kv_heads,
                head_dim: hd,
                theta,
                axes,
                positions,
                position_offset: 0,
                k_cache,
                v_cache,
                cache_row: 0,
            });
            let (_dir, ckpt) = unused_checkpoint();
            let mut cpu = CpuBackend::new(plan, vec![], &ckpt, 1).unwrap();
            let values: Vec<f32> = (0..rows * width).map(|i| ((i * 29 % 31) as f32 - 15.0) / 8.0).collect();
            let pos: Vec<i32> = (0..axis_count * rows).map(|i| ((i * 7) % rows) as i32).collect();
            cpu.input_f32(host).copy_from_slice(&values);
            cpu.input_i32(positions).copy_from_slice(&pos);
            cpu.run().unwrap();
            let (q_out, k_out) = (cpu.read_buffer("qkv.host").unwrap(), cpu.read_buffer("k").unwrap());
            let half = hd / 2;
            let angle = |r: usize, j: usize| -> f64 {
                let (axis, inv) = match axes {
                    RopeAxes::Rows2d { .. } => {
                        ((j >= half / 2) as usize, (theta as f64).powf(-2.0 * (j % (half / 2)) as f64 / half as f64))
                    }
                    _ => {
                        let axis = if j % 3 == 1 && j < 15 {
                            1
                        } else if j % 3 == 2 && j < 15 {
                            2
                        } else {
                            0
                        };
                        (axis, (theta as f64).powf(-2.0 * j as f64 / hd as f64))
                    }
                };
                pos[axis * rows + r] as f64 * inv
            };
            for r in 0..rows {
                let row = &values[r * width..][..width];
                let want = |head: &[f32]| -> Vec<f64> {
                    let (a, b) = head.split_at(half);
                    let lo = (0..half).map(|j| a[j] as f64 * angle(r, j).cos() - b[j] as f64 * angle(r, j).sin());
                    lo.chain((0..half).map(|j| b[j] as f64 * angle(r, j).cos() + a[j] as f64 * angle(r, j).sin())).collect()
                };
                let close = |got: &[f32], want: Vec<f64>| got.iter().zip(&want).all(|(g, w)| (*g as f64 - w).abs() < 1e-4);
                assert!(close(&q_out[r * width..][..hd], want(&row[..hd])), "{axes:?} q row {r}");
                assert!(close(&k_out[r * hd..][..hd], want(&row[heads * hd..][..hd])), "{axes:?} k row {r}");
            }
        }
    }

    #[test]
    fn scatter_rows_writes_or_adds_each_row_at_its_index() {
        use crate::plan::HostIo;
        for accumulate in [false, true] {
            let mut plan = Plan::default();
            let src_buf = plan.host_buffer("src", BufType::F32, 2 * 3, HostIo::Input);
            let dst_buf = plan.host_buffer("dst", BufType::F32, 4 * 3, HostIo::Input);
            let index = plan.host_buffer("index", BufType::I32, 2, HostIo::Input);
            let view = |buf, rows| View { buf, offset: 0, rows, cols: 3, stride: 3 };
            plan.push(Op::ScatterRows { src: view(src_buf, 2), index, dst: view(dst_buf, 4), accumulate });
            let (_dir, ckpt) = unused_checkpoint();
            let mut cpu = CpuBackend::new(plan, vec![], &ckpt, 1).unwrap();
            cpu.input_f32(src_buf).copy_from_slice(&[1., 2., 3., 4., 5., 6.]);
            cpu.input_f32(dst_buf).copy_from_slice(&[10.; 12]);
            cpu.input_i32(index).copy_from_slice(&[3, 1]);
            cpu.run().unwrap();
            let base = if accumulate { 10. } else { 0. };
            let want = [10., 10., 10., base + 4., base + 5., base + 6., 10., 10., 10., base + 1., base + 2., base + 3.];
            assert_eq!(cpu.read_buffer("dst").unwrap(), want, "accumulate {accumulate}");
        }
    }

    /// An FP8 product reads its weight rounded with the weight's own per-tensor scale and its
    /// input (a column window of a wider buffer) rounded with the calibrated scale, and
    /// accumulates in f32; one with an output scale then rounds its output with it; a product
    /// without a scale stays f32, bit for bit.
    #[test]
    fn fp8_emulation_rounds_inputs_and_weights_of_the_chosen_products() {
        use crate::plan::HostIo;
        let (rows, k, n) = (5, 24, 7);
        let mut plan = Plan::default();
        let host = plan.host_buffer("a.host", BufType::F32, rows * (k + 3), HostIo::Input);
        let a = View { buf: host, offset: 3, rows, cols: k, stride: k + 3 };
        let (w8, w32) = (plan.weight("w8", WeightRole::Matrix { n, k }), plan.weight("w32", WeightRole::Matrix { n, k }));
        let w8_out = plan.weight("w8_out", WeightRole::Matrix { n, k });
        let (out8, out32, out8_e4m3) = (plan.matrix("out8", rows, n), plan.matrix("out32", rows, n), plan.matrix("out8_e4m3", rows, n));
        plan.push(Op::Gemm { a, w: w8, bias: None, out: out8, accumulate: false });
        plan.push(Op::Gemm { a, w: w32, bias: None, out: out32, accumulate: false });
        plan.push(Op::Gemm { a, w: w8_out, bias: None, out: out8_e4m3, accumulate: false });
        let weight: Vec<f32> = (0..n * k).map(|i| ((i * 29 % 41) as f32 - 20.0) / 37.0).collect();
        let input: Vec<f32> = (0..rows * (k + 3)).map(|i| ((i * 13 % 31) as f32 - 15.0) / 3.0).collect();
        let (_dir, ckpt) = unused_checkpoint();
        let data = (0..3).map(|_| WeightData::Dense(weight.clone())).collect();
        // A weight scale other than the one its range gives: the emulation must take the one given.
        let (input_scale, weight_scale, output_scale) = (0.021, 1.5 * fp8::scale_for(fp8::amax(&weight)), 0.013);
        let fp8_scales = ProductScales { activation: input_scale, weight: weight_scale, output: None };
        let scales = [Some(fp8_scales), None, Some(ProductScales { output: Some(output_scale), ..fp8_scales })];
        let mut cpu = CpuBackend::new(plan, data, &ckpt, 1).unwrap().with_fp8(&scales);
        cpu.input_f32(host).copy_from_slice(&input);
        cpu.run().unwrap();
        let (got8, got32) = (cpu.read_buffer("out8").unwrap(), cpu.read_buffer("out32").unwrap());
        let got8_e4m3 = cpu.read_buffer("out8_e4m3").unwrap();
        let stored: Vec<f32> = got8.iter().map(|&x| fp8::round_trip(x, output_scale)).collect();
        assert_eq!(got8_e4m3, stored, "the output rounded through e4m3 with its scale");
        assert_ne!(stored, got8, "the output scale rounds visibly");
        for r in 0..rows {
            let row = &input[3 + r * (k + 3)..][..k];
            for c in 0..n {
                let w = &weight[c * k..][..k];
                let fp8: f64 = row
                    .iter()
                    .zip(w)
                    .map(|(&x, &w)| fp8::round_trip(x, input_scale) as f64 * fp8::round_trip(w, weight_scale) as f64)
                    .sum();
                let f32: f64 = row.iter().zip(w).map(|(&x, &w)| x as f64 * w as f64).sum();
                assert!((got8[r * n + c] as f64 - fp8).abs() < 1e-5, "fp8 product [{r}, {c}]: {} vs {fp8}", got8[r * n + c]);
                assert!((got32[r * n + c] as f64 - f32).abs() < 1e-5, "f32 product [{r}, {c}]");
                assert!((fp8 - f32).abs() > 1e-6 || f32.abs() < 1e-3, "rounding changes the product [{r}, {c}]");
            }
        }
    }

    #[test]
    fn rtc_prefix_and_euler_step_follow_their_definitions() {
        use crate::plan::HostIo;
        let mut plan = Plan::default();
        let x = plan.host_buffer("x", BufType::F32, 4 * 3, HostIo::Input);
        let prev = plan.host_buffer("prev", BufType::F32, 4 * 3, HostIo::Input);
        let step = plan.host_buffer("step", BufType::F32, 4 * 3, HostIo::Input);
        let prefix = plan.host_buffer("prefix", BufType::I32, 2, HostIo::Input);
        let strength = plan.host_buffer("strength", BufType::F32, 4, HostIo::Input);
        let view = |buf| View { buf, offset: 0, rows: 4, cols: 3, stride: 3 };
        plan.push(Op::RtcPrefix { x: view(x), prev: view(prev), prefix, cols: 2 });
        plan.push(Op::RtcEuler { x: view(x), step: view(step), strength });
        let (_dir, ckpt) = unused_checkpoint();
        let mut cpu = CpuBackend::new(plan, vec![], &ckpt, 1).unwrap();
        cpu.input_f32(x).copy_from_slice(&[-1.; 12]);
        cpu.input_f32(prev).copy_from_slice(&(1..=12).map(|v| v as f32).collect::<Vec<_>>());
        cpu.input_f32(step).copy_from_slice(&[0.5; 12]);
        // Rows 0 and 1 from the previous chunk's rows 1 and 2 (two robot columns, then 0).
        cpu.input_i32(prefix).copy_from_slice(&[1, 2]);
        cpu.input_f32(strength).copy_from_slice(&[0., 0.5, 1., 2.]);
        cpu.run().unwrap();
        let want = [4., 5., 0., 7.25, 8.25, 0.25, -0.5, -0.5, -0.5, 0., 0., 0.];
        assert_eq!(cpu.read_buffer("x").unwrap(), want);
    }

    #[test]
    fn norm_forms_match_their_definitions() {
        use crate::plan::HostIo;
        let (rows, cols) = (3, 12);
        let mut plan = Plan::default();
        let host = plan.host_buffer("x.host", BufType::F32, rows * cols, HostIo::Input);
        let x = View { buf: host, offset: 0, rows, cols, stride: cols };
        let values: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 23) as f32 - 11.0) / 4.0).collect();
        let (modulation, weight): (Vec<f32>, Vec<f32>) =
            ((0..2 * cols).map(|i| i as f32 / 10.0 - 1.0).collect(), (0..cols).map(|i| 0.5 + i as f32 / 8.0).collect());
        let m = plan.weight("modulation", WeightRole::Vector);
        let w = plan.weight("weight", WeightRole::Vector);
        let (ada, rms) = (plan.matrix("ada_layer_norm", rows, cols), plan.matrix("weighted_rms_norm", rows, cols));
        plan.push(Op::LayerNorm { x, out: ada, affine: None, modulation: Some(m), eps: 1e-6 });
        plan.push(Op::RmsNorm { x, out: rms, weight: Some(w), eps: 1e-6 });
        // Per head: each half of a row normalised alone, with the first half of the weight.
        let per_head = plan.matrix("head_rms_norm", rows, cols);
        plan.push(Op::HeadRmsNorm { x, out: per_head, heads: 2, weight: w, eps: 1e-6 });
        let (_dir, ckpt) = unused_checkpoint();
        let weights = vec![WeightData::Dense(modulation.clone()), WeightData::Dense(weight.clone())];
        let mut cpu = CpuBackend::new(plan, weights, &ckpt, 1).unwrap();
        cpu.input_f32(host).copy_from_slice(&values);
        cpu.run().unwrap();
        let (got_ada, got_rms) = (cpu.read_buffer("ada_layer_norm").unwrap(), cpu.read_buffer("weighted_rms_norm").unwrap());
        let got_heads = cpu.read_buffer("head_rms_norm").unwrap();
        for (r, row) in values.chunks(cols).enumerate() {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / cols as f64;
            for c in 0..cols {
                let ada = (row[c] as f64 - mean) / (var + 1e-6).sqrt() * (1.0 + modulation[c] as f64) + modulation[cols + c] as f64;
                let rms = row[c] as f64 / (ms + 1e-6).sqrt() * weight[c] as f64;
                assert!((got_ada[r * cols + c] as f64 - ada).abs() < 1e-5, "AdaLN row {r} col {c}");
                assert!((got_rms[r * cols + c] as f64 - rms).abs() < 1e-5, "weighted RMSNorm row {r} col {c}");
            }
            for (h, head) in row.chunks(cols / 2).enumerate() {
                let ms = head.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / head.len() as f64;
                for (c, &v) in head.iter().enumerate() {
                    let want = v as f64 / (ms + 1e-6).sqrt() * weight[c] as f64;
                    assert!((got_heads[r * cols + h * cols / 2 + c] as f64 - want).abs() < 1e-5, "head RMSNorm row {r} head {h}");
                }
            }
        }
    }
}

//! The weights on the device: converted (bf16, f32 or e4m3, by use) and uploaded once at open through
//! pinned staging, and the streamed MLPs' weights retiled for their kernel.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::driver::{result, sys};
use flashrt_kernels::{DevPtr, Kernels};

use super::arena::{Elem, Layout};
use super::device::{DeviceMemory, Pinned, check};
use super::fp8::Fp8Products;
use super::fusion::Fusions;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::plan::{Op, Plan, WeightId, WeightRole};
use crate::weights::WeightData;

/// Bytes of one pinned staging buffer for the weight upload (two alternate).
pub(super) const STAGE_BYTES: usize = 64 << 20;

/// Uploaded weights: one device allocation, each (weight, element type) pair's address and each
/// uploaded weight's element count.
pub(super) struct UploadedWeights {
    pub(super) memory: DeviceMemory,
    pub(super) ptrs: HashMap<(usize, Elem), DevPtr>,
    pub(super) numels: HashMap<usize, usize>,
}

/// The plan's weight selections ([`Op::SelectWeight`]) as `Kernels::select_weights` reads them:
/// per op, in plan order, one (destination, table, bytes per entry, entries) piece for each
/// element type its destination is stored in.
pub(super) struct Selections {
    /// The pieces in device memory (`None` without selections).
    pub(super) memory: Option<DeviceMemory>,
    /// Each selecting op's pieces, by op index.
    pub(super) pieces: HashMap<usize, std::ops::Range<usize>>,
    /// Bytes of the largest entry.
    pub(super) largest: usize,
}

/// Bytes of one piece of [`Selections`].
pub(super) const SELECTION_PIECE_BYTES: u64 = 4 * 8;

impl Selections {
    pub(super) fn upload(plan: &Plan, weights: &UploadedWeights) -> Result<Selections> {
        let (mut table, mut pieces, mut largest) = (Vec::<u64>::new(), HashMap::new(), 0);
        for (i, op) in plan.ops.iter().enumerate() {
            let Op::SelectWeight { entries, table: from, dst, .. } = *op else { continue };
            let first = table.len() / 4;
            for elem in [Elem::Bf16, Elem::F32] {
                let (Some(&to), Some(&stack)) = (weights.ptrs.get(&(dst.0, elem)), weights.ptrs.get(&(from.0, elem))) else { continue };
                let (len, stacked) = (weights.numels[&dst.0], weights.numels[&from.0]);
                if stacked != entries * len {
                    let name = |w: WeightId| &plan.weights[w.0].name;
                    return Err(Error::Backend(format!(
                        "select_weight: {} holds {stacked} values, not {entries} entries of {}'s {len}",
                        name(from),
                        name(dst)
                    )));
                }
                let bytes = len * elem.size();
                largest = largest.max(bytes);
                table.extend([to, stack, bytes as u64, entries as u64]);
            }
            pieces.insert(i, first..table.len() / 4);
        }
        if table.is_empty() {
            return Ok(Selections { memory: None, pieces, largest });
        }
        let memory = DeviceMemory::new(table.len() * 8, "weight selections")?;
        // SAFETY: the allocation was sized for the table.
        check("uploading the weight selections", unsafe { result::memcpy_htod_sync(memory.ptr, &table) })?;
        Ok(Selections { memory: Some(memory), pieces, largest })
    }
}

/// Which element type each use of a weight needs: GEMM matrices and the embedding in bf16,
/// biases in the type of their GEMM's output, every other vector in f32. The matrices of FP8
/// products (`fp8`: cuBLASLt's, by weight, and the streamed MLPs', by op) are e4m3 instead, their
/// biases bf16 (cuBLASLt's FP8 bias).
pub(super) fn weight_uses(plan: &Plan, elems: &[Elem], fp8: &Fp8Products) -> Vec<(usize, Elem)> {
    let mut uses = Vec::new();
    for (i, op) in plan.ops.iter().enumerate() {
        match *op {
            Op::Gemm { w, bias, out, .. } => {
                let in_fp8 = fp8.chosen.contains_key(&w.0) || fp8.streams(i);
                uses.push((w.0, if in_fp8 { Elem::E4m3 } else { Elem::Bf16 }));
                if let Some(b) = bias {
                    uses.push((b.0, if in_fp8 { Elem::Bf16 } else { elems[out.buf.0] }));
                }
            }
            Op::Embed { table, .. } => uses.push((table.0, Elem::Bf16)),
            Op::AddTable { table, .. } => uses.push((table.0, Elem::F32)),
            Op::LayerNorm { affine, modulation, .. } => {
                uses.extend(affine.into_iter().flat_map(|(g, b)| [(g.0, Elem::F32), (b.0, Elem::F32)]));
                uses.extend(modulation.map(|m| (m.0, Elem::F32)));
            }
            Op::RmsNorm { weight: Some(w), .. } | Op::HeadRmsNorm { weight: w, .. } => uses.push((w.0, Elem::F32)),
            Op::AdaRmsNorm { modulation, .. } | Op::GatedResidual { modulation, .. } => uses.push((modulation.0, Elem::F32)),
            Op::Affine { scale, offset, .. } => uses.extend([(scale.0, Elem::F32), (offset.0, Elem::F32)]),
            _ => {}
        }
    }
    // A selection table in every element type its destination is read in.
    let selected: Vec<(usize, Elem)> = plan
        .ops
        .iter()
        .filter_map(|op| match *op {
            Op::SelectWeight { table, dst, .. } => Some((table, dst)),
            _ => None,
        })
        .flat_map(|(table, dst)| uses.iter().filter(move |u| u.0 == dst.0).map(move |&(_, e)| (table.0, e)))
        .collect();
    uses.extend(selected);
    uses.sort_unstable_by_key(|&(w, e)| (w, e.size()));
    uses.dedup();
    uses
}

/// Runs `f` over `0..n` split into contiguous ranges across the host's cores (weights are
/// converted at open; on a 16-core host this keeps bf16 conversion off the cold-start path).
pub(super) fn parallel_ranges(n: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
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

/// Device addresses of weights, by weight index and element type.
pub(super) type WeightPtrs = HashMap<(usize, Elem), DevPtr>;

/// One weight of a streamed launch as its kernel reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Tiling {
    pub(super) w: WeightId,
    /// The pairing's half (`Kernels::retile_weight`): gate/up's GeGLU width, half a head for a
    /// QKV product run with its RoPE, 0 for the others.
    pub(super) paired_half: usize,
    /// bf16, or e4m3 in an MLP that runs in FP8.
    pub(super) elem: Elem,
    /// Whether the tiles replace the row-major form (no unfused product reads it in that type).
    pub(super) in_place: bool,
}

/// The weights of the fused MLPs (first ops `mlps`) and streamed products (`products`; those in
/// `qkv_ropes` run with their RoPE, whose head dimension it gives) as [`Kernels::mlp_stream`],
/// [`Kernels::product_stream`] and [`Kernels::qkv_rope_stream`] read them, in e4m3 where `fp8`
/// streams them. A weight that also serves an unfused product in the same element type (the
/// expert's in the first denoise step, which runs beside the prefix on cuBLASLt, in e4m3 with FP8
/// and bf16 without) is tiled into a copy; the others replace their row-major form.
pub(super) fn stream_weight_tiling(
    plan: &Plan,
    mlps: &[usize],
    products: &[usize],
    qkv_ropes: &[(usize, usize)],
    fp8: &Fp8Products,
) -> Vec<Tiling> {
    let elem = |i: usize| if fp8.streams(i) { Elem::E4m3 } else { Elem::Bf16 };
    let mut tiled = Vec::new();
    for &i in mlps {
        if let (Op::Gemm { w: w_gate_up, .. }, Op::GatedActivation { out: hidden, .. }, Op::Gemm { w: w_down, .. }) =
            (&plan.ops[i], &plan.ops[i + 1], &plan.ops[i + 2])
        {
            tiled.extend([(*w_gate_up, hidden.cols, elem(i)), (*w_down, 0, elem(i))]);
        }
    }
    for &i in products {
        if let Op::Gemm { w, .. } = plan.ops[i] {
            let paired_half = qkv_ropes.iter().find(|&&(op, _)| op == i).map_or(0, |&(_, head_dim)| head_dim / 2);
            tiled.push((w, paired_half, elem(i)));
        }
    }
    tiled.sort_unstable_by_key(|&(w, _, elem)| (w.0, elem.size()));
    tiled.dedup();
    let fused_op = |j: usize| mlps.iter().any(|&i| (i..i + 3).contains(&j)) || products.contains(&j);
    let unfused: Vec<(WeightId, Elem)> = plan
        .ops
        .iter()
        .enumerate()
        .filter_map(|(j, op)| match op {
            Op::Gemm { w, .. } if !fused_op(j) => Some((*w, if fp8.chosen.contains_key(&w.0) { Elem::E4m3 } else { Elem::Bf16 })),
            _ => None,
        })
        .collect();
    tiled.into_iter().map(|(w, paired_half, elem)| Tiling { w, paired_half, elem, in_place: !unfused.contains(&(w, elem)) }).collect()
}

/// Tiles the streamed launches' weights once, at open (see [`stream_weight_tiling`]): in place
/// through a staging copy, or into one allocation of copies. Returns that allocation (if any) and
/// each tiled weight's address, by weight and element type.
pub(super) fn retile_streamed_weights(
    kernels: &Kernels,
    plan: &Plan,
    fusions: &Fusions,
    fp8: &Fp8Products,
    ptrs: &WeightPtrs,
    stream: sys::CUstream,
) -> Result<(Option<DeviceMemory>, WeightPtrs)> {
    let tiling = stream_weight_tiling(plan, &fusions.mlps, &fusions.products, &fusions.qkv_ropes, fp8);
    let bytes = |t: &Tiling| match plan.weights[t.w.0].role {
        WeightRole::Matrix { n, k } => n * k * t.elem.size(),
        _ => 0,
    };
    let mut layout = Layout::default();
    let copy_at: Vec<Option<usize>> = tiling.iter().map(|t| (!t.in_place).then(|| layout.take(bytes(t)))).collect();
    let copies = if layout.bytes > 0 { Some(DeviceMemory::new(layout.bytes, "tiled MLP weights")?) } else { None };
    let staging_bytes = tiling.iter().filter(|t| t.in_place).map(bytes).max().unwrap_or(0);
    let staging = if staging_bytes > 0 { Some(DeviceMemory::new(staging_bytes, "weight tiling")?) } else { None };
    let mut tiled = HashMap::with_capacity(tiling.len());
    for (t, &at) in tiling.iter().zip(&copy_at) {
        let WeightRole::Matrix { n, k } = plan.weights[t.w.0].role else { continue };
        let (plain, size) = (ptrs[&(t.w.0, t.elem)], t.elem.size());
        // SAFETY: every region holds n · k elements of `size` bytes; the stream orders each copy
        // before its tiling and that tiling before the staging buffer's next copy.
        let dst = unsafe {
            match (at, &copies, &staging) {
                (Some(off), Some(copies), _) => {
                    let dst = copies.ptr + off as u64;
                    kernels.retile_weight(dst, plain, n, k * size, t.paired_half, stream).map_err(|e| Error::Backend(e.to_string()))?;
                    dst
                }
                (_, _, Some(staging)) => {
                    check("weight tiling copy", sys::cuMemcpyDtoDAsync_v2(staging.ptr, plain, n * k * size, stream).result())?;
                    kernels
                        .retile_weight(plain, staging.ptr, n, k * size, t.paired_half, stream)
                        .map_err(|e| Error::Backend(e.to_string()))?;
                    plain
                }
                _ => unreachable!("sized above for every tiled weight"),
            }
        };
        tiled.insert((t.w.0, t.elem), dst);
    }
    if !tiling.is_empty() {
        // SAFETY: the stream belongs to the caller's backend; the staging buffer outlives its work.
        check("weight tiling", unsafe { result::stream::synchronize(stream) })?;
        let copied = copies.as_ref().map_or(0, |c| c.bytes);
        log::info!(
            "{} few-row MLPs and {} products run as one streamed launch each ({} weights tiled, {:.1} MiB of them as copies)",
            fusions.mlps.len(),
            fusions.products.len(),
            tiling.len(),
            copied as f64 / (1 << 20) as f64
        );
    }
    Ok((copies, tiled))
}

/// Converts and uploads every used weight through two alternating pinned staging buffers (the
/// FP8 products' matrices in e4m3 with their calibrated scales, `fp8`).
pub(super) fn upload_weights(
    plan: &Plan,
    data: Vec<WeightData>,
    ckpt: &Checkpoint,
    elems: &[Elem],
    fp8: &Fp8Products,
    stream: sys::CUstream,
) -> Result<UploadedWeights> {
    let uses = weight_uses(plan, elems, fp8);
    let numel = |w: usize| match plan.weights[w].role {
        WeightRole::Matrix { n, k } => n * k,
        WeightRole::MatrixStack { entries, n, k } => entries * n * k,
        WeightRole::Embedding { vocab, width } => vocab * width,
        WeightRole::Vector => data[w].len(ckpt),
    };
    let numels: HashMap<usize, usize> = uses.iter().map(|&(w, _)| (w, numel(w))).collect();
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
                // Checkpoint-backed weights are read (and folded) from the file chunk by chunk.
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
                    Elem::E4m3 => {
                        // As the CPU emulation rounds the weight: e4m3(w · (1 / scale)).
                        let scales = fp8.weight_scales(w).ok_or_else(|| {
                            Error::Backend(format!("weight {} is asked for in e4m3 without FP8 scales", plan.weights[w].name))
                        })?;
                        let inverse = 1.0 / scales.weight;
                        let out = SyncSlice(stage.as_mut_slice::<u8>().as_mut_ptr());
                        parallel_ranges(count, |r| {
                            // SAFETY: disjoint ranges inside the stage (count ≤ its capacity).
                            let o = unsafe { std::slice::from_raw_parts_mut(out.at(r.start), r.len()) };
                            o.iter_mut().zip(&values[r]).for_each(|(o, v)| *o = crate::fp8::encode(v * inverse));
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
    Ok(UploadedWeights { memory, ptrs, numels })
}

/// A raw pointer that scoped threads may share; each thread writes a disjoint range.
#[derive(Clone, Copy)]
pub(super) struct SyncSlice<T>(*mut T);

unsafe impl<T> Sync for SyncSlice<T> {}

unsafe impl<T> Send for SyncSlice<T> {}

impl<T> SyncSlice<T> {
    pub(super) fn at(self, i: usize) -> *mut T {
        // SAFETY: callers stay within the buffer this pointer was taken from.
        unsafe { self.0.add(i) }
    }
}

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
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{result, sys};
use flashrt_kernels::{DevPtr, Dtype, Kernels, MAX_PROMPT_BUCKETS, QwenImageSizes, has_fp8};

use super::arena::{DeviceBuf, Elem, Layout, Scratch, ScratchSizes, copied_input, element_types};
use super::device::{BlasLt, Context, DeviceMemory, Event, Graph, Pinned, Stream, check};
use super::fp8::{FP8_MIN_ROWS, Fp8Products};
use super::fusion::{AttentionLowering, Fusions, StreamedShapes, streamed_products};
use super::gemm::WORKSPACE_BYTES;
use super::graph::Launcher;
use super::lowering::{Lowered, Lowering};
pub use super::options::CudaOptions;
use super::options::Switches;
use super::steps::{LANES, RopeRows, Step};
use super::weights::{Selections, retile_streamed_weights, upload_weights};
use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::fp8::ProductScales;
use crate::plan::{BufId, HostIo, Op, Plan, RopeSpec};
use crate::weights::WeightData;

pub struct CudaBackend {
    plan: Plan,
    device_name: String,
    /// What `explain()` reports of the lowering (see [`Backend::lowering`]).
    lowering: String,
    /// The whole step; `None` only while opening.
    graph: Option<Graph>,
    /// Steps run so far, and where FRT_PROFILE asks the profile to go (taken when written).
    runs: usize,
    profile: Option<PathBuf>,
    /// [`Backend::fail_next_run`] was called.
    fail_next_run: bool,
    /// The lowered step, its streams and what enqueues it.
    launcher: Launcher,
    bufs: Vec<DeviceBuf>,
    /// Pinned host copies of the plan's host-I/O buffers (`None` for internal buffers).
    host: Vec<Option<Pinned>>,
    arena: DeviceMemory,
    weights: DeviceMemory,
    /// Tiled copies of weights the streamed MLPs share with cuBLASLt products (see
    /// [`super::weights::mlp_weight_tiling`]).
    tiled_weights: Option<DeviceMemory>,
    /// What `Op::SelectWeight` copies (see [`Selections`]).
    selections: Option<DeviceMemory>,
    /// The FP8 products' scales (see [`Fp8Products::upload_scales`]).
    fp8_scales: Option<DeviceMemory>,
    /// Declared last: dropped after every resource that lives in the context.
    ctx: Context,
}

// SAFETY: the backend exclusively owns every handle and pointer it holds (driver handles, pinned
// host memory, the graph). Driver objects may be used from any thread with the context current,
// which every entry point that calls the driver ensures; host views go through `&mut self`.
unsafe impl Send for CudaBackend {}

/// FRT_PROFILE profiles after this many steps (a diagnostic mode: it allocates and takes seconds).
const PROFILE_AFTER_RUNS: usize = 5;

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
        let switches = opts.switches;
        let arch = flashrt_kernels::device_arch(major, minor, switches.wgmma);
        if !opts.fp8_scales.is_empty() && !has_fp8(&arch) {
            return Err(Error::Backend(format!("FP8 products need sm_89 or newer; {device_name} is {arch}")));
        }
        let board = crate::board::BoardProfile::for_compute_capability(major, minor);
        if let Some(board) = board {
            log::info!("board profile {} ({}): {:?} precision", board.name, board.description, board.precision);
            if board.precision == crate::backend::Precision::Fp8 && opts.fp8_scales.is_empty() {
                log::info!("the board profile suggests FP8: calibrate (`flashrt calibrate`) and open with precision FP8");
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
        // inputs get device copies, made by one kernel at the start of the step: four copy nodes cost ~17 µs, and kernels whose every block reads the same
        // host lines ~20-30 µs more each).
        let elems = element_types(&plan);
        let mut layout = Layout::default();
        let offsets: Vec<Option<usize>> = plan
            .buffers
            .iter()
            .zip(&elems)
            .map(|(b, e)| (b.host == HostIo::Internal || copied_input(b)).then(|| layout.take(b.len * e.size())))
            .collect();
        let mut positions_bufs = Vec::new();
        let multiprocessors = ctx.multiprocessors()?;
        // Concurrent phases take the second stream (switched off: everything on one stream).
        let op_lanes: Vec<usize> =
            if switches.overlap { plan.concurrent_ops().into_iter().map(usize::from).collect() } else { vec![0; plan.ops.len()] };
        let mut fusions =
            Fusions::run(&plan, &elems, &op_lanes, switches, kernels.has_fused_attention(), multiprocessors, |rows, width, hidden| {
                kernels.mlp_stream_splits(rows, width, hidden, multiprocessors, false).is_some()
            });
        let fp8_shapes = Fp8Shapes { kernels: &kernels, multiprocessors, switches };
        let candidates =
            if !opts.fp8_scales.is_empty() { streamed_products(&plan, &elems, &op_lanes, &fusions.mlps, &fp8_shapes) } else { Vec::new() };
        let fp8 = Fp8Products::choose(
            &plan,
            &opts.fp8_scales,
            &fusions.mlps,
            &candidates,
            opts.fp8_min_rows.unwrap_or(FP8_MIN_ROWS),
            switches.fp8_first_step,
            &fp8_shapes,
        );
        fusions.stream_products(&plan, &op_lanes, fp8.streamed_products.keys().copied().collect());
        let cublaslt_fp8: Vec<usize> = (0..plan.ops.len())
            .filter(|&i| matches!(plan.ops[i], Op::Gemm { w, .. } if fp8.chosen.contains_key(&w.0)) && !fp8.streams(i))
            .collect();
        fusions.fp8_producers(&plan, &op_lanes, &cublaslt_fp8);
        fusions.e4m3_mlp_inputs(&plan, &op_lanes, &fp8.streamed.keys().copied().collect::<Vec<_>>());
        let mut sizes = [ScratchSizes::default(); LANES];
        for (i, (op, &lane)) in plan.ops.iter().zip(&op_lanes).enumerate() {
            let size = &mut sizes[lane];
            match *op {
                Op::Attention { q, k, heads, groups, .. } => match fusions.attention(i) {
                    AttentionLowering::ActionTokens(split) => {
                        let (o, ml) = split.partial_lens;
                        (size.attention_o, size.attention_ml) = (size.attention_o.max(o), size.attention_ml.max(ml));
                    }
                    AttentionLowering::Heads => {}
                    AttentionLowering::Products => size.scores = size.scores.max(heads * (q.rows / groups) * (k.rows / groups)),
                },
                // Their e4m3 input: cuBLASLt's FP8 products', and those the expert's gated norms and attention merges write.
                Op::Gemm { a, .. } if cublaslt_fp8.binary_search(&i).is_ok() || fusions.takes_e4m3_from_its_producer(i) => {
                    size.fp8_input = size.fp8_input.max(a.rows * a.cols);
                    if fusions.e4m3_from_products.binary_search(&i).is_ok() {
                        size.fp8_product_output = size.fp8_product_output.max(a.rows * a.cols);
                    }
                }
                Op::Gemm { a, .. } if elems[a.buf.0] == Elem::F32 => size.shadow = size.shadow.max(a.rows * a.cols),
                Op::Positions { positions, .. } => positions_bufs.push(positions),
                _ => {}
            }
        }
        // A second stream with no ops gets no scratch (only the cuBLASLt workspace is unsized).
        let used_lanes = op_lanes.iter().max().map_or(1, |l| l + 1);
        let scratch_at: Vec<[usize; 9]> = sizes[..used_lanes]
            .iter()
            .map(|size| {
                [
                    layout.take(size.scores * 4),
                    layout.take(size.scores * 2),
                    layout.take(size.shadow * 2),
                    layout.take(size.fp8_input),
                    layout.take(size.fp8_product_output),
                    layout.take(size.attention_o * 4),
                    layout.take(size.attention_ml * 4),
                    layout.take(WORKSPACE_BYTES),
                    layout.take(4),
                ]
            })
            .collect();
        // One (cos, sin) pair of tables per RoPE spec (θ, head dimension) of the plan.
        let specs = plan.rope_specs();
        let table_at: Vec<[usize; 2]> = specs
            .iter()
            .map(|s| {
                let bytes = s.positions * s.head_dim / 2 * 4;
                [layout.take(bytes), layout.take(bytes)]
            })
            .collect();
        // Gathered rows need whole 16-byte groups (rope_rows_gather), one positions buffer and one
        // table; else RoPE reads the positions itself.
        let gathered = match (&positions_bufs[..], &specs[..]) {
            (&[positions], &[spec]) if spec.head_dim / 2 % 4 == 0 && spec.positions > 0 => {
                Some((positions, plan.buffers[positions.0].len, spec))
            }
            _ => None,
        };
        let rows_len = gathered.map_or(0, |(_, slots, spec)| slots * spec.head_dim / 2 * 4);
        let rope_rows_at = [layout.take(rows_len), layout.take(rows_len)];
        // The GR00T image op's tables and planes, shared by its cameras (run one after another).
        let image_scratch_bytes = plan
            .ops
            .iter()
            .filter_map(|op| match *op {
                Op::QwenImagePatches { max_width, max_height, image, .. } => Some(
                    QwenImageSizes { max_width, max_height, edge: image.edge, target: image.target, letterbox: image.letterbox }
                        .scratch_bytes(),
                ),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let image_scratch_at = layout.take(image_scratch_bytes);
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
                fp8_input: at(o[3]),
                fp8_product_output: at(o[4]),
                attention_o: at(o[5]),
                attention_ml: at(o[6]),
                workspace: at(o[7]),
                grid_barrier: at(o[8]),
            })
            .collect();
        let rope: Vec<(RopeSpec, (DevPtr, DevPtr))> = specs.iter().zip(&table_at).map(|(s, t)| (*s, (at(t[0]), at(t[1])))).collect();
        let rope_rows = gathered.map(|(positions, slots, spec)| RopeRows {
            positions,
            tables: rope[0].1,
            rows: (at(rope_rows_at[0]), at(rope_rows_at[1])),
            slots,
            half: spec.head_dim / 2,
        });
        for (spec, (cos_at, sin_at)) in &rope {
            let (cos, sin) = spec.tables();
            // SAFETY: both regions were sized for these tables above.
            unsafe {
                check("uploading RoPE tables", result::memcpy_htod_sync(*cos_at, &cos))?;
                check("uploading RoPE tables", result::memcpy_htod_sync(*sin_at, &sin))?;
            }
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

        let uploaded = upload_weights(&plan, weights, &checkpoint, &elems, &fp8, stream.0)?;
        let (fp8_scales, scales_at) = fp8.upload_scales()?;
        let fp8_products: HashMap<usize, (ProductScales, DevPtr)> =
            fp8.chosen.iter().map(|(&w, &scales)| (w, (scales, scales_at[&w]))).collect();
        let (tiled_memory, tiled) = retile_streamed_weights(&kernels, &plan, &fusions, &fp8, &uploaded.ptrs, stream.0)?;
        let selections = Selections::upload(&plan, &uploaded)?;
        if let Some(board) = board {
            let used = (uploaded.memory.bytes + tiled_memory.as_ref().map_or(0, |m| m.bytes) + arena.bytes) as u64;
            if let Some(warning) = board.budget_warning(used, ctx.total_memory()? as u64) {
                log::warn!("{warning}");
            }
        }
        let lowering = Lowering {
            plan: &plan,
            bufs: &bufs,
            lt: &lt,
            weights: &uploaded.ptrs,
            scratch: &scratch,
            rope: &rope,
            rope_rows,
            op_lanes: &op_lanes,
            host_inputs,
            lane: 0,
            fusions: &fusions,
            multiprocessors,
            image_scratch: at(image_scratch_at),
            op_index: 0,
            early_after_products: switches.early_launch,
            tiled: &tiled,
            fp8_fast_accumulation: switches.fp8_fast_accumulation,
            fp8: &fp8_products,
            fp8_streamed: &fp8,
            selections: &selections,
            steps: Vec::new(),
            step_lanes: Vec::new(),
            step_accesses: Vec::new(),
            phase_steps: Vec::new(),
            phase_buckets: Vec::new(),
            matmuls: Vec::new(),
            zeroed_outputs: Vec::new(),
        };
        let Lowered { steps, schedule, phase_steps, sections, matmuls } = lowering.lower()?;
        let zeroed = steps.iter().filter(|s| matches!(s, Step::StreamedProduct { out_zeroed: true, .. })).count();
        let e4m3_gate_up =
            steps.iter().filter(|s| matches!(s, Step::GatedActivation { gate_up, .. } if gate_up.dtype == Dtype::E4m3)).count();
        if schedule.concurrent(0..steps.len()) {
            log::info!(
                "{} of {} launches on a second stream, {} cross-stream waits",
                schedule.lanes.iter().filter(|&&l| l != 0).count(),
                steps.len(),
                schedule.waits.iter().flatten().count()
            );
        }
        let launcher = Launcher {
            stream,
            side,
            fork: Event::ordering()?,
            join: Event::ordering()?,
            lt,
            kernels,
            events: (0..schedule.events()).map(|_| Event::ordering()).collect::<Result<_>>()?,
            steps,
            phase_steps,
            sections,
            prompt_buckets: plan.prompt_buckets.clone(),
            bucket_handles: Cell::new([0; MAX_PROMPT_BUCKETS]),
            matmuls,
            workspace: scratch[0].workspace,
            schedule,
            ctx: ctx.ctx,
        };
        let lowering = format!(
            "  switches: {}\n{}  zeroed branches: {zeroed} streamed product(s) add into an output its last reader left zero, \
             without a grid barrier\n  e4m3 gate/up outputs: {e4m3_gate_up} FP8 product(s) store their output in e4m3 for the gated \
             activation after them\n{}  ops on the second stream: {}\n  launches: {}\n",
            switches.describe(),
            fusions.describe(),
            if opts.fp8_scales.is_empty() { String::new() } else { fp8.describe(switches.fp8_fast_accumulation) },
            op_lanes.iter().filter(|&&l| l != 0).count(),
            launcher.launch_counts()
        );
        let mut backend = CudaBackend {
            device_name: format!("{device_name} ({arch})"),
            lowering,
            graph: None,
            runs: 0,
            profile: None,
            fail_next_run: false,
            launcher,
            bufs,
            host,
            arena,
            weights: uploaded.memory,
            tiled_weights: tiled_memory,
            selections: selections.memory,
            fp8_scales,
            ctx,
            plan,
        };
        let started = std::time::Instant::now();
        backend.launcher.tune_gemms()?;
        log::info!("GEMM algorithms timed in {:.2?}", started.elapsed());
        let started = std::time::Instant::now();
        backend.launcher.issue_all()?;
        backend.launcher.synchronize("warm-up")?;
        backend.graph = Some(backend.launcher.capture()?);
        backend.launcher.synchronize("graph upload")?;
        log::info!(
            "CUDA graph of {} ops ({} launches, {} GEMMs) captured in {:.2?}; {:.1} MiB weights, {:.1} MiB activations",
            backend.plan.ops.len(),
            backend.launcher.steps.len(),
            backend.launcher.matmuls.len(),
            started.elapsed(),
            backend.weight_bytes() as f64 / (1 << 20) as f64,
            backend.arena.bytes as f64 / (1 << 20) as f64
        );
        backend.profile = std::env::var_os("FRT_PROFILE").map(PathBuf::from);
        Ok(backend)
    }

    /// Device memory of the weights, tiled copies, the selection pieces and the FP8 scales included.
    fn weight_bytes(&self) -> usize {
        let extra = [&self.tiled_weights, &self.selections, &self.fp8_scales];
        self.weights.bytes + extra.iter().map(|m| m.as_ref().map_or(0, |m| m.bytes)).sum::<usize>()
    }

    fn host_buffer(&self, id: BufId) -> &Pinned {
        self.host[id.0].as_ref().unwrap_or_else(|| unreachable!("buffer {} is not a host buffer", self.plan.buffers[id.0].name))
    }

    fn host_buffer_mut(&mut self, id: BufId) -> &mut Pinned {
        let name = &self.plan.buffers[id.0].name;
        self.host[id.0].as_mut().unwrap_or_else(|| unreachable!("buffer {name} is not a host buffer"))
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_name(&self) -> String {
        self.device_name.clone()
    }

    fn lowering(&self) -> String {
        self.lowering.clone()
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
        graph.launch(self.launcher.stream.0)?;
        if std::mem::take(&mut self.fail_next_run) {
            // As a failing synchronize would: the graph may still be running (drop waits for it).
            return Err(Error::Backend("step: injected fault (Backend::fail_next_run) after the graph launch".into()));
        }
        self.launcher.synchronize("step")?;
        self.runs += 1;
        if self.runs == PROFILE_AFTER_RUNS {
            if let Some(path) = self.profile.take() {
                let graph = self.graph.as_ref().expect("captured at open");
                self.launcher.profile_phases(graph, &self.device_name, &path)?;
            }
        }
        Ok(())
    }

    fn fail_next_run(&mut self) {
        self.fail_next_run = true;
    }

    fn output_f32(&self, id: BufId) -> &[f32] {
        self.host_buffer(id).as_slice()
    }

    fn run_traced(&mut self, _after_phase: &mut dyn FnMut(&str, &dyn Backend)) -> Result<()> {
        Err(Error::invalid(
            "step_traced",
            "a traced step stops between phases, which the CUDA backend's captured graph cannot; trace on the CPU backend",
        ))
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
                Elem::I32 | Elem::U8 | Elem::E4m3 => None,
            }
        }
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // The fields release themselves in declaration order (graph, stream, handle, matmuls,
        // kernels, memory, the context last); they need the context current and the GPU idle.
        if self.ctx.make_current().is_ok() {
            let _ = self.launcher.synchronize("teardown");
        }
    }
}

/// The shapes this device's streamed FP8 kernels run (none when `Switches::fp8_streamed` is off).
struct Fp8Shapes<'a> {
    kernels: &'a Kernels,
    multiprocessors: usize,
    switches: Switches,
}

impl StreamedShapes for Fp8Shapes<'_> {
    fn mlp(&self, rows: usize, width: usize, hidden: usize) -> bool {
        self.switches.fp8_streamed && self.kernels.mlp_stream_splits(rows, width, hidden, self.multiprocessors, true).is_some()
    }
    fn product(&self, rows: usize, n: usize, k: usize) -> bool {
        self.switches.fp8_streamed && self.kernels.product_stream_splits(rows, n, k, self.multiprocessors).is_some()
    }
    fn qkv_rope(&self, rows: usize, n: usize, k: usize, head_dim: usize) -> bool {
        self.switches.fp8_streamed
            && self.switches.fp8_expert_e4m3
            && self.kernels.qkv_rope_stream_fits(rows, n, k, head_dim, self.multiprocessors)
    }
}

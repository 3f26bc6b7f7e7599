//! Loaded modules and typed launchers. A launcher checks shapes, picks the kernel instantiation
//! for the operands' element types and enqueues it on `stream`; it never allocates device memory.

use std::ffi::{CString, c_void};

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUfunction, CUmodule, CUstream};

use crate::compile::{Cubin, arch_number};
use crate::{KernelError, Result};

/// A device address (`CUdeviceptr`).
pub type DevPtr = u64;

/// Element type of an activation buffer on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }
}

/// A strided row-major matrix on the device: element `(r, c)` at `ptr + (r · stride + c) · size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mat {
    pub ptr: DevPtr,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
    pub dtype: Dtype,
}

/// Arguments of [`Kernels::rope_qkv`] besides the stream.
#[derive(Clone, Copy, Debug)]
pub struct RopeArgs {
    /// `[rows, (heads + 2) · head_dim]`: q heads, then k, then v.
    pub qkv: Mat,
    pub heads: usize,
    pub head_dim: usize,
    /// i32 positions: row `r` uses table row `positions[position_offset + r]`; `None`: the tables
    /// hold the sequence's rows ([`Kernels::rope_rows_gather`]) and row `r` uses row
    /// `position_offset + r`.
    pub positions: Option<DevPtr>,
    pub position_offset: usize,
    pub k_cache: Mat,
    pub v_cache: Mat,
    pub cache_row: usize,
    /// f32 `[position][head_dim / 2]` tables (or `[slot][head_dim / 2]` rows, see `positions`).
    pub cos: DevPtr,
    pub sin: DevPtr,
    /// Launched as the programmatic dependent of the kernel before it on the stream (sm_90 on),
    /// which must not write the tables or positions: it loads them, then waits for that kernel.
    pub early: bool,
}

/// Arguments of [`Kernels::attention_mq256`] besides the stream: softmax attention of `heads`
/// query heads of dimension 256 over one shared K/V head.
#[derive(Clone, Copy, Debug)]
pub struct AttentionArgs {
    /// `[queries, heads · 256]` bf16.
    pub q: Mat,
    /// `[keys, 256]` bf16 each.
    pub k: Mat,
    pub v: Mat,
    /// `[queries, heads · 256]` bf16.
    pub out: Mat,
    pub heads: usize,
    /// f32 per key (0 masks the key out) and per query (0 gives a zero output row).
    pub key_valid: Option<DevPtr>,
    pub query_valid: Option<DevPtr>,
    /// How the keys are split over blocks, from [`Kernels::attention_split`].
    pub split: AttentionSplit,
    /// f32 scratch of `split.partial_lens`: partial outputs, and two values (running max, sum)
    /// per split and row.
    pub partial_o: DevPtr,
    pub partial_ml: DevPtr,
    /// `Some(n)`: the kernel before this launch on the stream writes `q` and no key or value
    /// before key `n`, and lets its dependents start at once (`rope_qkv`). The Hopper form is then
    /// launched as its programmatic dependent and loads keys it does not write while it runs; other forms launch plainly.
    pub keys_ready: Option<usize>,
}

/// How [`Kernels::attention_mq256`] splits the keys of one attention over blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSplit {
    pub splits: usize,
    pub keys_per_split: usize,
    /// f32 elements of the partial outputs and of the (max, sum) pairs the splits leave for the
    /// merge kernel (none for one split).
    pub partial_lens: (usize, usize),
}

/// Most prompt buckets one `prompt_bucket_256` launch picks among.
pub const MAX_PROMPT_BUCKETS: usize = 4;

/// Rows (query × head) per block of `attention_mq256` (attention.cu), and keys per split: a
/// multiple of its chunk (ATT_KEYS: 64 keys from sm_90 on, 32 before).
const ATTENTION_ROWS: usize = 64;
const ATTENTION_SPLIT_KEYS: usize = 64;
const ATTENTION_HEAD_DIM: usize = 256;
/// Rows per block of `attention_mq256_combine` (ATT_MERGE_ROWS).
const ATTENTION_MERGE_ROWS: usize = 4;
/// bf16 elements per shared-memory row of Q and K, and of V (ATT_QK_STRIDE, ATT_V_STRIDE: padded
/// against bank conflicts).
const ATTENTION_QK_STRIDE: usize = ATTENTION_HEAD_DIM + 32;
const ATTENTION_V_STRIDE: usize = ATTENTION_HEAD_DIM + 8;
/// Its dynamic shared memory (ATT_SHARED_BYTES in attention.cu) for chunks of `keys` keys: the Q
/// tile and two chunks each of K, V and key validity (f32).
const fn attention_shared_bytes(keys: usize) -> u32 {
    (ATTENTION_ROWS * ATTENTION_QK_STRIDE * 2 + 2 * keys * ATTENTION_QK_STRIDE * 2 + 2 * keys * ATTENTION_V_STRIDE * 2 + 2 * keys * 4)
        as u32
}

/// `attention_mq256_wgmma`'s dynamic shared memory (ATTW_SHARED_BYTES): 1024 bytes of alignment
/// slack, then the Q tile and two chunks each of K and V (64 rows × 256 bf16 each), two chunks of
/// key validity, and four copy barriers (8 bytes each).
const ATTENTION_WGMMA_SHARED_BYTES: u32 =
    (1024 + 5 * ATTENTION_ROWS * ATTENTION_HEAD_DIM * 2 + 2 * ATTENTION_SPLIT_KEYS * 4 + 4 * 8) as u32;

/// Keys per chunk of `attention_mq256` as compiled for `arch` ("sm_90"): ATT_KEYS in attention.cu.
fn attention_chunk_keys(arch: &str) -> usize {
    if arch_number(arch).is_some_and(|n| n >= 90) { 64 } else { 32 }
}

/// Head dimension, query rows and threads per block and most keys per group of `attention_mh72`
/// (attention.cu: VA_D, VA_ROWS, VA_THREADS, VA_MAX_KEYS), its shared-memory row stride in bf16
/// elements (VA_STRIDE: padded against bank conflicts), and its dynamic shared memory
/// (VA_SHARED_BYTES: the Q tile and every key's K and V).
const VISION_HEAD_DIM: usize = 72;
const VISION_ROWS: usize = 64;
const VISION_THREADS: u32 = 256;
pub const VISION_MAX_KEYS: usize = 256;
const VISION_STRIDE: usize = 88;
const VISION_SHARED_BYTES: u32 = ((VISION_ROWS + 2 * VISION_MAX_KEYS) * VISION_STRIDE * 2) as u32;

/// Kernel argument as the C signature takes it; `params` points at these while launching.
#[derive(Clone, Copy)]
enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
    M(TensorMap),
}

impl Arg {
    fn as_param(&self) -> *mut c_void {
        match self {
            Arg::P(v) => v as *const u64 as *mut c_void,
            Arg::I(v) => v as *const i32 as *mut c_void,
            Arg::L(v) => v as *const i64 as *mut c_void,
            Arg::F(v) => v as *const f32 as *mut c_void,
            Arg::M(v) => v as *const TensorMap as *mut c_void,
        }
    }
}

/// A driver tensor map (`CUtensorMap`, 128 opaque bytes) passed by value: attention.cu's
/// `TensorMap`. Aligned as CUDA 13 declares it (12 asks for 64).
#[derive(Clone, Copy)]
#[repr(C, align(128))]
struct TensorMap([u64; 16]);

impl TensorMap {
    /// A map the kernel never reads (the mma.sync attention's unused arguments).
    const UNUSED: TensorMap = TensorMap([0; 16]);

    /// A bf16 matrix `[rows, 256]` (row stride `m.stride` elements) read in 64 × 64 boxes that land
    /// in shared memory with the 128-byte swizzle wgmma reads; rows past the end arrive as zeros.
    fn bf16_rows_64x64(m: &Mat, what: &str) -> Result<TensorMap> {
        let row_bytes = (m.stride * 2) as u64;
        Self::encode_bf16_256(m.ptr, [m.rows as u64, 1], [row_bytes, row_bytes * m.rows as u64], [64, 1], what)
    }

    /// The query rows of `q` (`[queries, heads · 256]`, row stride `q.stride`) as (query, head)
    /// pairs, read 64 pairs at a time (64 / `heads` queries, every head) in the same boxes; `None`
    /// when `heads` does not divide 64 (no box then spans a 64-row tile).
    fn bf16_query_heads_64(q: &Mat, heads: usize, what: &str) -> Result<Option<TensorMap>> {
        if heads == 0 || 64 % heads != 0 {
            return Ok(None);
        }
        let dims = [heads as u64, q.rows as u64];
        let strides = [(ATTENTION_HEAD_DIM * 2) as u64, (q.stride * 2) as u64];
        Self::encode_bf16_256(q.ptr, dims, strides, [heads as u32, (64 / heads) as u32], what).map(Some)
    }

    /// A rank-3 map `[outer[1], outer[0], 256]` of bf16 (byte strides `strides` of the two outer
    /// dimensions) in boxes of 64 × `boxes`, 128-byte swizzled; reads past any dimension's end
    /// arrive as zeros.
    fn encode_bf16_256(ptr: DevPtr, outer: [u64; 2], strides: [u64; 2], boxes: [u32; 2], what: &str) -> Result<TensorMap> {
        let mut map = TensorMap::UNUSED;
        let dims = [ATTENTION_HEAD_DIM as u64, outer[0], outer[1]];
        let (boxes, element_strides) = ([64, boxes[0], boxes[1]], [1u32; 3]);
        // SAFETY: the out-pointer is a 128-byte-aligned, 128-byte map; the arrays are as long as
        // the rank (3) asks (strides: rank - 1); the driver only encodes, it reads no memory.
        let status = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map as *mut TensorMap as *mut sys::CUtensorMap,
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                3,
                ptr as *mut c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        status.result().map_err(|e| KernelError::cuda(format!("{what}: tensor map of {dims:?} (strides {strides:?})"), e))?;
        Ok(map)
    }
}

/// Dynamic shared memory of `mlp_stream_wgmma` (mlp.cu: MLP_SHARED_BYTES): alignment slack, eight
/// weight stages and sixteen 64-column chunks of A, 8 KB each.
const MLP_SHARED_BYTES: u32 = 1024 + (8 + MLP_A_CHUNKS as u32) * 8192;
/// Most columns of the narrow side of the step-boundary row kernels (norm.cu's ROW_PRODUCT_MAX).
pub const ROW_PRODUCT_MAX: usize = 32;

/// Most 64-column chunks of A a block of `mlp_stream_wgmma` holds (MLP_A_CHUNKS).
const MLP_A_CHUNKS: usize = 16;

const IN_OUT: [&str; 6] = ["layer_norm", "rms_norm", "gated_residual_rms_norm", "gated_residual_rms_norm_product", "copy", "gelu_tanh_mul"];
const TYPED: [&str; 10] = [
    "product_rms_norm",
    "gated_residual",
    "gelu_tanh",
    "affine",
    "embed_bf16",
    "rope_qkv",
    "image_patches_u8",
    "attention_mq256",
    "attention_mq256_combine",
    "attention_mh72",
];
const SINGLE: [&str; 6] =
    ["add_table_f32", "copy_host_inputs", "positions_scan_1024", "prompt_bucket_256", "rope_rows_gather", "softmax_rows_masked_f32_bf16"];

/// Whether modules compiled for `arch` hold the warpgroup-MMA forms (attention.cu's
/// `attention_mq256_wgmma`): sm_90a, the arch-specific target of the H100/H200.
pub fn has_wgmma(arch: &str) -> bool {
    arch == "sm_90a"
}

/// Every kernel the launchers use in modules compiled for `arch`, as the macros in `cuda/*.cu`
/// instantiate them.
pub fn kernel_names(arch: &str) -> Vec<String> {
    let types = ["f32", "bf16"];
    let mut names: Vec<String> = SINGLE.iter().map(|s| s.to_string()).collect();
    for base in IN_OUT {
        for a in types {
            for b in types {
                names.push(format!("{base}_{a}_{b}"));
            }
        }
    }
    let wgmma: &[&str] = if has_wgmma(arch) { &["attention_mq256_wgmma"] } else { &[] };
    for base in TYPED.iter().chain(wgmma) {
        for t in types {
            names.push(format!("{base}_{t}"));
        }
    }
    if has_wgmma(arch) {
        names.extend(["mlp_stream_wgmma".to_string(), "retile_weight".to_string()]);
    }
    names
}

/// The launch attribute that makes a launch the programmatic dependent of the kernel before it on
/// its stream (it may start once that kernel's blocks have all triggered or exited).
fn programmatic_attribute() -> sys::CUlaunchAttribute {
    // SAFETY: the attribute value is a plain C union; all-zero bytes are a valid value.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    sys::CUlaunchAttribute { id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, pad: [0; 4], value }
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| KernelError::Cuda { context: what.into(), message: format!("{v} exceeds the 32-bit range of the kernel argument") })
}

fn shape_error(what: &str, message: String) -> KernelError {
    KernelError::Cuda { context: what.into(), message }
}

/// Loaded modules with every kernel of [`kernel_names`] resolved. Owns the modules; the CUDA
/// context they were loaded into must be current when launching and when dropping.
pub struct Kernels {
    modules: Vec<CUmodule>,
    /// Sorted by name for lookup.
    functions: Vec<(String, CUfunction)>,
    /// Whether the device grants the fused attention kernels their shared memory (not
    /// sm_86/sm_89, 99 KB).
    fused_attention: bool,
    /// The form of the multi-query attention the loaded architecture runs best (`attention_mq256`
    /// or, on sm_90a, `attention_mq256_wgmma`), and its dynamic shared memory.
    attention_kernel: &'static str,
    attention_shared_bytes: u32,
    /// Whether `mlp_stream_wgmma` is loaded (sm_90a) and granted its shared memory.
    mlp_stream: bool,
    /// Whether the architecture has programmatic dependent launch (sm_90 on): elsewhere the
    /// launches asked to start early are plain ones.
    programmatic: bool,
}

// SAFETY: module and function handles are plain driver handles, valid in any thread that makes
// their context current; `Kernels` has no interior mutability.
unsafe impl Send for Kernels {}

impl Kernels {
    /// Loads the cubins into the current context and resolves every kernel.
    pub fn load(cubins: &[Cubin]) -> Result<Kernels> {
        let arch = cubins.first().map_or("", |c| c.arch.as_str());
        let (attention_kernel, attention_shared_bytes) = if has_wgmma(arch) {
            ("attention_mq256_wgmma", ATTENTION_WGMMA_SHARED_BYTES)
        } else {
            ("attention_mq256", attention_shared_bytes(attention_chunk_keys(arch)))
        };
        let mut kernels = Kernels {
            modules: Vec::with_capacity(cubins.len()),
            functions: Vec::new(),
            fused_attention: true,
            attention_kernel,
            attention_shared_bytes,
            mlp_stream: false,
            programmatic: arch_number(arch).is_some_and(|n| n >= 90),
        };
        for cubin in cubins {
            // SAFETY: `image` is a complete cubin produced by NVRTC (or read back from the cache);
            // the driver copies it during the call.
            let module = unsafe { result::module::load_data(cubin.image.as_ptr() as *const c_void) }
                .map_err(|e| KernelError::cuda(format!("loading the {} module ({})", cubin.source, cubin.arch), e))?;
            kernels.modules.push(module);
        }
        for name in kernel_names(arch) {
            let cname = CString::new(name.as_str()).expect("kernel names have no NUL");
            let found = kernels.modules.iter().find_map(|&m| {
                // SAFETY: `m` is a loaded module; a missing name returns an error, not UB.
                unsafe { result::module::get_function(m, cname.clone()) }.ok()
            });
            let f = found.ok_or_else(|| KernelError::MissingKernel(name.clone()))?;
            kernels.functions.push((name, f));
        }
        kernels.functions.sort_by(|a, b| a.0.cmp(&b.0));
        if has_wgmma(arch) {
            let f = kernels.function("mlp_stream_wgmma")?;
            let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            // SAFETY: `f` is a resolved function of a loaded module; the value is a byte count.
            kernels.mlp_stream = unsafe { sys::cuFuncSetAttribute(f, attr, MLP_SHARED_BYTES as i32) }.result().is_ok();
        }
        for (base, bytes) in [(kernels.attention_kernel, kernels.attention_shared_bytes), ("attention_mh72", VISION_SHARED_BYTES)] {
            for dtype in ["bf16", "f32"] {
                let f = kernels.function(&format!("{base}_{dtype}"))?;
                let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                // SAFETY: `f` is a resolved function of a loaded module; the value is a byte count.
                let granted = unsafe { sys::cuFuncSetAttribute(f, attr, bytes as i32) }.result();
                kernels.fused_attention &= granted.is_ok();
            }
        }
        Ok(kernels)
    }

    fn function(&self, name: &str) -> Result<CUfunction> {
        self.functions
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .map(|i| self.functions[i].1)
            .map_err(|_| KernelError::MissingKernel(name.into()))
    }

    /// # Safety
    /// The arguments must match the kernel's C signature and point to live device memory.
    unsafe fn launch<const N: usize>(&self, name: &str, grid: (u32, u32, u32), block: u32, stream: CUstream, args: [Arg; N]) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.launch_with_shared(name, grid, block, 0, stream, args) }
    }

    /// [`Kernels::launch`] with `shared` bytes of dynamic shared memory.
    ///
    /// # Safety
    /// As [`Kernels::launch`].
    unsafe fn launch_with_shared<const N: usize>(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        stream: CUstream,
        args: [Arg; N],
    ) -> Result<()> {
        let f = self.function(name)?;
        let mut params: [*mut c_void; N] = std::array::from_fn(|i| args[i].as_param());
        // SAFETY: `params` points into `args`, alive until the driver has copied them.
        unsafe { result::launch_kernel(f, grid, (block, 1, 1), shared, stream, &mut params) }
            .map_err(|e| KernelError::cuda(format!("launching {name}"), e))
    }

    /// [`Kernels::launch_with_shared`] with launch attributes (`cuLaunchKernelEx`).
    ///
    /// # Safety
    /// As [`Kernels::launch`], and the kernel must honour the attributes (e.g. a programmatic
    /// dependent waits for the kernel before it, `wait_for_prior_grid` in common.cuh, before
    /// reading what that kernel writes).
    #[allow(clippy::too_many_arguments)] // launch_with_shared's, plus the attributes
    unsafe fn launch_with_attributes<const N: usize>(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        stream: CUstream,
        args: [Arg; N],
        attrs: &mut [sys::CUlaunchAttribute],
    ) -> Result<()> {
        let f = self.function(name)?;
        let mut params: [*mut c_void; N] = std::array::from_fn(|i| args[i].as_param());
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared,
            hStream: stream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        // SAFETY: `params` points into `args` and `config` at `attrs`, both alive for the call.
        unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| KernelError::cuda(format!("launching {name}"), e))
    }

    /// As the programmatic dependent of the kernel before it on `stream` where asked and the
    /// architecture has it (its blocks may start before that kernel ends), else a plain launch.
    ///
    /// # Safety
    /// As [`Kernels::launch_with_attributes`] with the programmatic attribute.
    #[allow(clippy::too_many_arguments)] // launch_with_shared's, plus the wish
    unsafe fn launch_maybe_early<const N: usize>(
        &self,
        early: bool,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        stream: CUstream,
        args: [Arg; N],
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe {
            if early && self.programmatic {
                self.launch_with_attributes(name, grid, block, shared, stream, args, &mut [programmatic_attribute()])
            } else {
                self.launch_with_shared(name, grid, block, shared, stream, args)
            }
        }
    }

    /// One thread per element: grid `(ceil(cols / 256), rows)`.
    fn elementwise_grid(rows: usize, cols: usize, what: &str) -> Result<(u32, u32, u32)> {
        if rows > 65_535 {
            return Err(shape_error(what, format!("{rows} rows exceed the grid's y limit")));
        }
        Ok((cols.div_ceil(256).max(1) as u32, rows.max(1) as u32, 1))
    }

    /// One block per row: enough warps to cover the row once, at most 256 threads.
    fn row_block(cols: usize) -> u32 {
        cols.div_ceil(32).clamp(1, 8) as u32 * 32
    }

    /// `(per, threads)` of the row kernels in norm.cu: one group of 8 columns per thread when
    /// every matrix row and f32 vector can be read in 16-byte pieces and a block holds the row,
    /// else strided single columns over [`Kernels::row_block`] threads.
    fn row_launch(mats: &[(Mat, usize)], vectors: &[DevPtr], cols: usize) -> (i32, u32) {
        if Self::columns_per_thread(mats) == 8 && vectors.iter().all(|p| p % 16 == 0) && cols / 8 <= 1024 {
            (8, Self::row_threads(cols))
        } else {
            (1, Self::row_block(cols))
        }
    }

    /// Threads of a row kernel that gives each thread one group of 8 columns: whole warps.
    fn row_threads(cols: usize) -> u32 {
        (cols / 8).div_ceil(32) as u32 * 32
    }

    fn same_shape(what: &str, a: &Mat, b: &Mat) -> Result<()> {
        if (a.rows, a.cols) != (b.rows, b.cols) {
            return Err(shape_error(what, format!("{}x{} vs {}x{}", a.rows, a.cols, b.rows, b.cols)));
        }
        Ok(())
    }

    /// `dst = src` (same shape), converting the element type.
    ///
    /// # Safety
    /// Both matrices must lie in live device memory of this context.
    pub unsafe fn copy(&self, dst: Mat, src: Mat, stream: CUstream) -> Result<()> {
        Self::same_shape("copy", &dst, &src)?;
        let name = format!("copy_{}_{}", src.dtype.suffix(), dst.dtype.suffix());
        let grid = Self::elementwise_grid(dst.rows, dst.cols, &name)?;
        let args = [
            Arg::P(dst.ptr),
            Arg::I(i32_of(dst.stride, "copy")?),
            Arg::P(src.ptr),
            Arg::I(i32_of(src.stride, "copy")?),
            Arg::I(dst.rows as i32),
            Arg::I(i32_of(dst.cols, "copy")?),
        ];
        // SAFETY: matches `copy_*` in elementwise.cu; memory validity is the caller's contract.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// Copies `count` pieces, each `(destination, source, bytes)` of the u64 table `pieces` in
    /// device memory (bytes a multiple of 4), in one launch: the host inputs from mapped pinned
    /// memory into device buffers.
    ///
    /// # Safety
    /// `pieces` must hold `count` triples of live, device-accessible, 4-byte aligned ranges.
    pub unsafe fn copy_host_inputs(&self, pieces: DevPtr, count: usize, stream: CUstream) -> Result<()> {
        let args = [Arg::P(pieces), Arg::I(i32_of(count, "copy_host_inputs")?)];
        // SAFETY: matches `copy_host_inputs` in elementwise.cu: one block per piece.
        unsafe { self.launch("copy_host_inputs", (count.max(1) as u32, 1, 1), 256, stream, args) }
    }

    /// `x += table`, the f32 table's rows repeating every `table_rows` rows.
    ///
    /// # Safety
    /// `x` (f32) and `table` (`table_rows × x.cols` f32) must be live device memory.
    pub unsafe fn add_table(&self, x: Mat, table: DevPtr, table_rows: usize, stream: CUstream) -> Result<()> {
        if x.dtype != Dtype::F32 || table_rows == 0 {
            return Err(shape_error("add_table", format!("needs an f32 residual and table rows > 0, got {:?} and {table_rows}", x.dtype)));
        }
        let grid = Self::elementwise_grid(x.rows, x.cols, "add_table")?;
        let args = [
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, "add_table")?),
            Arg::P(table),
            Arg::I(i32_of(table_rows, "add_table")?),
            Arg::I(x.rows as i32),
            Arg::I(i32_of(x.cols, "add_table")?),
        ];
        // SAFETY: matches `add_table_f32`.
        unsafe { self.launch("add_table_f32", grid, 256, stream, args) }
    }

    /// Row-wise LayerNorm with f32 `gamma`/`beta` of `x.cols`.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    pub unsafe fn layer_norm(&self, out: Mat, x: Mat, gamma: DevPtr, beta: DevPtr, eps: f32, stream: CUstream) -> Result<()> {
        Self::same_shape("layer_norm", &out, &x)?;
        let name = format!("layer_norm_{}_{}", x.dtype.suffix(), out.dtype.suffix());
        let (per, threads) = Self::row_launch(&[(out, 0), (x, 0)], &[gamma, beta], x.cols);
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(gamma),
            Arg::P(beta),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::F(eps),
            Arg::I(per),
        ];
        // SAFETY: matches `layer_norm_*` in norm.cu.
        unsafe { self.launch(&name, (x.rows as u32, 1, 1), threads, stream, args) }
    }

    /// Row-wise RMS norm; with `modulation` (`[scale | shift | gate]`, 3 · cols f32) the adaRMS
    /// form `rms(x) · (1 + scale) + shift`.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    pub unsafe fn rms_norm(&self, out: Mat, x: Mat, modulation: Option<DevPtr>, eps: f32, stream: CUstream) -> Result<()> {
        Self::same_shape("rms_norm", &out, &x)?;
        let name = format!("rms_norm_{}_{}", x.dtype.suffix(), out.dtype.suffix());
        let (per, threads) = Self::row_launch(&[(out, 0), (x, 0)], &[modulation.unwrap_or(0)], x.cols);
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(modulation.unwrap_or(0)),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::F(eps),
            Arg::I(per),
        ];
        // SAFETY: matches `rms_norm_*` in norm.cu (a null modulation means plain RMS).
        unsafe { self.launch(&name, (x.rows as u32, 1, 1), threads, stream, args) }
    }

    /// `x += y ⊙ gate`, gate = the third third of `modulation` (3 · cols f32); `x` is f32.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    pub unsafe fn gated_residual(&self, x: Mat, y: Mat, modulation: DevPtr, stream: CUstream) -> Result<()> {
        Self::same_shape("gated_residual", &x, &y)?;
        if x.dtype != Dtype::F32 {
            return Err(shape_error("gated_residual", "the residual stream must be f32".into()));
        }
        let name = format!("gated_residual_{}", y.dtype.suffix());
        let grid = Self::elementwise_grid(x.rows, x.cols, &name)?;
        let args = [
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(y.ptr),
            Arg::I(i32_of(y.stride, &name)?),
            Arg::P(modulation),
            Arg::I(x.rows as i32),
            Arg::I(i32_of(x.cols, &name)?),
        ];
        // SAFETY: matches `gated_residual_*` in norm.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// `x += y ⊙ gate(gate_modulation)`, then `out = rms(x) · (1 + scale) + shift` with
    /// `norm_modulation`, in one pass per row.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // mirrors the kernel's signature: two matrices in, two modulations
    pub unsafe fn gated_residual_rms_norm(
        &self,
        out: Mat,
        x: Mat,
        y: Mat,
        gate_modulation: DevPtr,
        norm_modulation: DevPtr,
        eps: f32,
        early: bool,
        stream: CUstream,
    ) -> Result<()> {
        Self::same_shape("gated_residual_rms_norm", &x, &y)?;
        Self::same_shape("gated_residual_rms_norm", &x, &out)?;
        if x.dtype != Dtype::F32 {
            return Err(shape_error("gated_residual_rms_norm", "the residual stream must be f32".into()));
        }
        let name = format!("gated_residual_rms_norm_{}_{}", y.dtype.suffix(), out.dtype.suffix());
        let (per, threads) = Self::row_launch(&[(out, 0), (x, 0), (y, 0)], &[gate_modulation, norm_modulation], x.cols);
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(y.ptr),
            Arg::I(i32_of(y.stride, &name)?),
            Arg::P(gate_modulation),
            Arg::P(norm_modulation),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::F(eps),
            Arg::I(per),
        ];
        // SAFETY: matches `gated_residual_rms_norm_*` in norm.cu, which waits for the kernel
        // before it first.
        unsafe { self.launch_maybe_early(early, &name, (x.rows as u32, 1, 1), threads, 0, stream, args) }
    }

    /// The step-boundary row kernels' rows (all of one width) and vectors: one group of 8 columns
    /// per thread in 16-byte pieces (aligned rows and vectors, at most 8192 columns).
    fn row_pieces(rows: &[Mat], vectors: &[DevPtr]) -> bool {
        let pieces = |m: &Mat| m.ptr % 16 == 0 && (m.stride * m.dtype.size()) % 16 == 0 && m.cols % 8 == 0;
        rows.iter().all(|m| pieces(m) && m.cols == rows[0].cols && m.cols / 8 <= 1024) && vectors.iter().all(|p| p % 16 == 0)
    }

    /// Whether [`Kernels::gated_residual_rms_norm_product`] takes these operands (`vectors`: the
    /// two modulations and the weight): an f32 residual and an f32 product over the same rows
    /// of at most [`ROW_PRODUCT_MAX`] columns.
    pub fn gated_residual_rms_norm_product_fits(out: &Mat, x: &Mat, y: &Mat, vectors: &[DevPtr], acc: &Mat) -> bool {
        [x.dtype, acc.dtype] == [Dtype::F32; 2]
            && acc.rows == x.rows
            && (1..=ROW_PRODUCT_MAX).contains(&acc.cols)
            && Self::row_pieces(&[*x, *y, *out], vectors)
    }

    /// Whether [`Kernels::product_rms_norm`] takes these operands (`vectors`: the weight, bias
    /// and modulation, null where absent): f32 rows from an f32 input of [`ROW_PRODUCT_MAX`]
    /// columns in 16-byte aligned rows.
    pub fn product_rms_norm_fits(out: &Mat, x: &Mat, a: &Mat, vectors: &[DevPtr]) -> bool {
        [x.dtype, a.dtype] == [Dtype::F32; 2]
            && a.rows == x.rows
            && a.cols == ROW_PRODUCT_MAX
            && a.ptr % 16 == 0
            && (a.stride * 4) % 16 == 0
            && Self::row_pieces(&[*x, *out], vectors)
    }

    /// `x += y ⊙ gate(gate_modulation)`, `out = rms(x) · (1 + scale) + shift` with
    /// `norm_modulation`, then `acc (+)= bf16(out) · wᵀ + bias` (w bf16 `[acc.cols, x.cols]`,
    /// bias f32 `acc.cols`), one launch of one block per row: the end of an Euler step.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // mirrors the kernel's signature: the norm's and the product's operands
    pub unsafe fn gated_residual_rms_norm_product(
        &self,
        norm: (Mat, Mat, Mat),
        gate_modulation: DevPtr,
        norm_modulation: DevPtr,
        eps: f32,
        w: DevPtr,
        bias: Option<DevPtr>,
        (acc, accumulate): (Mat, bool),
        stream: CUstream,
    ) -> Result<()> {
        let (out, x, y) = norm;
        let what = "gated_residual_rms_norm_product";
        Self::same_shape(what, &x, &y)?;
        Self::same_shape(what, &x, &out)?;
        if !Self::gated_residual_rms_norm_product_fits(&out, &x, &y, &[gate_modulation, norm_modulation, w], &acc) {
            return Err(shape_error(
                what,
                format!(
                    "needs an f32 residual {}x{} (16-byte aligned rows and vectors) and an f32 product of at most \
                     {ROW_PRODUCT_MAX} columns over its rows, got {:?} and {:?} {}x{}",
                    x.rows, x.cols, x.dtype, acc.dtype, acc.rows, acc.cols
                ),
            ));
        }
        let threads = Self::row_threads(x.cols);
        let name = format!("{what}_{}_{}", y.dtype.suffix(), out.dtype.suffix());
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(y.ptr),
            Arg::I(i32_of(y.stride, &name)?),
            Arg::P(gate_modulation),
            Arg::P(norm_modulation),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::F(eps),
            Arg::P(w),
            Arg::P(bias.unwrap_or(0)),
            Arg::P(acc.ptr),
            Arg::I(i32_of(acc.stride, &name)?),
            Arg::I(acc.cols as i32),
            Arg::I(accumulate as i32),
        ];
        // SAFETY: matches `gated_residual_rms_norm_product_*` in norm.cu (null bias: none).
        unsafe { self.launch(&name, (x.rows as u32, 1, 1), threads, stream, args) }
    }

    /// `x = bf16(a) · wᵀ + bias` (a f32 `[rows, 32]`, w bf16 `[x.cols, 32]`, bias f32 `x.cols`),
    /// then `out = rms(x)`, `· (1 + scale) + shift` with `modulation`, one launch of one block
    /// per row: the start of an Euler step.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // mirrors the kernel's signature
    pub unsafe fn product_rms_norm(
        &self,
        out: Mat,
        x: Mat,
        a: Mat,
        w: DevPtr,
        bias: Option<DevPtr>,
        modulation: Option<DevPtr>,
        eps: f32,
        stream: CUstream,
    ) -> Result<()> {
        let what = "product_rms_norm";
        Self::same_shape(what, &x, &out)?;
        if !Self::product_rms_norm_fits(&out, &x, &a, &[w, bias.unwrap_or(0), modulation.unwrap_or(0)]) {
            return Err(shape_error(
                what,
                format!(
                    "needs f32 rows {}x{} (16-byte aligned rows and vectors) from an f32 input of {ROW_PRODUCT_MAX} columns in \
                     16-byte aligned rows, got {:?} from {:?} {}x{}",
                    x.rows, x.cols, x.dtype, a.dtype, a.rows, a.cols
                ),
            ));
        }
        let threads = Self::row_threads(x.cols);
        let name = format!("{what}_{}", out.dtype.suffix());
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(a.ptr),
            Arg::I(i32_of(a.stride, &name)?),
            Arg::P(w),
            Arg::P(bias.unwrap_or(0)),
            Arg::P(modulation.unwrap_or(0)),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::F(eps),
        ];
        // SAFETY: matches `product_rms_norm_*` in norm.cu (null bias or modulation: none).
        unsafe { self.launch(&name, (x.rows as u32, 1, 1), threads, stream, args) }
    }

    /// In place `x = gelu_tanh(x)`.
    ///
    /// # Safety
    /// `x` must be live device memory.
    pub unsafe fn gelu_tanh(&self, x: Mat, stream: CUstream) -> Result<()> {
        let name = format!("gelu_tanh_{}", x.dtype.suffix());
        let per = Self::columns_per_thread(&[(x, x.cols)]);
        let grid = Self::elementwise_grid(x.rows, x.cols.div_ceil(per), &name)?;
        let args =
            [Arg::P(x.ptr), Arg::I(i32_of(x.stride, &name)?), Arg::I(x.rows as i32), Arg::I(i32_of(x.cols, &name)?), Arg::I(per as i32)];
        // SAFETY: matches `gelu_tanh_*` in elementwise.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// `out = gelu_tanh(gate) ⊙ up` with `gate_up = [gate | up]`, each `out.cols` wide.
    ///
    /// # Safety
    /// Both matrices must be live device memory.
    pub unsafe fn gelu_tanh_mul(&self, out: Mat, gate_up: Mat, stream: CUstream) -> Result<()> {
        if gate_up.rows != out.rows || gate_up.cols != 2 * out.cols {
            return Err(shape_error(
                "gelu_tanh_mul",
                format!("gate_up {}x{} for out {}x{}", gate_up.rows, gate_up.cols, out.rows, out.cols),
            ));
        }
        let name = format!("gelu_tanh_mul_{}_{}", gate_up.dtype.suffix(), out.dtype.suffix());
        // The up half starts `out.cols` into each gate_up row: it must be aligned too.
        let per = Self::columns_per_thread(&[(out, out.cols), (gate_up, out.cols)]);
        let grid = Self::elementwise_grid(out.rows, out.cols.div_ceil(per), &name)?;
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(gate_up.ptr),
            Arg::I(i32_of(gate_up.stride, &name)?),
            Arg::I(out.rows as i32),
            Arg::I(i32_of(out.cols, &name)?),
            Arg::I(per as i32),
        ];
        // SAFETY: matches `gelu_tanh_mul_*` in elementwise.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// 8 when every row of every matrix can be read in 16-byte pieces of 8 elements from the
    /// start and from `offset` columns in (and `cols` divides into them), else 1.
    fn columns_per_thread(mats: &[(Mat, usize)]) -> usize {
        let aligned = mats.iter().all(|(m, offset)| {
            let size = m.dtype.size() as u64;
            m.ptr % 16 == 0 && (m.stride as u64 * size) % 16 == 0 && (*offset as u64 * size) % 16 == 0 && m.cols % 8 == 0
        });
        if aligned { 8 } else { 1 }
    }

    /// `out = x ⊙ scale + offset` per column (f32 vectors of `out.cols`); `out` is f32.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    pub unsafe fn affine(&self, out: Mat, x: Mat, scale: DevPtr, offset: DevPtr, stream: CUstream) -> Result<()> {
        Self::same_shape("affine", &out, &x)?;
        if out.dtype != Dtype::F32 {
            return Err(shape_error("affine", "the output must be f32".into()));
        }
        let name = format!("affine_{}", x.dtype.suffix());
        let grid = Self::elementwise_grid(out.rows, out.cols, &name)?;
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(scale),
            Arg::P(offset),
            Arg::I(out.rows as i32),
            Arg::I(i32_of(out.cols, &name)?),
        ];
        // SAFETY: matches `affine_*` in elementwise.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// `out[r] = table[clamp(tokens[r])] · scale` from a bf16 `[vocab, out.cols]` table.
    ///
    /// # Safety
    /// `tokens` (`out.rows` i32) and the table must be live device memory.
    pub unsafe fn embed(&self, out: Mat, tokens: DevPtr, table: DevPtr, vocab: usize, scale: f32, stream: CUstream) -> Result<()> {
        let name = format!("embed_bf16_{}", out.dtype.suffix());
        let grid = Self::elementwise_grid(out.rows, out.cols, &name)?;
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(tokens),
            Arg::P(table),
            Arg::I(i32_of(vocab, &name)?),
            Arg::F(scale),
            Arg::I(out.rows as i32),
            Arg::I(i32_of(out.cols, &name)?),
        ];
        // SAFETY: matches `embed_bf16_*` in elementwise.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// Sets the IF-node handle of the prompt bucket this step runs to 1 and the others to 0
    /// (`prompt_bucket_256`: the smallest of `buckets`, ascending slot counts, that holds the
    /// last valid slot of `token_mask`). Only meaningful in a captured graph that owns `handles`.
    ///
    /// # Safety
    /// `token_mask` must point to `prompt_len` i32 on the device; `handles` must belong to the
    /// graph under capture.
    pub unsafe fn prompt_bucket(
        &self,
        token_mask: DevPtr,
        prompt_len: usize,
        buckets: &[usize],
        handles: &[u64],
        stream: CUstream,
    ) -> Result<()> {
        let name = "prompt_bucket_256";
        if buckets.is_empty() || buckets.len() > MAX_PROMPT_BUCKETS || handles.len() != buckets.len() {
            return Err(shape_error(
                name,
                format!("{} buckets with {} handles (1 to {MAX_PROMPT_BUCKETS} each)", buckets.len(), handles.len()),
            ));
        }
        let (mut b, mut h) = ([0i32; MAX_PROMPT_BUCKETS], [0u64; MAX_PROMPT_BUCKETS]);
        for (i, (&bucket, &handle)) in buckets.iter().zip(handles).enumerate() {
            (b[i], h[i]) = (i32_of(bucket, name)?, handle);
        }
        let args = [
            Arg::P(token_mask),
            Arg::I(i32_of(prompt_len, name)?),
            Arg::I(buckets.len() as i32),
            Arg::I(b[0]),
            Arg::I(b[1]),
            Arg::I(b[2]),
            Arg::I(b[3]),
            Arg::P(h[0]),
            Arg::P(h[1]),
            Arg::P(h[2]),
            Arg::P(h[3]),
        ];
        // SAFETY: matches `prompt_bucket_256` in attention.cu (one block of 256 threads).
        unsafe { self.launch(name, (1, 1, 1), 256, stream, args) }
    }

    /// Validity flags (f32) and RoPE positions (i32) of the `cameras · tokens_per_image +
    /// prompt_len + suffix` slots, from the frame info and the prompt token mask.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated lengths.
    #[allow(clippy::too_many_arguments)] // the op's own fields, one to one
    pub unsafe fn positions(
        &self,
        valid: DevPtr,
        positions: DevPtr,
        frame_info: DevPtr,
        cameras: usize,
        tokens_per_image: usize,
        token_mask: DevPtr,
        prompt_len: usize,
        suffix: usize,
        stream: CUstream,
    ) -> Result<()> {
        let name = "positions_scan_1024";
        let args = [
            Arg::P(valid),
            Arg::P(positions),
            Arg::P(frame_info),
            Arg::I(i32_of(cameras, name)?),
            Arg::I(i32_of(tokens_per_image, name)?),
            Arg::P(token_mask),
            Arg::I(i32_of(prompt_len, name)?),
            Arg::I(i32_of(suffix, name)?),
        ];
        // SAFETY: matches `positions_scan_1024` in attention.cu (one block of 1024 threads).
        unsafe { self.launch(name, (1, 1, 1), 1024, stream, args) }
    }

    /// The RoPE table rows of the sequence's `slots` slots: `cos_rows[s] = cos[positions[s]]` (and
    /// sin), `half` f32 each, for [`RopeArgs`] without positions.
    ///
    /// # Safety
    /// All pointers must be live device memory: `slots` positions, tables with a row for each of
    /// them, and `slots · half` f32 for each output.
    #[allow(clippy::too_many_arguments)] // two outputs, the positions and two tables, one to one
    pub unsafe fn rope_rows_gather(
        &self,
        cos_rows: DevPtr,
        sin_rows: DevPtr,
        positions: DevPtr,
        slots: usize,
        cos: DevPtr,
        sin: DevPtr,
        half: usize,
        stream: CUstream,
    ) -> Result<()> {
        let name = "rope_rows_gather";
        if half % 4 != 0 || [cos_rows, sin_rows, cos, sin].iter().any(|p| p % 16 != 0) || slots == 0 {
            return Err(shape_error(name, format!("needs 16-byte aligned tables of a multiple of 4 columns, got {half} columns")));
        }
        let args = [Arg::P(cos_rows), Arg::P(sin_rows), Arg::P(positions), Arg::P(cos), Arg::P(sin), Arg::I(i32_of(half, name)?)];
        let threads = (half / 4).div_ceil(32).clamp(1, 8) as u32 * 32;
        // SAFETY: matches `rope_rows_gather` in attention.cu: one block per slot.
        unsafe { self.launch(name, (i32_of(slots, name)? as u32, 1, 1), threads, stream, args) }
    }

    /// Rotary embedding of q (in place) and k, k and v written into the caches.
    ///
    /// # Safety
    /// All pointers must be live device memory; the caches must have `cache_row + qkv.rows` rows
    /// and the tables a row for every position the buffer holds.
    pub unsafe fn rope_qkv(&self, a: &RopeArgs, stream: CUstream) -> Result<()> {
        let name = format!("rope_qkv_{}", a.qkv.dtype.suffix());
        if a.k_cache.dtype != a.qkv.dtype
            || a.v_cache.dtype != a.qkv.dtype
            || a.qkv.cols < (a.heads + 2) * a.head_dim
            || a.head_dim % 2 != 0
        {
            return Err(shape_error(
                &name,
                format!("qkv {:?} / caches {:?} {:?} do not fit {} heads of {}", a.qkv, a.k_cache, a.v_cache, a.heads, a.head_dim),
            ));
        }
        // 8 pairs (or 8 values of v) per thread when every piece is 16-byte aligned, the tables'
        // rows included (head_dim / 2 f32 apart).
        let vectors = a.head_dim % 16 == 0
            && Self::columns_per_thread(&[(a.qkv, a.head_dim / 2), (a.k_cache, a.head_dim / 2), (a.v_cache, 0)]) == 8
            && [a.cos, a.sin].iter().all(|p| p % 16 == 0);
        let vector_threads = (a.heads + 1) * a.head_dim / 16 + a.head_dim / 8;
        let (per, threads) = if vectors && vector_threads <= 1024 {
            (8, vector_threads.div_ceil(32) as u32 * 32)
        } else {
            (1, ((a.heads + 1) * a.head_dim / 2).max(a.head_dim).div_ceil(32).clamp(1, 8) as u32 * 32)
        };
        let args = [
            Arg::P(a.qkv.ptr),
            Arg::I(i32_of(a.qkv.stride, &name)?),
            Arg::I(i32_of(a.heads, &name)?),
            Arg::I(i32_of(a.head_dim, &name)?),
            Arg::P(a.positions.unwrap_or(0)),
            Arg::I(i32_of(a.position_offset, &name)?),
            Arg::P(a.k_cache.ptr),
            Arg::I(i32_of(a.k_cache.stride, &name)?),
            Arg::P(a.v_cache.ptr),
            Arg::I(i32_of(a.v_cache.stride, &name)?),
            Arg::I(i32_of(a.cache_row, &name)?),
            Arg::P(a.cos),
            Arg::P(a.sin),
            Arg::I(per),
        ];
        // SAFETY: matches `rope_qkv_*` in attention.cu, which reads qkv only after waiting for the
        // kernel before it.
        unsafe { self.launch_maybe_early(a.early, &name, (a.qkv.rows as u32, 1, 1), threads, 0, stream, args) }
    }

    /// `p = softmax(s)` per row over valid keys: `s` f32 and `p` bf16, both dense
    /// `[heads · queries, keys]`; `key_valid` (f32 flags of the keys) masks keys, `query_valid`
    /// (f32 flags of the queries) zeroes the rows of invalid queries.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // two matrices, their shape and two optional masks
    pub unsafe fn softmax_rows(
        &self,
        p: DevPtr,
        s: DevPtr,
        rows: usize,
        queries: usize,
        keys: usize,
        key_valid: Option<DevPtr>,
        query_valid: Option<DevPtr>,
        stream: CUstream,
    ) -> Result<()> {
        let name = "softmax_rows_masked_f32_bf16";
        if queries == 0 || rows % queries != 0 {
            return Err(shape_error(name, format!("{rows} rows are not whole heads of {queries} queries")));
        }
        let args = [
            Arg::P(p),
            Arg::P(s),
            Arg::I(i32_of(rows, name)?),
            Arg::I(i32_of(queries, name)?),
            Arg::I(i32_of(keys, name)?),
            Arg::P(key_valid.unwrap_or(0)),
            Arg::P(query_valid.unwrap_or(0)),
        ];
        // SAFETY: matches the kernel in attention.cu: one warp per row, 8 rows per block.
        unsafe { self.launch(name, (rows.div_ceil(8) as u32, 1, 1), 256, stream, args) }
    }

    /// Whether [`Kernels::attention_mq256`] and [`Kernels::attention_mh72`] can run on this
    /// device (178 KB from sm_90 on, else 105 KB, and 99 KB of shared memory per block).
    pub fn has_fused_attention(&self) -> bool {
        self.fused_attention
    }

    /// The K split of the down product when [`Kernels::mlp_stream`] runs an MLP of `rows` rows,
    /// `width` features and `hidden` GeGLU features on this device (`multiprocessors` SMs), or
    /// `None` when it cannot: not sm_90a, more than 64 rows, widths not whole 64-column tiles, A
    /// chunks past what a block holds, or more blocks (hidden / 32, one per SM) than SMs. The
    /// split is the largest that gives down no more units than there are blocks.
    pub fn mlp_stream_splits(&self, rows: usize, width: usize, hidden: usize, multiprocessors: usize) -> Option<usize> {
        let (width_chunks, hidden_chunks, blocks) = (width / 64, hidden / 64, hidden / 32);
        if !self.mlp_stream
            || !(1..=64).contains(&rows)
            || width % 64 != 0
            || hidden % 64 != 0
            || !(1..=MLP_A_CHUNKS).contains(&width_chunks)
            || blocks > multiprocessors
        {
            return None;
        }
        (1..=hidden_chunks).rev().find(|&s| hidden_chunks % s == 0 && width_chunks * s <= blocks && hidden_chunks / s <= MLP_A_CHUNKS)
    }

    /// The few-row MLP `out = (gelu(a · w_gateᵀ) ⊙ (a · w_upᵀ)) · w_downᵀ` in one cooperative
    /// launch (mlp.cu), `hidden` receiving the GeGLU output (bf16) and `out` (f32) overwritten.
    /// The weights must be tiled by [`Kernels::retile_weight`] (gate/up paired); `barrier` is a
    /// device word no concurrent launch uses. `programmatic`: launched as a programmatic dependent
    /// of the kernel before it on the stream, which must be the RMS norm writing `a` (it lets the
    /// MLP start early; the MLP waits for it before reading `a`).
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // the op's operands and shape, one to one
    pub unsafe fn mlp_stream(
        &self,
        out: Mat,
        hidden: Mat,
        a: Mat,
        w_gate_up: DevPtr,
        w_down: DevPtr,
        barrier: DevPtr,
        multiprocessors: usize,
        programmatic: bool,
        stream: CUstream,
    ) -> Result<()> {
        let what = "mlp_stream_wgmma";
        let (rows, width, hid) = (a.rows, a.cols, hidden.cols);
        let splits = self.mlp_stream_splits(rows, width, hid, multiprocessors);
        let aligned = |m: &Mat, bytes: u64| m.ptr % 16 == 0 && (m.stride as u64 * m.dtype.size() as u64) % bytes == 0;
        let Some(splits) = splits.filter(|_| {
            (a.dtype, hidden.dtype, out.dtype) == (Dtype::Bf16, Dtype::Bf16, Dtype::F32)
                && (hidden.rows, out.rows, out.cols) == (rows, rows, width)
                && aligned(&a, 16)
                && aligned(&hidden, 16)
                && aligned(&out, 16)
                && barrier % 4 == 0
        }) else {
            return Err(shape_error(
                what,
                format!(
                    "needs bf16 a [1-64 rows, 64·(1-16)], bf16 hidden [rows, 64·n], f32 out [rows, a's width], 16-byte aligned rows, \
                     sm_90a with hidden / 32 ≤ {multiprocessors} SMs; got a {}x{} {:?}, hidden {}x{} {:?}, out {}x{} {:?}",
                    a.rows, a.cols, a.dtype, hidden.rows, hidden.cols, hidden.dtype, out.rows, out.cols, out.dtype
                ),
            ));
        };
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, what)?),
            Arg::P(hidden.ptr),
            Arg::I(i32_of(hidden.stride, what)?),
            Arg::P(a.ptr),
            Arg::I(i32_of(a.stride, what)?),
            Arg::P(w_gate_up),
            Arg::P(w_down),
            Arg::I(rows as i32),
            Arg::I(width as i32),
            Arg::I(i32_of(hid, what)?),
            Arg::I(splits as i32),
            Arg::P(barrier),
        ];
        // Cooperative: the blocks meet at a grid barrier, so all must be resident at once.
        // SAFETY: the attribute value is a plain C union; all-zero bytes are a valid value.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.cooperative = 1;
        let cooperative = sys::CUlaunchAttribute { id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, pad: [0; 4], value };
        let mut attrs = [cooperative, programmatic_attribute()];
        let attrs = if programmatic { &mut attrs[..] } else { &mut attrs[..1] };
        // SAFETY: the arguments match `mlp_stream_wgmma`'s signature: 160 threads, one block per 32
        // GeGLU columns; it waits for the norm before it (programmatic) before reading `a`.
        unsafe { self.launch_with_attributes(what, ((hid / 32) as u32, 1, 1), 160, MLP_SHARED_BYTES, stream, args, attrs) }
    }

    /// Copies the row-major bf16 weight `src` (`[n, k]`) into `out` as [`Kernels::mlp_stream`]
    /// reads it: 64 × 64 swizzled tiles, with `paired_half` > 0 each tile's rows 32-63 the rows
    /// `paired_half` below its rows 0-31 (gate/up).
    ///
    /// # Safety
    /// `out` and `src` must be live, disjoint device memory of `n · k` bf16.
    pub unsafe fn retile_weight(&self, out: DevPtr, src: DevPtr, n: usize, k: usize, paired_half: usize, stream: CUstream) -> Result<()> {
        let what = "retile_weight";
        let rows_ok = if paired_half > 0 { n == 2 * paired_half && paired_half % 32 == 0 } else { n % 64 == 0 };
        if !rows_ok || k == 0 || k % 64 != 0 || out % 16 != 0 || src % 16 != 0 {
            return Err(shape_error(what, format!("{n}x{k} (paired half {paired_half}) is not whole 64 x 64 tiles")));
        }
        let pieces = n * k / 8;
        let args = [Arg::P(out), Arg::P(src), Arg::I(i32_of(n, what)?), Arg::I(i32_of(k, what)?), Arg::I(i32_of(paired_half, what)?)];
        // SAFETY: matches `retile_weight` in mlp.cu: one thread per 16-byte piece.
        unsafe { self.launch(what, (pieces.div_ceil(256) as u32, 1, 1), 256, stream, args) }
    }

    /// How to split `keys` for `rows` (query × head) rows so that about `target_blocks` blocks
    /// run; few rows (the action tokens) take several splits. Scratch sizing at open and the
    /// lowering both ask here.
    pub fn attention_split(rows: usize, keys: usize, target_blocks: usize) -> AttentionSplit {
        let (row_tiles, chunks) = (rows.div_ceil(ATTENTION_ROWS).max(1), keys.div_ceil(ATTENTION_SPLIT_KEYS).max(1));
        let wanted = target_blocks.div_ceil(row_tiles).clamp(1, chunks);
        let keys_per_split = chunks.div_ceil(wanted) * ATTENTION_SPLIT_KEYS;
        let splits = keys.div_ceil(keys_per_split).max(1);
        let partial_lens = if splits > 1 { (splits * rows * ATTENTION_HEAD_DIM, splits * rows * 2) } else { (0, 0) };
        AttentionSplit { splits, keys_per_split, partial_lens }
    }

    /// Fused multi-query attention, head dimension 256: `softmax(q kᵀ / 16) v` per head with the
    /// masks of [`AttentionArgs`], in one launch (plus a merge of the splits when there are
    /// several).
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes; the partial buffers must
    /// not be in use by a concurrent launch.
    pub unsafe fn attention_mq256(&self, args: &AttentionArgs, stream: CUstream) -> Result<()> {
        let what = "attention_mq256";
        let AttentionArgs { q, k, v, out, heads, split, .. } = *args;
        let d = ATTENTION_HEAD_DIM;
        if !self.fused_attention {
            return Err(shape_error(
                what,
                format!("the device does not grant {} bytes of shared memory per block", self.attention_shared_bytes),
            ));
        }
        if [q.dtype, k.dtype, v.dtype] != [Dtype::Bf16; 3]
            || heads == 0
            || q.cols != heads * d
            || (out.rows, out.cols) != (q.rows, q.cols)
            || k.cols != d
            || (v.rows, v.cols) != (k.rows, k.cols)
        {
            return Err(shape_error(
                what,
                format!(
                    "needs bf16 q [queries, {heads}·{d}] and k/v [keys, {d}], out like q, got q {}x{} {:?}, k {}x{}, v {}x{}, out {}x{}",
                    q.rows, q.cols, q.dtype, k.rows, k.cols, v.rows, v.cols, out.rows, out.cols
                ),
            ));
        }
        if k.rows == 0 {
            return Err(shape_error(what, "no keys".into()));
        }
        if [q, k, v, out].iter().any(|m| m.ptr % 16 != 0 || m.stride % 8 != 0) || args.partial_o % 16 != 0 {
            return Err(shape_error(what, "q, k, v, out and the partial outputs must be 16-byte aligned".into()));
        }
        let (rows, keys) = (q.rows * heads, k.rows);
        if split.splits == 0 || split.keys_per_split % ATTENTION_SPLIT_KEYS != 0 || split.splits * split.keys_per_split < keys {
            return Err(shape_error(what, format!("{split:?} does not cover {keys} keys in whole chunks")));
        }
        // The Hopper form reads K and V (and Q, when its heads tile 64 rows) by bulk tensor
        // copies; the maps are encoded here, at capture, and travel in the graph's launch
        // parameters.
        let hopper = self.attention_kernel == "attention_mq256_wgmma";
        let (early, keys_ready) = match args.keys_ready {
            Some(n) if hopper => (true, n.min(keys)),
            _ => (false, 0),
        };
        let (q_map, k_map, v_map) = if hopper {
            (TensorMap::bf16_query_heads_64(&q, heads, what)?, TensorMap::bf16_rows_64x64(&k, what)?, TensorMap::bf16_rows_64x64(&v, what)?)
        } else {
            (None, TensorMap::UNUSED, TensorMap::UNUSED)
        };
        let args_list = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, what)?),
            Arg::P(q.ptr),
            Arg::I(i32_of(q.stride, what)?),
            Arg::P(k.ptr),
            Arg::I(i32_of(k.stride, what)?),
            Arg::P(v.ptr),
            Arg::I(i32_of(v.stride, what)?),
            Arg::P(args.key_valid.unwrap_or(0)),
            Arg::P(args.query_valid.unwrap_or(0)),
            Arg::I(i32_of(q.rows, what)?),
            Arg::I(i32_of(heads, what)?),
            Arg::I(i32_of(keys, what)?),
            Arg::I(i32_of(split.keys_per_split, what)?),
            Arg::F(std::f32::consts::LOG2_E / (d as f32).sqrt()),
            Arg::P(args.partial_o),
            Arg::P(args.partial_ml),
            Arg::I(i32_of(keys_ready, what)?),
            Arg::I(q_map.is_some() as i32),
            Arg::M(q_map.unwrap_or(TensorMap::UNUSED)),
            Arg::M(k_map),
            Arg::M(v_map),
        ];
        let grid = (rows.div_ceil(ATTENTION_ROWS) as u32, split.splits as u32, 1);
        let name = format!("{}_{}", self.attention_kernel, out.dtype.suffix());
        // SAFETY: matches `attention_mq256_*` and `attention_mq256_wgmma_*` (the same signature):
        // 128 threads, grid (row tiles, splits), the shared memory granted at load; the Hopper
        // form waits for the kernel before it before reading Q or keys from `keys_ready` on.
        unsafe { self.launch_maybe_early(early, &name, grid, 128, self.attention_shared_bytes, stream, args_list)? };
        if split.splits == 1 {
            return Ok(());
        }
        let name = &format!("attention_mq256_combine_{}", out.dtype.suffix());
        let combine = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, name)?),
            Arg::P(args.partial_o),
            Arg::P(args.partial_ml),
            Arg::P(args.query_valid.unwrap_or(0)),
            Arg::I(i32_of(q.rows, name)?),
            Arg::I(i32_of(heads, name)?),
            Arg::I(split.splits as i32),
        ];
        // SAFETY: matches `attention_mq256_combine`: blocks of 256 threads, ATTENTION_MERGE_ROWS rows each.
        unsafe { self.launch(name, (rows.div_ceil(ATTENTION_MERGE_ROWS) as u32, 1, 1), 256, stream, combine) }
    }

    /// Fused attention of SigLIP's shape: `heads` heads of dimension 72, each with its own K/V
    /// head, per group (camera) of `q.rows / groups` queries over `k.rows / groups` keys (at most
    /// [`VISION_MAX_KEYS`]), no masks: `softmax(q kᵀ / √72) v` in one launch.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // the op's operands and shape, one to one
    pub unsafe fn attention_mh72(&self, out: Mat, q: Mat, k: Mat, v: Mat, heads: usize, groups: usize, stream: CUstream) -> Result<()> {
        let name = format!("attention_mh72_{}", out.dtype.suffix());
        let d = VISION_HEAD_DIM;
        if !self.fused_attention {
            return Err(shape_error(&name, format!("the device does not grant {VISION_SHARED_BYTES} bytes of shared memory per block")));
        }
        let (rows, keys) = (q.rows / groups.max(1), k.rows / groups.max(1));
        if [q.dtype, k.dtype, v.dtype] != [Dtype::Bf16; 3]
            || heads == 0
            || groups == 0
            || [q.cols, k.cols, v.cols] != [heads * d; 3]
            || (out.rows, out.cols) != (q.rows, q.cols)
            || v.rows != k.rows
            || rows * groups != q.rows
            || keys * groups != k.rows
            || !(1..=VISION_MAX_KEYS).contains(&keys)
        {
            return Err(shape_error(
                &name,
                format!(
                    "needs bf16 q/k/v [{groups} groups of rows, {heads}·{d}] with 1 to {VISION_MAX_KEYS} keys per group, out like q; got q {}x{} {:?}, k {}x{}, v {}x{}, out {}x{}",
                    q.rows, q.cols, q.dtype, k.rows, k.cols, v.rows, v.cols, out.rows, out.cols
                ),
            ));
        }
        if [q, k, v, out].iter().any(|m| m.ptr % 16 != 0 || m.stride % 8 != 0) {
            return Err(shape_error(&name, "q, k, v and out rows must be 16-byte aligned (8-element strides)".into()));
        }
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(q.ptr),
            Arg::I(i32_of(q.stride, &name)?),
            Arg::P(k.ptr),
            Arg::I(i32_of(k.stride, &name)?),
            Arg::P(v.ptr),
            Arg::I(i32_of(v.stride, &name)?),
            Arg::I(i32_of(rows, &name)?),
            Arg::I(i32_of(keys, &name)?),
            Arg::F(std::f32::consts::LOG2_E / (d as f32).sqrt()),
        ];
        let grid = (rows.div_ceil(VISION_ROWS) as u32, i32_of(heads, &name)? as u32, i32_of(groups, &name)? as u32);
        // SAFETY: matches `attention_mh72_*`: its threads, grid (query tiles, heads, groups), the
        // shared memory granted at load.
        unsafe { self.launch_with_shared(&name, grid, VISION_THREADS, VISION_SHARED_BYTES, stream, args) }
    }

    /// Resize-with-pad, normalise and patchify camera `camera` of the staged u8 frames into `out`
    /// (`[(size / patch)², 3 · patch²]`).
    ///
    /// # Safety
    /// `frames` must be device-accessible (device or mapped pinned host memory) holding
    /// `frame_stride` bytes per camera; `frame_info` 4 i32 per camera.
    #[allow(clippy::too_many_arguments)] // the op's own fields, one to one
    pub unsafe fn image_patches(
        &self,
        out: Mat,
        frames: DevPtr,
        frame_stride: usize,
        frame_info: DevPtr,
        camera: usize,
        size: usize,
        patch: usize,
        stream: CUstream,
    ) -> Result<()> {
        let name = format!("image_patches_u8_{}", out.dtype.suffix());
        if patch == 0 || size % patch != 0 || out.rows != (size / patch).pow(2) || out.cols != 3 * patch * patch {
            return Err(shape_error(&name, format!("{}x{} output for size {size}, patch {patch}", out.rows, out.cols)));
        }
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(frames),
            Arg::L(frame_stride as i64),
            Arg::P(frame_info),
            Arg::I(i32_of(camera, &name)?),
            Arg::I(i32_of(size, &name)?),
            Arg::I(i32_of(patch, &name)?),
        ];
        // SAFETY: matches `image_patches_u8_*` in image.cu (one thread per output pixel).
        unsafe { self.launch(&name, ((size * size).div_ceil(256) as u32, 1, 1), 256, stream, args) }
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        for &m in &self.modules {
            // SAFETY: each module was loaded by `load` and is unloaded once; failures at teardown
            // (e.g. a context already destroyed) leave nothing to recover.
            let _ = unsafe { result::module::unload(m) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mat(ptr: DevPtr, rows: usize, cols: usize, stride: usize, dtype: Dtype) -> Mat {
        Mat { ptr, rows, cols, stride, dtype }
    }

    #[test]
    fn the_wgmma_kernels_are_asked_for_on_sm_90a_only() {
        let wgmma = |arch: &str| {
            kernel_names(arch)
                .iter()
                .filter(|n| n.starts_with("attention_mq256_wgmma") || n.starts_with("mlp_stream") || *n == "retile_weight")
                .count()
        };
        assert_eq!(wgmma("sm_90a"), 4);
        for arch in ["sm_87", "sm_90", "sm_110"] {
            assert_eq!(wgmma(arch), 0, "{arch}");
        }
        assert_eq!(kernel_names("sm_90a").len(), kernel_names("sm_90").len() + 4);
        // MLP_SHARED_BYTES in mlp.cu: 1024 + (8 + 16) · 8 KB.
        assert_eq!(MLP_SHARED_BYTES, 197_632);
        // ATTW_SHARED_BYTES in attention.cu: 1024 + 5 · 32 KB + 2 · 64 · 4 + 4 · 8.
        assert_eq!(ATTENTION_WGMMA_SHARED_BYTES, 165_408);
        assert_eq!(crate::device_arch(9, 0, true), "sm_90a");
        assert_eq!(crate::device_arch(9, 0, false), "sm_90");
        assert_eq!(crate::device_arch(8, 7, true), "sm_87");
        assert_eq!(crate::device_arch(11, 0, true), "sm_110");
    }

    #[test]
    fn attention_splits_cover_the_keys_in_whole_chunks() {
        // The expert: 50 queries × 8 heads over 762 keys on 132 SMs.
        let split = Kernels::attention_split(400, 762, 132);
        assert_eq!((split.splits, split.keys_per_split), (12, 64));
        assert_eq!(split.partial_lens, (12 * 400 * ATTENTION_HEAD_DIM, 12 * 400 * 2));
        for (rows, keys, blocks) in [(1, 1, 132), (64, 31, 8), (400, 762, 16), (712 * 8, 712, 132), (8, 5000, 132)] {
            let s = Kernels::attention_split(rows, keys, blocks);
            assert!(s.keys_per_split % ATTENTION_SPLIT_KEYS == 0 && s.splits * s.keys_per_split >= keys, "{s:?}");
            assert!((s.splits - 1) * s.keys_per_split < keys, "an empty split: {s:?}");
            assert_eq!(s.partial_lens == (0, 0), s.splits == 1, "{s:?}");
        }
    }

    #[test]
    fn attention_chunks_follow_the_architecture() {
        assert_eq!(attention_chunk_keys("sm_87"), 32);
        assert_eq!(attention_chunk_keys("sm_90"), 64);
        assert_eq!(attention_chunk_keys("sm_90a"), 64);
        assert_eq!(attention_chunk_keys("sm_110"), 64);
        // Orin's 163 KB hold the 32-key chunks; the H200's 227 KB the 64-key ones.
        assert_eq!(attention_shared_bytes(32), 107_776);
        assert_eq!(attention_shared_bytes(64), 178_688);
        assert_eq!(ATTENTION_SPLIT_KEYS % 64, 0);
    }

    #[test]
    fn row_kernels_take_eight_columns_per_thread_only_on_aligned_rows() {
        let f32_rows = mat(256, 50, 1024, 1024, Dtype::F32);
        let bf16_rows = mat(512, 50, 1024, 1024, Dtype::Bf16);
        assert_eq!(Kernels::row_launch(&[(f32_rows, 0), (bf16_rows, 0)], &[4096], 1024), (8, 128));
        // SigLIP's 1152 columns: 144 groups, 160 threads (16 of them idle).
        assert_eq!(Kernels::row_launch(&[(mat(0, 512, 1152, 1152, Dtype::Bf16), 0)], &[], 1152), (8, 160));
        // An odd stride, an unaligned vector, a width that is not whole groups, a row too wide.
        assert_eq!(Kernels::row_launch(&[(mat(0, 4, 1024, 1027, Dtype::Bf16), 0)], &[], 1024).0, 1);
        assert_eq!(Kernels::row_launch(&[(bf16_rows, 0)], &[4100], 1024).0, 1);
        assert_eq!(Kernels::row_launch(&[(mat(0, 4, 1021, 1024, Dtype::F32), 0)], &[], 1021).0, 1);
        assert_eq!(Kernels::row_launch(&[(mat(0, 4, 16384, 16384, Dtype::Bf16), 0)], &[], 16384), (1, 256));
    }
}

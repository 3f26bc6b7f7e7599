//! Loaded modules and typed launchers. A launcher checks shapes, picks the kernel instantiation
//! for the operands' element types and enqueues it on `stream`; it never allocates device memory.

use std::ffi::{CString, c_void};

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUfunction, CUmodule, CUstream};

use crate::compile::{Cubin, arch_number};
use crate::{KernelError, Result};

pub mod attention;
pub mod elementwise;
pub mod mlp;
mod norm;
pub mod sequence;

/// A device address (`CUdeviceptr`).
pub type DevPtr = u64;

/// Element type of an activation buffer on the device. `E4m3` (FP8, one byte) is only the
/// operand of an FP8 product: written by [`Kernels::quantize_e4m3`], read by cuBLASLt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    F32,
    Bf16,
    E4m3,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
            Dtype::E4m3 => 1,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::E4m3 => "e4m3",
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

/// Rows (query × head) per block of `attention_mq256` (attention_mq256.cu), and keys per split: a
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
/// Its dynamic shared memory (ATT_SHARED_BYTES in attention_mq256.cu) for chunks of `keys` keys: the Q
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

/// Keys per chunk of `attention_mq256` as compiled for `arch` ("sm_90"): ATT_KEYS in attention_mq256.cu.
fn attention_chunk_keys(arch: &str) -> usize {
    if arch_number(arch).is_some_and(|n| n >= 90) { 64 } else { 32 }
}

/// The head dimensions `attention_hd{D}` (attention_heads.cu) is compiled for, each with the most
/// keys per group it holds in shared memory: SigLIP (72), GR00T's vision tower and VL
/// self-attention (64), its DiT (48) and its Qwen3 decoder (128).
pub const HEADS_ATTENTION: [(usize, usize); 4] = [(48, 320), (64, 320), (72, 256), (128, 256)];
/// The head dimensions `attention_hd{D}_e4m3` is compiled for (sm_89 on): an attention writing
/// the input of an FP8 output projection in e4m3 (GR00T's DiT and vision tower, SigLIP).
pub const HEADS_ATTENTION_E4M3: [usize; 3] = [48, 64, 72];
/// Query rows and threads per block of `attention_hd{D}` (AH_ROWS, AH_THREADS).
const HEADS_ROWS: usize = 64;
const HEADS_THREADS: u32 = 256;
/// Its dynamic shared memory (AhShape::shared_bytes): the Q tile and every key's K and V, in rows
/// of the head dimension padded to 16, plus 8 against bank conflicts.
const fn heads_shared_bytes(head_dim: usize, max_keys: usize) -> u32 {
    ((HEADS_ROWS + 2 * max_keys) * (head_dim.div_ceil(16) * 16 + 8) * 2) as u32
}

/// The most keys per group `attention_hd{head_dim}` holds, `None` when no form has that head
/// dimension.
pub fn heads_attention_max_keys(head_dim: usize) -> Option<usize> {
    HEADS_ATTENTION.iter().find(|(d, _)| *d == head_dim).map(|&(_, keys)| keys)
}

/// Kernel argument as the C signature takes it; `params` points at these while launching.
#[derive(Clone, Copy)]
enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
    D(f64),
    M(TensorMap),
}

impl Arg {
    fn as_param(&self) -> *mut c_void {
        match self {
            Arg::P(v) => v as *const u64 as *mut c_void,
            Arg::I(v) => v as *const i32 as *mut c_void,
            Arg::L(v) => v as *const i64 as *mut c_void,
            Arg::F(v) => v as *const f32 as *mut c_void,
            Arg::D(v) => v as *const f64 as *mut c_void,
            Arg::M(v) => v as *const TensorMap as *mut c_void,
        }
    }
}

/// Dynamic shared memory of `mlp_stream_wgmma*` (mlp.cu: MLP_SHARED_BYTES): alignment slack, eight
/// weight stages and sixteen 128-byte column chunks of A, 8 KB each.
const MLP_SHARED_BYTES: u32 = 1024 + (8 + MLP_A_CHUNKS as u32) * 8192;
/// Most columns of the narrow side of the step-boundary row kernels (norm.cu's ROW_PRODUCT_MAX).
pub const ROW_PRODUCT_MAX: usize = 32;

/// The streamed kernels of mlp.cu (sm_90a), each granted MLP_SHARED_BYTES.
const STREAMED: [&str; 4] = ["mlp_stream_wgmma", "mlp_stream_wgmma_e4m3", "product_stream_wgmma_e4m3", "qkv_rope_stream_wgmma_e4m3"];

/// Most 128-byte column chunks of A a block of `mlp_stream_wgmma*` holds (MLP_A_CHUNKS): 64
/// columns of bf16, 128 of e4m3.
const MLP_A_CHUNKS: usize = 16;

const IN_OUT: [&str; 7] =
    ["layer_norm", "rms_norm", "gated_residual_rms_norm", "gated_residual_rms_norm_product", "copy", "gated_activation", "scatter_rows"];
/// The `IN_OUT` kernels also instantiated into e4m3 (`FOR_IN_E4M3`, sm_89 on): the producers of
/// FP8 products' inputs.
const INTO_E4M3: [&str; 4] = ["layer_norm", "rms_norm", "gated_residual_rms_norm", "gated_activation"];
const TYPED: [&str; 15] = [
    "product_rms_norm",
    "gated_residual",
    "activation",
    "affine",
    "embed_bf16",
    "rope_qkv",
    "rope_qkv_axes",
    "image_patches_u8",
    "qwen_image_patchify",
    "attention_mq256",
    "attention_mq256_combine",
    "attention_hd48",
    "attention_hd64",
    "attention_hd72",
    "attention_hd128",
];
const SINGLE: [&str; 13] = [
    "add_table_f32",
    "select_weights",
    "rtc_guide_f32",
    "rtc_prefix_f32",
    "rtc_euler_f32",
    "copy_host_inputs",
    "positions_scan_1024",
    "prompt_bucket_256",
    "rope_rows_gather",
    "softmax_rows_masked_f32_bf16",
    "qwen_image_weights",
    "qwen_image_resample",
    "qwen_image_area",
];

/// A driver tensor map (`CUtensorMap`, 128 opaque bytes) passed by value: attention_mq256.cu's
/// `TensorMap`. Aligned as CUDA 13 declares it (12 asks for 64).
#[derive(Clone, Copy)]
#[repr(C, align(128))]
struct TensorMap([u64; 16]);

/// Whether modules compiled for `arch` hold the warpgroup-MMA forms (attention_mq256.cu's
/// `attention_mq256_wgmma`): sm_90a, the arch-specific target of the H100/H200.
pub fn has_wgmma(arch: &str) -> bool {
    arch == "sm_90a"
}

/// Whether modules compiled for `arch` hold the FP8 kernels (fp8.cu): sm_89 on, the GPUs with FP8
/// tensor cores and the e4m3 conversion instruction.
pub fn has_fp8(arch: &str) -> bool {
    crate::compile::arch_number(arch).is_some_and(|n| n >= 89)
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
        names.extend(STREAMED.iter().map(|n| n.to_string()));
        names.push("retile_weight".to_string());
    }
    if has_fp8(arch) {
        names.extend(types.map(|t| format!("quantize_e4m3_{t}")));
        names.push("attention_mq256_combine_e4m3".to_string());
        for base in INTO_E4M3 {
            names.extend(types.map(|t| format!("{base}_{t}_e4m3")));
        }
        names.extend(HEADS_ATTENTION_E4M3.map(|d| format!("attention_hd{d}_e4m3")));
        names.push("gated_activation_e4m3_e4m3".to_string());
    }
    names
}

/// A cooperative launch: all blocks resident at once (the streamed kernels' grid barrier).
fn cooperative_attribute() -> sys::CUlaunchAttribute {
    // SAFETY: the attribute value is a plain C union; all-zero bytes are a valid value.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.cooperative = 1;
    sys::CUlaunchAttribute { id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, pad: [0; 4], value }
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
    /// Whether the streamed kernels (`STREAMED`) are loaded (sm_90a) and granted their shared memory.
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
            let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            let mut granted = true;
            for name in STREAMED {
                let f = kernels.function(name)?;
                // SAFETY: `f` is a resolved function of a loaded module; the value is a byte count.
                granted &= unsafe { sys::cuFuncSetAttribute(f, attr, MLP_SHARED_BYTES as i32) }.result().is_ok();
            }
            kernels.mlp_stream = granted;
        }
        let heads = HEADS_ATTENTION.map(|(d, keys)| (format!("attention_hd{d}"), heads_shared_bytes(d, keys)));
        let fused = [(kernels.attention_kernel.to_string(), kernels.attention_shared_bytes)].into_iter().chain(heads);
        let with_e4m3 = |base: &str| has_fp8(arch) && HEADS_ATTENTION_E4M3.iter().any(|d| base == format!("attention_hd{d}"));
        for (base, bytes) in fused {
            let dtypes: &[&str] = if with_e4m3(&base) { &["bf16", "f32", "e4m3"] } else { &["bf16", "f32"] };
            for dtype in dtypes {
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

    /// 8 when every row of every matrix can be read in 16-byte pieces of 8 elements from the
    /// start and from `offset` columns in (and `cols` divides into them), else 1.
    fn columns_per_thread(mats: &[(Mat, usize)]) -> usize {
        let aligned = mats.iter().all(|(m, offset)| {
            let size = m.dtype.size() as u64;
            m.ptr % 16 == 0 && (m.stride as u64 * size) % 16 == 0 && (*offset as u64 * size) % 16 == 0 && m.cols % 8 == 0
        });
        if aligned { 8 } else { 1 }
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
                .filter(|n| {
                    n.starts_with("attention_mq256_wgmma")
                        || n.starts_with("mlp_stream")
                        || n.starts_with("product_stream")
                        || n.starts_with("qkv_rope_stream")
                        || *n == "retile_weight"
                })
                .count()
        };
        assert_eq!(wgmma("sm_90a"), 7);
        for arch in ["sm_87", "sm_90", "sm_110"] {
            assert_eq!(wgmma(arch), 0, "{arch}");
        }
        assert_eq!(kernel_names("sm_90a").len(), kernel_names("sm_90").len() + 7);
        // MLP_SHARED_BYTES in mlp.cu: 1024 + (8 + 16) · 8 KB.
        assert_eq!(MLP_SHARED_BYTES, 197_632);
        // ATTW_SHARED_BYTES in attention_mq256.cu: 1024 + 5 · 32 KB + 2 · 64 · 4 + 4 · 8.
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

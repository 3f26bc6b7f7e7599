//! cuBLASLt matrix products with descriptors, layouts and the algorithm chosen once at open.
//!
//! Everything is stated in cuBLAS's column-major terms. A row-major `[rows, cols]` matrix with
//! row stride `ld` is, to cuBLAS, a column-major `cols × rows` matrix with leading dimension `ld`,
//! so the plan's `out[M,N] = a[M,K] · w[N,K]ᵀ` becomes `outᵀ (N×M) = op_T(W: K×N) · aᵀ (K×M)`.

use std::ffi::c_void;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use flashrt_kernels::{DevPtr, Dtype};

/// The cuBLASLt workspace every product may use (NVIDIA recommends 32 MiB on Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// One operand in column-major terms: the stored matrix is `rows × cols` with leading dimension
/// `ld`; `transpose` applies `op_T` to it.
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    pub ptr: DevPtr,
    pub dtype: Dtype,
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
    pub transpose: bool,
    /// Elements from one batch entry to the next (0 broadcasts one matrix to every entry).
    pub batch_stride: usize,
}

/// `d = alpha · op(a) · op(b) + beta · d (+ bias)`, `batch` times.
#[derive(Clone, Copy, Debug)]
pub struct MatmulSpec {
    pub a: Operand,
    pub b: Operand,
    /// The output, also the accumulator when `beta` is 1 (C and D are the same matrix).
    pub d: Operand,
    pub batch: usize,
    pub alpha: f32,
    pub beta: f32,
    /// One value per output row (per output feature of the row-major view), D's element type.
    pub bias: Option<DevPtr>,
    /// GELU (tanh approximation, cuBLASLt's) applied to the result, after the bias.
    pub gelu: bool,
    /// An FP8 product (A and B in e4m3): the device address of A's per-tensor scale (f32), with
    /// B's `super::fp8::SCALE_STRIDE` bytes on. A bias is then bf16 whatever D's type (cuBLASLt's
    /// FP8 bias type).
    pub scales: Option<DevPtr>,
    /// With `scales` and D in e4m3: the device address of the f32 that D is multiplied by, after
    /// the bias and the GELU, before it is rounded (the inverse input scale of the FP8 product
    /// that reads D). C is then not read (beta 0), and cuBLASLt types it as the bias (bf16).
    pub d_scale: Option<DevPtr>,
    /// With `scales`: Hopper's fast FP8 accumulation (fewer accumulator bits inside the tensor
    /// core, no periodic promotion to f32), as `Switches::fp8_fast_accumulation` asks.
    pub fast_accumulation: bool,
}

impl MatmulSpec {
    /// The same product for batch entry `i` alone (used when cuBLASLt rejects a batched form).
    pub fn entry(&self, i: usize) -> MatmulSpec {
        let at = |o: Operand| Operand { ptr: o.ptr + (i * o.batch_stride * o.dtype.size()) as u64, batch_stride: 0, ..o };
        MatmulSpec { a: at(self.a), b: at(self.b), d: at(self.d), batch: 1, ..*self }
    }
}

/// How many of the heuristic's algorithms are kept as candidates for timing at open.
const CANDIDATES: usize = 8;

/// A ready-to-launch product: descriptors and the heuristic's candidate algorithms, owned; the
/// first candidate is used until [`Matmul::choose`] picks another (timed at open).
pub struct Matmul {
    spec: MatmulSpec,
    desc: sys::cublasLtMatmulDesc_t,
    /// A, B, C and D (C is D's but for an e4m3 D).
    layouts: [sys::cublasLtMatrixLayout_t; 4],
    algos: Vec<sys::cublasLtMatmulAlgo_t>,
    chosen: usize,
}

fn data_type(d: Dtype) -> sys::cudaDataType {
    match d {
        Dtype::F32 => sys::cudaDataType::CUDA_R_32F,
        Dtype::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        Dtype::E4m3 => sys::cudaDataType::CUDA_R_8F_E4M3,
    }
}

/// Largest power of two (≤ 256) dividing every byte offset a kernel may form from this operand:
/// the base address, the leading dimension and the batch stride.
fn alignment(o: &Operand) -> u32 {
    let size = o.dtype.size() as u64;
    let mut bytes = o.ptr | (o.ld as u64 * size) | 256;
    if o.batch_stride > 0 {
        bytes |= o.batch_stride as u64 * size;
    }
    1 << bytes.trailing_zeros().min(8)
}

fn cublas(what: &str) -> impl FnOnce(lt::CublasError) -> String + '_ {
    move |e| format!("cuBLASLt {what}: {e:?}")
}

impl Matmul {
    /// Builds descriptors and asks the heuristic for the best algorithm for exactly this shape,
    /// these alignments and the shared workspace.
    pub fn new(handle: sys::cublasLtHandle_t, spec: MatmulSpec) -> Result<Matmul, String> {
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
            .map_err(cublas("matmul descriptor"))?;
        // Partially built descriptors are released by Drop on every early return below.
        let mut mm = Matmul { spec, desc, layouts: [std::ptr::null_mut(); 4], algos: Vec::new(), chosen: 0 };
        // SAFETY: every attribute value below has the type cuBLASLt documents for it (int32 for
        // transposes and batch counts, uint32 for epilogue and alignments, int64 strides, uint64
        // workspace, a device pointer for the bias), passed by address with its exact size.
        unsafe {
            let set_desc = |attr, value: *const c_void, size| {
                lt::set_matmul_desc_attribute(desc, attr, value, size).map_err(cublas("descriptor attribute"))
            };
            for (attr, op) in [
                (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &spec.a),
                (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &spec.b),
            ] {
                let t: i32 = op.transpose as i32; // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
                set_desc(attr, &t as *const i32 as *const c_void, 4)?;
            }
            use sys::cublasLtEpilogue_t::*;
            let epilogue = match (spec.bias.is_some(), spec.gelu) {
                (false, false) => None,
                (true, false) => Some(CUBLASLT_EPILOGUE_BIAS),
                (false, true) => Some(CUBLASLT_EPILOGUE_GELU),
                (true, true) => Some(CUBLASLT_EPILOGUE_GELU_BIAS),
            };
            if let Some(epilogue) = epilogue {
                let epilogue = epilogue as u32;
                set_desc(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue as *const u32 as *const c_void, 4)?;
            }
            if let Some(bias) = spec.bias.as_ref() {
                set_desc(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias as *const u64 as *const c_void, 8)?;
            }
            if let Some(scales) = spec.scales {
                use sys::cublasLtMatmulDescAttributes_t::*;
                let (a_scale, b_scale) = (scales, scales + super::fp8::SCALE_STRIDE);
                set_desc(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale as *const u64 as *const c_void, 8)?;
                set_desc(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale as *const u64 as *const c_void, 8)?;
                // Full f32 accumulation unless asked otherwise, as the calibration measured and the
                // CPU emulation computes (Hopper's fast mode keeps fewer accumulator bits).
                let fast_accumulation = spec.fast_accumulation as i8;
                set_desc(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accumulation as *const i8 as *const c_void, 1)?;
                if spec.bias.is_some() {
                    let bias_type = sys::cudaDataType::CUDA_R_16BF as i32;
                    set_desc(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type as *const i32 as *const c_void, 4)?;
                }
                if let Some(d_scale) = spec.d_scale {
                    set_desc(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &d_scale as *const u64 as *const c_void, 8)?;
                }
            }
            // An e4m3 D takes a C of the bias's type (bf16), which beta 0 leaves unread.
            let c = Operand { dtype: if spec.d_scale.is_some() { Dtype::Bf16 } else { spec.d.dtype }, ..spec.d };
            for (i, op) in [spec.a, spec.b, c, spec.d].iter().enumerate() {
                let layout = lt::create_matrix_layout(data_type(op.dtype), op.rows as u64, op.cols as u64, op.ld as i64)
                    .map_err(cublas("matrix layout"))?;
                mm.layouts[i] = layout;
                if spec.batch > 1 {
                    let count = spec.batch as i32;
                    let stride = op.batch_stride as i64;
                    lt::set_matrix_layout_attribute(
                        layout,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        &count as *const i32 as *const c_void,
                        4,
                    )
                    .map_err(cublas("batch count"))?;
                    lt::set_matrix_layout_attribute(
                        layout,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        &stride as *const i64 as *const c_void,
                        8,
                    )
                    .map_err(cublas("batch stride"))?;
                }
            }
            let pref = lt::create_matmul_pref().map_err(cublas("preference"))?;
            let workspace = WORKSPACE_BYTES as u64;
            let prefs = [
                (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(&spec.a)),
                (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(&spec.b)),
                (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(&spec.d)),
                (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(&spec.d)),
            ];
            let mut set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &workspace as *const u64 as *const c_void,
                8,
            );
            for (attr, value) in prefs {
                set = set.and_then(|_| lt::set_matmul_pref_attribute(pref, attr, &value as *const u32 as *const c_void, 4));
            }
            let [a, b, c, d] = mm.layouts;
            // SAFETY (zeroed): the heuristic result is a plain C struct that cuBLASLt fills.
            let mut results: [sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] = std::mem::zeroed();
            let mut count = 0;
            let heuristic = set.and_then(|_| {
                sys::cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, d, pref, CANDIDATES as i32, results.as_mut_ptr(), &mut count)
                    .result()
            });
            let _ = lt::destroy_matmul_pref(pref);
            heuristic.map_err(|e| format!("cuBLASLt heuristic for {spec:?}: {e:?}"))?;
            mm.algos = results[..count.max(0) as usize]
                .iter()
                .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= WORKSPACE_BYTES)
                .map(|r| r.algo)
                .collect();
            if mm.algos.is_empty() {
                return Err(format!("cuBLASLt found no algorithm for {spec:?}"));
            }
        }
        Ok(mm)
    }

    /// What the product computes.
    pub fn spec(&self) -> &MatmulSpec {
        &self.spec
    }

    /// Number of candidate algorithms.
    pub fn candidates(&self) -> usize {
        self.algos.len()
    }

    /// Uses candidate `i` from now on.
    pub fn choose(&mut self, i: usize) {
        assert!(i < self.algos.len(), "candidate {i} of {}", self.algos.len());
        self.chosen = i;
    }

    /// `rows x cols (k K, batch B)` of the row-major product, for logs and profiles.
    pub fn label(&self) -> String {
        let s = &self.spec;
        let k = if s.a.transpose { s.a.rows } else { s.a.cols };
        let fp8 = if s.scales.is_some() { " fp8" } else { "" };
        let gelu = if s.gelu { " + gelu" } else { "" };
        let e4m3 = if s.d_scale.is_some() { " into e4m3" } else { "" };
        format!("{}x{} (k {k}, batch {}){fp8}{gelu}{e4m3}", s.d.cols, s.d.rows, s.batch)
    }

    /// Everything the speed of an algorithm depends on (shapes, types, layouts, alignments,
    /// epilogue, scalars) but not the addresses: products with equal keys share a timing.
    pub fn shape_key(&self) -> String {
        let s = &self.spec;
        let norm = |o: Operand| Operand { ptr: alignment(&o) as u64, ..o };
        format!(
            "{:?}",
            MatmulSpec {
                a: norm(s.a),
                b: norm(s.b),
                d: norm(s.d),
                bias: s.bias.map(|_| 0),
                scales: s.scales.map(|_| 0),
                d_scale: s.d_scale.map(|_| 0),
                ..*s
            }
        )
    }

    /// Enqueues the product on `stream`.
    ///
    /// # Safety
    /// The operands' memory, `workspace` (`WORKSPACE_BYTES`) and the handle must be live, and
    /// the context current.
    pub unsafe fn launch(
        &self,
        handle: sys::cublasLtHandle_t,
        workspace: DevPtr,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), String> {
        let s = &self.spec;
        let [a, b, c, d] = self.layouts;
        // Beta 0 with an e4m3 D: C is not read (null, as cuBLASLt allows).
        let c_ptr = if s.d_scale.is_some() { std::ptr::null() } else { s.d.ptr as *const c_void };
        // SAFETY: descriptors were built for exactly these pointers; alpha/beta are host scalars
        // read during the call (also under graph capture, where they become kernel parameters).
        unsafe {
            lt::matmul(
                handle,
                self.desc,
                &s.alpha as *const f32 as *const c_void,
                &s.beta as *const f32 as *const c_void,
                s.a.ptr as *const c_void,
                a,
                s.b.ptr as *const c_void,
                b,
                c_ptr,
                c,
                s.d.ptr as *mut c_void,
                d,
                &self.algos[self.chosen],
                workspace as *mut c_void,
                WORKSPACE_BYTES,
                stream as sys::cudaStream_t,
            )
        }
        .map_err(|e| {
            format!(
                "cuBLASLt matmul {}x{}x{} (batch {}): {e:?}",
                s.d.rows,
                s.d.cols,
                if s.a.transpose { s.a.rows } else { s.a.cols },
                s.batch
            )
        })
    }
}

impl Drop for Matmul {
    fn drop(&mut self) {
        // SAFETY: each handle was created in `new` and is destroyed once; null layouts (a
        // constructor that failed midway) are skipped.
        unsafe {
            for layout in self.layouts {
                if !layout.is_null() {
                    let _ = lt::destroy_matrix_layout(layout);
                }
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_weakest_of_base_ld_and_stride() {
        let o = Operand { ptr: 0x1000, dtype: Dtype::Bf16, rows: 8, cols: 8, ld: 588, transpose: false, batch_stride: 0 };
        assert_eq!(alignment(&o), 8); // 588 · 2 = 1176 = 8 · 147
        assert_eq!(alignment(&Operand { ld: 2048, ..o }), 256);
        assert_eq!(alignment(&Operand { ld: 2048, ptr: 0x1000 + 144, ..o }), 16);
        assert_eq!(alignment(&Operand { ld: 2048, batch_stride: 72, ..o }), 16);
    }
}

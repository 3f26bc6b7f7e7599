//! f32 GEMM for the CPU backend: `out (+)= a · wᵀ` with `w` packed once at open.
//!
//! Why not a crate: `gemm` (0.19) and `matrixmultiply` both allocate packing buffers on every call
//! (`gemm-common/src/gemm.rs`: `MemBuffer::new`, `vec![false; mc / MR]`), which breaks the
//! zero-allocation contract of `step`. Packing the weights at open removes the only buffer this
//! kernel needs; activations are read in place.
//!
//! Blocking follows BLIS: K in `KC` slices, M in `MC` blocks (the A block stays in L2), one
//! `KC × NR` weight micro-panel in L1 reused by every `MR`-row tile of the block.

pub const MR: usize = 6;
pub const NR: usize = 16;
const KC: usize = 256;
const MC: usize = 192;

/// A `[n, k]` weight matrix stored as `ceil(n / NR)` panels of `[k][NR]` (rows past `n` are zero).
#[derive(Clone)]
pub struct PackedMatrix {
    pub n: usize,
    pub k: usize,
    data: Vec<f32>,
}

impl PackedMatrix {
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "weight has {} values, expected {n}x{k}", w.len());
        let panels = n.div_ceil(NR);
        let mut data = vec![0.0; panels * k * NR];
        for (row, values) in w.chunks_exact(k).enumerate() {
            let (panel, lane) = (row / NR, row % NR);
            let base = panel * k * NR;
            for (p, &v) in values.iter().enumerate() {
                data[base + p * NR + lane] = v;
            }
        }
        PackedMatrix { n, k, data }
    }

    /// The packed values (the padding of a partial last panel is zeros), for element-wise
    /// rewrites such as FP8 rounding.
    pub fn values_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    pub fn values(&self) -> &[f32] {
        &self.data
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// Overwrites this matrix with `other`, packed for the same shape.
    pub fn copy_from(&mut self, other: &PackedMatrix) {
        debug_assert_eq!((self.n, self.k), (other.n, other.k), "copy between packed matrices of different shapes");
        self.data.copy_from_slice(&other.data);
    }
}

/// A strided row-major matrix argument.
#[derive(Clone, Copy)]
pub struct Strided {
    pub offset: usize,
    pub rows: usize,
    pub stride: usize,
}

type Kernel = fn(&[f32], Strided, &PackedMatrix, &mut [f32], Strided, bool);

/// Picks the fastest kernel this CPU supports (once, at open), with its name.
pub fn select_kernel() -> (Kernel, &'static str) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        let avx2: Kernel = |a, ad, w, o, od, acc| {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            unsafe { gemm_avx2(a, ad, w, o, od, acc) }
        };
        return (avx2, "avx2+fma");
    }
    // aarch64 always has fused multiply-add (NEON); elsewhere a plain multiply and add.
    if cfg!(target_arch = "aarch64") { (gemm_generic::<true>, "neon") } else { (gemm_generic::<false>, "portable") }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gemm_avx2(a: &[f32], ad: Strided, w: &PackedMatrix, out: &mut [f32], od: Strided, accumulate: bool) {
    gemm_generic::<true>(a, ad, w, out, od, accumulate)
}

/// `out[r, c] (+)= Σ_k a[r, k] · w[c, k]` for `r < ad.rows`, `c < w.n`.
#[inline(always)]
fn gemm_generic<const FMA: bool>(a: &[f32], ad: Strided, w: &PackedMatrix, out: &mut [f32], od: Strided, accumulate: bool) {
    let (m, n, k) = (ad.rows, w.n, w.k);
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        let overwrite = k0 == 0 && !accumulate;
        for m0 in (0..m).step_by(MC) {
            let m_end = (m0 + MC).min(m);
            for panel in 0..n.div_ceil(NR) {
                let b = &w.data[panel * k * NR + k0 * NR..][..kc * NR];
                let cols = NR.min(n - panel * NR);
                for r0 in (m0..m_end).step_by(MR) {
                    let rows = MR.min(m_end - r0);
                    // Rows past the end repeat the last row; their results are discarded.
                    let a_rows: [&[f32]; MR] = std::array::from_fn(|i| {
                        let r = r0 + i.min(rows - 1);
                        &a[ad.offset + r * ad.stride + k0..][..kc]
                    });
                    let acc = micro_kernel::<FMA>(&a_rows, b, kc);
                    for (i, acc_row) in acc.iter().enumerate().take(rows) {
                        let o = &mut out[od.offset + (r0 + i) * od.stride + panel * NR..][..cols];
                        if overwrite {
                            o.copy_from_slice(&acc_row[..cols]);
                        } else {
                            o.iter_mut().zip(acc_row).for_each(|(o, v)| *o += v);
                        }
                    }
                }
            }
        }
    }
}

/// One `MR × NR` tile: `Σ_p a[i][p] · b[p][j]` over `kc` steps of a `[kc][NR]` panel.
///
/// `FMA` on x86_64 means the caller runs under AVX2+FMA (`gemm_avx2`, `attention::attend_avx2`,
/// both reached only after the feature check): there the tile is written with intrinsics, because
/// the compiler's vectorisation of the plain loop spilled half the accumulators to the stack on
/// every step of `kc` in the attention's `scores·v` product.
#[inline(always)]
pub fn micro_kernel<const FMA: bool>(a: &[&[f32]; MR], b: &[f32], kc: usize) -> [[f32; NR]; MR] {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: see above; FMA = true is instantiated on x86_64 only under AVX2+FMA.
        return unsafe { micro_kernel_avx2(a, b, kc) };
    }
    // Rows cut to `kc` up front: the loop then needs no bounds checks.
    let a: [&[f32]; MR] = std::array::from_fn(|i| &a[i][..kc]);
    let mut acc = [[0.0f32; NR]; MR];
    for (p, b) in b[..kc * NR].chunks_exact(NR).enumerate() {
        let b: &[f32; NR] = b.try_into().expect("panel rows are NR wide");
        for i in 0..MR {
            let av = a[i][p];
            for j in 0..NR {
                acc[i][j] = mul_add::<FMA>(av, b[j], acc[i][j]);
            }
        }
    }
    acc
}

/// `a·b + c`, fused where the target has the instruction (elsewhere `mul_add` is a libm call).
#[inline(always)]
pub fn mul_add<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// [`micro_kernel`] in twelve AVX registers: two 8-lane halves of `NR` per row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn micro_kernel_avx2(a: &[&[f32]; MR], b: &[f32], kc: usize) -> [[f32; NR]; MR] {
    use std::arch::x86_64::{__m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps};
    const { assert!(NR == 16) };
    // A loop, not `array::from_fn`: closures do not inherit the target features and were
    // called out of line here.
    let mut rows: [&[f32]; MR] = [&[]; MR];
    for (row, a) in rows.iter_mut().zip(a) {
        *row = &a[..kc];
    }
    let a = rows;
    let mut acc: [[__m256; 2]; MR] = [[_mm256_setzero_ps(); 2]; MR];
    for (p, b) in b[..kc * NR].chunks_exact(NR).enumerate() {
        // SAFETY: `b` is NR = 16 floats.
        let (b0, b1) = unsafe { (_mm256_loadu_ps(b.as_ptr()), _mm256_loadu_ps(b.as_ptr().add(8))) };
        for i in 0..MR {
            let av = _mm256_set1_ps(a[i][p]);
            acc[i] = [_mm256_fmadd_ps(av, b0, acc[i][0]), _mm256_fmadd_ps(av, b1, acc[i][1])];
        }
    }
    let mut out = [[0.0f32; NR]; MR];
    for (row, acc) in out.iter_mut().zip(&acc) {
        // SAFETY: `row` is NR = 16 floats.
        unsafe {
            _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(a: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0.0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k).map(|p| a[r * k + p] as f64 * w[c * k + p] as f64).sum();
            }
        }
        out.into_iter().map(|v| v as f32).collect()
    }

    #[test]
    fn matches_reference_on_awkward_shapes() {
        let (kernel, _) = select_kernel();
        for &(m, n, k) in &[(1, 1, 1), (7, 17, 3), (50, 33, 300), (200, 64, 513), (13, 48, 256)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0).collect();
            let packed = PackedMatrix::pack(&w, n, k);
            // Write into the middle of a wider, poisoned output to check strides and bounds.
            let stride = n + 5;
            let mut out = vec![f32::NAN; m * stride + 3];
            kernel(&a, Strided { offset: 0, rows: m, stride: k }, &packed, &mut out, Strided { offset: 3, rows: m, stride }, false);
            let expect = reference(&a, m, k, &w, n);
            for r in 0..m {
                for c in 0..n {
                    let got = out[3 + r * stride + c];
                    assert!((got - expect[r * n + c]).abs() <= 1e-4 * (1.0 + expect[r * n + c].abs()), "{m}x{n}x{k} at {r},{c}: {got}");
                }
                assert!(out[3 + r * stride + n].is_nan() || r + 1 == m && n + 3 + r * stride >= out.len(), "wrote past the row");
            }
            // Accumulate adds on top.
            kernel(&a, Strided { offset: 0, rows: m, stride: k }, &packed, &mut out, Strided { offset: 3, rows: m, stride }, true);
            let got = out[3 + (m - 1) * stride + n - 1];
            let e = 2.0 * expect[m * n - 1];
            assert!((got - e).abs() <= 1e-4 * (1.0 + e.abs()));
        }
    }
}

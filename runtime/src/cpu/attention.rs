//! Attention for the CPU backend as two small GEMMs on the GEMM micro-kernel: the valid keys of one
//! K/V head are packed once per op (masked keys are left out, not computed and then zeroed), then
//! every block of query rows takes `scores = q·kᵀ`, a softmax over the valid keys and `scores·v`.
//!
//! The rows of a block are (query, head) pairs: under multi-query attention all heads of a query
//! share the packed K/V. Each row's arithmetic depends only on that row, so splitting the queries
//! across threads changes no result bit.

use std::ops::Range;

use super::gemm::{MR, NR, micro_kernel, mul_add};

/// (query, head) rows per block: whole micro-kernel tiles, scores `ROWS × keys` stay in L2.
const ROWS: usize = 4 * MR;

/// One K/V head of one group: the keys and values a block of queries attends to.
pub struct KeysValues<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub k_stride: usize,
    pub v_stride: usize,
    pub head_dim: usize,
    pub keys: Range<usize>,
    pub key_valid: Option<&'a [f32]>,
}

/// The valid keys of one K/V head packed for the micro-kernel: `k` as `[key panel][dim][NR]` (the
/// `b` operand of `q·kᵀ`), `v` as `[dim panel][key][NR]` (the `b` operand of `scores·v`), and
/// each packed key's index in its range (ascending: a causal row sees a prefix of them).
#[derive(Default)]
pub struct Packed {
    k: Vec<f32>,
    v: Vec<f32>,
    index: Vec<usize>,
    keys: usize,
    head_dim: usize,
}

impl Packed {
    pub fn with_capacity(keys: usize, head_dim: usize) -> Packed {
        let padded = keys.div_ceil(NR) * NR;
        Packed { k: vec![0.0; padded * head_dim], v: vec![0.0; keys * head_dim.div_ceil(NR) * NR], index: vec![0; keys], keys: 0, head_dim }
    }

    /// How many valid keys the last `pack` gathered.
    pub fn keys(&self) -> usize {
        self.keys
    }

    /// Gathers the valid keys of `kv` (capacity checked at open).
    pub fn pack(&mut self, kv: &KeysValues) {
        let d = kv.head_dim;
        let valid = |key: &usize| kv.key_valid.is_none_or(|m| m[*key] != 0.0);
        let n = kv.keys.clone().filter(valid).count();
        let (k_panels, d_panels) = (n.div_ceil(NR), d.div_ceil(NR));
        let (k, v) = (&mut self.k[..k_panels * d * NR], &mut self.v[..d_panels * n * NR]);
        // Lanes past the last key (and columns past `d`) stay zero.
        if k_panels > 0 {
            k[(k_panels - 1) * d * NR..].fill(0.0);
        }
        v.fill(0.0);
        for (j, key) in kv.keys.clone().filter(valid).enumerate() {
            self.index[j] = key - kv.keys.start;
            let (krow, vrow) = (&kv.k[key * kv.k_stride..][..d], &kv.v[key * kv.v_stride..][..d]);
            let (panel, lane) = (j / NR, j % NR);
            for (dim, &x) in krow.iter().enumerate() {
                k[(panel * d + dim) * NR + lane] = x;
            }
            for (p, cols) in vrow.chunks(NR).enumerate() {
                v[(p * n + j) * NR..][..cols.len()].copy_from_slice(cols);
            }
        }
        (self.keys, self.head_dim) = (n, d);
    }
}

/// The query side of one op for one K/V head: `q` rows hold `heads_per_kv` heads of `head_dim`
/// starting at `q_col`; the output rows likewise at `out_col`. With `causal: Some(offset)`, query
/// `first + r` sees the keys of index `0..=r + offset` in the packed range only.
#[derive(Clone, Copy)]
pub struct Queries<'a> {
    pub q: &'a [f32],
    pub q_stride: usize,
    pub q_col: usize,
    pub heads_per_kv: usize,
    pub query_valid: Option<&'a [f32]>,
    pub first: usize,
    pub causal: Option<usize>,
}

pub type AttendFn = fn(&Queries, Range<usize>, &Packed, &mut [f32], usize, usize, &mut [f32]);

/// The block kernel, compiled for AVX2+FMA where the CPU has it (like the GEMM).
pub fn select() -> AttendFn {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return |q, rows, kv, out, stride, col, scratch| {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            unsafe { attend_avx2(q, rows, kv, out, stride, col, scratch) }
        };
    }
    if cfg!(target_arch = "aarch64") { attend::<true> } else { attend::<false> }
}

/// Scratch one thread needs for up to `keys` keys and `heads_per_kv` ≤ [`ROWS`] heads per K/V head.
pub fn scratch_len(keys: usize, heads_per_kv: usize) -> usize {
    assert!(heads_per_kv <= ROWS, "the CPU attention handles up to {ROWS} query heads per K/V head");
    ROWS.div_ceil(MR) * MR * keys.div_ceil(NR) * NR
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn attend_avx2(q: &Queries, queries: Range<usize>, kv: &Packed, out: &mut [f32], stride: usize, col: usize, scratch: &mut [f32]) {
    attend::<true>(q, queries, kv, out, stride, col, scratch)
}

/// `softmax(q·kᵀ/√d)·v` for query rows `queries`; output row `i` of the range is written at
/// `out[i * stride + col..]`, every head of the K/V head side by side. An invalid query's output
/// is zero (it is never read: its slot is masked as a key everywhere).
#[inline(always)]
fn attend<const FMA: bool>(
    q: &Queries,
    queries: Range<usize>,
    kv: &Packed,
    out: &mut [f32],
    stride: usize,
    col: usize,
    scratch: &mut [f32],
) {
    let (d, h, n) = (kv.head_dim, q.heads_per_kv, kv.keys);
    let width = n.div_ceil(NR) * NR;
    let first = queries.start;
    let valid = |qi: &usize| q.query_valid.is_none_or(|m| m[*qi] != 0.0);
    // Invalid queries, and every query when no key is valid, get zeros.
    for qi in queries.clone().filter(|qi| n == 0 || !valid(qi)) {
        out[(qi - first) * stride + col..][..h * d].fill(0.0);
    }
    if n == 0 {
        return;
    }
    let scale = 1.0 / (d as f32).sqrt();
    // Row `r` of a block is head `r % h` of the block's `r / h`-th valid query.
    let per_block = (ROWS / h).max(1);
    let mut pending = queries.clone().filter(valid).peekable();
    let mut block = [0usize; ROWS];
    while pending.peek().is_some() {
        let mut count = 0;
        for (slot, qi) in block.iter_mut().zip(pending.by_ref().take(per_block)) {
            *slot = qi;
            count += h;
        }
        let q_row = |r: usize| &q.q[block[r / h] * q.q_stride + q.q_col + (r % h) * d..][..d];
        let scores = &mut scratch[..count.div_ceil(MR) * MR * width];
        // scores = q·kᵀ, one MR-row tile against one NR-key panel at a time.
        for r0 in (0..count).step_by(MR) {
            let rows: [&[f32]; MR] = std::array::from_fn(|i| q_row((r0 + i).min(count - 1)));
            for (p, panel) in kv.k[..width * d].chunks_exact(d * NR).enumerate() {
                let acc = micro_kernel::<FMA>(&rows, panel, d);
                for (i, acc) in acc.iter().enumerate() {
                    scores[(r0 + i) * width + p * NR..][..NR].copy_from_slice(acc);
                }
            }
        }
        // Softmax numerators over the keys each row sees (all valid ones, or a causal prefix of
        // them, the rest zero); the sums divide the outputs below.
        let mut sums = [0.0f32; ROWS];
        for (r, (row, sum)) in scores.chunks_exact_mut(width).zip(&mut sums).take(count).enumerate() {
            let seen = q.causal.map_or(n, |offset| kv.index[..n].partition_point(|&key| key <= block[r / h] - q.first + offset));
            *sum = softmax_numerators::<FMA>(&mut row[..seen], scale);
            row[seen..n].fill(0.0);
        }
        // out = scores·v, one tile against one NR-column panel of v at a time.
        for r0 in (0..count).step_by(MR) {
            let rows: [&[f32]; MR] = std::array::from_fn(|i| &scores[(r0 + i).min(count - 1) * width..][..n]);
            for (p, panel) in kv.v[..d.div_ceil(NR) * n * NR].chunks_exact(n * NR).enumerate() {
                let acc = micro_kernel::<FMA>(&rows, panel, n);
                let cols = NR.min(d - p * NR);
                for (i, acc) in acc.iter().enumerate().take(count - r0) {
                    let r = r0 + i;
                    let o = &mut out[(block[r / h] - first) * stride + col + (r % h) * d + p * NR..][..cols];
                    // A causal row that sees no valid key gets zeros, as does a row with no valid key.
                    let inv = if sums[r] > 0.0 { 1.0 / sums[r] } else { 0.0 };
                    o.iter_mut().zip(acc).for_each(|(o, a)| *o = a * inv);
                }
            }
        }
    }
}

/// `row[i] = e^(row[i]·scale − max)`, returning their sum. Lanes of running maxima and sums, so
/// that both reductions vectorise: four vectors of maxima (one would be a serial chain of
/// `max` latencies), one of sums (the exponential between two adds hides their latency).
#[inline(always)]
fn softmax_numerators<const FMA: bool>(row: &mut [f32], scale: f32) -> f32 {
    const LANES: usize = 8;
    let mut max = [f32::NEG_INFINITY; 4 * LANES];
    let wide = row.len() / max.len() * max.len();
    for chunk in row[..wide].chunks_exact(max.len()) {
        for l in 0..max.len() {
            max[l] = if chunk[l] > max[l] { chunk[l] } else { max[l] };
        }
    }
    let max = row[wide..].iter().chain(&max).fold(f32::NEG_INFINITY, |m, &s| if s > m { s } else { m }) * scale;
    let mut sum = [0.0f32; LANES];
    let whole = row.len() / LANES * LANES;
    let (chunks, tail) = row.split_at_mut(whole);
    for chunk in chunks.chunks_exact_mut(LANES) {
        for l in 0..LANES {
            chunk[l] = exp_nonpositive::<FMA>(mul_add::<FMA>(chunk[l], scale, -max));
            sum[l] += chunk[l];
        }
    }
    for s in tail.iter_mut() {
        *s = exp_nonpositive::<FMA>(mul_add::<FMA>(*s, scale, -max));
    }
    sum.iter().chain(tail.iter()).sum()
}

/// `e^x` for `x ≤ 0` (softmax arguments) within 2 ulp, branch-free so that it vectorises along a
/// row of scores (libm's `expf` is a call per element). Cody–Waite range reduction
/// `x = n·ln2 + r`, a degree-6 polynomial for `e^r` on |r| ≤ ln2/2, and `2^n` built in the exponent
/// bits; arguments below −87 flush to 0. `n` is rounded by adding and subtracting 1.5·2²³, which
/// leaves it in the low mantissa bits, instead of `f32::round` and an `as i32` cast, which do not
/// vectorise.
#[inline(always)]
fn exp_nonpositive<const FMA: bool>(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    let fma = mul_add::<FMA>;
    let x = if x < -87.0 { -87.0 } else { x };
    let shifted = fma(x, std::f32::consts::LOG2_E, SHIFT);
    let n = shifted - SHIFT;
    let r = fma(-n, 1.428_606_8e-6, fma(-n, 0.693_145_75, x));
    let p = [0.041_666_5, 0.166_666_67, 0.5, 1.0, 1.0].iter().fold(fma(r, 0.001_393_6, 0.008_333_9), |p, &c| fma(p, r, c));
    // `shifted`'s bits minus SHIFT's are `n` (two's complement, |n| ≤ 126).
    let n = shifted.to_bits().wrapping_sub(SHIFT.to_bits());
    p * f32::from_bits(n.wrapping_add(127) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive per-head attention in f64 over the valid keys query `qi` sees: all of them, or with
    /// `causal: Some((first, offset))` those of index `..= qi - first + offset` in the key range.
    /// Zeros when it sees none.
    fn reference(q: &[f32], qi: usize, h: usize, kv: &KeysValues, causal: Option<(usize, usize)>) -> Vec<f32> {
        let d = kv.head_dim;
        let seen = |k: usize| causal.is_none_or(|(first, offset)| k - kv.keys.start <= qi - first + offset);
        let valid: Vec<usize> = kv.keys.clone().filter(|&k| kv.key_valid.is_none_or(|m| m[k] != 0.0) && seen(k)).collect();
        if valid.is_empty() {
            return vec![0.0; h * d];
        }
        let mut out = Vec::new();
        for head in 0..h {
            let qrow = &q[qi * h * d + head * d..][..d];
            let scores: Vec<f64> = valid
                .iter()
                .map(|&k| qrow.iter().zip(&kv.k[k * kv.k_stride..][..d]).map(|(a, b)| (a * b) as f64).sum::<f64>() / (d as f64).sqrt())
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            out.extend(
                (0..d).map(|c| valid.iter().zip(&weights).map(|(&k, w)| w / sum * kv.v[k * kv.v_stride + c] as f64).sum::<f64>() as f32),
            );
        }
        out
    }

    #[test]
    fn attention_matches_a_naive_reference() {
        // Key counts around the NR-key panels, masked keys, invalid queries, heads per K/V head
        // from 1 to more than one block holds, head dims across and past one NR panel, and
        // query ranges that start inside the buffer; bidirectional and causal (offsets 0 and 3:
        // the first rows of a masked range then see no key at all).
        let mut seed = 1u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32 * 2.0 - 1.0
        };
        let mut packed = Packed::with_capacity(40, 72);
        let mut scratch = vec![f32::NAN; scratch_len(40, 16)];
        for (h, d) in [(1, 72), (3, 16), (8, 16), (16, 4), (5, 20)] {
            for keys in [1, 3, 15, 16, 17, 38] {
                let stride = d + 3;
                let (k, v): (Vec<f32>, Vec<f32>) = (0..(keys + 2) * stride).map(|_| (next(), next())).unzip();
                let mask: Vec<f32> = (0..keys + 2).map(|i| if i % 3 == 1 && i != 2 { 0.0 } else { 1.0 }).collect();
                let queries = 2..11;
                let q: Vec<f32> = (0..11 * h * d).map(|_| next()).collect();
                let query_mask: Vec<f32> = (0..11).map(|i| if i == 4 { 0.0 } else { 1.0 }).collect();
                for (masked, causal) in [false, true].into_iter().flat_map(|m| [(m, None), (m, Some(0)), (m, Some(3))]) {
                    let kv = KeysValues {
                        k: &k,
                        v: &v,
                        k_stride: stride,
                        v_stride: stride,
                        head_dim: d,
                        keys: 2..keys + 2,
                        key_valid: masked.then_some(mask.as_slice()),
                    };
                    packed.pack(&kv);
                    let qs = Queries {
                        q: &q,
                        q_stride: h * d,
                        q_col: 0,
                        heads_per_kv: h,
                        query_valid: masked.then_some(query_mask.as_slice()),
                        first: 2,
                        causal,
                    };
                    // Output rows wider than the heads, starting at column 1: neighbours stay NaN.
                    let out_stride = h * d + 2;
                    for attend in [select(), attend::<false> as AttendFn] {
                        let mut out = vec![f32::NAN; queries.len() * out_stride];
                        attend(&qs, queries.clone(), &packed, &mut out, out_stride, 1, &mut scratch);
                        for qi in queries.clone() {
                            let row = &out[(qi - 2) * out_stride..][..out_stride];
                            assert!(row[0].is_nan() && row[out_stride - 1].is_nan(), "wrote outside the heads' columns");
                            let got = &row[1..1 + h * d];
                            if masked && qi == 4 {
                                assert!(got.iter().all(|&x| x == 0.0), "an invalid query's output is zero");
                                continue;
                            }
                            let want = reference(&q, qi, h, &kv, causal.map(|offset| (2, offset)));
                            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                            assert!(
                                worst < 1e-5,
                                "{h} heads × {d}, {keys} keys, masked {masked}, causal {causal:?}, query {qi}: max error {worst:e}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn fast_exp_matches_libm() {
        // Fused and unfused multiply-adds: the AVX2/NEON kernels and the portable one.
        for (fused, exp) in [(true, exp_nonpositive::<true> as fn(f32) -> f32), (false, exp_nonpositive::<false>)] {
            let mut worst = 0.0f32;
            for i in 0..=200_000 {
                let x = -88.0 * i as f32 / 200_000.0;
                let (got, want) = (exp(x), x.exp());
                if want > 1e-30 {
                    worst = worst.max((got - want).abs() / want);
                }
            }
            assert!(worst < 5e-7, "fused {fused}: relative error {worst:e}");
            assert_eq!(exp(f32::NEG_INFINITY), exp(-87.0));
            assert!(exp(f32::NEG_INFINITY) < 2e-38);
        }
    }
}

//! FP8 on the CUDA backend (opened with `Precision::Fp8` and a calibration): which of the
//! calibrated products run as cuBLASLt FP8 products, and the device copy of their scales.
//!
//! An FP8 product stores its weight in e4m3 (half the bytes of bf16) and quantizes its input with
//! the calibrated per-tensor scale in one launch right before the product ([`Step::QuantizeE4m3`]
//! in the lowering); cuBLASLt multiplies the two in e4m3 with f32 accumulation and applies both
//! scales. That launch is what FP8 costs, so a product runs in FP8 only where its arithmetic
//! dominates: enough rows (the prefix and the vision tower, not the action expert's 50-row
//! products, whose time is latency), and not inside a fused kernel that reads bf16 tiles.
//!
//! [`Step::QuantizeE4m3`]: super::steps::Step::QuantizeE4m3

use std::collections::{BTreeMap, HashMap};

use cudarc::driver::result;
use flashrt_kernels::DevPtr;

use super::device::{DeviceMemory, check};
use crate::error::Result;
use crate::fp8::ProductScales;
use crate::plan::{Op, Plan, WeightRole};

/// Fewest rows a product needs to run in FP8 by default: below it (the action expert's
/// 50-action-token products) the quantizing launch costs about what the product would save.
pub const FP8_MIN_ROWS: usize = 128;

/// Bytes from one device scale to the next. cuBLASLt checks the scale pointers' alignment when a
/// product launches: tools/device/probes/fp8_gemm_probe.cu found a B scale 4 bytes after the A
/// scale refused (CUBLAS_STATUS_NOT_SUPPORTED, cuBLASLt 13.1 on an H100) in every configuration,
/// and 16-byte aligned ones accepted in all.
pub(super) const SCALE_STRIDE: u64 = 16;
const _: () = assert!(SCALE_STRIDE % 16 == 0, "cuBLASLt wants 16-byte aligned FP8 scale pointers");

/// The products the backend runs in FP8 and the calibrated ones it keeps in bf16.
#[derive(Debug, Default)]
pub(super) struct Fp8Products {
    /// Each FP8 weight's scales, by weight index.
    pub(super) chosen: HashMap<usize, ProductScales>,
    /// Calibrated FP8 weights kept in bf16 here: why, and how many.
    pub(super) kept: BTreeMap<String, usize>,
}

impl Fp8Products {
    /// Chooses among the weights with calibrated FP8 `scales` (by weight index): each runs in FP8
    /// when every op that reads it is a product outside the streamed MLPs (the fused MLP kernel
    /// at op indices `fused_mlps[i]..+3` reads bf16 tiles), with at least `min_rows` rows and
    /// N and K multiples of 16 (cuBLASLt's FP8 operands).
    pub(super) fn choose(plan: &Plan, scales: &[Option<ProductScales>], fused_mlps: &[usize], min_rows: usize) -> Fp8Products {
        let mut products = Fp8Products::default();
        let fused = |i: usize| fused_mlps.iter().any(|&m| (m..m + 3).contains(&i));
        for (w, scales) in scales.iter().enumerate().filter_map(|(w, s)| Some((w, (*s)?))) {
            let why = match plan.weights[w].role {
                WeightRole::Matrix { n, k } if n % 16 != 0 || k % 16 != 0 => {
                    Some(format!("{n}x{k}: cuBLASLt's FP8 products need N and K multiples of 16"))
                }
                WeightRole::Matrix { .. } => {
                    let readers: Vec<(usize, &Op)> =
                        plan.ops.iter().enumerate().filter(|(_, op)| op.weights_read().any(|r| r.0 == w)).collect();
                    let rows = readers.iter().map(|(_, op)| if let Op::Gemm { a, .. } = op { a.rows } else { 0 }).min();
                    if let Some((_, op)) = readers.iter().find(|(_, op)| !matches!(op, Op::Gemm { w: gw, .. } if gw.0 == w)) {
                        Some(format!("also read by {} (not a product)", op.name()))
                    } else if readers.iter().any(|&(i, _)| fused(i)) {
                        Some("in a streamed MLP (its fused kernel reads bf16 tiles)".to_string())
                    } else {
                        rows.filter(|&r| r < min_rows).map(|rows| {
                            format!("{rows}-row products, under {min_rows}: latency-bound, the quantizing launch would cost what FP8 saves")
                        })
                    }
                }
                _ => Some("not a matrix".to_string()),
            };
            match why {
                Some(why) => *products.kept.entry(why).or_default() += 1,
                None => {
                    products.chosen.insert(w, scales);
                }
            }
        }
        products
    }

    /// Lines for `explain()`.
    pub(super) fn describe(&self) -> String {
        let mut s = format!(
            "  fp8: {} weights' products as cuBLASLt e4m3 products (per-tensor scales, f32 accumulation), their inputs quantized \
             by one launch each\n",
            self.chosen.len()
        );
        for (why, count) in &self.kept {
            s += &format!("    {count} calibrated weight(s) kept in bf16: {why}\n");
        }
        s
    }

    /// The chosen products' scales on the device and where each weight's are: the weight's at
    /// that address, the input's [`SCALE_STRIDE`] bytes on, each scale 16-byte aligned.
    pub(super) fn upload_scales(&self) -> Result<(Option<DeviceMemory>, HashMap<usize, DevPtr>)> {
        if self.chosen.is_empty() {
            return Ok((None, HashMap::new()));
        }
        let mut order: Vec<(&usize, &ProductScales)> = self.chosen.iter().collect();
        order.sort_unstable_by_key(|(w, _)| **w);
        let per_scale = SCALE_STRIDE as usize / 4;
        let mut values = vec![0f32; order.len() * 2 * per_scale];
        for (i, (_, s)) in order.iter().enumerate() {
            (values[2 * i * per_scale], values[(2 * i + 1) * per_scale]) = (s.weight, s.activation);
        }
        let memory = DeviceMemory::new(values.len() * 4, "FP8 scales")?;
        // SAFETY: the allocation was sized for the values.
        check("uploading the FP8 scales", unsafe { result::memcpy_htod_sync(memory.ptr, &values) })?;
        let at = order.iter().enumerate().map(|(i, (w, _))| (**w, memory.ptr + 2 * i as u64 * SCALE_STRIDE)).collect();
        Ok((Some(memory), at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{View, WeightId};

    #[test]
    fn products_run_in_fp8_only_where_they_are_wide_plain_and_calibrated() {
        let mut plan = Plan::default();
        let (x, h) = (plan.matrix("x", 256, 64), plan.matrix("h", 256, 64));
        let (small, hidden) = (plan.matrix("small", 50, 64), plan.matrix("hidden", 50, 128));
        let weight = |plan: &mut Plan, name: &str, n: usize, k: usize| plan.weight(name, WeightRole::Matrix { n, k });
        let wide = weight(&mut plan, "wide", 64, 64);
        let narrow = weight(&mut plan, "narrow", 64, 64);
        let odd = weight(&mut plan, "odd", 40, 64);
        let odd_out = plan.matrix("odd_out", 256, 40);
        let gate_up = weight(&mut plan, "gate_up", 128, 64);
        let uncalibrated = weight(&mut plan, "uncalibrated", 64, 64);
        let gemm = |a: View, w: WeightId, out: View| Op::Gemm { a, w, bias: None, out, accumulate: false };
        plan.push(gemm(x, wide, h));
        plan.push(gemm(h, uncalibrated, x));
        // The same weight at 256 rows and at 50: the fewest rows decide.
        plan.push(gemm(x, narrow, h));
        plan.push(gemm(small, narrow, small));
        plan.push(gemm(x, odd, odd_out));
        let fused_at = plan.ops.len();
        plan.push(gemm(small, gate_up, hidden));
        let scales = ProductScales { activation: 0.5, weight: 0.25 };
        let mut calibrated = vec![Some(scales); plan.weights.len()];
        calibrated[uncalibrated.0] = None;

        let products = Fp8Products::choose(&plan, &calibrated, &[fused_at], 128);
        assert_eq!(products.chosen, HashMap::from([(wide.0, scales)]));
        let kept: Vec<&str> = products.kept.keys().map(String::as_str).collect();
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert!(kept.iter().any(|k| k.starts_with("50-row products, under 128")), "{kept:?}");
        assert!(kept.iter().any(|k| k.starts_with("40x64: cuBLASLt's FP8 products need N and K multiples of 16")), "{kept:?}");
        assert!(kept.iter().any(|k| k.starts_with("in a streamed MLP")), "{kept:?}");
        let text = products.describe();
        assert!(text.contains("fp8: 1 weights' products as cuBLASLt e4m3 products"), "{text}");
        // A lower row bound takes the 50-row products too.
        assert!(Fp8Products::choose(&plan, &calibrated, &[fused_at], 1).chosen.contains_key(&narrow.0));
    }
}

//! FP8 on the CUDA backend (opened with `Precision::Fp8` and a calibration): which of the
//! calibrated products run in FP8, and the device copy of their scales.
//!
//! Two forms. A plain product stores its weight in e4m3 (half the bytes of bf16) and quantizes
//! its input with the calibrated per-tensor scale in one launch right before the product
//! ([`Step::QuantizeE4m3`] in the lowering); cuBLASLt multiplies the two in e4m3, accumulating
//! in Hopper's fast mode (`Switches::fp8_fast_accumulation`), and applies both scales. That
//! launch is what FP8 costs (where the producer of its input cannot write e4m3 itself), so a plain
//! product runs in FP8 only where its arithmetic dominates: enough rows (the prefix and the vision
//! tower, not 50-row products, whose time is latency). A streamed MLP (the action expert's
//! gate/up, GeGLU and down in one launch, `Kernels::mlp_stream`) runs in FP8 inside its own
//! kernel: its weights tiled in e4m3, its input quantized as the kernel loads it and the GeGLU
//! output written in e4m3, with no launch added, so it halves the bytes the denoise loop streams
//! there. The expert's products in the first denoise step, which runs on cuBLASLt beside the
//! prefix, read the same weights: they run in FP8 too, from a row-major e4m3 copy (half the bytes
//! of the bf16 copy they would need; 0.11 ms faster on an H100, where their launches share the
//! SMs with the prefix's products).
//!
//! [`Step::QuantizeE4m3`]: super::steps::Step::QuantizeE4m3

use std::collections::{BTreeMap, HashMap};

use cudarc::driver::result;
use flashrt_kernels::{DevPtr, MlpFp8Scales};

use super::device::{DeviceMemory, check};
use super::fusion::StreamedShapes;
use crate::error::Result;
use crate::fp8::ProductScales;
use crate::plan::{Op, Plan, WeightId, WeightRole};

/// Fewest rows a product needs to run in FP8 where `CudaOptions::fp8_min_rows` names none (a
/// policy passes its model's bound, `ModelKind::fp8_min_rows`): below it the quantizing launch
/// can cost about what the product would save.
pub const FP8_MIN_ROWS: usize = 128;

/// Bytes from one device scale to the next. cuBLASLt checks the scale pointers' alignment when a
/// product launches: tools/device/probes/fp8_gemm_probe.cu found a B scale 4 bytes after the A
/// scale refused (CUBLAS_STATUS_NOT_SUPPORTED, cuBLASLt 13.1 on an H100) in every configuration,
/// and 16-byte aligned ones accepted in all.
pub(super) const SCALE_STRIDE: u64 = 16;
const _: () = assert!(SCALE_STRIDE % 16 == 0, "cuBLASLt wants 16-byte aligned FP8 scale pointers");
/// Each cuBLASLt FP8 product's device scales: its weight's, its input's, its input's inverse,
/// and its output's inverse (where it stores its output in e4m3 for a gated activation, else 1).
const SCALES_PER_PRODUCT: usize = 4;
/// Bytes from a product's scales to its input's inverse scale.
pub(super) const INVERSE_INPUT_SCALE_AT: u64 = 2 * SCALE_STRIDE;
/// Bytes from a product's scales to its output's inverse scale (its D scale when D is e4m3).
pub(super) const INVERSE_OUTPUT_SCALE_AT: u64 = 3 * SCALE_STRIDE;

/// The products the backend runs in FP8 and the calibrated ones it keeps in bf16.
#[derive(Debug, Default)]
pub(super) struct Fp8Products {
    /// Each cuBLASLt FP8 product's weight's scales, by weight index.
    pub(super) chosen: HashMap<usize, ProductScales>,
    /// The streamed MLPs that run in FP8, by their first op's index, with their scales.
    pub(super) streamed: BTreeMap<usize, MlpFp8Scales>,
    /// The streamed products that run in FP8, by op index, with their scales.
    pub(super) streamed_products: BTreeMap<usize, ProductScales>,
    /// Each weight of those MLPs and products with its scales (it is tiled in e4m3).
    streamed_weights: HashMap<usize, ProductScales>,
    /// Calibrated FP8 weights kept in bf16 here: why, and how many.
    pub(super) kept: BTreeMap<String, usize>,
}

impl Fp8Products {
    /// Chooses among the weights with calibrated FP8 `scales` (by weight index). A streamed MLP
    /// (the fused kernel at op indices `fused_mlps[i]..+3`) runs in FP8 when both its weights are
    /// calibrated and the device's FP8 form takes its shape (`fp8_shapes`), and so does each
    /// candidate product (op indices `streamed_products`, see `fusion::streamed_products`) of a
    /// calibrated weight. Any other weight runs as
    /// cuBLASLt FP8 products when every op that reads it is a product outside the streamed MLPs,
    /// with at least `min_rows` rows and N and K multiples of 16 (cuBLASLt's FP8 operands). A
    /// streamed weight's products outside the streamed kernels follow the same rules, except that
    /// with `first_step` their rows do not count: the e4m3 weight exists anyway, and the bf16
    /// copy they would otherwise need is the larger.
    pub(super) fn choose(
        plan: &Plan,
        scales: &[Option<ProductScales>],
        fused_mlps: &[usize],
        streamed_products: &[usize],
        min_rows: usize,
        first_step: bool,
        fp8_shapes: &dyn StreamedShapes,
    ) -> Fp8Products {
        let mut products = Fp8Products::default();
        let fused = |i: usize| fused_mlps.iter().any(|&m| (m..m + 3).contains(&i));
        let scales_of = |w: WeightId| scales.get(w.0).copied().flatten();
        for &i in fused_mlps {
            let Some([Op::Gemm { a, w: w_gate_up, .. }, Op::GatedActivation { out: hidden, .. }, Op::Gemm { w: w_down, .. }]) =
                plan.ops.get(i..i + 3)
            else {
                continue;
            };
            if let (Some(gate_up), Some(down)) = (scales_of(*w_gate_up), scales_of(*w_down))
                && fp8_shapes.mlp(a.rows, a.cols, hidden.cols)
            {
                let mlp = MlpFp8Scales { gate_up: (gate_up.activation, gate_up.weight), down: (down.activation, down.weight) };
                products.streamed.insert(i, mlp);
                products.streamed_weights.extend([(w_gate_up.0, gate_up), (w_down.0, down)]);
            }
        }
        for &i in streamed_products {
            let Op::Gemm { w, .. } = plan.ops[i] else { continue };
            if let Some(scales) = scales_of(w) {
                products.streamed_products.insert(i, scales);
                products.streamed_weights.insert(w.0, scales);
            }
        }
        for (w, scales) in scales.iter().enumerate().filter_map(|(w, s)| Some((w, (*s)?))) {
            // A weight the streamed kernels read in e4m3 may have products outside them too (the
            // expert's in the first denoise step, beside the prefix on cuBLASLt): those run in FP8
            // from a row-major e4m3 copy under the rules below, else in bf16 from a bf16 copy.
            let streamed = products.streamed_weights.contains_key(&w);
            let readers: Vec<(usize, &Op)> =
                plan.ops.iter().enumerate().filter(|&(i, op)| op.weights_read().any(|r| r.0 == w) && !products.streams(i)).collect();
            if streamed && readers.is_empty() {
                continue;
            }
            let why = match plan.weights[w].role {
                WeightRole::Matrix { n, k } if n % 16 != 0 || k % 16 != 0 => {
                    Some(format!("{n}x{k}: cuBLASLt's FP8 products need N and K multiples of 16"))
                }
                WeightRole::Matrix { .. } => {
                    let rows = readers.iter().map(|(_, op)| if let Op::Gemm { a, .. } = op { a.rows } else { 0 }).min();
                    if let Some((_, op)) = readers.iter().find(|(_, op)| !matches!(op, Op::Gemm { w: gw, .. } if gw.0 == w)) {
                        Some(format!("also read by {} (not a product)", op.name()))
                    } else if readers.iter().any(|&(i, _)| fused(i)) {
                        Some("in a streamed MLP the device's FP8 form does not take (or whose other weight is not calibrated)".to_string())
                    } else {
                        rows.filter(|&r| r < min_rows && !(streamed && first_step)).map(|rows| {
                            format!("{rows}-row products, under {min_rows}: latency-bound, the quantizing launch would cost what FP8 saves")
                        })
                    }
                }
                _ => Some("not a matrix".to_string()),
            };
            match why {
                // Not kept in bf16: its streamed products run in FP8.
                Some(_) if streamed => {}
                Some(why) => *products.kept.entry(why).or_default() += 1,
                None => {
                    products.chosen.insert(w, scales);
                }
            }
        }
        products
    }

    /// Whether op `i` belongs to a streamed MLP or is a streamed product that runs in FP8.
    pub(super) fn streams(&self, i: usize) -> bool {
        self.streamed_products.contains_key(&i) || self.streamed.range(..=i).next_back().is_some_and(|(&first, _)| i < first + 3)
    }

    /// The scales of weight `w` where it is held in e4m3 (a cuBLASLt FP8 product's or a streamed
    /// FP8 MLP's).
    pub(super) fn weight_scales(&self, w: usize) -> Option<ProductScales> {
        self.chosen.get(&w).or_else(|| self.streamed_weights.get(&w)).copied()
    }

    /// Lines for `explain()`; `fast_accumulation`: the products accumulate in Hopper's fast mode.
    pub(super) fn describe(&self, fast_accumulation: bool) -> String {
        let accumulation = if fast_accumulation { "Hopper's fast accumulation" } else { "f32 accumulation (FRT_NO_FP8_FAST_ACCUM)" };
        let mut s = format!(
            "  fp8: {} weights' products as cuBLASLt e4m3 products (per-tensor scales, {accumulation}), their inputs in e4m3 from \
             their producer or a quantizing launch\n",
            self.chosen.len()
        );
        if !self.streamed.is_empty() || !self.streamed_products.is_empty() {
            let shared = self.streamed_weights.keys().filter(|w| self.chosen.contains_key(w)).count();
            let outside = match shared {
                0 => "none of them serves a cuBLASLt e4m3 product outside these launches".to_string(),
                _ => format!("{shared} of them also serve cuBLASLt e4m3 products outside these launches (the first denoise step's)"),
            };
            s += &format!(
                "  fp8: {} streamed MLP and {} streamed product launches in e4m3 ({} weights tiled in e4m3; inputs quantized as the \
                 kernel loads them, the MLPs' GeGLU output in e4m3, {accumulation}); {outside}\n",
                self.streamed.len(),
                self.streamed_products.len(),
                self.streamed_weights.len()
            );
        }
        for (why, count) in &self.kept {
            s += &format!("    {count} calibrated weight(s) kept in bf16: {why}\n");
        }
        s
    }

    /// The chosen products' scales on the device and where each weight's are: the weight's at
    /// that address, the input's [`SCALE_STRIDE`] bytes on and the input's inverse (what an
    /// e4m3 producer of the input multiplies by, [`INVERSE_INPUT_SCALE_AT`]) after it, each
    /// scale 16-byte aligned.
    pub(super) fn upload_scales(&self) -> Result<(Option<DeviceMemory>, HashMap<usize, DevPtr>)> {
        if self.chosen.is_empty() {
            return Ok((None, HashMap::new()));
        }
        let mut order: Vec<(&usize, &ProductScales)> = self.chosen.iter().collect();
        order.sort_unstable_by_key(|(w, _)| **w);
        let per_scale = SCALE_STRIDE as usize / 4;
        let mut values = vec![0f32; order.len() * SCALES_PER_PRODUCT * per_scale];
        for (i, (_, s)) in order.iter().enumerate() {
            let slots = &mut values[i * SCALES_PER_PRODUCT * per_scale..];
            (slots[0], slots[per_scale], slots[2 * per_scale]) = (s.weight, s.activation, 1.0 / s.activation);
            slots[3 * per_scale] = 1.0 / s.output.unwrap_or(1.0);
        }
        let memory = DeviceMemory::new(values.len() * 4, "FP8 scales")?;
        // SAFETY: the allocation was sized for the values.
        check("uploading the FP8 scales", unsafe { result::memcpy_htod_sync(memory.ptr, &values) })?;
        let at = order.iter().enumerate().map(|(i, (w, _))| (**w, memory.ptr + (SCALES_PER_PRODUCT * i) as u64 * SCALE_STRIDE)).collect();
        Ok((Some(memory), at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Activation, View};

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
        let gate_up = weight(&mut plan, "gate_up", 256, 64);
        let down = weight(&mut plan, "down", 64, 128);
        let uncalibrated = weight(&mut plan, "uncalibrated", 64, 64);
        let gemm = |a: View, w: WeightId, out: View| Op::Gemm { a, w, bias: None, out, accumulate: false };
        plan.push(gemm(x, wide, h));
        plan.push(gemm(h, uncalibrated, x));
        // The same weight at 256 rows and at 50: the fewest rows decide.
        plan.push(gemm(x, narrow, h));
        plan.push(gemm(small, narrow, small));
        plan.push(gemm(x, odd, odd_out));
        // A streamed MLP: gate/up, GeGLU, down.
        let fused_at = plan.ops.len();
        let gate_up_out = plan.matrix("gate_up_out", 50, 256);
        plan.push(gemm(small, gate_up, gate_up_out));
        plan.push(Op::GatedActivation { gate_up: gate_up_out, out: hidden, kind: Activation::GeluTanh });
        plan.push(gemm(hidden, down, small));
        let scales = ProductScales { activation: 0.5, weight: 0.25, output: None };
        let down_scales = ProductScales { activation: 2.0, weight: 0.125, output: None };
        let mut calibrated = vec![Some(scales); plan.weights.len()];
        calibrated[uncalibrated.0] = None;
        calibrated[down.0] = Some(down_scales);

        let choose = |calibrated: &[Option<ProductScales>], products: &[usize], min_rows: usize, streams: bool| {
            Fp8Products::choose(&plan, calibrated, &[fused_at], products, min_rows, true, &Shapes(streams))
        };

        // A device without the FP8 streamed form keeps the MLP's weights in bf16.
        let products = choose(&calibrated, &[], 128, false);
        assert_eq!(products.chosen, HashMap::from([(wide.0, scales)]));
        assert!(products.streamed.is_empty());
        let kept: Vec<(&str, usize)> = products.kept.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert!(kept.iter().any(|k| k.0.starts_with("50-row products, under 128")), "{kept:?}");
        assert!(kept.iter().any(|k| k.0.starts_with("40x64: cuBLASLt's FP8 products need N and K multiples of 16")), "{kept:?}");
        assert_eq!(kept.iter().find(|k| k.0.starts_with("in a streamed MLP")).map(|k| k.1), Some(2), "{kept:?}");
        let text = products.describe(false);
        assert!(text.contains("fp8: 1 weights' products as cuBLASLt e4m3 products") && !text.contains("streamed MLP and"), "{text}");
        assert!(products.describe(true).contains("Hopper's fast accumulation)"), "{}", products.describe(true));
        assert!(products.describe(false).contains("f32 accumulation (FRT_NO_FP8_FAST_ACCUM)"), "{}", products.describe(false));
        // A lower row bound takes the 50-row products too.
        assert!(choose(&calibrated, &[], 1, false).chosen.contains_key(&narrow.0));

        // With it, the MLP runs in FP8 with both weights' scales.
        let products = choose(&calibrated, &[], 128, true);
        let mlp = MlpFp8Scales { gate_up: (0.5, 0.25), down: (2.0, 0.125) };
        assert_eq!(products.streamed, BTreeMap::from([(fused_at, mlp)]));
        assert!(
            (fused_at..fused_at + 3).all(|i| products.streams(i)) && !products.streams(fused_at - 1) && !products.streams(fused_at + 3)
        );
        assert_eq!((products.weight_scales(gate_up.0), products.weight_scales(down.0)), (Some(scales), Some(down_scales)));
        assert_eq!(products.weight_scales(wide.0), Some(scales));
        assert_eq!(products.weight_scales(narrow.0), None);
        assert!(!products.kept.keys().any(|k| k.starts_with("in a streamed MLP")), "{:?}", products.kept);
        let text = products.describe(false);
        assert!(text.contains("fp8: 1 streamed MLP and 0 streamed product launches in e4m3 (2 weights tiled in e4m3"), "{text}");
        assert!(text.contains("none of them serves a cuBLASLt e4m3 product outside"), "{text}");

        // A streamed product of a calibrated weight runs in FP8 too (its 50 rows would keep it
        // in bf16 on cuBLASLt), and so does the weight's 256-row product on cuBLASLt; one of an
        // uncalibrated weight stays bf16.
        let narrow_at = 3;
        let products = choose(&calibrated, &[narrow_at, 1], 128, true);
        assert_eq!(products.streamed_products, BTreeMap::from([(narrow_at, scales)]));
        assert!(products.streams(narrow_at) && !products.streams(1) && products.weight_scales(narrow.0) == Some(scales));
        assert_eq!(products.chosen.get(&narrow.0), Some(&scales));
        assert!(products.describe(false).contains("1 of them also serve cuBLASLt e4m3 products"), "{}", products.describe(false));
        assert!(products.describe(false).contains("1 streamed MLP and 1 streamed product launches"), "{}", products.describe(false));

        // Both of an MLP's weights need a calibration.
        calibrated[down.0] = None;
        assert!(choose(&calibrated, &[], 128, true).streamed.is_empty());
    }

    /// A device whose streamed FP8 kernels take every shape (or none).
    struct Shapes(bool);

    impl StreamedShapes for Shapes {
        fn mlp(&self, _: usize, _: usize, _: usize) -> bool {
            self.0
        }
        fn product(&self, _: usize, _: usize, _: usize) -> bool {
            self.0
        }
        fn qkv_rope(&self, _: usize, _: usize, _: usize, _: usize) -> bool {
            self.0
        }
    }
}

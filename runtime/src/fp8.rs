//! FP8 quantization in e4m3 (PyTorch's `float8_e4m3fn`, CUDA's `__nv_fp8_e4m3`): 4 exponent bits,
//! 3 mantissa bits, finite only, largest value 448. A tensor is stored as codes and one f32 scale,
//! `x ≈ scale · e4m3(x · (1 / scale))`, with the scale chosen so that the tensor's largest
//! magnitude maps onto 448. The conversion rounds to nearest even and saturates at ±448 (CUDA's
//! `__NV_SATFINITE`), so a value past the calibrated range clips instead of becoming NaN.
//!
//! These are the numerics every FP8 path shares: the calibration that measures each product's
//! error, the CPU backend's FP8 emulation (the reference for the GPU's FP8 products), and the
//! weights a GPU backend stores in e4m3.

use float8::F8E4M3;

/// e4m3's largest finite magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The scale that maps `amax` (a tensor's largest magnitude) onto [`E4M3_MAX`]; 1 for a tensor
/// of zeros (or a non-finite amax), which any scale represents exactly.
pub fn scale_for(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() { amax / E4M3_MAX } else { 1.0 }
}

/// The e4m3 code of `x`: round to nearest even, ±448 past the range, NaN stays NaN.
pub fn encode(x: f32) -> u8 {
    F8E4M3::from_f32(x).to_bits()
}

/// The value of an e4m3 code.
pub fn decode(code: u8) -> f32 {
    F8E4M3::from_bits(code).to_f32()
}

/// `x` as a product reads it after quantization with `scale`: `scale · e4m3(x · (1 / scale))`.
/// Multiplying by the reciprocal (not dividing) is what the quantizing kernels do, so this is
/// their result bit for bit.
pub fn round_trip(x: f32, scale: f32) -> f32 {
    decode(encode(x * (1.0 / scale))) * scale
}

/// [`round_trip`] of every element in place.
pub fn round_trip_all(values: &mut [f32], scale: f32) {
    let inverse = 1.0 / scale;
    values.iter_mut().for_each(|x| *x = decode(encode(*x * inverse)) * scale);
}

/// The per-tensor scales of one weight's FP8 products, from its calibration: the weight's codes
/// are `e4m3(w / weight)`, each input's `e4m3(x / activation)`, and the product is
/// `weight · activation · Σ codes × codes`, accumulated in f32. With `output`, the product is
/// stored in e4m3 too, `e4m3(product / output)`: a gate/up product whose output only a gated
/// activation reads (half the bytes written and read between the two).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProductScales {
    pub activation: f32,
    pub weight: f32,
    pub output: Option<f32>,
}

/// The largest magnitude in `values` (NaNs are skipped; 0 for none).
pub fn amax(values: &[f32]) -> f32 {
    values.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> (Vec<f32>, Vec<f32>, Vec<u8>) {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/fp8/e4m3_torch.safetensors");
        let bytes = std::fs::read(path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let f32s = |name: &str| -> Vec<f32> {
            file.tensor(name).unwrap().data().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
        };
        (f32s("decoded"), f32s("inputs"), file.tensor("encoded").unwrap().data().to_vec())
    }

    /// Every code decodes to PyTorch's value, and every input (codes, ties between neighbours,
    /// points just off them, subnormals, random magnitudes) encodes to PyTorch's code.
    #[test]
    fn conversions_match_pytorch_float8_e4m3fn() {
        let (decoded, inputs, encoded) = reference();
        for (code, want) in decoded.iter().enumerate() {
            let got = decode(code as u8);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "code {code:#04x}: {got} vs {want}");
        }
        assert!(inputs.len() > 4000);
        for (x, &want) in inputs.iter().zip(&encoded) {
            // PyTorch keeps the sign of a value that rounds to zero; so does the CUDA conversion.
            assert_eq!(encode(*x), want, "{x:e}: {:#04x} vs PyTorch {want:#04x}", encode(*x));
        }
    }

    #[test]
    fn past_the_range_saturates_and_nan_stays_nan() {
        assert_eq!(decode(encode(1e6)), 448.0);
        assert_eq!(decode(encode(-470.0)), -448.0);
        assert!(decode(encode(f32::NAN)).is_nan());
        assert_eq!(decode(encode(f32::INFINITY)), 448.0);
    }

    #[test]
    fn a_calibrated_tensor_keeps_its_largest_value_and_relative_error_under_one_sixteenth() {
        let values: Vec<f32> = (0..1000).map(|i| ((i as f32 * 0.731).sin() * 3.7).powi(3)).collect();
        let scale = scale_for(amax(&values));
        let mut rounded = values.clone();
        round_trip_all(&mut rounded, scale);
        let peak = values.iter().position(|x| x.abs() == amax(&values)).unwrap();
        assert_eq!(rounded[peak], values[peak], "the largest magnitude maps onto 448 exactly");
        for (x, r) in values.iter().zip(&rounded) {
            // 3 mantissa bits: half an ulp is 1/16 of the value in the normal range; below it
            // (|x / scale| < 2^-6) the absolute error is at most half the subnormal step.
            let bound = (x.abs() / 16.0).max(scale * 2f32.powi(-10));
            assert!((x - r).abs() <= bound * 1.0001, "{x} -> {r}");
            assert_eq!(round_trip(*x, scale), *r);
        }
        assert_eq!(scale_for(0.0), 1.0);
        assert_eq!(amax(&[f32::NAN, -2.0, 1.0]), 2.0);
    }
}

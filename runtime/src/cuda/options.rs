//! What the CUDA backend is opened with: the device and kernel cache, and the switches that turn
//! each of its optimisations off for A/B runs and diagnosis (all on by default).

use std::path::PathBuf;

use crate::fp8::ProductScales;

/// Open-time options of the CUDA backend.
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    pub device: usize,
    /// Kernel cache directory; default `$XDG_CACHE_HOME/flashrt/kernels`.
    pub kernel_cache_dir: Option<PathBuf>,
    pub switches: Switches,
    /// FP8: the calibrated scales of each weight's products (by weight id; `None` keeps a weight
    /// in bf16), from `Calibration::product_scales`. Empty: everything in bf16.
    pub fp8_scales: Vec<Option<ProductScales>>,
    /// Fewest rows an FP8 product needs (`FRT_FP8_MIN_ROWS`; default [`super::fp8::FP8_MIN_ROWS`]).
    pub fp8_min_rows: Option<usize>,
}

/// The backend's optimisations, each of which can be switched off without changing what a step
/// computes (beyond bf16 rounding order). [`Switches::from_env`] reads them from the
/// environment, `explain()` lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Switches {
    /// Hopper's warpgroup MMA in the kernels that have it (`FRT_NO_WGMMA=1`: off).
    pub wgmma: bool,
    /// Few-query multi-query attention and SigLIP's attention as one kernel each, instead of two
    /// cuBLASLt products around a softmax (`FRT_NO_FUSED_ATTENTION=1`: off).
    pub fused_attention: bool,
    /// The action expert's MLPs as one streamed launch each (`FRT_NO_FUSED_MLP=1`: off).
    pub fused_mlp: bool,
    /// With an FP8 calibration, the action expert's streamed kernels in e4m3: its MLP and its
    /// few-row QKV and output products (`FRT_NO_FP8_STREAMED=1`: they stay bf16, the products on
    /// cuBLASLt).
    pub fp8_streamed: bool,
    /// With an FP8 calibration, the norms and gated activations that produce an FP8 product's
    /// whole input write it in e4m3 themselves (`FRT_NO_FP8_PRODUCERS=1`: they write bf16 and
    /// a launch of its own quantizes it).
    pub fp8_producers: bool,
    /// With an FP8 calibration, the action expert's gated residual norms write its QKV and MLP
    /// inputs in e4m3, its attention's split merge writes the output projection's, and its QKV
    /// product and RoPE run as one streamed e4m3 launch (`FRT_NO_FP8_EXPERT_E4M3=1`: the QKV
    /// product stays on cuBLASLt in bf16 with RoPE a launch of its own, and the streamed MLP and
    /// output projection quantize their bf16 inputs as they load them).
    pub fp8_expert_e4m3: bool,
    /// With an FP8 calibration, the FP8 products (cuBLASLt's and the expert's streamed kernels')
    /// accumulate in Hopper's fast mode, as inference engines and Transformer Engine's forward
    /// products run them (`FRT_NO_FP8_FAST_ACCUM=1`: the tensor core's partial sums promoted to
    /// f32 every 128 of K, as the CPU emulation and the calibration's error measure assume). Its
    /// speed and accuracy on Pi0.5 are in bench/NOTES.md.
    pub fp8_fast_accumulation: bool,
    /// With an FP8 calibration, the products of a weight the streamed kernels read in e4m3 that
    /// run outside them (the action expert's in the first denoise step, on cuBLASLt beside the
    /// prefix) are FP8 too, whatever their rows, from a row-major e4m3 copy
    /// (`FRT_NO_FP8_FIRST_STEP=1`: they run in bf16 from a bf16 copy of the weight).
    pub fp8_first_step: bool,
    /// The gated residual norm that reads the branch a streamed FP8 product writes next leaves it
    /// zero, so that product adds its K splits' sums at once, without zeroing it and a grid
    /// barrier first (`FRT_NO_ZEROED_BRANCH=1`: the product zeroes it itself).
    pub zeroed_branches: bool,
    /// Concurrent phases on a second stream (`FRT_NO_OVERLAP=1`: one stream).
    pub overlap: bool,
    /// Kernels launched as programmatic dependents of the one before them, starting their
    /// independent loads while it finishes: a fused MLP under its norm, an attention under its
    /// RoPE, RoPE and the gated residual norms under a cuBLASLt product, the FP8 output projection
    /// under its attention's merge (`FRT_NO_EARLY_LAUNCH=1`: every launch plain).
    pub early_launch: bool,
}

impl Default for Switches {
    fn default() -> Self {
        Switches {
            wgmma: true,
            fused_attention: true,
            fused_mlp: true,
            fp8_streamed: true,
            fp8_producers: true,
            fp8_expert_e4m3: true,
            fp8_fast_accumulation: true,
            fp8_first_step: true,
            zeroed_branches: true,
            overlap: true,
            early_launch: true,
        }
    }
}

impl Switches {
    /// The defaults with every `FRT_NO_*` variable that is set and not "0" switching its part off.
    pub fn from_env() -> Switches {
        let on = |name: &str| std::env::var_os(name).is_none_or(|v| v == "0");
        Switches {
            wgmma: on("FRT_NO_WGMMA"),
            fused_attention: on("FRT_NO_FUSED_ATTENTION"),
            fused_mlp: on("FRT_NO_FUSED_MLP"),
            fp8_streamed: on("FRT_NO_FP8_STREAMED"),
            fp8_producers: on("FRT_NO_FP8_PRODUCERS"),
            fp8_expert_e4m3: on("FRT_NO_FP8_EXPERT_E4M3"),
            fp8_fast_accumulation: on("FRT_NO_FP8_FAST_ACCUM"),
            fp8_first_step: on("FRT_NO_FP8_FIRST_STEP"),
            zeroed_branches: on("FRT_NO_ZEROED_BRANCH"),
            overlap: on("FRT_NO_OVERLAP"),
            early_launch: on("FRT_NO_EARLY_LAUNCH"),
        }
    }

    /// One line for `explain()`: each switch and whether it is on.
    pub fn describe(&self) -> String {
        let Switches {
            wgmma,
            fused_attention,
            fused_mlp,
            fp8_streamed,
            fp8_producers,
            fp8_expert_e4m3,
            fp8_fast_accumulation,
            fp8_first_step,
            zeroed_branches,
            overlap,
            early_launch,
        } = *self;
        let state = |on: bool| if on { "on" } else { "off" };
        format!(
            "wgmma {}, fused attention {}, fused MLP {}, FP8 streamed kernels {}, FP8 inputs from their producers {}, FP8 expert inputs \
             in e4m3 {}, FP8 fast accumulation {}, FP8 first denoise step {}, branches zeroed by their reader {}, two streams {}, \
             early launches {} (FRT_NO_WGMMA, FRT_NO_FUSED_ATTENTION, FRT_NO_FUSED_MLP, FRT_NO_FP8_STREAMED, \
             FRT_NO_FP8_PRODUCERS, FRT_NO_FP8_EXPERT_E4M3, FRT_NO_FP8_FAST_ACCUM, FRT_NO_FP8_FIRST_STEP, \
             FRT_NO_ZEROED_BRANCH, FRT_NO_OVERLAP, FRT_NO_EARLY_LAUNCH)",
            state(wgmma),
            state(fused_attention),
            state(fused_mlp),
            state(fp8_streamed),
            state(fp8_producers),
            state(fp8_expert_e4m3),
            state(fp8_fast_accumulation),
            state(fp8_first_step),
            state(zeroed_branches),
            state(overlap),
            state(early_launch)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_switch_is_on_by_default_and_described() {
        let all = Switches::default();
        assert!(
            all.wgmma
                && all.fused_attention
                && all.fused_mlp
                && all.fp8_streamed
                && all.fp8_producers
                && all.fp8_expert_e4m3
                && all.fp8_fast_accumulation
                && all.fp8_first_step
                && all.zeroed_branches
                && all.overlap
                && all.early_launch
        );
        let off = Switches { overlap: false, ..all };
        assert!(off.describe().contains("two streams off") && off.describe().contains("fused MLP on"), "{}", off.describe());
    }
}

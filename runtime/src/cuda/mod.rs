//! The CUDA backend (features `cuda-12` / `cuda-13`). Without either feature this module only
//! answers that CUDA is unavailable, so backend selection needs no conditional code.

#[cfg(feature = "cuda")]
mod arena;
#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod fp8;
#[cfg(feature = "cuda")]
mod fusion;
#[cfg(feature = "cuda")]
mod gemm;
#[cfg(feature = "cuda")]
mod graph;
#[cfg(feature = "cuda")]
mod lowering;
#[cfg(feature = "cuda")]
mod options;
#[cfg(feature = "cuda")]
mod profile;
#[cfg(feature = "cuda")]
mod steps;
#[cfg(feature = "cuda")]
mod weights;

#[cfg(feature = "cuda")]
pub use backend::CudaBackend;
#[cfg(feature = "cuda")]
pub use options::{CudaOptions, Switches};

/// The name of CUDA device `ordinal`, or why CUDA cannot run here (no driver, no device, no
/// cuBLASLt, or a build without CUDA). Never panics.
#[cfg(feature = "cuda")]
pub fn probe(ordinal: usize) -> Result<String, String> {
    device::probe(ordinal)
}

#[cfg(not(feature = "cuda"))]
pub fn probe(_ordinal: usize) -> Result<String, String> {
    Err("this build has no CUDA support (build flashrt with feature cuda-12 or cuda-13)".into())
}

/// Whether a GPU of compute capability `major.minor` has FP8 (e4m3) tensor cores: Ada (sm_89),
/// Hopper (sm_90), Blackwell and Thor (sm_100, sm_110, sm_120); not Orin (sm_87) or older.
pub fn has_fp8_tensor_cores(major: u32, minor: u32) -> bool {
    (major, minor) >= (8, 9)
}

/// Whether CUDA device `ordinal` can run FP8 products; if not, why, with what to use instead.
pub fn fp8_support(ordinal: usize) -> crate::Result<()> {
    #[cfg(feature = "cuda")]
    let capability = device::Context::new(ordinal).and_then(|ctx| ctx.compute_capability());
    #[cfg(not(feature = "cuda"))]
    let capability: crate::Result<(u32, u32)> = Err(crate::Error::Backend(probe(ordinal).unwrap_err()));
    match capability? {
        (major, minor) if !has_fp8_tensor_cores(major, minor) => Err(crate::Error::Backend(format!(
            "precision FP8 needs FP8 tensor cores (sm_89 or newer); CUDA device {ordinal} is sm_{major}{minor} (Jetson AGX Orin \
             is sm_87): open it in bf16 (Precision::Bf16 or Auto)"
        ))),
        _ => Ok(()),
    }
}

/// Bytes of device memory in use on the device of the calling thread's current context (as
/// `cuMemGetInfo` reports: every process's allocations), or `None` without a current context.
/// Tests use it to show that device memory stays constant across steps.
#[cfg(feature = "cuda")]
pub fn used_device_memory() -> Option<usize> {
    let (free, total) = cudarc::driver::result::mem_get_info().ok()?;
    Some(total - free)
}

/// Opens the CUDA backend for `plan`, in bf16, with the products `fp8_scales` names (by weight
/// id, from a calibration) in FP8 where they qualify: among them, products of at least
/// `fp8_min_rows` rows (the model's bound; `FRT_FP8_MIN_ROWS` overrides it).
pub fn open(
    plan: crate::plan::Plan,
    weights: Vec<crate::weights::WeightData>,
    checkpoint: std::sync::Arc<crate::checkpoint::Checkpoint>,
    device: usize,
    kernel_cache_dir: Option<std::path::PathBuf>,
    fp8_scales: Vec<Option<crate::fp8::ProductScales>>,
    fp8_min_rows: usize,
) -> crate::Result<Box<dyn crate::backend::Backend>> {
    #[cfg(feature = "cuda")]
    {
        let fp8_min_rows = match std::env::var("FRT_FP8_MIN_ROWS") {
            Ok(v) => Some(v.parse().map_err(|_| crate::Error::invalid("FRT_FP8_MIN_ROWS", format!("{v:?}: expected a row count")))?),
            Err(_) => Some(fp8_min_rows),
        };
        let opts = CudaOptions { device, kernel_cache_dir, switches: Switches::from_env(), fp8_scales, fp8_min_rows };
        Ok(Box::new(CudaBackend::new(plan, weights, checkpoint, &opts)?))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (plan, weights, checkpoint, kernel_cache_dir, fp8_scales, fp8_min_rows);
        Err(crate::Error::Backend(probe(device).unwrap_err()))
    }
}

/// Ahead-of-time kernels: compiles every kernel for `arch` (e.g. "sm_87") with NVRTC into `out`
/// under the kernel cache's file names (`flashrt kernels --arch sm_87 --out DIR`); copy them into
/// the target's cache directory (or point `kernel_cache_dir` at them) to skip NVRTC at open.
pub fn write_kernels(arch: &str, out: &std::path::Path) -> crate::Result<Vec<std::path::PathBuf>> {
    #[cfg(feature = "cuda")]
    {
        flashrt_kernels::write_cubins(arch, out).map_err(|e| crate::Error::Backend(e.to_string()))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (arch, out);
        Err(crate::Error::Backend(probe(0).unwrap_err()))
    }
}

#[cfg(test)]
mod tests {
    /// FP8 tensor cores from Ada (sm_89) on; Orin (sm_87) has none, and the board profiles agree.
    #[test]
    fn fp8_tensor_cores_from_sm89_on_and_the_boards_agree() {
        assert!(!super::has_fp8_tensor_cores(8, 7) && !super::has_fp8_tensor_cores(8, 6));
        for (major, minor) in [(8, 9), (9, 0), (10, 0), (11, 0), (12, 0)] {
            assert!(super::has_fp8_tensor_cores(major, minor), "sm_{major}{minor}");
        }
        for (major, minor) in [(8, 7), (11, 0)] {
            let board = crate::board::BoardProfile::for_compute_capability(major, minor).expect("a Jetson board");
            assert_eq!(board.fp8_tensor_cores, super::has_fp8_tensor_cores(major, minor), "{}", board.name);
        }
    }
}

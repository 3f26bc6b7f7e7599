//! FlashRT's CUDA kernels: the CUDA C sources (`cuda/*.cu`, embedded at build time), their
//! compilation with NVRTC for the exact device architecture (cached on disk as cubin, keyed by
//! source hash, architecture and NVRTC version), and typed launchers.
//!
//! Nothing here needs a CUDA toolkit to build: NVRTC and the driver are loaded at run time
//! (cudarc `dynamic-loading`). Kernels avoid toolkit headers too (bf16 is handled as raw bits in
//! `cuda/common.cuh`), so NVRTC alone compiles them.
//!
//! Launchers follow the TensorRT-LLM convention: output first, stream last, no allocation of
//! device memory inside. They are meant for warm-up and CUDA-graph capture, not for a hot loop:
//! resolving a kernel by name formats a string.

#[cfg(all(feature = "cuda-12", feature = "cuda-13"))]
compile_error!("features cuda-12 and cuda-13 are exclusive: build with `--no-default-features --features cuda-12` for CUDA 12");
#[cfg(not(any(feature = "cuda-12", feature = "cuda-13")))]
compile_error!("flashrt-kernels needs one CUDA flavour: feature cuda-12 or cuda-13");

mod compile;
mod launch;

pub use compile::{
    COMMON_HEADER, Cubin, SOURCES, Source, cubin_file_name, default_cache_dir, device_arch, load_or_compile, nvrtc_available,
    nvrtc_version, ptxas_report, supported_archs, write_cubins,
};
pub use launch::attention::{AttentionArgs, AttentionSplit, HeadsAttentionArgs};
pub use launch::elementwise::{QwenImageArgs, QwenImageSizes};
pub use launch::mlp::MlpFp8Scales;
pub use launch::sequence::{MAX_PROMPT_BUCKETS, MultiAxis, RopeArgs};
pub use launch::{
    DevPtr, Dtype, HEADS_ATTENTION, HEADS_ATTENTION_E4M3, Kernels, Mat, ROW_PRODUCT_MAX, has_fp8, has_wgmma, heads_attention_max_keys,
    kernel_names,
};

pub type Result<T, E = KernelError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// NVRTC is needed (no cached cubin) but its library cannot be loaded.
    #[error("NVRTC (libnvrtc) could not be loaded: {0}")]
    NoNvrtc(String),
    #[error("NVRTC failed to compile {source_name}.cu for {arch}: {log}")]
    Compile { source_name: String, arch: String, log: String },
    #[error("invalid GPU architecture {0:?}: expected sm_XY, e.g. sm_87, sm_90, sm_110")]
    Arch(String),
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A CUDA driver call failed; `context` says which and on what.
    #[error("{context}: {message}")]
    Cuda { context: String, message: String },
    #[error("kernel {0} is missing from the loaded modules")]
    MissingKernel(String),
}

impl KernelError {
    pub(crate) fn cuda(context: impl Into<String>, err: cudarc::driver::result::DriverError) -> Self {
        KernelError::Cuda { context: context.into(), message: format!("{err:?}") }
    }
}

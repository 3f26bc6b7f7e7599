//! NVRTC compilation of the embedded sources, the on-disk cubin cache and ahead-of-time output.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys;

use crate::{KernelError, Result};

/// One CUDA C translation unit, compiled into one module.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    pub name: &'static str,
    pub code: &'static str,
}

/// Included by every source as `common.cuh` (handed to NVRTC as an in-memory header).
pub const COMMON_HEADER: &str = include_str!("../cuda/common.cuh");

pub const SOURCES: [Source; 9] = [
    Source { name: "norm", code: include_str!("../cuda/norm.cu") },
    Source { name: "elementwise", code: include_str!("../cuda/elementwise.cu") },
    Source { name: "sequence", code: include_str!("../cuda/sequence.cu") },
    Source { name: "softmax", code: include_str!("../cuda/softmax.cu") },
    Source { name: "attention_mq256", code: include_str!("../cuda/attention_mq256.cu") },
    Source { name: "attention_heads", code: include_str!("../cuda/attention_heads.cu") },
    Source { name: "image", code: include_str!("../cuda/image.cu") },
    Source { name: "mlp", code: include_str!("../cuda/mlp.cu") },
    Source { name: "fp8", code: include_str!("../cuda/fp8.cu") },
];

/// A compiled module for one architecture.
#[derive(Clone, Debug)]
pub struct Cubin {
    pub source: &'static str,
    pub arch: String,
    pub image: Vec<u8>,
}

/// Whether the NVRTC library can be loaded (cudarc panics on use when it cannot).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

fn require_nvrtc() -> Result<()> {
    if nvrtc_available() { Ok(()) } else { Err(KernelError::NoNvrtc("libnvrtc not found on the library path (LD_LIBRARY_PATH)".into())) }
}

fn nvrtc_check(what: &str, r: sys::nvrtcResult) -> Result<()> {
    r.result().map_err(|e| KernelError::NoNvrtc(format!("{what}: {e:?}")))
}

/// `(major, minor)` of the loaded NVRTC.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loadable (checked); the out-pointers are valid.
    nvrtc_check("nvrtcVersion", unsafe { sys::nvrtcVersion(&mut major, &mut minor) })?;
    Ok((major, minor))
}

/// The `sm_XY` numbers (e.g. 87, 90, 110) the loaded NVRTC can compile for.
pub fn supported_archs() -> Result<Vec<i32>> {
    require_nvrtc()?;
    let mut n: c_int = 0;
    // SAFETY: NVRTC is loadable; `archs` has room for the `n` entries NVRTC reports.
    unsafe {
        nvrtc_check("nvrtcGetNumSupportedArchs", sys::nvrtcGetNumSupportedArchs(&mut n))?;
        let mut archs = vec![0; n.max(0) as usize];
        nvrtc_check("nvrtcGetSupportedArchs", sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()))?;
        Ok(archs)
    }
}

/// The number of an `sm_XY` architecture name, suffix dropped ("sm_90a" → 90); `None` for
/// anything else.
pub(crate) fn arch_number(arch: &str) -> Option<u32> {
    let digits = arch.strip_prefix("sm_")?.trim_end_matches(['a', 'f']);
    if digits.len() >= 2 && digits.bytes().all(|b| b.is_ascii_digit()) { digits.parse().ok() } else { None }
}

/// The architecture to compile for on a device of compute capability `major.minor`: its own
/// `sm_XY`, except that the H100/H200 (9.0) get the arch-specific `sm_90a`, whose warpgroup MMA
/// (wgmma) the attention uses, unless `wgmma` is false (`FRT_NO_WGMMA=1` in the runtime).
pub fn device_arch(major: u32, minor: u32, wgmma: bool) -> String {
    if (major, minor) == (9, 0) && wgmma { "sm_90a".into() } else { format!("sm_{major}{minor}") }
}

fn check_arch(arch: &str) -> Result<()> {
    arch_number(arch).map(|_| ()).ok_or_else(|| KernelError::Arch(arch.into()))
}

fn options(arch: &str) -> [String; 2] {
    [format!("--gpu-architecture={arch}"), "--std=c++17".into()]
}

/// FNV-1a (64-bit) of the header, the source and the compile options: stable across Rust
/// versions and platforms, unlike `DefaultHasher`, so cache names survive toolchain updates.
pub fn source_hash(source: &Source) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [COMMON_HEADER, source.code, &options("").join(" ")] {
        for &b in part.as_bytes().iter().chain(&[0u8]) {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn cubin_prefix(source: &Source, arch: &str) -> String {
    format!("{}-{:016x}-{arch}-nvrtc", source.name, source_hash(source))
}

/// Cache / ahead-of-time file name: `<source>-<hash>-<arch>-nvrtc<major>.<minor>.cubin`.
pub fn cubin_file_name(source: &Source, arch: &str, nvrtc: (i32, i32)) -> String {
    format!("{}{}.{}.cubin", cubin_prefix(source, arch), nvrtc.0, nvrtc.1)
}

/// `$XDG_CACHE_HOME/flashrt/kernels`, else `$HOME/.cache/flashrt/kernels`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("flashrt").join("kernels"))
}

/// Compiles one source for `arch` (e.g. "sm_90") and returns the cubin.
pub fn compile(source: &Source, arch: &str) -> Result<Vec<u8>> {
    compile_with(source, arch, &[]).map(|(image, _)| image)
}

/// What ptxas says about each kernel of one source compiled for `arch` (its `-v` report:
/// registers, spills, and warnings such as C7514, warpgroup MMAs serialized because other
/// instructions touch their accumulators mid-flight, which cost the FP8 expert 0.45 ms on an
/// H100 and show nowhere else without a GPU).
pub fn ptxas_report(source: &Source, arch: &str) -> Result<String> {
    compile_with(source, arch, &["--ptxas-options=-v"]).map(|(_, log)| log)
}

/// The cubin and NVRTC's log (ptxas's included) of one source for `arch`, with `extra` options.
fn compile_with(source: &Source, arch: &str, extra: &[&str]) -> Result<(Vec<u8>, String)> {
    check_arch(arch)?;
    require_nvrtc()?;
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| KernelError::Compile {
            source_name: source.name.into(),
            arch: arch.into(),
            log: "NUL byte in source".into(),
        })
    };
    let (code, name) = (cstr(source.code)?, cstr(&format!("{}.cu", source.name))?);
    let (header, header_name) = (cstr(COMMON_HEADER)?, cstr("common.cuh")?);
    let opts: Vec<CString> = options(arch).iter().map(String::as_str).chain(extra.iter().copied()).map(cstr).collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer handed to NVRTC points into a CString alive until the program is
    // destroyed below; output buffers are sized from NVRTC's own size queries.
    unsafe {
        nvrtc_check(
            "nvrtcCreateProgram",
            sys::nvrtcCreateProgram(
                &mut prog,
                code.as_ptr(),
                name.as_ptr(),
                1,
                [header.as_ptr()].as_ptr(),
                [header_name.as_ptr()].as_ptr(),
            ),
        )?;
        let compiled = sys::nvrtcCompileProgram(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
        let mut size = 0usize;
        let mut log = String::new();
        if sys::nvrtcGetProgramLogSize(prog, &mut size) == sys::nvrtcResult::NVRTC_SUCCESS && size > 0 {
            let mut buf = vec![0u8; size];
            if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) == sys::nvrtcResult::NVRTC_SUCCESS {
                log = CStr::from_bytes_until_nul(&buf).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
            }
        }
        let result = if compiled == sys::nvrtcResult::NVRTC_SUCCESS {
            nvrtc_check("nvrtcGetCUBINSize", sys::nvrtcGetCUBINSize(prog, &mut size)).and_then(|_| {
                let mut image = vec![0u8; size];
                nvrtc_check("nvrtcGetCUBIN", sys::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut c_char)).map(|_| (image, log))
            })
        } else {
            Err(KernelError::Compile { source_name: source.name.into(), arch: arch.into(), log: format!("{compiled:?}\n{log}") })
        };
        sys::nvrtcDestroyProgram(&mut prog);
        result
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KernelError + '_ {
    move |source| KernelError::Io { path: path.to_path_buf(), source }
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a concurrent reader never
/// sees a half-written cubin.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Every module for `arch`: from `cache_dir` when a cubin for this source and architecture is
/// there, else compiled with NVRTC and written to `cache_dir`. With NVRTC loadable the lookup
/// names its version exactly; without it (a deployment with ahead-of-time cubins), any cached
/// NVRTC version of the same source and architecture is accepted.
pub fn load_or_compile(arch: &str, cache_dir: Option<&Path>) -> Result<Vec<Cubin>> {
    check_arch(arch)?;
    let nvrtc = if nvrtc_available() { Some(nvrtc_version()?) } else { None };
    if let Some(dir) = cache_dir {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut out = Vec::with_capacity(SOURCES.len());
    for source in &SOURCES {
        let cached = cache_dir.and_then(|dir| match nvrtc {
            Some(v) => Some(dir.join(cubin_file_name(source, arch, v))).filter(|p| p.is_file()),
            None => {
                let prefix = cubin_prefix(source, arch);
                let entries = std::fs::read_dir(dir).ok()?;
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".cubin")))
            }
        });
        let image = match cached {
            Some(path) => {
                log::debug!("kernel cache hit: {}", path.display());
                std::fs::read(&path).map_err(io(&path))?
            }
            None => {
                let Some(version) = nvrtc else {
                    return Err(KernelError::NoNvrtc(format!(
                        "no cached cubin for {}.cu ({arch}) in {}; install NVRTC or precompile with `flashrt kernels --arch {arch} --out DIR`",
                        source.name,
                        cache_dir.map_or("<no cache dir>".into(), |d| d.display().to_string())
                    )));
                };
                let started = std::time::Instant::now();
                let image = compile(source, arch)?;
                log::info!("compiled {}.cu for {arch} with NVRTC {}.{} in {:.2?}", source.name, version.0, version.1, started.elapsed());
                if let Some(dir) = cache_dir {
                    write_atomic(&dir.join(cubin_file_name(source, arch, version)), &image)?;
                }
                image
            }
        };
        out.push(Cubin { source: source.name, arch: arch.into(), image });
    }
    Ok(out)
}

/// Ahead-of-time build: compiles every source for `arch` into `out_dir` under the cache's file
/// names, so the directory can serve as (or be copied into) a kernel cache on the target.
pub fn write_cubins(arch: &str, out_dir: &Path) -> Result<Vec<PathBuf>> {
    check_arch(arch)?;
    let version = nvrtc_version()?;
    std::fs::create_dir_all(out_dir).map_err(io(out_dir))?;
    let mut paths = Vec::with_capacity(SOURCES.len());
    for source in &SOURCES {
        let path = out_dir.join(cubin_file_name(source, arch, version));
        write_atomic(&path, &compile(source, arch)?)?;
        paths.push(path);
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_are_checked() {
        for ok in ["sm_87", "sm_90", "sm_90a", "sm_110", "sm_120f"] {
            assert!(check_arch(ok).is_ok(), "{ok}");
        }
        for bad in ["sm_", "90", "compute_90", "sm_9", "sm_x0"] {
            assert!(check_arch(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cache_names_carry_source_arch_and_version() {
        let n = cubin_file_name(&SOURCES[0], "sm_87", (12, 6));
        assert!(n.starts_with("norm-") && n.ends_with("-sm_87-nvrtc12.6.cubin"), "{n}");
        let hashes: std::collections::HashSet<u64> = SOURCES.iter().map(source_hash).collect();
        assert_eq!(hashes.len(), SOURCES.len(), "distinct sources hash differently");
    }
}

//! Every kernel compiles with NVRTC for the architectures FlashRT ships to: sm_87 (Jetson Orin),
//! sm_89 (Ada workstation GPUs, the first with FP8 tensor cores), sm_90 and sm_90a (H100/H200: the
//! runtime compiles for sm_90a, whose wgmma the attention uses; sm_90 with `FRT_NO_WGMMA=1`) and,
//! with CUDA 13, sm_110 (Jetson Thor). No GPU needed: NVRTC alone (from
//! PyPI in CI, see kernels/ci.sh) produces the cubins. The test is `#[ignore]`d, so that a plain
//! `cargo test` without NVRTC lists it as ignored instead of passing it unrun; kernels/ci.sh puts
//! NVRTC on the library path and runs it with `--include-ignored`, and then a missing NVRTC fails.
//! With NVRTC 13.0 a second test reads ptxas's report of the sm_90a build for serialized warpgroup
//! MMAs.

use flashrt_kernels::{SOURCES, kernel_names, load_or_compile, nvrtc_available, nvrtc_version, supported_archs, write_cubins};

/// The architectures this build's CUDA flavour must cover (NVRTC 12.6 predates sm_110).
fn targets() -> &'static [&'static str] {
    if cfg!(feature = "cuda-13") { &["sm_87", "sm_89", "sm_90", "sm_90a", "sm_110"] } else { &["sm_87", "sm_89", "sm_90", "sm_90a"] }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
#[ignore = "needs NVRTC on the library path: bash kernels/ci.sh"]
fn every_kernel_compiles_for_every_target() {
    assert!(nvrtc_available(), "libnvrtc is not on the library path (kernels/ci.sh installs it from PyPI and sets LD_LIBRARY_PATH)");
    let version = nvrtc_version().unwrap();
    let supported = supported_archs().unwrap();
    eprintln!("NVRTC {}.{} supports {supported:?}", version.0, version.1);
    let cache = tempfile::tempdir().unwrap();
    for arch in targets() {
        let number: i32 = arch[3..].trim_end_matches('a').parse().unwrap();
        assert!(supported.contains(&number), "NVRTC {}.{} cannot compile for {arch}", version.0, version.1);
        let started = std::time::Instant::now();
        let cubins = load_or_compile(arch, Some(cache.path())).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{arch}: {} modules compiled in {:.2?}", cubins.len(), started.elapsed());
        // Every kernel a launcher can ask for is defined (as an unmangled ELF symbol) in a module.
        for name in kernel_names(arch) {
            let symbol = [name.as_bytes(), b"\0"].concat();
            let holders = cubins.iter().filter(|c| contains(&c.image, &symbol)).count();
            assert_eq!(holders, 1, "{arch}: kernel {name} is defined in {holders} modules, expected 1");
        }
    }
    // A second open reads the cache instead of compiling, and returns the same bytes.
    let arch = targets()[1];
    let first = load_or_compile(arch, Some(cache.path())).unwrap();
    assert_eq!(
        std::fs::read_dir(cache.path()).unwrap().count(),
        SOURCES.len() * targets().len(),
        "one cache file per source and architecture"
    );
    let again = load_or_compile(arch, Some(cache.path())).unwrap();
    assert!(first.iter().zip(&again).all(|(a, b)| a.image == b.image));
    // Ahead-of-time output uses the cache's file names, so it can seed a cache on the target.
    let aot = tempfile::tempdir().unwrap();
    let written = write_cubins(arch, aot.path()).unwrap();
    for path in written {
        assert!(cache.path().join(path.file_name().unwrap()).is_file(), "{} is not a cache name", path.display());
    }
}

/// No warpgroup MMA of the sm_90a build runs serialized. ptxas serializes a kernel's wgmma
/// instructions (warning C7514, performance only) when other instructions read or write their
/// accumulators while they are in flight: the FP8 expert kernels, so compiled, took 0.45 ms
/// longer per step on an H100 (bench/NOTES.md), which nothing but a GPU run would otherwise show.
/// NVRTC 13.0's ptxas, the one the H100/H200 builds use, reports it; 12.6's log stays silent on
/// the same source, so the check is for the cuda-13 flavour.
#[cfg(feature = "cuda-13")]
#[test]
#[ignore = "needs NVRTC on the library path: bash kernels/ci.sh"]
fn no_warpgroup_mma_is_serialized() {
    use flashrt_kernels::ptxas_report;
    assert!(nvrtc_available(), "libnvrtc is not on the library path (kernels/ci.sh installs it from PyPI and sets LD_LIBRARY_PATH)");
    for source in &SOURCES {
        let report = ptxas_report(source, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
        let serialized: Vec<&str> = report.lines().filter(|l| l.contains("C7514")).collect();
        assert!(serialized.is_empty(), "{}.cu for sm_90a: ptxas serializes warpgroup MMAs:\n{}", source.name, serialized.join("\n"));
    }
}

//! The C ABI from C and C++: `tests/c/abi_test.c` (every function and error path, against
//! libflashrt.so) and `tests/c/hpp_test.cpp` (the RAII wrapper, against libflashrt.a), both under
//! valgrind memcheck when it is installed; `tests/c/stream_test.c` (the action stream: a simulated
//! control loop, its errors and panic boundary); and the export list and soname of libflashrt.so.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// System libraries a program linking the static libflashrt.a needs (`rustc --print
/// native-static-libs` on Linux); install.sh writes the same list into flashrt.pc and the CMake
/// package.
const STATIC_DEPS: &[&str] = &["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"];

/// `target/<profile>/deps`, where cargo puts libflashrt_ffi.{so,a} for this test run (next to the
/// test binary). `cargo test` does not copy them up to `target/<profile>`; only `cargo build` does.
fn artifacts() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().expect("test binary in target/<profile>/deps").to_path_buf()
}

/// The libraries under their installed names in `dir/lib`: libflashrt.so.<version>, the
/// libflashrt.so link, libflashrt.a. Returns the lib directory.
fn stage(dir: &Path) -> PathBuf {
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let so = format!("libflashrt.so.{}", env!("CARGO_PKG_VERSION"));
    std::fs::copy(artifacts().join("libflashrt_ffi.so"), lib.join(&so)).expect("libflashrt_ffi.so built by cargo");
    std::os::unix::fs::symlink(&so, lib.join("libflashrt.so")).unwrap();
    std::os::unix::fs::symlink(artifacts().join("libflashrt_ffi.a"), lib.join("libflashrt.a")).unwrap();
    lib
}

fn dynamic_symbols(so: &Path) -> Option<Vec<String>> {
    let out = common::run(common::tool("nm")?.args(["-D", "--defined-only", "--format=just-symbols"]).arg(so));
    Some(out.lines().map(str::to_owned).collect())
}

/// Runs a test program, under valgrind memcheck when available: any invalid access or leak fails.
fn run_checked(program: &Path, args: &[&Path]) {
    let mut cmd = match common::tool("valgrind") {
        Some(mut v) => {
            v.args([
                "--error-exitcode=99",
                "--leak-check=full",
                "--show-leak-kinds=definite,possible",
                "--errors-for-leak-kinds=definite,possible",
                "--quiet",
                // Deep enough that the suppressions' frames (the tokenizer's statics) are seen.
                "--num-callers=80",
                // Valgrind runs one thread at a time; without fair scheduling the stepping thread
                // can keep the lock for whole steps and starve the observation recorder's writer,
                // whose queue then drops observations the test expects in the log.
                "--fair-sched=yes",
            ]);
            v.arg(format!("--suppressions={}", common::repo().join("ffi/tests/valgrind.supp").display()));
            v.arg(program);
            v
        }
        None => Command::new(program),
    };
    // The injected panics print their message; a backtrace each would drown the report.
    let out = common::run(cmd.args(args).env("RUST_BACKTRACE", "0"));
    eprintln!("{out}");
}

/// The smallest Pi0.5 the runtime's synthesizer writes (lerobot layout, tokenizer.json inside):
/// under valgrind a step of the tiny model costs ~20 s, of this one a few. The C programs know it
/// only through the header, as a user would.
fn synthesized(dir: &Path) -> (PathBuf, PathBuf) {
    let ckpt = dir.join("pi05_micro");
    flashrt::models::pi05::synth::synthesize(&ckpt, flashrt::models::pi05::synth::SynthSize::Micro, 7, &|_| {})
        .expect("synthesize a micro checkpoint");
    let tokenizer = ckpt.join("tokenizer.json");
    (ckpt, tokenizer)
}

fn version_defines() -> Vec<String> {
    vec![
        format!("-DEXPECTED_MAJOR={}", env!("CARGO_PKG_VERSION_MAJOR")),
        format!("-DEXPECTED_MINOR={}", env!("CARGO_PKG_VERSION_MINOR")),
        format!("-DEXPECTED_PATCH={}", env!("CARGO_PKG_VERSION_PATCH")),
        format!("-DEXPECTED_VERSION=\"{}\"", env!("CARGO_PKG_VERSION")),
    ]
}

#[test]
fn exports_only_frt_symbols_and_soname_is_exact() {
    let so = artifacts().join("libflashrt_ffi.so");
    let Some(symbols) = dynamic_symbols(&so) else { return };
    let foreign: Vec<&String> = symbols.iter().filter(|s| !s.starts_with("frt_")).collect();
    assert!(foreign.is_empty(), "libflashrt.so exports non-frt symbols: {foreign:?}");
    // Every function the header declares is exported.
    let header = std::fs::read_to_string(common::include_dir().join("flashrt.h")).unwrap();
    let declared = header.split('(').filter_map(|before| before.rsplit(|c: char| !c.is_alphanumeric() && c != '_').next());
    for name in declared.filter(|w| w.starts_with("frt_")) {
        assert!(symbols.iter().any(|s| s == name), "{name} is declared in flashrt.h but not exported");
    }
    let Some(mut readelf) = common::tool("readelf") else { return };
    let dynamic = common::run(readelf.arg("-d").arg(&so));
    let soname = format!("[libflashrt.so.{}]", env!("CARGO_PKG_VERSION"));
    assert!(dynamic.contains(&soname), "soname is not {soname}:\n{dynamic}");
}

#[test]
fn c_program_covers_every_function_and_error_path() {
    let Some(mut gcc) = common::tool("gcc") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lib = stage(tmp.path());
    let exe = tmp.path().join("abi_test");
    gcc.args(["-std=c99", "-g"]).args(common::STRICT).args(version_defines());
    // Debug libraries carry the panic-injection hook (ffi/src/boundary.rs); release ones do not.
    let hook = dynamic_symbols(&lib.join("libflashrt.so")).is_some_and(|s| s.iter().any(|s| s == "frt_debug_panic_next_call"));
    if hook {
        gcc.arg("-DFRT_PANIC_HOOK");
    } else {
        if cfg!(debug_assertions) {
            panic!("a debug build must export frt_debug_panic_next_call");
        }
        common::skipped("panic boundary test: the release library has no injection hook");
    }
    gcc.arg("-I").arg(common::include_dir()).arg(common::repo().join("tests/c/abi_test.c")).arg("-o").arg(&exe);
    common::run(gcc.arg("-L").arg(&lib).arg("-lflashrt").arg("-lm").arg(format!("-Wl,-rpath,{}", lib.display())));
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let (ckpt, tokenizer) = synthesized(tmp.path());
    let groot = common::repo().join("tests/data/groot_n17_tiny");
    run_checked(&exe, &[&ckpt, &tokenizer, &scratch, &groot]);
    recorded_steps_read_back(&scratch.join("recorded.frtobs"));
}

/// The observation log `frt_policy_record_start` wrote during the C program's `test_steps`: its
/// six successful steps, frames packed as the C program filled them (`fill_frames`).
fn recorded_steps_read_back(path: &Path) {
    use flashrt::observation_log::ObservationLogReader;
    let (w, h) = (64, 48);
    let value = |y: usize, x: usize, c: usize| ((y * 7 + x * 13 + c * 101) % 251) as u8;
    let pixels = |order: [usize; 3], alpha: bool| -> Vec<u8> {
        let mut out = Vec::new();
        for y in 0..h {
            for x in 0..w {
                out.extend(order.map(|c| value(y, x, c)));
                if alpha {
                    out.push(255);
                }
            }
        }
        out
    };
    let (rgb, bgr, rgba) = (pixels([0, 1, 2], false), pixels([2, 1, 0], false), pixels([0, 1, 2], true));
    let state: Vec<f32> = (0..8).map(|i| 0.1 * i as f32 - 0.2).collect();
    let noise: Vec<f32> = (0..50 * 32).map(|i: i32| (i * 37 % 101 - 50) as f32 / 50.0).collect();

    let reader = ObservationLogReader::open(path).unwrap();
    let header = reader.header();
    assert_eq!((header.model.as_str(), header.cameras, header.state_dim), ("pi05", 3, 8));
    let records: Vec<_> = reader.map(Result::unwrap).collect();
    assert_eq!(records.len(), 6, "six successful steps, the refused one not recorded");
    for (r, rec) in records.iter().enumerate() {
        assert_eq!(rec.prompt, if r < 5 { "pick up the cube" } else { "place it in the bowl" }, "record {r}");
        let frames: Vec<_> = rec.cameras.iter().map(|c| c.as_ref().map(|f| (f.width, f.height, f.format, &f.data[..]))).collect();
        let (first, second) = if r == 2 { ((1, &bgr), (2, &rgba)) } else { ((0, &rgb), (0, &rgb)) };
        assert_eq!(frames, [Some((64, 48, first.0, &first.1[..])), Some((64, 48, second.0, &second.1[..])), None], "record {r}");
        let mut expected_state = state.clone();
        if r == 3 {
            expected_state[0] = 0.9;
        }
        assert_eq!(rec.state, expected_state, "record {r}");
        assert_eq!(rec.noise.as_deref(), (r != 4).then_some(&noise[..]), "record {r}");
    }
}

#[test]
fn cpp_wrapper_works_with_the_static_library() {
    let Some(mut gxx) = common::tool("g++") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lib = stage(tmp.path());
    let exe = tmp.path().join("hpp_test");
    gxx.args(["-std=c++17", "-g"]).args(common::STRICT).arg("-I").arg(common::include_dir());
    gxx.arg(common::repo().join("tests/c/hpp_test.cpp")).arg("-o").arg(&exe).arg(lib.join("libflashrt.a")).args(STATIC_DEPS);
    common::run(&mut gxx);
    let (ckpt, tokenizer) = synthesized(tmp.path());
    run_checked(&exe, &[&ckpt, &tokenizer]);
}

#[test]
fn c_stream_program_runs_a_control_loop() {
    let Some(mut gcc) = common::tool("gcc") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let lib = stage(tmp.path());
    let exe = tmp.path().join("stream_test");
    gcc.args(["-std=c99", "-g"]).args(common::STRICT);
    if dynamic_symbols(&lib.join("libflashrt.so")).is_some_and(|s| s.iter().any(|s| s == "frt_debug_panic_next_call")) {
        gcc.arg("-DFRT_PANIC_HOOK");
    }
    gcc.arg("-I").arg(common::include_dir()).arg(common::repo().join("tests/c/stream_test.c")).arg("-o").arg(&exe);
    common::run(gcc.arg("-L").arg(&lib).arg("-lflashrt").arg("-lm").arg(format!("-Wl,-rpath,{}", lib.display())));
    let (ckpt, tokenizer) = synthesized(tmp.path());
    run_checked(&exe, &[&ckpt, &tokenizer]);
}

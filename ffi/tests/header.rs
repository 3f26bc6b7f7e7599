//! `include/flashrt.h` is exactly what the pinned cbindgen generates from `ffi/src`, and it
//! compiles cleanly as C99 and C++17. `FRT_BLESS=1` rewrites the committed header instead of
//! failing.

mod common;

use std::path::Path;

#[test]
fn committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("ffi/cbindgen.toml parses");
    let bindings =
        cbindgen::Builder::new().with_config(config).with_src(dir.join("src/lib.rs")).generate().expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = dir.join("../include/flashrt.h");
    if std::env::var_os("FRT_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/flashrt.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/flashrt.h is stale: regenerate it with `FRT_BLESS=1 cargo test -p flashrt-ffi --test header` and commit it"
    );
}

#[test]
fn header_compiles_as_c99_and_cpp17() {
    let include = common::include_dir();
    let tmp = tempfile::tempdir().unwrap();
    for (compiler, std, file) in [("gcc", "-std=c99", "t.c"), ("g++", "-std=c++17", "t.cpp")] {
        let Some(mut cc) = common::tool(compiler) else { continue };
        let src = tmp.path().join(file);
        std::fs::write(&src, "#include <flashrt.h>\n#include <flashrt.h>\nint main(void) { return FRT_STATUS_OK; }\n").unwrap();
        common::run(cc.arg(std).args(common::STRICT).arg("-I").arg(&include).arg("-c").arg(&src).arg("-o").arg(tmp.path().join("t.o")));
    }
}

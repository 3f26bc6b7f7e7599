//! Link arguments for libflashrt.so: the soname pins the exact release (no ABI promise between
//! 0.x releases).
//!
//! No version script of our own: for a cdylib rustc already passes the linker one that exports only
//! the C-level symbols (`#[unsafe(no_mangle)] pub extern "C"` functions, here all `frt_*`) and
//! makes everything else local. A second one (the former `exports.map`, `frt_*` global, `*` local)
//! produced a byte-identical library with rustup's x86_64 toolchain, and GNU ld refuses two
//! anonymous version scripts, which forced gold for aarch64. `tests/c_api.rs` (x86_64) and
//! `jetson/ci.sh` (aarch64) check that only `frt_*` symbols are exported.

fn main() {
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libflashrt.so.{version}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

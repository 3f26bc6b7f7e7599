//! Link arguments for libflashrt.so: the soname pins the exact release (no ABI promise between
//! 0.x releases) and the version script keeps every non-`frt_*` symbol local.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libflashrt.so.{version}");
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/exports.map");
    }
    println!("cargo:rerun-if-changed=exports.map");
    println!("cargo:rerun-if-changed=build.rs");
}

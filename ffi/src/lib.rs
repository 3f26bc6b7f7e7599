//! The C ABI of FlashRT (`libflashrt`), described by the generated `include/flashrt.h`.
//!
//! Conventions (DESIGN.md §5, after rustls-ffi): `frt_<object>_<verb>` names; every fallible
//! function returns an [`FrtStatus`] with stable numbers; receiver first, then inputs, then outputs;
//! outputs are written only on success; every buffer pointer is followed by its length; NULL is
//! checked everywhere; every export runs inside a panic boundary ([`boundary::guard`]), because a
//! panic unwinding into C would abort the robot controller. Numbers that C writes (enum fields in
//! config and observation structs, status codes passed back in) are read as plain `u32` and
//! checked, never transmuted into a Rust enum.
//!
//! Regenerate the header after changing any item here:
//! `FRT_BLESS=1 cargo test -p flashrt-ffi --test header`.

// A panic must become FRT_STATUS_PANIC; with panic=abort the boundary could not catch it.
#[cfg(panic = "abort")]
compile_error!("flashrt-ffi needs panic=unwind: its exports turn panics into FRT_STATUS_PANIC");

// Declaration order is the header's order (cbindgen follows it); rustfmt sorts only within a group.
mod status;
// Configuration, then the policy and its calls.
mod config;
mod logging;
mod policy;
mod stream;
// Internals.
mod boundary;

pub use config::*;
pub use logging::{FrtLogCallback, FrtLogLevel};
pub use policy::*;
pub use status::*;
pub use stream::*;

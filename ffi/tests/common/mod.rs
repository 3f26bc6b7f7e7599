//! Helpers for tests that drive external tools (gcc, g++, valgrind, nm).

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

/// Warnings that C and C++ users of the header must be able to enable.
pub const STRICT: &[&str] = &["-Wall", "-Wextra", "-Werror", "-pedantic"];

/// A command for `name` if it is on PATH. A missing tool skips the caller's check with a visible
/// message, or fails it under `FRT_REQUIRE_ALL=1` (CI), where a skipped check would hide a gap.
pub fn tool(name: &str) -> Option<Command> {
    let found = Command::new(name).arg("--version").output().is_ok_and(|o| o.status.success());
    if found {
        return Some(Command::new(name));
    }
    assert!(std::env::var("FRT_REQUIRE_ALL").as_deref() != Ok("1"), "{name} not found and FRT_REQUIRE_ALL=1");
    skipped(&format!("{name} not found; install it to run this check (CI sets FRT_REQUIRE_ALL=1)"));
    None
}

/// Reports a skipped check on the process's stderr itself: libtest captures `eprintln!` of a
/// passing test, which would hide the skip, but not direct writes to the stream.
pub fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED (the test still reports ok): {why}");
}

/// Runs a command and fails the test with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{text}", out.status);
    text
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn include_dir() -> PathBuf {
    repo().join("include")
}

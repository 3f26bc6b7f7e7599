//! Log messages of the runtime (`log` crate) delivered to the C caller.
//!
//! One process-wide logger is installed on first use; it forwards a record only while an `frt_*`
//! call runs on the same thread, to the sink of that call's policy (its config's level and
//! callback). Messages are formatted into a stack buffer, so logging never allocates.

use std::cell::Cell;
use std::ffi::{c_char, c_void};
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Severity of a log message; in `FrtPolicyConfig.log_level`, the least severe level delivered.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrtLogLevel {
    /// No messages.
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

/// Receives one log message: `message` is NUL-terminated, `message_len` bytes long (without the
/// NUL), truncated to 1023 bytes, and valid only during the call. Called on the thread that made
/// the `frt_*` call, before that call returns.
pub type FrtLogCallback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, level: FrtLogLevel, message: *const c_char, message_len: usize)>;

#[derive(Clone, Copy)]
pub(crate) struct Sink {
    level: log::LevelFilter,
    callback: FrtLogCallback,
    user_data: *mut c_void,
}

thread_local! {
    static CURRENT: Cell<Option<Sink>> = const { Cell::new(None) };
}

/// Most verbose level any sink asked for: the `log` macros skip everything above it cheaply.
static MAX_LEVEL: AtomicUsize = AtomicUsize::new(0);

impl Sink {
    pub(crate) fn new(level: log::LevelFilter, callback: FrtLogCallback, user_data: *mut c_void) -> Sink {
        Sink { level, callback, user_data }
    }

    /// Routes this thread's log records to the sink until the returned scope drops.
    pub(crate) fn enter(self) -> Scope {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        // Fails only if the host (a Rust program linking the rlib) has its own logger: keep that one.
        INSTALL.call_once(|| drop(log::set_logger(&Logger)));
        if self.level as usize > MAX_LEVEL.load(Ordering::Relaxed) {
            static RAISE: std::sync::Mutex<()> = std::sync::Mutex::new(());
            let _one_at_a_time = RAISE.lock();
            if self.level as usize > MAX_LEVEL.load(Ordering::Relaxed) {
                MAX_LEVEL.store(self.level as usize, Ordering::Relaxed);
                log::set_max_level(self.level);
            }
        }
        Scope(CURRENT.replace(Some(self)))
    }
}

pub(crate) struct Scope(Option<Sink>);

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.set(self.0);
    }
}

struct Logger;

impl log::Log for Logger {
    fn enabled(&self, meta: &log::Metadata) -> bool {
        CURRENT.get().is_some_and(|s| meta.level() <= s.level)
    }

    fn log(&self, record: &log::Record) {
        let Some(sink) = CURRENT.get().filter(|s| record.level() <= s.level) else { return };
        let mut line = Line { buf: [0; 1024], len: 0 };
        let _ = write!(line, "{}", record.args());
        match sink.callback {
            Some(callback) => {
                let level = match record.level() {
                    log::Level::Error => FrtLogLevel::Error,
                    log::Level::Warn => FrtLogLevel::Warn,
                    log::Level::Info => FrtLogLevel::Info,
                    log::Level::Debug => FrtLogLevel::Debug,
                    log::Level::Trace => FrtLogLevel::Trace,
                };
                // SAFETY: the caller gave a callback with this signature; buf holds len bytes + NUL.
                unsafe { callback(sink.user_data, level, line.buf.as_ptr().cast(), line.len) };
            }
            None => {
                let _ = writeln!(std::io::stderr(), "flashrt {}: {}", record.level(), line.text());
            }
        }
    }

    fn flush(&self) {}
}

/// A NUL-terminated message in a fixed buffer; longer text is cut at a character boundary.
struct Line {
    buf: [u8; 1024],
    len: usize,
}

impl Line {
    fn text(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut n = s.len().min(self.buf.len() - 1 - self.len);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_at_a_char_boundary_and_stay_terminated() {
        let mut line = Line { buf: [0; 1024], len: 0 };
        let _ = write!(line, "{}", "é".repeat(600));
        assert_eq!(line.len, 1022);
        assert_eq!(line.buf[line.len], 0);
        assert!(line.text().chars().all(|c| c == 'é'));
    }
}

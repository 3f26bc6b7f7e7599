//! A logger that keeps every record with the thread that logged it, so that tests running in
//! parallel each read only their own. Only for test binaries that include it (`#[path]`).

use std::sync::Mutex;
use std::thread::ThreadId;

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Capture(Mutex<Vec<(ThreadId, Level, String)>>);

static CAPTURE: Capture = Capture(Mutex::new(Vec::new()));

impl Log for Capture {
    fn enabled(&self, _: &Metadata) -> bool {
        true
    }

    fn log(&self, record: &Record) {
        let line = (std::thread::current().id(), record.level(), record.args().to_string());
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }

    fn flush(&self) {}
}

/// Runs `f` and returns what it logged on this thread at warn level or above.
pub fn warnings<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    if log::set_logger(&CAPTURE).is_ok() {
        log::set_max_level(LevelFilter::Trace);
    }
    let me = std::thread::current().id();
    let mine = |v: &[(ThreadId, Level, String)]| v.iter().filter(|(t, ..)| *t == me).count();
    let before = mine(&CAPTURE.0.lock().unwrap_or_else(|e| e.into_inner()));
    let out = f();
    let all = CAPTURE.0.lock().unwrap_or_else(|e| e.into_inner());
    let lines = all.iter().filter(|(t, ..)| *t == me).skip(before).filter(|(_, l, _)| *l <= Level::Warn).map(|(.., m)| m.clone()).collect();
    (out, lines)
}

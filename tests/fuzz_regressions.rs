//! What the fuzz targets found, kept fixed in a plain `cargo test` (fuzz/ci.sh runs the targets
//! themselves):
//! - every checkpoint file the `checkpoint` target found a crash with, replayed through
//!   `Policy::open`: each file in tests/data/fuzz/ named `<model>__<file>__<what>` replaces
//!   `<file>` of a loadable checkpoint (`pi05`: the micro Pi0.5; `groot`:
//!   tests/data/groot_n17_tiny), and open must fail with an error naming the problem, not panic;
//! - the memory that target ran out of: opening and dropping a policy with a tokenizer must not
//!   keep memory (tokenizers' thread-local BPE cache did, 1.6 MB per open of the micro Pi0.5).

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};

use flashrt::models::pi05::synth::{SynthSize, synthesize};
use flashrt::{BackendKind, Error, Policy, PolicyConfig};

/// Bytes allocated and not yet freed, by every thread.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Tracking;

// SAFETY: forwards to the system allocator; only counts bytes.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// The tests run one at a time: the memory test reads the whole process's live bytes.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with("golden") {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(&name));
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

fn open(dir: &Path) -> flashrt::Result<Policy> {
    let mut config = PolicyConfig::new(dir);
    config.backend = BackendKind::Cpu;
    config.threads = Some(1);
    Policy::open(&config)
}

/// Each finding's expected error: its kind and words of its message.
fn expected(what: &str) -> (fn(&Error) -> bool, &'static str) {
    match what {
        "truncated-decoder" => (|e| matches!(e, Error::Tokenizer(_)), "not well-formed JSON"),
        "merge-longer-than-vocab" => (|e| matches!(e, Error::Tokenizer(_)), "makes a token longer than any in the vocabulary"),
        "attend-text-every-zero" => (|e| matches!(e, Error::Checkpoint { .. }), "attend_text_every_n_blocks is 0"),
        "dit-heads-zero" => (|e| matches!(e, Error::Checkpoint { .. }), "inconsistent head counts"),
        other => panic!("tests/data/fuzz: no expectation for {other:?}; add one here"),
    }
}

/// A micro Pi0.5 and a copy of the tiny GR00T under `root`, as the checkpoint fuzz target has them.
fn checkpoints(root: &Path) -> (PathBuf, PathBuf) {
    let pi05 = root.join("pi05");
    synthesize(&pi05, SynthSize::Micro, 5, &|_| {}).unwrap();
    let groot = root.join("groot");
    copy_dir(&data().join("groot_n17_tiny"), &groot);
    (pi05, groot)
}

#[test]
fn checkpoint_files_found_by_fuzzing_are_refused_by_name() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::tempdir().unwrap();
    let (pi05, groot) = checkpoints(root.path());
    for dir in [&pi05, &groot] {
        open(dir).unwrap_or_else(|e| panic!("the unchanged {} does not open: {e}", dir.display()));
    }

    let mut inputs: Vec<PathBuf> = std::fs::read_dir(data().join("fuzz")).unwrap().map(|e| e.unwrap().path()).collect();
    inputs.sort();
    assert!(!inputs.is_empty());
    for input in inputs {
        let name = input.file_name().unwrap().to_str().unwrap().to_string();
        let [model, file, what] = name.split("__").collect::<Vec<_>>()[..] else { panic!("{name}: not <model>__<file>__<what>") };
        let dir = match model {
            "pi05" => &pi05,
            "groot" => &groot,
            other => panic!("{name}: unknown model {other}"),
        };
        let target = dir.join(file);
        let original = std::fs::read(&target).unwrap();
        std::fs::copy(&input, &target).unwrap();
        let result = open(dir);
        std::fs::write(&target, original).unwrap();
        let (kind, words) = expected(what);
        match result {
            Ok(_) => panic!("{name}: opened"),
            Err(e) => assert!(kind(&e) && e.to_string().contains(words), "{name}: {e}"),
        }
    }
}

#[test]
fn opening_and_dropping_policies_keeps_no_memory() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::tempdir().unwrap();
    let (pi05, groot) = checkpoints(root.path());
    let cycle = || {
        for dir in [&pi05, &groot] {
            let mut policy = open(dir).unwrap();
            policy.set_prompt("pick up the red block").unwrap();
        }
    };
    // Once for what is made once per process (lazy statics, thread-locals of this thread).
    cycle();
    let before = LIVE.load(Ordering::SeqCst);
    let cycles = 4;
    for _ in 0..cycles {
        cycle();
    }
    let kept = LIVE.load(Ordering::SeqCst) - before;
    // The leak kept 1.6 MB per Pi0.5 open; allow small bookkeeping (the cache's per-model slot).
    assert!(kept < 64 * 1024, "{cycles} open/drop cycles kept {kept} bytes");
}

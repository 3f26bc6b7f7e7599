//! Every checkpoint file the `checkpoint` fuzz target found a crash with, replayed through
//! `Policy::open`: each file in tests/data/fuzz/ named `<model>__<file>__<what>` replaces `<file>`
//! of a loadable checkpoint (`pi05`: the micro Pi0.5; `groot`: tests/data/groot_n17_tiny), and
//! open must fail with an error naming the problem, not panic. fuzz/ci.sh runs the fuzz targets
//! themselves; this keeps their findings fixed in a plain `cargo test`.

use std::path::{Path, PathBuf};

use flashrt::models::pi05::synth::{SynthSize, synthesize};
use flashrt::{BackendKind, Error, Policy, PolicyConfig};

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
        other => panic!("tests/data/fuzz: no expectation for {other:?}; add one here"),
    }
}

#[test]
fn checkpoint_files_found_by_fuzzing_are_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let pi05 = root.path().join("pi05");
    synthesize(&pi05, SynthSize::Micro, 5, &|_| {}).unwrap();
    let groot = root.path().join("groot");
    copy_dir(&data().join("groot_n17_tiny"), &groot);
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

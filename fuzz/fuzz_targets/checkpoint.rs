//! The file parsers on mutated files: the input picks one file of a real checkpoint (the micro
//! Pi0.5 with lerobot statistics; the same with openpi's norm_stats.json and a sharded index; the
//! tiny GR00T N1.7 with its sidecars and Qwen tokenizer) or a real observation log, and replaces
//! it, overwrites its beginning (a safetensors header over the real data) or removes it.
//! `Policy::open` on the checkpoint, or reading every record of the log (`flashrt run
//! --observations`, FP8 calibration), must return Ok or Err: a panic, abort, hang or runaway
//! allocation is a finding.
//!
//! Input: `[slot, mode, bytes...]`.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use flashrt::observation_log::{LogHeader, ObservationLogReader, ObservationLogWriter};
use flashrt::{Frame, Observation, PixelFormat, Policy};
use flashrt_fuzz::{cpu_config, micro_pi05, scratch_dir};
use libfuzzer_sys::fuzz_target;

/// The files an input can change: checkpoint directory and path inside it. Order is part of the
/// corpus format (the first input byte indexes it): append only.
const SLOTS: &[(&str, &str)] = &[
    ("pi05", "config.json"),
    ("pi05", "model.safetensors"),
    ("pi05", "policy_preprocessor_step_3_normalizer_processor.safetensors"),
    ("pi05", "policy_postprocessor_step_0_unnormalizer_processor.safetensors"),
    ("pi05", "tokenizer.json"),
    ("openpi", "config.json"),
    ("openpi", "model.safetensors.index.json"),
    ("openpi", "model-00001-of-00001.safetensors"),
    ("openpi", "norm_stats.json"),
    ("groot", "config.json"),
    ("groot", "backbone/config.json"),
    ("groot", "model.safetensors"),
    ("groot", "processor_config.json"),
    ("groot", "statistics.json"),
    ("groot", "embodiment_id.json"),
    ("groot", "tokenizer.json"),
    (LOG_DIR, "observations.frtobs"),
];

/// The slot directory that holds an observation log, not a checkpoint.
const LOG_DIR: &str = "log";

struct Fixtures {
    root: PathBuf,
    /// The original bytes of every slot, restored after each input.
    originals: Vec<Vec<u8>>,
}

fn copy_dir(from: &Path, to: &Path, skip: &dyn Fn(&str) -> bool) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if skip(&name) {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(&name), skip);
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let root = scratch_dir().join("checkpoints");
        copy_dir(micro_pi05(), &root.join("pi05"), &|_| false);
        // openpi statistics instead of lerobot's processor files, and the weights as one shard.
        let openpi = root.join("openpi");
        copy_dir(micro_pi05(), &openpi, &|name| name.starts_with("policy_"));
        std::fs::rename(openpi.join("model.safetensors"), openpi.join("model-00001-of-00001.safetensors")).unwrap();
        let weights = std::fs::read(openpi.join("model-00001-of-00001.safetensors")).unwrap();
        let names = safetensors::SafeTensors::deserialize(&weights).unwrap().names().into_iter().map(String::from).collect::<Vec<_>>();
        let map: serde_json::Map<String, serde_json::Value> =
            names.into_iter().map(|n| (n, "model-00001-of-00001.safetensors".into())).collect();
        std::fs::write(openpi.join("model.safetensors.index.json"), serde_json::json!({ "metadata": {}, "weight_map": map }).to_string())
            .unwrap();
        let quantiles =
            |dim: usize| serde_json::json!({"mean": vec![0.0; dim], "std": vec![1.0; dim], "q01": vec![-1.0; dim], "q99": vec![1.0; dim]});
        let stats = serde_json::json!({"norm_stats": {"state": quantiles(8), "actions": quantiles(7)}});
        std::fs::write(openpi.join("norm_stats.json"), stats.to_string()).unwrap();
        let groot = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/groot_n17_tiny");
        copy_dir(&groot, &root.join("groot"), &|name| name.starts_with("golden") || name == "README.md");

        write_log(&root.join(LOG_DIR));

        let originals = SLOTS.iter().map(|(dir, file)| std::fs::read(root.join(dir).join(file)).unwrap()).collect();
        let f = Fixtures { root, originals };
        // The unchanged fixtures open: otherwise every input would only test the same refusal.
        for dir in ["pi05", "openpi", "groot"] {
            if let Err(e) = Policy::open(&cpu_config(&f.root.join(dir))) {
                panic!("the unchanged {dir} fixture does not open: {e}");
            }
        }
        assert_eq!(read_log(&f.root.join(LOG_DIR).join("observations.frtobs")), Ok(3), "the unchanged log reads");
        f
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixtures();
    let [slot, mode, bytes @ ..] = data else { return };
    let slot = *slot as usize % SLOTS.len();
    let (dir, file) = SLOTS[slot];
    let path = f.root.join(dir).join(file);
    let original = &f.originals[slot];
    match mode % 3 {
        0 => std::fs::write(&path, bytes).unwrap(),
        1 => {
            let mut changed = original.clone();
            let n = bytes.len().min(changed.len());
            changed[..n].copy_from_slice(&bytes[..n]);
            std::fs::write(&path, changed).unwrap();
        }
        _ => std::fs::remove_file(&path).unwrap(),
    }
    // Ok or Err are both fine: the loader must only never panic, abort or hang.
    if dir == LOG_DIR {
        let _ = read_log(&path);
    } else {
        let _ = Policy::open(&cpu_config(&f.root.join(dir)));
    }
    std::fs::write(&path, original).unwrap();
});

/// An observation log as `flashrt record` writes one: 3 cameras (one missing in a record, one
/// with padded rows), state 8, a prompt change, noise on one record.
fn write_log(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let header = LogHeader::new("pi05", 3, 8, "fuzz fixture");
    let mut log = ObservationLogWriter::create(dir.join("observations.frtobs"), header).unwrap();
    let pixels: Vec<u8> = (0..8 * 6 * 4).map(|i| (i * 7) as u8).collect();
    let noise = [0.5f32; 12];
    for r in 0..3 {
        let cameras = [
            Some(Frame::packed(&pixels[..6 * 6 * 3], 6, 6, PixelFormat::Rgb8)),
            (r != 1).then(|| Frame { data: &pixels, width: 5, height: 6, stride: 8 * 4, format: PixelFormat::Rgba8 }),
            Some(Frame::packed(&pixels[..4 * 3 * 3], 4, 3, PixelFormat::Bgr8)),
        ];
        let state = [r as f32; 8];
        let obs = Observation { cameras: &cameras, state: &state, noise: (r == 2).then_some(&noise[..]) };
        log.append(&obs, ["pick up the cube", "place it"][r / 2]).unwrap();
    }
    log.finish().unwrap();
}

/// Reads every record of the log at `path` as a replay does (frames and observation included);
/// the number of records, or the first error's text.
fn read_log(path: &Path) -> Result<usize, String> {
    let reader = ObservationLogReader::open(path).map_err(|e| e.to_string())?;
    let cameras = usize::from(reader.header().cameras);
    let mut records = 0;
    for record in reader {
        let record = record.map_err(|e| e.to_string())?;
        let frames = record.frames();
        let obs = record.observation(&frames);
        assert_eq!(obs.cameras.len(), cameras, "the reader checks every record against the header");
        records += 1;
    }
    Ok(records)
}

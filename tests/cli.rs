//! The `flashrt` binary end to end: synth → inspect → run (synthetic and file observations) →
//! bench JSON, and a clear error for a bad checkpoint.

use std::path::Path;
use std::process::Command;

fn flashrt(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flashrt")).args(args).env("RUST_LOG", "warn").output().expect("flashrt runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `flashrt synth` of a tiny Pi0.5 into `dir/tiny`; returns its path.
fn synth_tiny(dir: &Path, seed: &str) -> std::path::PathBuf {
    let ckpt = dir.join("tiny");
    let (ok, stdout, stderr) = flashrt(&["synth", "--model", "pi05", "--size", "tiny", "--out", path(&ckpt), "--seed", seed]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("wrote a Tiny Pi0.5 checkpoint"));
    ckpt
}

#[test]
fn synth_inspect_run_and_bench() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth_tiny(dir.path(), "9");

    let (ok, stdout, stderr) = flashrt(&["inspect", "--checkpoint", path(&ckpt)]);
    assert!(ok, "{stderr}");
    for needle in ["model pi05", "3 cameras", "state 8 -> actions 50x7", "phase vision", "phase denoise step 9", "folded at load"] {
        assert!(stdout.contains(needle), "inspect output lacks {needle:?}:\n{stdout}");
    }

    let (ok, stdout, stderr) = flashrt(&["run", "--checkpoint", path(&ckpt), "--steps", "3", "--prompt", "stack the cups"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("3 steps: p50"), "{stdout}");

    // An observation file: cameras 0 and 1 at 320x240, camera 2 missing, a state of 8.
    let frame: Vec<u8> = (0..320 * 240 * 3).map(|i| (i % 251) as u8).collect();
    let state: Vec<u8> = [0.1f32, -0.2, 0.3, 0.0, 0.5, -0.6, 0.7, 0.05].iter().flat_map(|v| v.to_le_bytes()).collect();
    let obs = dir.path().join("obs.safetensors");
    let views = vec![
        ("image.0", safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![240, 320, 3], &frame).unwrap()),
        ("image.1", safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![240, 320, 3], &frame).unwrap()),
        ("state", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![8], &state).unwrap()),
    ];
    safetensors::serialize_to_file(views, None, &obs).unwrap();
    let (ok, stdout, stderr) = flashrt(&["run", "--checkpoint", path(&ckpt), "--steps", "2", "--observation", path(&obs)]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("first action row"), "{stdout}");

    let json = dir.path().join("bench.json");
    for _ in 0..2 {
        let (ok, _, stderr) = flashrt(&["bench", "--checkpoint", path(&ckpt), "--iterations", "5", "--warmup", "1", "--out", path(&json)]);
        assert!(ok, "{stderr}");
    }
    let results: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(results.len(), 2, "bench appends to the result list");
    for key in [
        "workload",
        "model",
        "device",
        "backend",
        "precision",
        "views",
        "prompt_tokens",
        "steps",
        "horizon",
        "iterations",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "max_ms",
        "cold_start_s",
        "device_mem_mib",
        "commit",
        "command",
        "date",
    ] {
        assert!(results[0].get(key).is_some(), "bench JSON lacks {key}");
    }
    let r = &results[1];
    assert_eq!(r["iterations"], 5);
    let ms = |key: &str| r[key].as_f64().unwrap_or_else(|| panic!("bench JSON lacks {key}"));
    assert!(ms("p50_ms") > 0.0 && ms("p50_ms") <= ms("max_ms"));
    // The backend's run lies inside each step, so each of its order statistics lies under the step's.
    assert!(0.0 < ms("backend_p50_ms") && ms("backend_p50_ms") <= ms("backend_p99_ms") && ms("backend_p99_ms") <= ms("backend_max_ms"));
    assert!(ms("backend_p99_ms") <= ms("p99_ms") && ms("backend_max_ms") <= ms("max_ms"), "{r}");
}

#[test]
fn prompt_capacity_sizes_the_prefix() {
    // 32 slots: the smallest capacity the test tokenizer accepts with 8 state dims is above 16.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth_tiny(dir.path(), "3");
    // The first denoise step is the plan's concurrent phase (a second stream on a GPU).
    let (ok, stdout, stderr) = flashrt(&["inspect", "--checkpoint", path(&ckpt), "--prompt-capacity", "32"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("phase denoise step 0 (concurrent)"), "{stdout}");
    let prefix_rows = |text: &str| -> usize {
        let line = text.lines().find(|l| l.contains(" prefix_x ")).expect("a prefix_x buffer");
        line.split_whitespace().last().unwrap().parse::<usize>().unwrap()
    };
    let (_, full, _) = flashrt(&["inspect", "--checkpoint", path(&ckpt)]);
    // prefix_x is [image tokens + prompt slots, width]: 32 slots instead of the checkpoint's 200.
    let width = (prefix_rows(&full) - prefix_rows(&stdout)) / (200 - 32);
    assert!(width > 0 && prefix_rows(&full) - prefix_rows(&stdout) == (200 - 32) * width, "{full}");

    let json = dir.path().join("bench.json");
    let bench = |tokens: &str| {
        flashrt(&[
            "bench",
            "--checkpoint",
            path(&ckpt),
            "--prompt-capacity",
            "32",
            "--prompt-tokens",
            tokens,
            "--iterations",
            "2",
            "--out",
            path(&json),
        ])
    };
    let (ok, _, stderr) = bench("12");
    assert!(ok, "{stderr}");
    let results: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(results[0]["prompt_capacity"], 32);
    let (ok, _, stderr) = bench("33");
    assert!(!ok && stderr.contains("invalid prompt_tokens: 33 tokens given; 1 to 32 allowed"), "{stderr}");
}

#[test]
fn prompt_buckets_show_in_the_plan_and_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth_tiny(dir.path(), "4");
    let (ok, with, stderr) = flashrt(&["inspect", "--checkpoint", path(&ckpt)]);
    assert!(ok, "{stderr}");
    assert!(with.contains("prompt buckets: [32, 64, 128, 200] slots"), "{with}");
    assert!(with.contains("phase prefix (prompt bucket: first 64 slots)"), "{with}");
    assert!(with.contains("prompt_bucket of token_mask"), "{with}");
    let (ok, without, stderr) = flashrt(&["inspect", "--checkpoint", path(&ckpt), "--no-prompt-buckets"]);
    assert!(ok, "{stderr}");
    assert!(!without.contains("prompt bucket"), "{without}");
    assert_eq!(without.matches("phase prefix").count(), 1, "{without}");
}

#[test]
fn bad_checkpoint_is_a_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), b"garbage").unwrap();
    let (ok, _, stderr) = flashrt(&["inspect", "--checkpoint", path(dir.path())]);
    assert!(!ok);
    assert!(stderr.contains("error: checkpoint") && stderr.contains("model.safetensors"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `flashrt synth --model groot-n17` with 1 and 3 cameras (the sidecars' modality config) and two
/// embodiments: the policy takes that many cameras and runs, inspect names the embodiments;
/// the options are refused for Pi0.5.
#[test]
fn synth_groot_with_cameras_and_embodiments() {
    let dir = tempfile::tempdir().unwrap();
    let (one, three) = (dir.path().join("one"), dir.path().join("three"));
    let (ok, _, stderr) = flashrt(&["synth", "--model", "groot-n17", "--size", "tiny", "--cameras", "1", "--out", path(&one)]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = flashrt(&["run", "--checkpoint", path(&one), "--steps", "1", "--prompt", "wave"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("1 steps: p50"), "{stdout}");

    let args = ["synth", "--model", "groot-n17", "--size", "tiny", "--cameras", "3", "--embodiments", "2", "--out", path(&three)];
    let (ok, _, stderr) = flashrt(&args);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = flashrt(&["inspect", "--checkpoint", path(&three), "--embodiment", "robot_2"]);
    assert!(ok, "{stderr}");
    for needle in [
        "3 cameras",
        "state 7 -> actions 6x8",
        "embodiment: robot_2 (set_embodiment switches between robot, robot_2)",
        "embodiments: 2 resident",
    ] {
        assert!(stdout.contains(needle), "inspect output lacks {needle:?}:\n{stdout}");
    }

    let (ok, _, stderr) = flashrt(&["synth", "--model", "pi05", "--cameras", "2", "--out", path(&dir.path().join("pi05"))]);
    assert!(!ok && stderr.contains("GR00T N1.7 options"), "{stderr}");
}

/// Micro Pi0.5 (3 cameras, state 8) in `dir/micro`, tokenizer beside it.
fn synth_micro(dir: &Path) -> std::path::PathBuf {
    let ckpt = dir.join("micro");
    flashrt::models::pi05::synth::synthesize(&ckpt, flashrt::models::pi05::synth::SynthSize::Micro, 3, &|_| {}).unwrap();
    ckpt
}

/// `run --observations` steps every record of a log once (prompts and noise from the records),
/// loops with more `--steps`, and refuses a log recorded for another policy or a damaged one by
/// name.
#[test]
fn run_replays_an_observation_log() {
    use flashrt::observation_log::{LogHeader, ObservationLogWriter};
    use flashrt::{Frame, Observation, PixelFormat};

    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth_micro(dir.path());
    let log = dir.path().join("obs.frtobs");
    let mut writer = ObservationLogWriter::create(&log, LogHeader::new("pi05", 3, 8, "cli test")).unwrap();
    let frame: Vec<u8> = (0..40 * 30 * 3).map(|i| (i % 253) as u8).collect();
    let noise = vec![0.1; 50 * 32];
    for r in 0..3 {
        let cameras = [
            Some(Frame::packed(&frame, 40, 30, PixelFormat::Rgb8)),
            None,
            (r != 1).then(|| Frame::packed(&frame, 30, 40, PixelFormat::Bgr8)),
        ];
        let state: Vec<f32> = (0..8).map(|i| (i + r) as f32 / 10.0).collect();
        let obs = Observation { cameras: &cameras, state: &state, noise: (r == 2).then_some(&noise[..]) };
        writer.append(&obs, ["stack the cups", "open the drawer"][r / 2]).unwrap();
    }
    writer.finish().unwrap();

    let (ok, stdout, stderr) = flashrt(&["run", "--checkpoint", path(&ckpt), "--observations", path(&log)]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("replayed 3 records of") && stdout.contains("(1 passes)") && stdout.contains("3 steps: p50"), "{stdout}");
    // FP8 calibrated on the log (fewer records than the default 8 steps: all of them, said so)
    // and replayed with it on the CPU's FP8 emulation.
    let calibration = dir.path().join("cal.json");
    let (ok, stdout, stderr) = flashrt(&[
        "calibrate",
        "--checkpoint",
        path(&ckpt),
        "--observations",
        path(&log),
        "--min-product-features",
        "16",
        "--out",
        path(&calibration),
    ]);
    assert!(ok && stderr.contains("holds 3 observations: calibrating on those, not 8") && !stderr.contains("SYNTHETIC"), "{stderr}");
    assert!(stdout.contains("calibrated 3 steps (2 measured)"), "{stdout}");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&calibration).unwrap()).unwrap();
    assert_eq!(json["synthetic"], false);
    assert!(json["settings"]["observations"].as_str().unwrap().starts_with("log obs.frtobs (sha256 "), "{json}");
    let tokens_only = dir.path().join("tokens.frtobs");
    let mut writer = ObservationLogWriter::create(&tokens_only, LogHeader::new("pi05", 3, 8, "prompted by token ids")).unwrap();
    let state = [0.0; 8];
    writer.append(&Observation { cameras: &[None, None, None], state: &state, noise: None }, "").unwrap();
    writer.finish().unwrap();
    let (ok, _, stderr) = flashrt(&["calibrate", "--checkpoint", path(&ckpt), "--observations", path(&tokens_only)]);
    assert!(!ok && stderr.contains("record 0 has no prompt text"), "{stderr}");
    let fp8 =
        ["run", "--checkpoint", path(&ckpt), "--observations", path(&log), "--precision", "fp8", "--fp8-calibration", path(&calibration)];
    let (ok, stdout, stderr) = flashrt(&fp8);
    assert!(ok && stdout.contains("replayed 3 records of"), "{stdout}\n{stderr}");
    // The FP8 emulation against f32 on the log's records (its prompts and noise): within the
    // bounds given, and a bound it misses fails by name.
    let record = dir.path().join("compare.json");
    let compare = |bound: &str| {
        let mut args = vec!["compare", "--checkpoint", path(&ckpt), "--observations", path(&log), "--out", path(&record)];
        args.extend(["--precision", "fp8", "--fp8-calibration", path(&calibration), "--min-mean-cosine", "0.99", "--min-cosine", bound]);
        flashrt(&args)
    };
    let (ok, stdout, stderr) = compare("0.99");
    assert!(ok && stdout.contains("cpu fp8-emulated against cpu f32: 3 observations: cosine mean 0.99"), "{stdout}\n{stderr}");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    let observations = json["observations"].as_array().unwrap();
    let cameras: Vec<_> = observations.iter().map(|o| o["cameras"].as_u64().unwrap()).collect();
    assert_eq!(
        (cameras, &json["pass"], &observations[2]["prompt"]),
        (vec![2, 1, 2], &serde_json::json!(true), &serde_json::json!("open the drawer"))
    );
    assert!(json["worst_rel_l2"].as_f64().unwrap() > 0.0, "FP8 rounds: {json}");
    assert!(json["observations_from"].as_str().unwrap().starts_with("log ") && json["precision"] == "fp8-emulated", "{json}");
    let (ok, _, stderr) = compare("1");
    assert!(!ok && stderr.contains("compare: missed worst cosine 0.99") && stderr.contains("(bound 1)"), "{stderr}");

    let (ok, stdout, stderr) = flashrt(&["run", "--checkpoint", path(&ckpt), "--observations", path(&log), "--steps", "7"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("(3 passes)") && stdout.contains("7 steps: p50"), "{stdout}");

    // Recorded for a Pi0.5 with 3 cameras and state 8: the GR00T fixture has 2 and 12.
    let groot = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/groot_n17_tiny");
    let (ok, _, stderr) = flashrt(&["run", "--checkpoint", path(&groot), "--observations", path(&log)]);
    assert!(!ok);
    for needle in
        ["recorded for another policy", "model \"pi05\" (the policy is \"groot-n17\")", "3 cameras (the policy has 2)", "state width 8"]
    {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    // A log cut inside its last record: the records before it run, then the damage is named.
    let bytes = std::fs::read(&log).unwrap();
    std::fs::write(&log, &bytes[..bytes.len() - 100]).unwrap();
    let (ok, _, stderr) = flashrt(&["run", "--checkpoint", path(&ckpt), "--observations", path(&log)]);
    assert!(!ok && stderr.contains("obs.frtobs: record 2 is truncated"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // `--observation` (one safetensors file) and `--observations` exclude each other.
    let (ok, _, stderr) = flashrt(&["run", "--checkpoint", path(&ckpt), "--observations", path(&log), "--observation", path(&log)]);
    assert!(!ok && stderr.contains("cannot be used with"), "{stderr}");
}

/// `flashrt record` is `serve` that logs every observation it steps on: an openpi client's
/// requests over loopback (frames, state, noise, a prompt change) come back from the log as
/// sent; a refused request is not recorded; the log replays with `run --observations`.
#[test]
fn record_logs_what_the_server_steps_on() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    use flashrt::observation_log::ObservationLogReader;
    use flashrt::serve::msgpack_numpy::{Reply, write_u8_array};
    use tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth_micro(dir.path());
    let cameras = flashrt::Policy::open(&flashrt::PolicyConfig::new(&ckpt)).unwrap().info().cameras;
    let log = dir.path().join("served.frtobs");
    let mut server = Command::new(env!("CARGO_BIN_EXE_flashrt"))
        .args(["record", "--checkpoint", path(&ckpt), "--backend", "cpu", "--port", "0", "--max-requests", "4"])
        .args(["--observations", path(&log), "--note", "loopback test"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first.strip_prefix("listening on ").unwrap_or_else(|| panic!("{first}"));
    let (mut ws, _) = tungstenite::connect(addr).unwrap();
    ws.read().unwrap(); // metadata

    // Requests: 40x30 RGB frames (camera 1 left out of the second), a state, noise on the last,
    // a new prompt from the third; then one with a short state, refused.
    let frame = |r: usize| -> Vec<u8> { (0..40 * 30 * 3).map(|i| (i * 7 + r * 31) as u8).collect() };
    let state = |r: usize| -> Vec<f32> { (0..8).map(|i| (i as f32 - r as f32) / 8.0).collect() };
    let noise = vec![-0.25f32; 50 * 32];
    let prompts = ["pick up the cube", "pick up the cube", "place it in the bowl"];
    for r in 0..4 {
        let (image, state) = (frame(r), state(r));
        let mut array = Vec::new();
        write_u8_array(&mut array, &image, &[30, 40, 3]);
        let mut entries: Vec<(&str, Reply)> = vec![(cameras[0].as_str(), Reply::Raw(&array))];
        if r != 1 {
            entries.push((cameras[1].as_str(), Reply::Raw(&array)));
        }
        entries.push(("state", Reply::F32Array(if r == 3 { &state[..5] } else { &state }, vec![if r == 3 { 5 } else { 8 }])));
        entries.push(("prompt", Reply::Str(prompts[r.min(2)])));
        if r == 2 {
            entries.push(("noise", Reply::F32Array(&noise, vec![50, 32])));
        }
        ws.send(Message::binary(Reply::Map(entries).encode())).unwrap();
        let reply = ws.read().unwrap();
        assert_eq!(reply.is_binary(), r < 3, "request {r}: {reply:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            panic!("flashrt record did not stop after --max-requests");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout: Vec<String> = lines.map_while(Result::ok).collect();
    let stderr = std::io::read_to_string(server.stderr.take().unwrap()).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stdout.iter().any(|l| l.starts_with("recorded 3 observations to") && l.contains("(0 dropped")), "{stdout:?}");

    let reader = ObservationLogReader::open(&log).unwrap();
    let h = reader.header();
    assert_eq!((h.model.as_str(), h.cameras, h.state_dim, h.note.as_str()), ("pi05", 3, 8, "loopback test"));
    let records: Vec<_> = reader.map(Result::unwrap).collect();
    assert_eq!(records.len(), 3, "the refused request is not recorded");
    for (r, rec) in records.iter().enumerate() {
        assert_eq!(rec.prompt, prompts[r]);
        assert_eq!(rec.state, state(r));
        assert_eq!(rec.noise, (r == 2).then(|| noise.clone()));
        let image = frame(r);
        for c in 0..3 {
            let f = rec.cameras[c].as_ref().map(|f| (f.width, f.height, f.format, &f.data[..]));
            let sent = (c == 0 || (c == 1 && r != 1)).then_some((40, 30, 0, &image[..]));
            assert_eq!(f, sent, "record {r} camera {c}");
        }
    }
    let (ok, stdout, stderr) = flashrt(&["run", "--checkpoint", path(&ckpt), "--observations", path(&log)]);
    assert!(ok && stdout.contains("replayed 3 records"), "{stdout}\n{stderr}");
}

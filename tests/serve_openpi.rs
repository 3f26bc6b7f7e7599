//! `flashrt serve` against the real openpi client: the binary serves a synthesized micro Pi0.5
//! with the LIBERO key map on a free loopback port, and `tests/serve/openpi_client_check.py`
//! (openpi-client 0.1.2 from PyPI) drives it: metadata, round trips with uint8 images of several
//! sizes HWC and CHW, two clients at once, malformed requests each answered with an error while
//! the server keeps serving, the API key, the connection limit, and SIGTERM while a request is in
//! flight (answered, then a clean exit). The script records its round trips' inputs and actions;
//! this test then runs the same inputs through an in-process `Policy::step` and requires the
//! same actions, bit for bit: the server adds transport, nothing else.
//!
//! Needs python3 with openpi-client (FRT_PYTHON names the interpreter; `.ci/run` installs the
//! packages of ros2_bridge/tests/peer/requirements.txt into its venv). Without it the test skips
//! with a message, or fails when FRT_REQUIRE_ALL=1 (CI). Bounded: the script gives up after
//! 240 s (its own alarm), this test kills both processes after 300 s.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use flashrt::{Frame, Observation, PixelFormat, Policy, PolicyConfig};

const API_KEY: &str = "frt-test-key";
const MAX_CONNECTIONS: &str = "3";

fn python() -> String {
    std::env::var("FRT_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Skips (with a visible message) or, under FRT_REQUIRE_ALL=1, fails.
fn missing(what: &str) {
    if std::env::var("FRT_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("serve_openpi cannot run: {what} (FRT_REQUIRE_ALL=1)");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED serve_openpi: {what}");
}

/// Kills the child on drop unless it has exited: a failing assertion leaves no server behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn openpi_client_drives_flashrt_serve() {
    let probe = Command::new(python()).args(["-c", "import openpi_client.websocket_client_policy, numpy"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = probe
            .map(|o| String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or_default().to_string())
            .unwrap_or_else(|e| e.to_string());
        return missing(&format!(
            "{} cannot import openpi_client ({why}); pip install -r ros2_bridge/tests/peer/requirements.txt",
            python()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("pi05_micro");
    flashrt::models::pi05::synth::synthesize(&checkpoint, flashrt::models::pi05::synth::SynthSize::Micro, 11, &|_| {}).unwrap();

    let mut server = Reaped(
        Command::new(env!("CARGO_BIN_EXE_flashrt"))
            .args(["serve", "--checkpoint", checkpoint.to_str().unwrap(), "--backend", "cpu", "--host", "127.0.0.1", "--port", "0"])
            .args(["--keys", "libero", "--api-key", API_KEY, "--max-connections", MAX_CONNECTIONS])
            .args(["--max-message-bytes", &(4 << 20).to_string(), "--max-array-bytes", &(1 << 20).to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("flashrt runs"),
    );
    // The address line, then the rest of stdout, from a reader thread (a read cannot time out).
    let (tx, rx_lines) = mpsc::channel::<String>();
    let lines = BufReader::new(server.0.stdout.take().unwrap()).lines();
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| drop(tx.send(l))));
    let first = rx_lines.recv_timeout(Duration::from_secs(60)).expect("the server prints its address within 60 s");
    let port = first.strip_prefix("listening on ws://127.0.0.1:").unwrap_or_else(|| panic!("unexpected first line {first:?}"));
    let stderr = server.0.stderr.take().unwrap();
    let server_log = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());

    // The README's example client, as a user runs it, first.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/openpi_robot_client.py");
    let mut run = Command::new(python());
    run.arg(&example).args(["--port", port, "--api-key", API_KEY, "--steps", "3"]).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut example_run = Reaped(run.spawn().expect("python runs"));
    let example_status = wait_for(&mut example_run.0, Duration::from_secs(120));
    let example_out = std::io::read_to_string(example_run.0.stdout.take().unwrap()).unwrap_or_default();
    let example_err = std::io::read_to_string(example_run.0.stderr.take().unwrap()).unwrap_or_default();
    assert!(example_status.is_some_and(|s| s.success()), "examples/openpi_robot_client.py failed:\n{example_out}\n{example_err}");
    assert!(example_out.contains("server: flashrt"), "{example_out}");

    let record = dir.path().join("record.safetensors");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/serve/openpi_client_check.py");
    let mut client = Reaped(
        Command::new(python())
            .arg(&script)
            .args(["--port", port, "--api-key", API_KEY, "--max-connections", MAX_CONNECTIONS])
            .args(["--server-pid", &server.0.id().to_string(), "--record", record.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python runs"),
    );
    let (out, err) = (client.0.stdout.take().unwrap(), client.0.stderr.take().unwrap());
    let out = std::thread::spawn(move || std::io::read_to_string(out).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let status = wait_for(&mut client.0, Duration::from_secs(300));
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    // The script sends SIGTERM last; the server then finishes and exits by itself.
    let server_status = wait_for(&mut server.0, Duration::from_secs(30));
    drop(server);
    let server_log = server_log.join().unwrap();
    let summary: Vec<String> = rx_lines.try_iter().collect();
    assert!(status.is_some_and(|s| s.success()), "openpi client check failed ({status:?}):\n{out}\n{err}\nserver log:\n{server_log}");
    assert!(out.contains("ALL OK"), "{out}");
    assert!(server_status.is_some_and(|s| s.success()), "the server did not exit cleanly after SIGTERM ({server_status:?}):\n{server_log}");
    assert!(!server_log.contains("panicked"), "{server_log}");
    let served = summary.iter().find(|l| l.starts_with("served ")).unwrap_or_else(|| panic!("no summary line in {summary:?}"));
    eprintln!("server: {served}");

    same_actions_in_process(&checkpoint, &record);
}

/// Every recorded round trip's actions equal an in-process step on the same frames (HWC, as the
/// script made them before it sent some CHW), state, noise and prompt.
fn same_actions_in_process(checkpoint: &Path, record: &Path) {
    let bytes = std::fs::read(record).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let prompts = meta.metadata().clone().unwrap_or_default();
    let mut config = PolicyConfig::new(checkpoint);
    config.backend = flashrt::BackendKind::Cpu;
    let mut policy = Policy::open(&config).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        st.tensor(name).unwrap().data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    };
    let mut cases = 0;
    while let Some(prompt) = prompts.get(&format!("case{cases}.prompt")) {
        let c = format!("case{cases}");
        let images: Vec<_> = (0..2).map(|i| st.tensor(&format!("{c}.image.{i}")).unwrap()).collect();
        let frames: Vec<Option<Frame>> =
            images.iter().map(|t| Some(Frame::packed(t.data(), t.shape()[1], t.shape()[0], PixelFormat::Rgb8))).chain([None]).collect();
        let (state, noise, served) = (f32s(&format!("{c}.state")), f32s(&format!("{c}.noise")), f32s(&format!("{c}.actions")));
        policy.set_prompt(prompt).unwrap();
        let mut actions = vec![f32::NAN; policy.actions_len()];
        policy.step(&Observation { cameras: &frames, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
        let max_abs = actions.iter().zip(&served).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert_eq!(served.len(), actions.len(), "{c}");
        assert!(
            actions.iter().zip(&served).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{c} ({:?}): served actions differ from the in-process step, max abs {max_abs}",
            images[0].shape()
        );
        cases += 1;
    }
    assert_eq!(cases, 4, "the record holds every round trip");
}

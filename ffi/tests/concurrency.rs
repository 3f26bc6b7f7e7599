//! Two threads on one policy, against the documented one-thread-at-a-time rule: a call taking
//! `FrtPolicy*` that finds another running on the same policy returns `FRT_STATUS_BUSY`, does
//! nothing, and the policy works normally afterwards. Made deterministic by calling from inside
//! the policy's log callback, which runs while `frt_policy_set_prompt` holds the policy (a long
//! prompt logs a truncation warning); plus an unsynchronized race whose every status must be
//! `FRT_STATUS_OK` or `FRT_STATUS_BUSY`.

use std::ffi::{CString, c_char, c_void};
use std::ptr;
use std::sync::Mutex;

use flashrt::models::pi05::synth::{SynthSize, synthesize};
use flashrt_ffi::*;

/// The policy and a valid observation, shared with the log callback.
struct Fixture {
    policy: *mut FrtPolicy,
    frames: Vec<FrtFrame>,
    state: Vec<f32>,
    actions_len: usize,
    _pixels: Vec<u8>,
}

// SAFETY: the raw pointers are only used as the tests below describe (that is what they test).
unsafe impl Send for Fixture {}
unsafe impl Sync for Fixture {}

impl Fixture {
    fn open(dir: &std::path::Path) -> Fixture {
        synthesize(dir, SynthSize::Micro, 3, &|_| {}).unwrap();
        let checkpoint = CString::new(dir.to_str().unwrap()).unwrap();
        // SAFETY: every pointer outlives the call it is passed to; sizes are exact.
        unsafe {
            let mut config: FrtPolicyConfig = std::mem::zeroed();
            config.struct_size = size_of::<FrtPolicyConfig>();
            assert_eq!(frt_policy_config_default(&mut config), FrtStatus::Ok);
            config.checkpoint = checkpoint.as_ptr();
            config.backend = FrtBackend::Cpu as u32;
            config.threads = 1;
            config.log_callback = Some(on_log);
            config.log_level = FrtLogLevel::Warn as u32;
            let mut policy = ptr::null_mut();
            assert_eq!(frt_policy_open(&config, &mut policy), FrtStatus::Ok);
            let mut info: FrtPolicyInfo = std::mem::zeroed();
            info.struct_size = size_of::<FrtPolicyInfo>();
            assert_eq!(frt_policy_info(policy, &mut info), FrtStatus::Ok);
            let pixels = vec![90u8; 56 * 56 * 3];
            let frames = (0..info.cameras)
                .map(|_| FrtFrame {
                    data: pixels.as_ptr(),
                    data_len: pixels.len(),
                    width: 56,
                    height: 56,
                    stride: 0,
                    format: 0,
                    present: true,
                })
                .collect();
            Fixture { policy, frames, state: vec![0.1; info.state_dim], actions_len: info.actions_len, _pixels: pixels }
        }
    }

    fn step(&self) -> FrtStatus {
        let observation = FrtObservation {
            struct_size: size_of::<FrtObservation>(),
            cameras: self.frames.as_ptr(),
            cameras_len: self.frames.len(),
            state: self.state.as_ptr(),
            state_len: self.state.len(),
            noise: ptr::null(),
            noise_len: 0,
        };
        let mut actions = vec![0.0f32; self.actions_len];
        // SAFETY: every pointer owns what its length declares; the policy is open.
        unsafe { frt_policy_step(self.policy, &observation, actions.as_mut_ptr(), actions.len(), ptr::null_mut()) }
    }

    fn set_prompt(&self, text: &str) -> FrtStatus {
        // SAFETY: text readable for its length; the policy is open.
        unsafe { frt_policy_set_prompt(self.policy, text.as_ptr().cast(), text.len()) }
    }

    fn last_error(&self) -> String {
        let mut buf = vec![0u8; 1024];
        let mut written = 0;
        // SAFETY: buf writable for its length.
        assert_eq!(unsafe { frt_policy_last_error(self.policy, buf.as_mut_ptr().cast(), buf.len(), &mut written) }, FrtStatus::Ok);
        String::from_utf8_lossy(&buf[..written]).into_owned()
    }
}

/// What the log callback saw: the statuses of the calls it made while the policy was held.
static IN_CALLBACK: Mutex<Option<(&'static Fixture, Vec<FrtStatus>)>> = Mutex::new(None);

unsafe extern "C" fn on_log(_: *mut c_void, _: FrtLogLevel, _: *const c_char, _: usize) {
    let mut seen = IN_CALLBACK.lock().unwrap();
    let Some((f, statuses)) = seen.as_mut() else { return };
    let f: &Fixture = f;
    // The same thread re-entering, then another thread, both while set_prompt holds the policy.
    statuses.push(f.step());
    statuses.push(f.set_prompt("pick up the cube"));
    statuses.push(std::thread::scope(|s| s.spawn(|| f.step()).join().unwrap()));
}

#[test]
fn a_second_call_on_a_busy_policy_returns_busy_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let f: &'static Fixture = Box::leak(Box::new(Fixture::open(dir.path())));
    assert_eq!(f.set_prompt("pick up the red block"), FrtStatus::Ok);
    assert_eq!(f.step(), FrtStatus::Ok);

    // Longer than the prompt capacity: set_prompt logs a truncation warning while it runs.
    let long = "pick up the red block and put it in the box ".repeat(40);
    *IN_CALLBACK.lock().unwrap() = Some((f, Vec::new()));
    assert_eq!(f.set_prompt(&long), FrtStatus::Ok, "{}", f.last_error());
    let (_, statuses) = IN_CALLBACK.lock().unwrap().take().unwrap();
    assert!(!statuses.is_empty(), "the long prompt logged no warning: the test did not run its calls");
    assert!(statuses.iter().all(|s| *s == FrtStatus::Busy), "{statuses:?}");
    // The refused calls left no message behind (the running call owns the last error).
    assert_eq!(f.last_error(), "");
    assert_eq!(f.step(), FrtStatus::Ok, "{}", f.last_error());

    // A NULL policy is still NULL, not busy.
    // SAFETY: NULL is accepted.
    assert_eq!(unsafe { frt_policy_reset_stats(ptr::null_mut()) }, FrtStatus::NullArgument);
    // SAFETY: opened above, not used after this.
    unsafe { frt_policy_free(f.policy) };
}

#[test]
fn racing_steps_on_one_policy_each_succeed_or_report_busy() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fixture::open(dir.path());
    assert_eq!(f.set_prompt("pick up the red block"), FrtStatus::Ok);
    let statuses: Vec<Vec<FrtStatus>> = std::thread::scope(|s| {
        (0..2).map(|_| s.spawn(|| (0..25).map(|_| f.step()).collect())).collect::<Vec<_>>().into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: Vec<FrtStatus> = statuses.into_iter().flatten().collect();
    assert!(all.iter().all(|s| matches!(s, FrtStatus::Ok | FrtStatus::Busy)), "{all:?}");
    assert!(all.contains(&FrtStatus::Ok));
    assert_eq!(f.step(), FrtStatus::Ok, "{}", f.last_error());
    // SAFETY: opened above, not used after this.
    unsafe { frt_policy_free(f.policy) };
}

/// An action stream holds its policy: while it runs, calls on the policy and a second stream
/// over it are `FRT_STATUS_BUSY`; once it is freed the policy steps again.
#[test]
fn a_policy_lent_to_a_stream_is_busy_until_the_stream_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fixture::open(dir.path());
    assert_eq!(f.set_prompt("pick up the red block"), FrtStatus::Ok);
    // SAFETY: every pointer outlives the call it is passed to; the policy is open.
    unsafe {
        let mut config: FrtStreamConfig = std::mem::zeroed();
        config.struct_size = size_of::<FrtStreamConfig>();
        assert_eq!(frt_stream_config_default(&mut config), FrtStatus::Ok);
        let mut stream = ptr::null_mut();
        assert_eq!(frt_stream_create(f.policy, &config, &mut stream), FrtStatus::Ok);
        assert_eq!(f.step(), FrtStatus::Busy);
        assert_eq!(f.set_prompt("open the drawer"), FrtStatus::Busy);
        let mut second = ptr::null_mut();
        assert_eq!(frt_stream_create(f.policy, &config, &mut second), FrtStatus::Busy);
        assert!(second.is_null(), "a refused stream writes no handle");
        frt_stream_free(stream);
    }
    assert_eq!(f.step(), FrtStatus::Ok, "{}", f.last_error());
    // SAFETY: opened above, not used after this.
    unsafe { frt_policy_free(f.policy) };
}

/// A recording follows the policy into an action stream: the stream's steps are recorded with the
/// prompt the stream set, and while lent the policy refuses record calls like any other (busy).
#[test]
fn a_recording_policy_lent_to_a_stream_records_the_streams_steps() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fixture::open(dir.path());
    let log = dir.path().join("stream.frtobs");
    let log_path = log.to_str().unwrap();
    assert_eq!(f.set_prompt("pick up the red block"), FrtStatus::Ok);
    // SAFETY: every pointer outlives the call it is passed to; the policy is open.
    unsafe {
        assert_eq!(frt_policy_record_start(f.policy, log_path.as_ptr().cast(), log_path.len()), FrtStatus::Ok);
        let mut config: FrtStreamConfig = std::mem::zeroed();
        config.struct_size = size_of::<FrtStreamConfig>();
        assert_eq!(frt_stream_config_default(&mut config), FrtStatus::Ok);
        let mut stream = ptr::null_mut();
        assert_eq!(frt_stream_create(f.policy, &config, &mut stream), FrtStatus::Ok);
        assert_eq!(frt_policy_record_stop(f.policy), FrtStatus::Busy);
        let task = "open the drawer";
        assert_eq!(frt_stream_set_prompt(stream, task.as_ptr().cast(), task.len()), FrtStatus::Ok);
        let observation = FrtObservation {
            struct_size: size_of::<FrtObservation>(),
            cameras: f.frames.as_ptr(),
            cameras_len: f.frames.len(),
            state: f.state.as_ptr(),
            state_len: f.state.len(),
            noise: ptr::null(),
            noise_len: 0,
        };
        assert_eq!(frt_stream_push_observation(stream, &observation), FrtStatus::Ok);
        // Control ticks until the first chunk has come (it is asked for by the first tick).
        let mut tick: FrtActionTick = std::mem::zeroed();
        tick.struct_size = size_of::<FrtActionTick>();
        let mut action = vec![0.0f32; 7]; // the micro Pi0.5's action width
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while tick.chunk == 0 {
            assert!(std::time::Instant::now() < deadline, "no chunk in 30 s");
            assert_eq!(frt_stream_next_action(stream, action.as_mut_ptr(), action.len(), &mut tick), FrtStatus::Ok);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        frt_stream_free(stream);
        assert_eq!(frt_policy_record_stop(f.policy), FrtStatus::Ok, "{}", f.last_error());
        frt_policy_free(f.policy);
    }
    let records: Vec<_> = flashrt::observation_log::ObservationLogReader::open(&log).unwrap().map(Result::unwrap).collect();
    assert!(!records.is_empty());
    for r in &records {
        assert_eq!((r.prompt.as_str(), &r.state), ("open the drawer", &f.state));
        assert!(r.cameras.iter().all(|c| c.as_ref().is_some_and(|c| c.data == vec![90u8; 56 * 56 * 3])));
    }
}

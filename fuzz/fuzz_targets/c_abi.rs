//! The C ABI's step and prompt calls with fuzz-chosen struct sizes, declared lengths, strides,
//! formats, NULLs and values, on the micro Pi0.5 opened through `frt_policy_open` (once plainly,
//! once with real-time chunking). Pointers are never invalid: every non-NULL pointer owns at least
//! the length declared beside it, so a crash is the library's. Every call must return a status
//! other than `FRT_STATUS_PANIC` (and, as a panic aborts under libFuzzer, must not panic at all);
//! after a refused call, a valid step must still return `FRT_STATUS_OK`.
//!
//! Input: a byte stream decoded field by field (`arbitrary::Unstructured`).

#![no_main]

use std::ffi::CString;
use std::ptr;
use std::sync::Mutex;

use flashrt_ffi::*;
use flashrt_fuzz::{DENOISE_STEPS, MAX_FRAME, PROMPT_CAPACITY, micro_pi05};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

struct Opened {
    policy: *mut FrtPolicy,
    cameras: usize,
    state_dim: usize,
    actions_len: usize,
    noise_len: usize,
    prompt_capacity: usize,
}

// SAFETY: the policies are used by one thread at a time (behind the mutex below).
unsafe impl Send for Opened {}

static POLICIES: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

fn open(rtc: bool) -> Opened {
    let checkpoint = CString::new(micro_pi05().to_str().unwrap()).unwrap();
    // SAFETY: a zeroed config is valid for every field (NULL pointers, zero numbers, no callback).
    let mut config: FrtPolicyConfig = unsafe { std::mem::zeroed() };
    config.struct_size = size_of::<FrtPolicyConfig>();
    let ok = |s: FrtStatus, what: &str| assert_eq!(s, FrtStatus::Ok, "{what}");
    // SAFETY: valid, writable config.
    ok(unsafe { frt_policy_config_default(&mut config) }, "frt_policy_config_default");
    config.checkpoint = checkpoint.as_ptr();
    config.backend = FrtBackend::Cpu as u32;
    config.threads = 1;
    config.log_level = FrtLogLevel::Off as u32;
    config.max_frame_width = MAX_FRAME;
    config.max_frame_height = MAX_FRAME;
    config.denoise_steps = DENOISE_STEPS;
    config.prompt_capacity = PROMPT_CAPACITY;
    if rtc {
        config.rtc_schedule = FrtRtcSchedule::Linear as u32;
    }
    let mut policy = ptr::null_mut();
    // SAFETY: valid config (its strings outlive the call) and out pointer.
    ok(unsafe { frt_policy_open(&config, &mut policy) }, "frt_policy_open");
    let text = "pick up the red block";
    // SAFETY: a policy from frt_policy_open; text readable for its length.
    ok(unsafe { frt_policy_set_prompt(policy, text.as_ptr().cast(), text.len()) }, "frt_policy_set_prompt");
    // SAFETY: a zeroed FrtPolicyInfo is valid (NULL pointers, zero numbers).
    let mut info: FrtPolicyInfo = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<FrtPolicyInfo>();
    // SAFETY: a policy from frt_policy_open, a writable info.
    ok(unsafe { frt_policy_info(policy, &mut info) }, "frt_policy_info");
    Opened {
        policy,
        cameras: info.cameras,
        state_dim: info.state_dim,
        actions_len: info.actions_len,
        noise_len: info.noise_len,
        prompt_capacity: info.prompt_capacity,
    }
}

fn length(u: &mut Unstructured, expected: usize, cap: usize) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=3)? {
        0 | 1 => expected,
        2 => (expected + u.int_in_range(0..=2)?).saturating_sub(1),
        _ => u.int_in_range(0..=cap)?,
    })
}

fn struct_size(u: &mut Unstructured, real: usize) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=9)? {
        0 => 0,
        1 => real - 1,
        2 => real - size_of::<usize>(),
        3 => real + u.int_in_range(1..=64)?,
        _ => real,
    })
}

fn float(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0u8..=7)? {
        0 => f32::from_bits(u.arbitrary()?),
        1 => *u.choose(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -0.0])?,
        _ => u.int_in_range(-2000i16..=2000)? as f32 / 500.0,
    })
}

/// A pointer to `buf` or NULL (chosen by the input); the declared length is the caller's.
fn maybe_null<T>(u: &mut Unstructured, buf: &[T]) -> Result<*const T> {
    Ok(if u.ratio(1u8, 12)? { ptr::null() } else { buf.as_ptr() })
}

/// Owns what one frame's pointer refers to.
fn frame(u: &mut Unstructured) -> Result<(FrtFrame, Vec<u8>)> {
    let present = !u.ratio(1u8, 5)?;
    let format = if u.ratio(1u8, 16)? { u.arbitrary()? } else { u.int_in_range(0..=2)? };
    let bpp = [3, 3, 4].get(format as usize).copied().unwrap_or(3);
    let dim = |u: &mut Unstructured| -> Result<usize> {
        Ok(if u.ratio(1u8, 10)? {
            *u.choose(&[0, usize::MAX, usize::MAX / 2, 1 << 40, MAX_FRAME + 1])?
        } else {
            u.int_in_range(1..=MAX_FRAME)?
        })
    };
    let (width, height) = (dim(u)?, dim(u)?);
    let row = width.saturating_mul(bpp);
    let stride = match u.int_in_range(0u8..=5)? {
        0 => 0,
        1 => *u.choose(&[1, usize::MAX, usize::MAX / 7, row.saturating_sub(1)])?,
        _ => row.saturating_add(u.int_in_range(0..=8)?),
    };
    let packed = if stride == 0 { row } else { stride };
    let needed = height.saturating_sub(1).saturating_mul(packed).saturating_add(row).min(4 * MAX_FRAME * MAX_FRAME + 64);
    let data = vec![u.arbitrary::<u8>()?; length(u, needed, needed + 16)?];
    let ptr = maybe_null(u, &data)?;
    Ok((FrtFrame { data: ptr, data_len: data.len(), width, height, stride, format, present }, data))
}

fn run(u: &mut Unstructured, p: &Opened) -> Result<()> {
    let mut refused = false;
    let check = |s: FrtStatus, refused: &mut bool| {
        assert_ne!(s, FrtStatus::Panic, "a panic reached the C ABI boundary");
        *refused |= s != FrtStatus::Ok;
    };
    match u.int_in_range(0u8..=5)? {
        0 => {
            let n = u.int_in_range(0..=64)?;
            let text: Vec<u8> = u.bytes(n)?.to_vec();
            let ptr = maybe_null(u, &text)?;
            // SAFETY: text readable for its length, or NULL.
            check(unsafe { frt_policy_set_prompt(p.policy, ptr.cast(), text.len()) }, &mut refused);
        }
        1 => {
            let n = length(u, 16, p.prompt_capacity + 4)?;
            let ids: Vec<i32> =
                (0..n).map(|_| Ok(if u.ratio(1u8, 8)? { u.arbitrary()? } else { u.int_in_range(0..=1100)? })).collect::<Result<_>>()?;
            let ptr = maybe_null(u, &ids)?;
            // SAFETY: ids readable for their length, or NULL.
            check(unsafe { frt_policy_set_prompt_tokens(p.policy, ptr, ids.len()) }, &mut refused);
        }
        _ => {}
    }

    let owned: Vec<(FrtFrame, Vec<u8>)> = (0..length(u, p.cameras, 6)?).map(|_| frame(u)).collect::<Result<_>>()?;
    let frames: Vec<FrtFrame> = owned.iter().map(|(f, _)| FrtFrame { ..*f }).collect();
    let state: Vec<f32> = (0..length(u, p.state_dim, 12)?).map(|_| float(u)).collect::<Result<_>>()?;
    let noise: Vec<f32> = (0..length(u, p.noise_len, p.noise_len + 4)?).map(|_| float(u)).collect::<Result<_>>()?;
    let noise_ptr = if u.ratio(1u8, 3)? { noise.as_ptr() } else { ptr::null() };
    // A NULL noise pointer with a non-zero length must be refused; the buffer is not read then.
    let noise_len = if noise_ptr.is_null() && u.ratio(3u8, 4)? { 0 } else { noise.len() };
    let observation = FrtObservation {
        struct_size: struct_size(u, size_of::<FrtObservation>())?,
        cameras: maybe_null(u, &frames)?,
        cameras_len: frames.len(),
        state: maybe_null(u, &state)?,
        state_len: state.len(),
        noise: noise_ptr,
        noise_len,
    };
    let mut actions = vec![f32::NAN; length(u, p.actions_len, p.actions_len + 4)?];
    let actions_ptr = if u.ratio(1u8, 12)? { ptr::null_mut() } else { actions.as_mut_ptr() };
    let mut info =
        FrtStepInfo { struct_size: struct_size(u, size_of::<FrtStepInfo>())?, latency_ms: 0.0, prompt_tokens: 0, deadline_missed: false };
    let info_ptr: *mut FrtStepInfo = if u.arbitrary()? { &mut info } else { ptr::null_mut() };
    let obs_ptr: *const FrtObservation = if u.ratio(1u8, 16)? { ptr::null() } else { &observation };
    let status = if u.arbitrary()? {
        let mut count = || -> Result<usize> { Ok(if u.ratio(1u8, 6)? { u.arbitrary()? } else { u.int_in_range(0..=60)? }) };
        let (executed, delay) = (count()?, count()?);
        // SAFETY: every non-NULL pointer owns the length declared with it (or the struct it
        // points to); the struct sizes above are at most ours (a larger one is read as ours).
        unsafe { frt_policy_step_continuing(p.policy, obs_ptr, executed, delay, actions_ptr, actions.len(), info_ptr) }
    } else {
        // SAFETY: as above.
        unsafe { frt_policy_step(p.policy, obs_ptr, actions_ptr, actions.len(), info_ptr) }
    };
    check(status, &mut refused);

    // The error text of a refused call, into a fuzz-sized buffer.
    let mut text = vec![0u8; u.int_in_range(0..=300)?];
    let mut written = 0usize;
    // SAFETY: text writable for its length; written writable.
    check(unsafe { frt_policy_last_error(p.policy, text.as_mut_ptr().cast(), text.len(), &mut written) }, &mut false);

    if refused {
        valid_step(p);
    }
    Ok(())
}

/// A valid step: must succeed after anything the input did.
fn valid_step(p: &Opened) {
    let side = 32;
    let data = vec![100u8; side * side * 3];
    let frames: Vec<FrtFrame> = (0..p.cameras)
        .map(|_| FrtFrame { data: data.as_ptr(), data_len: data.len(), width: side, height: side, stride: 0, format: 0, present: true })
        .collect();
    let state = vec![0.1f32; p.state_dim];
    let observation = FrtObservation {
        struct_size: size_of::<FrtObservation>(),
        cameras: frames.as_ptr(),
        cameras_len: frames.len(),
        state: state.as_ptr(),
        state_len: state.len(),
        noise: ptr::null(),
        noise_len: 0,
    };
    let mut actions = vec![0.0f32; p.actions_len];
    // SAFETY: every pointer owns what its length declares.
    let status = unsafe { frt_policy_step(p.policy, &observation, actions.as_mut_ptr(), actions.len(), ptr::null_mut()) };
    if status != FrtStatus::Ok {
        let mut text = vec![0u8; 1024];
        let mut written = 0usize;
        // SAFETY: as above.
        unsafe { frt_policy_last_error(p.policy, text.as_mut_ptr().cast(), text.len(), &mut written) };
        panic!("a valid step returned {status:?} after a refused call: {}", String::from_utf8_lossy(&text[..written.min(text.len())]));
    }
}

fuzz_target!(|data: &[u8]| {
    let mut policies = POLICIES.lock().unwrap_or_else(|e| e.into_inner());
    if policies.is_empty() {
        policies.push(open(false));
        policies.push(open(true));
    }
    let mut u = Unstructured::new(data);
    let Ok(rtc) = u.arbitrary::<bool>() else { return };
    let _ = run(&mut u, &policies[rtc as usize]);
});

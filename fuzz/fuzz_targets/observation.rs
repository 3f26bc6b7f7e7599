//! `Policy::step` / `step_continuing` and the prompt setters on the micro Pi0.5: the input is
//! decoded into a prompt change, an observation (camera count, frame geometry, strides, formats,
//! data lengths, state and noise values and lengths, NaN and infinities included) and a
//! continuation. Every call must return Ok or Err, never panic; after a refused call, a valid step
//! must still succeed (the policy stays usable).

#![no_main]

use std::sync::Mutex;

use flashrt::{Continuation, Frame, Observation, PixelFormat, Policy};
use flashrt_fuzz::{MAX_FRAME, ValidInput, open_micro};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

struct State {
    plain: Policy,
    rtc: Policy,
    valid_plain: ValidInput,
    valid_rtc: ValidInput,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// A length near `expected` most of the time (the interesting boundary), anything small otherwise.
fn length(u: &mut Unstructured, expected: usize, cap: usize) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=3)? {
        0 | 1 => expected,
        2 => (expected + u.int_in_range(0..=2)?).saturating_sub(1),
        _ => u.int_in_range(0..=cap)?,
    })
}

/// A float that is often special: NaN, infinities, huge, tiny, negative zero.
fn float(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0u8..=7)? {
        0 => f32::from_bits(u.arbitrary()?),
        1 => *u.choose(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, f32::MIN_POSITIVE, -0.0, 1e30])?,
        _ => u.int_in_range(-2000i16..=2000)? as f32 / 500.0,
    })
}

/// A size that is usually plausible and sometimes extreme.
fn size(u: &mut Unstructured, plausible: usize) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=7)? {
        0 => *u.choose(&[0, 1, usize::MAX, usize::MAX / 3, 1 << 32, MAX_FRAME + 1])?,
        _ => u.int_in_range(1..=plausible)?,
    })
}

struct Camera {
    data: Vec<u8>,
    width: usize,
    height: usize,
    stride: usize,
    format: PixelFormat,
}

fn camera(u: &mut Unstructured) -> Result<Option<Camera>> {
    if u.ratio(1u8, 5)? {
        return Ok(None);
    }
    let format = *u.choose(&[PixelFormat::Rgb8, PixelFormat::Bgr8, PixelFormat::Rgba8])?;
    let (width, height) = (size(u, MAX_FRAME)?, size(u, MAX_FRAME)?);
    let row = width.saturating_mul(format.bytes_per_pixel());
    let stride = match u.int_in_range(0u8..=5)? {
        0 => 0,
        1 => size(u, 4 * MAX_FRAME)?,
        2 => row.saturating_sub(1),
        _ => row.saturating_add(u.int_in_range(0..=8)?),
    };
    // The bytes the geometry needs, capped: a frame the size checks refuse needs no real buffer.
    let needed = height.saturating_sub(1).saturating_mul(stride).saturating_add(row).min(4 * MAX_FRAME * MAX_FRAME + 64);
    let len = length(u, needed, needed + 16)?;
    let fill: u8 = u.arbitrary()?;
    let data = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
    Ok(Some(Camera { data, width, height, stride, format }))
}

fn run(u: &mut Unstructured, s: &mut State) -> Result<()> {
    let use_rtc = u.arbitrary::<bool>()?;
    let (policy, valid) = if use_rtc { (&mut s.rtc, &mut s.valid_rtc) } else { (&mut s.plain, &mut s.valid_plain) };
    let info = policy.info();
    let mut refused = false;

    match u.int_in_range(0u8..=5)? {
        0 => {
            let n = u.int_in_range(0..=64)?;
            let bytes: &[u8] = u.bytes(n)?;
            // Text as given when it is UTF-8 (the C ABI refuses the rest before the runtime).
            if let Ok(text) = std::str::from_utf8(bytes) {
                refused |= policy.set_prompt(text).is_err();
            }
        }
        1 => {
            let n = length(u, 16, info.prompt_capacity + 4)?;
            let ids: Vec<i32> =
                (0..n).map(|_| Ok(if u.ratio(1u8, 8)? { u.arbitrary()? } else { u.int_in_range(0..=1100)? })).collect::<Result<_>>()?;
            refused |= policy.set_prompt_tokens(&ids).is_err();
        }
        _ => {}
    }

    let cameras = length(u, info.cameras.len(), 5)?;
    let owned: Vec<Option<Camera>> = (0..cameras).map(|_| camera(u)).collect::<Result<_>>()?;
    let frames: Vec<Option<Frame>> = owned
        .iter()
        .map(|c| c.as_ref().map(|c| Frame { data: &c.data, width: c.width, height: c.height, stride: c.stride, format: c.format }))
        .collect();
    let state: Vec<f32> = (0..length(u, info.state_dim, 12)?).map(|_| float(u)).collect::<Result<_>>()?;
    let noise: Option<Vec<f32>> = if u.ratio(1u8, 3)? {
        Some((0..length(u, policy.noise_len(), policy.noise_len() + 4)?).map(|_| float(u)).collect::<Result<_>>()?)
    } else {
        None
    };
    let mut actions = vec![0.0; length(u, policy.actions_len(), policy.actions_len() + 4)?];
    let continuation = if u.arbitrary::<bool>()? {
        let mut count = || -> Result<usize> { Ok(if u.ratio(1u8, 6)? { u.arbitrary()? } else { u.int_in_range(0..=60)? }) };
        Some(Continuation { executed: count()?, inference_delay: count()? })
    } else {
        None
    };
    let obs = Observation { cameras: &frames, state: &state, noise: noise.as_deref() };
    // Finite but extreme values (noise of 1e30) may give non-finite actions: not a finding here.
    refused |= policy.step_continuing(&obs, continuation, &mut actions).is_err();
    if refused {
        valid.step_must_succeed(policy, "a refused call");
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let s = guard.get_or_insert_with(|| {
        let (plain, rtc) = (open_micro(false), open_micro(true));
        let (valid_plain, valid_rtc) = (ValidInput::new(&plain), ValidInput::new(&rtc));
        State { plain, rtc, valid_plain, valid_rtc }
    });
    let _ = run(&mut Unstructured::new(data), s);
});

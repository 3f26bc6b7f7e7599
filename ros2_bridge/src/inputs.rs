//! The latest frame per camera and the latest joint state, in buffers sized once at start.
//!
//! The DDS thread validates each message and copies it into its slot ([`FrameSlot::store`],
//! [`StateSlot::store`]); the inference thread copies slots into its own snapshot
//! ([`FrameSlot::copy_from`]). Neither copy allocates: a slot's buffer is allocated for the largest
//! accepted frame when the node starts. A rejected message empties its slot, because the newest
//! view of that camera (or of the joints) is then unknown, and an older one would be replayed as
//! if it were current.

use std::time::Instant;

use flashrt::{Frame, PixelFormat};

use crate::msg::{Image, JointState};

/// Camera slots held in fixed arrays on the inference path.
pub const MAX_CAMERAS: usize = 8;

/// A reason to drop an input message: a small index (for rate-limited warnings) and a sentence.
pub trait Reject: Copy {
    /// The number of reasons: `index` is below it.
    const COUNT: usize;
    fn index(self) -> usize;
    fn describe(self) -> &'static str;
}

/// Why a camera frame was not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameReject {
    /// Not `rgb8`, `bgr8` or `rgba8`.
    Encoding,
    /// Width or height zero, or larger than the configured maximum.
    TooLarge,
    /// Not the size configured for this camera.
    WrongSize,
    /// `step` shorter than a row, or `data` shorter than `step × height`.
    Truncated,
}

impl Reject for FrameReject {
    const COUNT: usize = 4;

    fn index(self) -> usize {
        self as usize
    }

    fn describe(self) -> &'static str {
        match self {
            FrameReject::Encoding => "unsupported encoding (rgb8, bgr8 and rgba8 are accepted)",
            FrameReject::TooLarge => "frame empty or larger than policy.max_frame_width/height",
            FrameReject::WrongSize => "frame size differs from the camera's configured width/height",
            FrameReject::Truncated => "step shorter than a row or data shorter than step x height",
        }
    }
}

/// Why a joint state was not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateReject {
    /// `position` does not have the policy's state width (names not configured).
    Count,
    /// A configured joint name is absent, or has no position.
    NameMismatch,
    /// A used position is NaN or infinite.
    NotFinite,
    /// A used position is finite but beyond what the policy's f32 state holds (|x| > 3.4e38).
    OutOfRange,
}

impl Reject for StateReject {
    const COUNT: usize = 4;

    fn index(self) -> usize {
        self as usize
    }

    fn describe(self) -> &'static str {
        match self {
            StateReject::Count => "position has the wrong number of values for the policy state",
            StateReject::NameMismatch => "a joint of joint_states.names is missing from the message",
            StateReject::NotFinite => "a joint position is NaN or infinite",
            StateReject::OutOfRange => "a joint position is out of range (|x| > 3.4e38, beyond the policy's f32 state)",
        }
    }
}

/// Why a prompt was not taken. Beyond this check the tokenizer judges prompts on the inference
/// thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptReject {
    /// Empty or only whitespace: not a task.
    Blank,
}

impl Reject for PromptReject {
    const COUNT: usize = 1;

    fn index(self) -> usize {
        self as usize
    }

    fn describe(self) -> &'static str {
        match self {
            PromptReject::Blank => "empty or blank prompt ignored, the previous task stays in force",
        }
    }
}

/// Checks a prompt received on the topic (or configured): blank as the runtime's prompt cleaning
/// sees it, so that nothing `Policy::set_prompt` would refuse replaces the task.
pub fn check_prompt(text: &str) -> Result<(), PromptReject> {
    if flashrt::models::pi05::prompt::is_blank_task(text) { Err(PromptReject::Blank) } else { Ok(()) }
}

pub fn pixel_format(encoding: &str) -> Option<PixelFormat> {
    match encoding {
        "rgb8" => Some(PixelFormat::Rgb8),
        "bgr8" => Some(PixelFormat::Bgr8),
        "rgba8" => Some(PixelFormat::Rgba8),
        _ => None,
    }
}

/// One camera's latest frame, packed (no row padding).
pub struct FrameSlot {
    data: Box<[u8]>,
    max_width: usize,
    max_height: usize,
    width: usize,
    height: usize,
    format: PixelFormat,
    /// When the frame arrived; `None` while the slot is empty.
    received: Option<Instant>,
}

impl FrameSlot {
    pub fn new(max_width: usize, max_height: usize) -> FrameSlot {
        let largest = max_width * max_height * PixelFormat::Rgba8.bytes_per_pixel();
        FrameSlot {
            data: vec![0; largest].into_boxed_slice(),
            max_width,
            max_height,
            width: 0,
            height: 0,
            format: PixelFormat::Rgb8,
            received: None,
        }
    }

    /// Validates `img` and stores it; on rejection the slot is emptied.
    pub fn store(&mut self, img: &Image, expected: Option<(u32, u32)>, now: Instant) -> Result<(), FrameReject> {
        let result = self.try_store(img, expected, now);
        if result.is_err() {
            self.received = None;
        }
        result
    }

    fn try_store(&mut self, img: &Image, expected: Option<(u32, u32)>, now: Instant) -> Result<(), FrameReject> {
        let format = pixel_format(&img.encoding).ok_or(FrameReject::Encoding)?;
        let (width, height, step) = (img.width as usize, img.height as usize, img.step as usize);
        if expected.is_some_and(|e| e != (img.width, img.height)) {
            return Err(FrameReject::WrongSize);
        }
        // Bounded by the maximum before any arithmetic, so nothing below can overflow.
        if width == 0 || height == 0 || width > self.max_width || height > self.max_height {
            return Err(FrameReject::TooLarge);
        }
        let row = width * format.bytes_per_pixel();
        if step < row || img.data.len() < step * (height - 1) + row {
            return Err(FrameReject::Truncated);
        }
        for (dst, src) in self.data.chunks_exact_mut(row).zip(img.data.chunks(step)).take(height) {
            dst.copy_from_slice(&src[..row]);
        }
        (self.width, self.height, self.format, self.received) = (width, height, format, Some(now));
        Ok(())
    }

    /// Copies another slot of the same capacity (the inference thread's snapshot).
    pub fn copy_from(&mut self, other: &FrameSlot) {
        let used = other.used();
        self.data[..used].copy_from_slice(&other.data[..used]);
        (self.width, self.height, self.format, self.received) = (other.width, other.height, other.format, other.received);
    }

    fn used(&self) -> usize {
        if self.received.is_some() { self.width * self.height * self.format.bytes_per_pixel() } else { 0 }
    }

    /// Age of the held frame, or `None` when empty.
    pub fn age(&self, now: Instant) -> Option<std::time::Duration> {
        self.received.map(|r| now.saturating_duration_since(r))
    }

    pub fn clear(&mut self) {
        self.received = None;
    }

    pub fn frame(&self) -> Option<Frame<'_>> {
        self.received?;
        Some(Frame::packed(&self.data[..self.used()], self.width, self.height, self.format))
    }
}

/// A joint position as the policy's f32 state value. Judged on the f64 itself: a finite value
/// beyond f32's range would become infinite in the conversion, and is out of range, not NaN.
fn to_f32(p: f64) -> Result<f32, StateReject> {
    if !p.is_finite() {
        Err(StateReject::NotFinite)
    } else if p.abs() > f32::MAX as f64 {
        Err(StateReject::OutOfRange)
    } else {
        Ok(p as f32)
    }
}

/// The latest joint state, already in the policy's state order.
pub struct StateSlot {
    values: Vec<f32>,
    received: Option<Instant>,
}

impl StateSlot {
    pub fn new(state_dim: usize) -> StateSlot {
        StateSlot { values: vec![0.0; state_dim], received: None }
    }

    /// Picks the policy state out of `js` (by `names` when given, else in order); on rejection the
    /// slot is emptied.
    pub fn store(&mut self, js: &JointState, names: &[String], now: Instant) -> Result<(), StateReject> {
        let result = self.try_store(js, names, now);
        if result.is_err() {
            self.received = None;
        }
        result
    }

    fn try_store(&mut self, js: &JointState, names: &[String], now: Instant) -> Result<(), StateReject> {
        if names.is_empty() {
            if js.position.len() != self.values.len() {
                return Err(StateReject::Count);
            }
            for (v, p) in self.values.iter_mut().zip(&js.position) {
                *v = to_f32(*p)?;
            }
        } else {
            for (v, name) in self.values.iter_mut().zip(names) {
                let i = js.name.iter().position(|n| n == name).ok_or(StateReject::NameMismatch)?;
                *v = to_f32(*js.position.get(i).ok_or(StateReject::NameMismatch)?)?;
            }
        }
        self.received = Some(now);
        Ok(())
    }

    pub fn copy_from(&mut self, other: &StateSlot) {
        self.values.copy_from_slice(&other.values);
        self.received = other.received;
    }

    pub fn age(&self, now: Instant) -> Option<std::time::Duration> {
        self.received.map(|r| now.saturating_duration_since(r))
    }

    pub fn values(&self) -> &[f32] {
        &self.values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(width: u32, height: u32, encoding: &str, step: u32) -> Image {
        let data = (0..step * height).map(|i| (i % 251) as u8).collect();
        Image { width, height, encoding: encoding.into(), step, data, ..Image::default() }
    }

    #[test]
    fn frames_are_packed_and_padding_dropped() {
        let mut slot = FrameSlot::new(8, 8);
        let now = Instant::now();
        // 3x2 rgb8 with 2 bytes of row padding.
        slot.store(&image(3, 2, "rgb8", 11), None, now).unwrap();
        let f = slot.frame().unwrap();
        assert_eq!((f.width, f.height, f.stride, f.format), (3, 2, 9, PixelFormat::Rgb8));
        assert_eq!(&f.data[..9], &(0..9).collect::<Vec<u8>>()[..]);
        assert_eq!(&f.data[9..18], &(11..20).collect::<Vec<u8>>()[..]);
        let mut copy = FrameSlot::new(8, 8);
        copy.copy_from(&slot);
        assert_eq!(copy.frame().unwrap().data, f.data);
    }

    #[test]
    fn bad_frames_are_rejected_and_empty_the_slot() {
        let mut slot = FrameSlot::new(8, 8);
        let now = Instant::now();
        let cases = [
            (image(4, 4, "mono8", 4), None, FrameReject::Encoding),
            (image(4, 4, "bgra8", 16), None, FrameReject::Encoding),
            (image(9, 4, "rgb8", 27), None, FrameReject::TooLarge),
            (image(0, 4, "rgb8", 0), None, FrameReject::TooLarge),
            (image(4, 4, "rgb8", 12), Some((4, 5)), FrameReject::WrongSize),
            (image(4, 4, "rgb8", 11), None, FrameReject::Truncated),
            (Image { data: vec![0; 47], ..image(4, 4, "rgb8", 12) }, None, FrameReject::Truncated),
        ];
        for (img, expected, reject) in cases {
            slot.store(&image(2, 2, "bgr8", 6), None, now).unwrap();
            assert!(slot.frame().is_some());
            assert_eq!(slot.store(&img, expected, now), Err(reject), "{}x{} {}", img.width, img.height, img.encoding);
            assert!(slot.frame().is_none() && slot.age(now).is_none());
        }
        // The configured size, and a padded frame whose last row carries no padding, are fine.
        slot.store(&image(4, 4, "rgb8", 12), Some((4, 4)), now).unwrap();
        slot.store(&Image { data: vec![7; 3 * 14 + 12], ..image(4, 4, "rgb8", 14) }, None, now).unwrap();
        assert_eq!(slot.frame().unwrap().data, [7; 48]);
        // Sizes near u32::MAX are rejected without overflow.
        assert_eq!(slot.store(&image(u32::MAX, 1, "rgba8", 0), None, now), Err(FrameReject::TooLarge));
    }

    #[test]
    fn joint_state_by_order_and_by_name() {
        let now = Instant::now();
        let mut slot = StateSlot::new(3);
        let js = |name: &[&str], position: &[f64]| JointState {
            name: name.iter().map(|s| s.to_string()).collect(),
            position: position.to_vec(),
            ..JointState::default()
        };
        slot.store(&js(&[], &[1.0, 2.0, 3.0]), &[], now).unwrap();
        assert_eq!(slot.values(), [1.0, 2.0, 3.0]);
        assert_eq!(slot.store(&js(&[], &[1.0, 2.0]), &[], now), Err(StateReject::Count));
        assert!(slot.age(now).is_none());

        let names: Vec<String> = ["c", "a", "b"].map(String::from).to_vec();
        slot.store(&js(&["a", "b", "x", "c"], &[1.0, 2.0, 9.0, 3.0]), &names, now).unwrap();
        assert_eq!(slot.values(), [3.0, 1.0, 2.0]);
        assert_eq!(slot.store(&js(&["a", "b"], &[1.0, 2.0]), &names, now), Err(StateReject::NameMismatch));
        assert_eq!(slot.store(&js(&["a", "b", "c"], &[1.0, 2.0]), &names, now), Err(StateReject::NameMismatch));
        assert_eq!(slot.store(&js(&["a", "b", "c"], &[1.0, f64::NAN, 3.0]), &names, now), Err(StateReject::NotFinite));
        assert_eq!(slot.store(&js(&["a", "b", "c"], &[1.0, 2.0, f64::NEG_INFINITY]), &names, now), Err(StateReject::NotFinite));
        // Finite, but beyond f32: out of range, not "NaN or infinite".
        assert_eq!(slot.store(&js(&[], &[1.0, 1e300, 3.0]), &[], now), Err(StateReject::OutOfRange));
        assert_eq!(slot.store(&js(&["a", "b", "c"], &[-4e38, 2.0, 3.0]), &names, now), Err(StateReject::OutOfRange));
        slot.store(&js(&[], &[f32::MAX as f64, -(f32::MAX as f64), 0.0]), &[], now).unwrap();
        assert_eq!(slot.values(), [f32::MAX, -f32::MAX, 0.0]);
        assert_eq!(slot.store(&js(&[], &[1.0, 1e300, 3.0]), &[], now), Err(StateReject::OutOfRange));
        assert!(slot.age(now).is_none());
    }
}

//! [`Recorder`]: an observation log written from a control loop without slowing it. The stepping
//! thread copies each observation into one of [`QUEUE_DEPTH`] reusable buffers and hands it to a
//! writer thread through a bounded channel; the writer encodes and writes it and hands the buffer
//! back. When every buffer is still waiting for the disk, the observation is dropped (counted, and
//! logged once) rather than the control loop blocked. One recorder type serves `flashrt serve`,
//! the ROS 2 node and the C ABI.
//!
//! Allocation on the stepping thread: none in [`Recorder::record`], except on a step whose frame is
//! larger than any that camera had before (the first step included): then every idle buffer grows
//! to it, so that later steps of that size find room wherever they land. [`Recorder::set_prompt`]
//! copies the text (it follows a prompt change, which allocates anyway). Drops are logged by the
//! writer thread, which allocates freely.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError, bounded};

use super::{LogHeader, ObservationLogWriter};
use crate::error::{Error, Result};
use crate::image::{Frame, PixelFormat};
use crate::policy::{Observation, Policy, StepInfo};
use crate::rtc::Continuation;
use crate::stream::{StreamDims, StreamPolicy};

/// Observations that may wait for the disk at once (each in its own buffer, sized for the largest
/// frames seen); a further one is dropped.
pub const QUEUE_DEPTH: usize = 4;

/// Counters of a recording.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecorderStats {
    /// Records written to the file.
    pub written: u64,
    /// Observations not recorded: the writer had fallen behind (or stopped after an error), or the
    /// observation did not fit the log (another camera count or state width).
    pub dropped: u64,
}

/// One observation on its way to the disk.
struct Slot {
    time: Duration,
    /// The prompt, when it changed since the previous observation handed over.
    prompt: Option<String>,
    frames: Vec<SlotFrame>,
    state: Vec<f32>,
    noise: Vec<f32>,
    has_noise: bool,
}

/// A camera's frame, packed.
struct SlotFrame {
    present: bool,
    width: usize,
    height: usize,
    format: PixelFormat,
    data: Vec<u8>,
}

impl Slot {
    fn new(cameras: usize, state_dim: usize, noise_len: usize) -> Slot {
        let frame = || SlotFrame { present: false, width: 0, height: 0, format: PixelFormat::Rgb8, data: Vec::new() };
        Slot {
            time: Duration::ZERO,
            prompt: None,
            frames: (0..cameras).map(|_| frame()).collect(),
            state: Vec::with_capacity(state_dim),
            noise: Vec::with_capacity(noise_len),
            has_noise: false,
        }
    }

    /// Copies `obs` (validated frames, this slot's camera count) in, rows packed.
    fn fill(&mut self, obs: &Observation, time: Duration, prompt: Option<String>) {
        self.time = time;
        self.prompt = prompt;
        for (slot, frame) in self.frames.iter_mut().zip(obs.cameras) {
            slot.present = frame.is_some();
            let Some(f) = frame else { continue };
            (slot.width, slot.height, slot.format) = (f.width, f.height, f.format);
            let row = f.width * f.format.bytes_per_pixel();
            slot.data.clear();
            for y in 0..f.height {
                slot.data.extend_from_slice(&f.data[y * f.stride..y * f.stride + row]);
            }
        }
        self.state.clear();
        self.state.extend_from_slice(obs.state);
        self.has_noise = obs.noise.is_some();
        self.noise.clear();
        self.noise.extend_from_slice(obs.noise.unwrap_or_default());
    }

    /// Makes room for frames of `largest` bytes per camera.
    fn reserve(&mut self, largest: &[usize]) {
        for (frame, &bytes) in self.frames.iter_mut().zip(largest) {
            frame.data.reserve(bytes.saturating_sub(frame.data.len()));
        }
    }
}

/// Why observations were dropped, as [`Progress::drop_reason`] numbers them (0: none yet).
const DROP_REASONS: [&str; 4] = [
    "",
    "the writer has fallen behind",
    "an observation had another camera count or state width than the log",
    "a frame's bytes did not cover its geometry",
];
const WRITER_BEHIND: usize = 1;
const OTHER_SHAPE: usize = 2;
const FRAME_UNCOVERED: usize = 3;

/// What the stepping and the writer thread share.
struct Progress {
    written: AtomicU64,
    dropped: AtomicU64,
    /// The first drop's reason (an index into [`DROP_REASONS`]), for the writer's warning.
    drop_reason: AtomicUsize,
    /// Per camera, the largest frame handed over (bytes): the writer grows the buffers it hands
    /// back to it.
    largest: Vec<AtomicUsize>,
}

/// Records the observations a policy steps on into an observation log, from the stepping thread,
/// without blocking it (see the module docs). Call [`Recorder::set_prompt`] whenever the policy's
/// prompt changes and [`Recorder::record`] after each successful step; [`Recorder::finish`] (or
/// dropping the recorder) writes what is queued and closes the file.
pub struct Recorder {
    path: PathBuf,
    /// Empty buffers, from the writer (and from `grow_idle`).
    free: Receiver<Slot>,
    free_back: Sender<Slot>,
    /// To the writer; `None` once finished.
    full: Option<Sender<Slot>>,
    writer: Option<JoinHandle<Result<u64>>>,
    progress: Arc<Progress>,
    started: Instant,
    /// A prompt set since the last observation handed over.
    prompt: Option<String>,
    cameras: usize,
    state_dim: usize,
    /// Per camera, the largest frame seen (bytes).
    largest: Vec<usize>,
    /// Room for the idle buffers while they grow.
    growing: Vec<Slot>,
}

impl Recorder {
    /// Starts recording the observations of `policy` (its camera count, state width and noise
    /// length) to `path`, created or truncated here: an error opening it is returned now.
    pub fn for_policy(path: impl AsRef<Path>, policy: &Policy, note: &str) -> Result<Recorder> {
        Recorder::start(path, LogHeader::for_policy(&policy.info(), note), policy.noise_len())
    }

    /// Starts recording observations of `header`'s shape to `path`; `noise_len` sizes the noise
    /// buffers (0 if steps are given none).
    pub fn start(path: impl AsRef<Path>, header: LogHeader, noise_len: usize) -> Result<Recorder> {
        let path = path.as_ref();
        let (cameras, state_dim) = (usize::from(header.cameras), header.state_dim as usize);
        let log = ObservationLogWriter::create(path, header)?;
        let (full, to_write) = bounded(QUEUE_DEPTH);
        let (free_back, free) = bounded(QUEUE_DEPTH);
        for _ in 0..QUEUE_DEPTH {
            let _ = free_back.try_send(Slot::new(cameras, state_dim, noise_len));
        }
        let progress = Arc::new(Progress {
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            drop_reason: AtomicUsize::new(0),
            largest: (0..cameras).map(|_| AtomicUsize::new(0)).collect(),
        });
        let writer = {
            let (progress, free_back) = (Arc::clone(&progress), free_back.clone());
            std::thread::Builder::new()
                .name("flashrt-recorder".into())
                .spawn(move || write_all(log, &to_write, &free_back, &progress))
                .map_err(|e| Error::Backend(format!("cannot start the observation recorder thread: {e}")))?
        };
        log::info!("recording observations to {}", path.display());
        Ok(Recorder {
            path: path.into(),
            free,
            free_back,
            full: Some(full),
            writer: Some(writer),
            progress,
            started: Instant::now(),
            prompt: None,
            cameras,
            state_dim,
            largest: vec![0; cameras],
            growing: Vec::with_capacity(QUEUE_DEPTH),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The prompt now in force; the next observation recorded carries it.
    pub fn set_prompt(&mut self, text: &str) {
        self.prompt = Some(text.to_owned());
    }

    /// Hands `obs` to the writer; `false` if it was dropped (counted, and logged once by the
    /// writer thread). Never blocks; see the module docs on allocation.
    pub fn record(&mut self, obs: &Observation) -> bool {
        if obs.cameras.len() != self.cameras || obs.state.len() != self.state_dim {
            return self.drop_one(OTHER_SHAPE);
        }
        // Frames the policy took are valid; anything else must not be copied out of bounds.
        if !obs.cameras.iter().flatten().all(covered) {
            return self.drop_one(FRAME_UNCOVERED);
        }
        let Ok(mut slot) = self.free.try_recv() else { return self.drop_one(WRITER_BEHIND) };
        let mut grew = false;
        for ((largest, shared), frame) in self.largest.iter_mut().zip(&self.progress.largest).zip(obs.cameras) {
            let bytes = frame.map_or(0, |f| f.width * f.height * f.format.bytes_per_pixel());
            if bytes > *largest {
                (*largest, grew) = (bytes, true);
                shared.store(bytes, Ordering::Relaxed);
            }
        }
        slot.fill(obs, self.started.elapsed(), self.prompt.take());
        let sent = self.full.as_ref().is_some_and(|full| full.try_send(slot).is_ok());
        if grew {
            self.grow_idle();
        }
        // Not sent: the writer stopped on an error (finish reports it).
        sent || self.drop_one(WRITER_BEHIND)
    }

    /// Grows every idle buffer to the largest frames seen.
    fn grow_idle(&mut self) {
        while let Ok(mut slot) = self.free.try_recv() {
            slot.reserve(&self.largest);
            self.growing.push(slot);
        }
        for slot in self.growing.drain(..) {
            // Room for every buffer there is: cannot fail.
            let _ = self.free_back.try_send(slot);
        }
    }

    fn drop_one(&self, reason: usize) -> bool {
        self.progress.dropped.fetch_add(1, Ordering::Relaxed);
        let _ = self.progress.drop_reason.compare_exchange(0, reason, Ordering::Relaxed, Ordering::Relaxed);
        false
    }

    pub fn stats(&self) -> RecorderStats {
        RecorderStats { written: self.progress.written.load(Ordering::Relaxed), dropped: self.progress.dropped.load(Ordering::Relaxed) }
    }

    /// Writes every observation handed over, closes the file and returns the counts, or the
    /// error that stopped the writer (the file then holds the records before it).
    pub fn finish(mut self) -> Result<RecorderStats> {
        self.stop()
    }

    fn stop(&mut self) -> Result<RecorderStats> {
        drop(self.full.take());
        let Some(writer) = self.writer.take() else { return Ok(self.stats()) };
        writer.join().map_err(|_| Error::Backend(format!("recording to {}: the writer thread panicked", self.path.display())))??;
        let stats = self.stats();
        log::info!("recorded {} observations to {} ({} dropped)", stats.written, self.path.display(), stats.dropped);
        Ok(stats)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            log::error!("{e}");
        }
    }
}

/// Whether `f`'s bytes cover its geometry (what `Frame::validate` checks, without formatting an
/// error).
fn covered(f: &Frame) -> bool {
    let row = f.width.checked_mul(f.format.bytes_per_pixel()).filter(|&row| row > 0 && f.height > 0 && f.stride >= row);
    let needed = row.and_then(|row| (f.height - 1).checked_mul(f.stride)?.checked_add(row));
    needed.is_some_and(|n| n <= f.data.len())
}

/// How often the writer looks for observations. It polls rather than sleeps on the channel, so
/// that handing one over is a few atomic operations and never a wake-up: no system call on the
/// stepping thread, and no thread handle that the channel's waker would allocate for a thread the
/// library did not start (a C controller's).
const POLL: Duration = Duration::from_millis(2);

/// The writer thread: each buffer handed over, appended to `log` and handed back grown to the
/// largest frames seen, until the recorder finishes. It logs the first drop.
fn write_all(mut log: ObservationLogWriter, to_write: &Receiver<Slot>, free: &Sender<Slot>, progress: &Progress) -> Result<u64> {
    let mut prompt = String::new();
    let mut largest = vec![0; progress.largest.len()];
    let mut warned = false;
    loop {
        let slot = match to_write.try_recv() {
            Ok(slot) => Some(slot),
            Err(TryRecvError::Empty) => {
                std::thread::sleep(POLL);
                None
            }
            Err(TryRecvError::Disconnected) => break,
        };
        if let Some(mut slot) = slot {
            if let Some(text) = slot.prompt.take() {
                prompt = text;
            }
            let appended = {
                let frames: Vec<Option<Frame>> =
                    slot.frames.iter().map(|f| f.present.then(|| Frame::packed(&f.data, f.width, f.height, f.format))).collect();
                let noise = slot.has_noise.then_some(&slot.noise[..]);
                log.append_at(slot.time, &Observation { cameras: &frames, state: &slot.state, noise }, &prompt)
            };
            if let Err(e) = appended {
                log::error!("recording stopped: {e}");
                return Err(e);
            }
            progress.written.fetch_add(1, Ordering::Relaxed);
            for (l, shared) in largest.iter_mut().zip(&progress.largest) {
                *l = shared.load(Ordering::Relaxed);
            }
            slot.reserve(&largest);
            let _ = free.try_send(slot);
        }
        let reason = progress.drop_reason.load(Ordering::Relaxed);
        if !warned && reason != 0 {
            warned = true;
            log::warn!("observation recorder: an observation was dropped ({}); further drops are only counted", DROP_REASONS[reason]);
        }
    }
    log.finish()
}

/// A [`StreamPolicy`] that records every observation its policy steps on (and the prompts it is
/// given): an action stream's chunks recorded as they are computed, on the stream's thread.
pub struct RecordingPolicy<P: StreamPolicy = Policy> {
    pub policy: P,
    /// `None`: a plain pass-through.
    pub recorder: Option<Recorder>,
}

impl<P: StreamPolicy> StreamPolicy for RecordingPolicy<P> {
    fn dims(&self) -> StreamDims {
        self.policy.dims()
    }
    fn step_chunk(&mut self, obs: &Observation, continuation: Option<Continuation>, actions: &mut [f32]) -> Result<StepInfo> {
        let info = self.policy.step_chunk(obs, continuation, actions)?;
        if let Some(r) = &mut self.recorder {
            r.record(obs);
        }
        Ok(info)
    }
    fn set_prompt(&mut self, text: &str) -> Result<()> {
        self.policy.set_prompt(text)?;
        if let Some(r) = &mut self.recorder {
            r.set_prompt(text);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    use super::super::ObservationLogReader;
    use super::*;

    fn wait_written(r: &Recorder, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while r.stats().written < n {
            assert!(Instant::now() < deadline, "the writer did not catch up: {:?}", r.stats());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn records_what_it_is_handed_with_the_prompt_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("obs.frtobs");
        let mut r = Recorder::start(&path, LogHeader::new("pi05", 2, 3, ""), 4).unwrap();
        // Camera 0 with padded rows and growing from step to step, camera 1 missing every other.
        let frames: Vec<Vec<u8>> = (0..5).map(|i| (0..(i + 2) * 16 * 3).map(|b| (b * 3 + i) as u8).collect()).collect();
        let noise = [0.25; 4];
        for (i, data) in frames.iter().enumerate() {
            if i == 0 || i == 3 {
                r.set_prompt(["pick", "place"][i / 3]);
            }
            let cameras = [
                Some(Frame { data, width: i + 1, height: 3, stride: (i + 2) * 16, format: PixelFormat::Rgb8 }),
                (i % 2 == 0).then(|| Frame::packed(&frames[0], 2, 2, PixelFormat::Rgba8)),
            ];
            let state = [i as f32, 0.0, -1.0];
            assert!(r.record(&Observation { cameras: &cameras, state: &state, noise: (i == 4).then_some(&noise[..]) }));
            wait_written(&r, i as u64 + 1);
        }
        assert_eq!(r.finish().unwrap(), RecorderStats { written: 5, dropped: 0 });

        let records: Vec<_> = ObservationLogReader::open(&path).unwrap().map(Result::unwrap).collect();
        assert_eq!(records.len(), 5);
        for (i, rec) in records.iter().enumerate() {
            assert_eq!(rec.prompt, ["pick", "place"][usize::from(i >= 3)]);
            assert_eq!(rec.state, [i as f32, 0.0, -1.0]);
            assert_eq!(rec.noise, (i == 4).then(|| noise.to_vec()));
            let packed: Vec<u8> = frames[i].chunks((i + 2) * 16).flat_map(|row| &row[..(i + 1) * 3]).copied().collect();
            assert_eq!(rec.cameras[0].as_ref().map(|f| (f.width, f.height, &f.data)), Some(((i + 1) as u32, 3, &packed)));
            assert_eq!(rec.cameras[1].as_ref().map(|f| f.data.clone()), (i % 2 == 0).then(|| frames[0][..16].to_vec()));
            assert!(i == 0 || rec.time_ns > records[i - 1].time_ns);
        }
    }

    /// A log written into a pipe nobody reads: the writer blocks on the first record, the next
    /// three wait in their buffers, and every further observation is dropped at once.
    #[test]
    fn a_writer_that_falls_behind_drops_instead_of_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pipe");
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // Our end, opened first so that the recorder's open does not wait for a reader.
        let mut reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path).unwrap();
        let mut r = Recorder::start(&path, LogHeader::new("pi05", 1, 1, ""), 0).unwrap();
        r.set_prompt("wave");
        // 120 KB a frame: more than the pipe holds.
        let data = vec![7u8; 200 * 200 * 3];
        let cameras = [Some(Frame::packed(&data, 200, 200, PixelFormat::Rgb8))];
        let started = Instant::now();
        let handed: Vec<bool> = (0..10).map(|_| r.record(&Observation { cameras: &cameras, state: &[0.5], noise: None })).collect();
        assert!(started.elapsed() < Duration::from_secs(2), "record blocked: {:?}", started.elapsed());
        assert_eq!(handed, [true, true, true, true, false, false, false, false, false, false]);
        assert_eq!(r.stats(), RecorderStats { written: 0, dropped: 6 });
        // Another shape is dropped too.
        assert!(!r.record(&Observation { cameras: &[None, None], state: &[0.5], noise: None }));

        let drain = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let mut buf = vec![0; 1 << 16];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => return bytes,
                    Ok(n) => bytes.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                    Err(e) => panic!("{e}"),
                }
            }
        });
        assert_eq!(r.finish().unwrap(), RecorderStats { written: 4, dropped: 7 });
        let log = dir.path().join("obs.frtobs");
        std::fs::write(&log, drain.join().unwrap()).unwrap();
        let records: Vec<_> = ObservationLogReader::open(&log).unwrap().map(Result::unwrap).collect();
        assert_eq!(records.len(), 4);
        assert!(records.iter().all(|rec| rec.prompt == "wave" && rec.cameras[0].as_ref().unwrap().data == data));
    }
}

//! Observation logs: the observations a policy stepped on, recorded from its live inputs and
//! replayed later, to calibrate FP8 on a robot's own data or to regression-test a new build on it.
//! Written by `flashrt serve --record` / `flashrt record`, the ROS 2 node's
//! `inputs.record_observations` and `frt_policy_record_start` (all through [`Recorder`], which
//! keeps file I/O off the control loop); read by `flashrt run --observations` and
//! [`ObservationLogReader`].
//!
//! Format, version 1 (integers in records are postcard varints, `f32` little-endian):
//! - the magic `FRTOBS\0\0` (8 bytes);
//! - the header, postcard-encoded: [`LogHeader`];
//! - records until the end of the file, each a `u32` little-endian byte count and then that many
//!   bytes of a postcard-encoded record: `time_ns: u64` (since the log started),
//!   `prompt: Option<String>` (only when it changed since the previous record; the first record
//!   always has it), `cameras: Vec<Option<RecordedFrame>>`, `state: Vec<f32>`,
//!   `noise: Option<Vec<f32>>`.
//!
//! A log is untrusted input. The reader checks the magic and the version, refuses a record longer
//! than [`MAX_RECORD_BYTES`] before reading it, reads no more than the file holds, and checks every
//! decoded record against the header (camera count, state width) and every frame's bytes against
//! its geometry. Whatever is wrong comes back as an error naming the file and the record index
//! ("record 17 is truncated: 1200 of 4096 bytes"), never a panic; the reader then ends.

mod recorder;

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use self::recorder::{QUEUE_DEPTH, Recorder, RecorderStats, RecordingPolicy};
use crate::error::{Error, Result};
use crate::image::{Frame, PixelFormat};
use crate::policy::{Observation, PolicyInfo};

/// The first 8 bytes of every observation log.
pub const MAGIC: [u8; 8] = *b"FRTOBS\0\0";
/// The format version this build writes, and the newest it reads.
pub const VERSION: u16 = 1;
/// The largest record a log may hold (a reader refuses a longer one before reading it): eight
/// 1920x1080 RGBA frames fit.
pub const MAX_RECORD_BYTES: usize = 64 << 20;
/// The largest header (its free-text note, mostly).
const MAX_HEADER_BYTES: usize = 64 << 10;

/// What a log was recorded for, at the start of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogHeader {
    /// The format version ([`VERSION`]).
    pub version: u16,
    /// The model kind (`PolicyInfo::model`, e.g. "pi05", "groot-n17").
    pub model: String,
    /// Camera slots of every record.
    pub cameras: u16,
    /// State values of every record.
    pub state_dim: u32,
    /// When recording started (seconds since the Unix epoch).
    pub created_unix_s: u64,
    /// Free text (where, which robot, which task).
    pub note: String,
}

impl LogHeader {
    /// A header for the current version, created now.
    pub fn new(model: &str, cameras: u16, state_dim: u32, note: &str) -> LogHeader {
        let created_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        LogHeader { version: VERSION, model: model.into(), cameras, state_dim, created_unix_s, note: note.into() }
    }

    /// A header for observations of the policy `info` describes.
    pub fn for_policy(info: &PolicyInfo, note: &str) -> LogHeader {
        // A plan of more than 65535 cameras or 2^32 state values cannot exist; saturated, the
        // writer would refuse every observation instead of recording a wrong header.
        let cameras = u16::try_from(info.cameras.len()).unwrap_or(u16::MAX);
        let state_dim = u32::try_from(info.state_dim).unwrap_or(u32::MAX);
        LogHeader::new(info.model, cameras, state_dim, note)
    }
}

/// One recorded camera frame: tightly packed rows (whatever stride the live frame had).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedFrame {
    pub width: u32,
    pub height: u32,
    /// A [`PixelFormat`] code.
    pub format: u8,
    /// `height` rows of `width` × bytes per pixel.
    #[serde(with = "crate::byte_string")]
    pub data: Vec<u8>,
}

impl RecordedFrame {
    /// The frame as a policy takes it; `None` for an unknown format code (which a reader never
    /// yields: it refuses such a record).
    pub fn frame(&self) -> Option<Frame<'_>> {
        let format = PixelFormat::from_code(self.format.into())?;
        Some(Frame::packed(&self.data, self.width as usize, self.height as usize, format))
    }
}

/// One record as the reader yields it: the prompt in force filled in (the file stores it only
/// when it changed).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedObservation {
    /// Nanoseconds since the log started.
    pub time_ns: u64,
    /// The task text the policy had for this observation.
    pub prompt: String,
    /// One entry per camera slot; `None` for a camera missing that step.
    pub cameras: Vec<Option<RecordedFrame>>,
    pub state: Vec<f32>,
    /// The initial noise the step was given, if any.
    pub noise: Option<Vec<f32>>,
}

impl RecordedObservation {
    /// The frames as a policy takes them, for [`RecordedObservation::observation`].
    pub fn frames(&self) -> Vec<Option<Frame<'_>>> {
        self.cameras.iter().map(|c| c.as_ref().and_then(RecordedFrame::frame)).collect()
    }

    /// The observation to pass to `Policy::step`, with `frames` from [`RecordedObservation::frames`].
    pub fn observation<'a>(&'a self, frames: &'a [Option<Frame<'a>>]) -> Observation<'a> {
        Observation { cameras: frames, state: &self.state, noise: self.noise.as_deref() }
    }
}

/// A record as stored (reading side).
#[derive(Deserialize)]
struct Record {
    time_ns: u64,
    prompt: Option<String>,
    cameras: Vec<Option<RecordedFrame>>,
    state: Vec<f32>,
    noise: Option<Vec<f32>>,
}

/// The same record, borrowed from a live observation (writing side): field for field the layout of
/// [`Record`].
#[derive(Serialize)]
struct RecordRef<'a> {
    time_ns: u64,
    prompt: Option<&'a str>,
    cameras: Vec<Option<FrameRef<'a>>>,
    state: &'a [f32],
    noise: Option<&'a [f32]>,
}

/// [`RecordedFrame`], borrowed.
#[derive(Serialize)]
struct FrameRef<'a> {
    width: u32,
    height: u32,
    format: u8,
    #[serde(serialize_with = "crate::byte_string::serialize")]
    data: &'a [u8],
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.into(), source }
}

/// Writes an observation log record by record through a buffer (see [`Recorder`] to write from a
/// control loop without blocking it).
pub struct ObservationLogWriter {
    path: PathBuf,
    out: BufWriter<File>,
    header: LogHeader,
    started: Instant,
    /// The prompt of the last record written.
    prompt: Option<String>,
    records: u64,
    /// The record being encoded (length prefix first), reused.
    encoded: Vec<u8>,
    /// Per camera: the rows of a frame with padded rows, packed; reused.
    packed: Vec<Vec<u8>>,
}

impl ObservationLogWriter {
    /// Creates (or truncates) `path` and writes the magic and `header`.
    pub fn create(path: impl AsRef<Path>, header: LogHeader) -> Result<ObservationLogWriter> {
        let path = path.as_ref();
        if header.version != VERSION {
            return Err(Error::invalid("header.version", format!("{}: this build writes version {VERSION}", header.version)));
        }
        let head = postcard::to_allocvec(&header).map_err(|e| Error::invalid("header", e.to_string()))?;
        if head.len() > MAX_HEADER_BYTES {
            return Err(Error::invalid(
                "header.note",
                format!("the header takes {} bytes, above the {MAX_HEADER_BYTES} allowed", head.len()),
            ));
        }
        let mut out = BufWriter::new(File::create(path).map_err(io_error(path))?);
        out.write_all(&MAGIC).and_then(|()| out.write_all(&head)).map_err(io_error(path))?;
        Ok(ObservationLogWriter {
            path: path.into(),
            out,
            packed: vec![Vec::new(); header.cameras.into()],
            header,
            started: Instant::now(),
            prompt: None,
            records: 0,
            encoded: Vec::new(),
        })
    }

    pub fn header(&self) -> &LogHeader {
        &self.header
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Appends `obs`, stepped with `prompt` in force, timed now.
    pub fn append(&mut self, obs: &Observation, prompt: &str) -> Result<()> {
        self.append_at(self.started.elapsed(), obs, prompt)
    }

    /// Appends `obs`, stepped with `prompt` in force, `time` after the log started. The observation
    /// must have the header's camera count and state width, and frames whose bytes cover their
    /// geometry; a refused one writes nothing.
    pub fn append_at(&mut self, time: Duration, obs: &Observation, prompt: &str) -> Result<()> {
        if obs.cameras.len() != usize::from(self.header.cameras) {
            let message = format!("{} given, the log holds {}", obs.cameras.len(), self.header.cameras);
            return Err(Error::invalid("observation.cameras", message));
        }
        if obs.state.len() != self.header.state_dim as usize {
            let message = format!("{} values given, the log holds {}", obs.state.len(), self.header.state_dim);
            return Err(Error::invalid("observation.state", message));
        }
        for (c, frame) in obs.cameras.iter().enumerate() {
            let Some(f) = frame else { continue };
            f.validate(&format!("observation.cameras[{c}]"), u32::MAX as usize, u32::MAX as usize)?;
            let row = f.width * f.format.bytes_per_pixel();
            if f.stride != row {
                let packed = &mut self.packed[c];
                packed.clear();
                for y in 0..f.height {
                    packed.extend_from_slice(&f.data[y * f.stride..y * f.stride + row]);
                }
            }
        }
        let cameras = obs
            .cameras
            .iter()
            .zip(&self.packed)
            .map(|(frame, packed)| {
                frame.map(|f| {
                    let row = f.width * f.format.bytes_per_pixel();
                    // Validated above: the sizes fit u32, the rows fit the data.
                    let data = if f.stride == row { &f.data[..row * f.height] } else { &packed[..] };
                    FrameRef { width: f.width as u32, height: f.height as u32, format: f.format as u8, data }
                })
            })
            .collect();
        let changed = self.prompt.as_deref() != Some(prompt);
        let record = RecordRef {
            time_ns: u64::try_from(time.as_nanos()).unwrap_or(u64::MAX),
            prompt: changed.then_some(prompt),
            cameras,
            state: obs.state,
            noise: obs.noise,
        };
        let mut encoded = std::mem::take(&mut self.encoded);
        encoded.clear();
        encoded.extend_from_slice(&[0; 4]);
        let mut encoded = postcard::to_extend(&record, encoded).map_err(|e| Error::invalid("observation", e.to_string()))?;
        let len = encoded.len() - 4;
        if len > MAX_RECORD_BYTES {
            self.encoded = encoded;
            return Err(Error::invalid("observation", format!("a record of {len} bytes, above the log's limit of {MAX_RECORD_BYTES}")));
        }
        encoded[..4].copy_from_slice(&(len as u32).to_le_bytes());
        let written = self.out.write_all(&encoded).map_err(io_error(&self.path));
        self.encoded = encoded;
        written?;
        if changed {
            self.prompt = Some(prompt.to_owned());
        }
        self.records += 1;
        Ok(())
    }

    /// Flushes the file; returns the number of records written.
    pub fn finish(mut self) -> Result<u64> {
        self.out.flush().map_err(io_error(&self.path))?;
        Ok(self.records)
    }
}

/// Reads an observation log: [`ObservationLogReader::open`] checks the magic and version and
/// reads the header; iterating yields every record in order, or the first error and then nothing.
pub struct ObservationLogReader {
    path: PathBuf,
    file: BufReader<File>,
    header: LogHeader,
    /// Index of the next record.
    index: u64,
    /// The prompt in force (the last one a record carried).
    prompt: Option<String>,
    /// The record being decoded, reused.
    buf: Vec<u8>,
    done: bool,
}

impl ObservationLogReader {
    pub fn open(path: impl AsRef<Path>) -> Result<ObservationLogReader> {
        let path = path.as_ref();
        let corrupt = |message: String| corrupt(path, message);
        let mut file = File::open(path).map_err(io_error(path))?;
        let mut magic = Vec::with_capacity(MAGIC.len());
        (&mut file).take(MAGIC.len() as u64).read_to_end(&mut magic).map_err(io_error(path))?;
        if magic != MAGIC {
            return Err(corrupt(format!("not an observation log: it does not start with {:?}", String::from_utf8_lossy(&MAGIC))));
        }
        let mut head = Vec::new();
        (&mut file).take(MAX_HEADER_BYTES as u64).read_to_end(&mut head).map_err(io_error(path))?;
        let undecodable = |e: postcard::Error| corrupt(format!("the header cannot be decoded: {e}"));
        let (version, _) = postcard::take_from_bytes::<u16>(&head).map_err(undecodable)?;
        if version > VERSION {
            return Err(corrupt(format!("log version {version} is newer than this build reads (version {VERSION}): update FlashRT")));
        }
        if version == 0 {
            return Err(corrupt("log version 0 does not exist (the first is 1)".into()));
        }
        let (header, rest) = postcard::take_from_bytes::<LogHeader>(&head).map_err(undecodable)?;
        let records_start = (MAGIC.len() + head.len() - rest.len()) as u64;
        file.seek(SeekFrom::Start(records_start)).map_err(io_error(path))?;
        Ok(ObservationLogReader {
            path: path.into(),
            file: BufReader::new(file),
            header,
            index: 0,
            prompt: None,
            buf: Vec::new(),
            done: false,
        })
    }

    pub fn header(&self) -> &LogHeader {
        &self.header
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Refuses a log recorded for another model, camera count or state width than the policy
    /// `info` describes, naming each difference.
    pub fn check_policy(&self, info: &PolicyInfo) -> Result<()> {
        let h = &self.header;
        let mut differences = Vec::new();
        if h.model != info.model {
            differences.push(format!("model {:?} (the policy is {:?})", h.model, info.model));
        }
        if usize::from(h.cameras) != info.cameras.len() {
            differences.push(format!("{} cameras (the policy has {})", h.cameras, info.cameras.len()));
        }
        if h.state_dim as usize != info.state_dim {
            differences.push(format!("state width {} (the policy's is {})", h.state_dim, info.state_dim));
        }
        match differences.is_empty() {
            true => Ok(()),
            false => Err(Error::invalid(
                format!("observation log {}", self.path.display()),
                format!("recorded for another policy: {}", differences.join(", ")),
            )),
        }
    }

    fn corrupt(&self, message: String) -> Error {
        corrupt(&self.path, format!("record {} {message}", self.index))
    }

    fn corrupt_frame(&self, camera: usize, message: String) -> Error {
        corrupt(&self.path, format!("record {}, camera {camera}: {message}", self.index))
    }

    /// The next record, `None` at a clean end of the file.
    fn read_record(&mut self) -> Result<Option<RecordedObservation>> {
        let mut prefix = Vec::with_capacity(4);
        (&mut self.file).take(4).read_to_end(&mut prefix).map_err(io_error(&self.path))?;
        let len = match <[u8; 4]>::try_from(&prefix[..]) {
            Ok(b) => u32::from_le_bytes(b) as usize,
            Err(_) if prefix.is_empty() => return Ok(None),
            Err(_) => return Err(self.corrupt(format!("is truncated: its length prefix has {} of 4 bytes", prefix.len()))),
        };
        if len > MAX_RECORD_BYTES {
            return Err(self.corrupt(format!("declares {len} bytes, above the limit of {MAX_RECORD_BYTES} (a corrupt length?)")));
        }
        self.buf.clear();
        (&mut self.file).take(len as u64).read_to_end(&mut self.buf).map_err(io_error(&self.path))?;
        if self.buf.len() < len {
            return Err(self.corrupt(format!("is truncated: {} of {len} bytes", self.buf.len())));
        }
        let (record, rest) = postcard::take_from_bytes::<Record>(&self.buf).map_err(|e| self.corrupt(format!("cannot be decoded: {e}")))?;
        if !rest.is_empty() {
            return Err(self.corrupt(format!("has {} bytes after its content", rest.len())));
        }
        self.check(&record)?;
        if let Some(prompt) = record.prompt {
            self.prompt = Some(prompt);
        }
        let Some(prompt) = self.prompt.clone() else {
            return Err(self.corrupt("carries no prompt, and no record before it did".into()));
        };
        Ok(Some(RecordedObservation { time_ns: record.time_ns, prompt, cameras: record.cameras, state: record.state, noise: record.noise }))
    }

    /// A decoded record against the header and its frames against their geometry.
    fn check(&self, record: &Record) -> Result<()> {
        let h = &self.header;
        if record.cameras.len() != usize::from(h.cameras) {
            return Err(self.corrupt(format!("has {} camera slots, the header says {}", record.cameras.len(), h.cameras)));
        }
        if record.state.len() != h.state_dim as usize {
            return Err(self.corrupt(format!("has {} state values, the header says {}", record.state.len(), h.state_dim)));
        }
        for (c, frame) in record.cameras.iter().enumerate() {
            let Some(f) = frame else { continue };
            let Some(format) = PixelFormat::from_code(f.format.into()) else {
                return Err(self.corrupt_frame(c, format!("unknown pixel format code {}", f.format)));
            };
            if f.width == 0 || f.height == 0 {
                return Err(self.corrupt_frame(c, format!("an empty {}x{} frame", f.width, f.height)));
            }
            let needed = (f.width as u64) * (f.height as u64) * format.bytes_per_pixel() as u64;
            if f.data.len() as u64 != needed {
                let message = format!("{} bytes, a {}x{} {format:?} frame has {needed}", f.data.len(), f.width, f.height);
                return Err(self.corrupt_frame(c, message));
            }
        }
        Ok(())
    }
}

/// An error about the content of the log at `path`: the file's name and what is wrong.
fn corrupt(path: &Path, message: String) -> Error {
    Error::Io { path: path.into(), source: std::io::Error::new(std::io::ErrorKind::InvalidData, message) }
}

impl Iterator for ObservationLogReader {
    type Item = Result<RecordedObservation>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.read_record();
        match next {
            Ok(Some(record)) => {
                self.index += 1;
                Some(Ok(record))
            }
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const W: usize = 5;
    const H: usize = 3;

    /// Five observations of two cameras and a state of 3: camera 0 an RGBA frame with padded rows,
    /// camera 1 a packed BGR frame missing in record 2; the prompt changes at record 3; noise on
    /// records 1 and 4.
    struct Inputs {
        rgba: Vec<Vec<u8>>,
        bgr: Vec<Vec<u8>>,
        states: Vec<Vec<f32>>,
        noise: Vec<f32>,
    }

    const STRIDE: usize = W * 4 + 7;
    const PROMPTS: [&str; 2] = ["pick up the FIRST-TASK cube", "stack the SECOND-TASK cups"];

    fn inputs() -> Inputs {
        Inputs {
            rgba: (0..5).map(|r| (0..STRIDE * H).map(|i| (i * 7 + r * 31) as u8).collect()).collect(),
            bgr: (0..5).map(|r| (0..W * H * 3).map(|i| (i * 13 + r) as u8).collect()).collect(),
            states: (0..5).map(|r| vec![r as f32, -0.5 * r as f32, 1e-3]).collect(),
            noise: (0..8).map(|i| i as f32 / 8.0 - 0.5).collect(),
        }
    }

    fn prompt(r: usize) -> &'static str {
        PROMPTS[usize::from(r >= 3)]
    }

    fn write_log(path: &Path, inputs: &Inputs) {
        let mut log = ObservationLogWriter::create(path, LogHeader::new("pi05", 2, 3, "unit test")).unwrap();
        for r in 0..5 {
            let frames = [
                Some(Frame { data: &inputs.rgba[r], width: W, height: H, stride: STRIDE, format: PixelFormat::Rgba8 }),
                (r != 2).then(|| Frame::packed(&inputs.bgr[r], W, H, PixelFormat::Bgr8)),
            ];
            let noise = (r % 3 == 1).then_some(&inputs.noise[..]);
            let obs = Observation { cameras: &frames, state: &inputs.states[r], noise };
            log.append_at(Duration::from_millis(20 * r as u64), &obs, prompt(r)).unwrap();
        }
        assert_eq!(log.finish().unwrap(), 5);
    }

    fn read_all(path: &Path) -> Vec<Result<RecordedObservation>> {
        ObservationLogReader::open(path).unwrap().collect()
    }

    /// The error text of the first failing record, after `ok` good ones.
    fn first_error(path: &Path, ok: usize) -> String {
        let records = read_all(path);
        assert!(records[..ok].iter().all(Result::is_ok), "{records:?}");
        let e = records.get(ok).unwrap_or_else(|| panic!("no error after {ok} records")).as_ref().unwrap_err().to_string();
        assert_eq!(records.len(), ok + 1, "the reader ends after an error");
        assert!(e.contains(&path.display().to_string()), "{e}");
        e
    }

    /// Byte offsets of each record's length prefix, and the end of the file.
    fn record_offsets(bytes: &[u8]) -> Vec<usize> {
        let header = postcard::to_allocvec(&LogHeader::new("pi05", 2, 3, "unit test")).unwrap();
        let mut at = MAGIC.len() + header.len();
        let mut offsets = vec![];
        while at < bytes.len() {
            offsets.push(at);
            at += 4 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        }
        assert_eq!(at, bytes.len());
        offsets.push(at);
        offsets
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("obs.frtobs");
        let inputs = inputs();
        write_log(&path, &inputs);

        let reader = ObservationLogReader::open(&path).unwrap();
        let h = reader.header().clone();
        assert_eq!((h.version, h.model.as_str(), h.cameras, h.state_dim, h.note.as_str()), (1, "pi05", 2, 3, "unit test"));
        assert!(h.created_unix_s > 1_700_000_000, "{h:?}");
        let records: Vec<RecordedObservation> = reader.map(Result::unwrap).collect();
        assert_eq!(records.len(), 5);
        for (r, rec) in records.iter().enumerate() {
            assert_eq!(rec.time_ns, 20_000_000 * r as u64);
            assert_eq!(rec.prompt, prompt(r), "record {r}: every record carries the prompt in force");
            assert_eq!(rec.state, inputs.states[r]);
            assert_eq!(rec.noise.as_deref(), (r % 3 == 1).then_some(&inputs.noise[..]));
            // Camera 0 without its row padding.
            let rows: Vec<u8> = inputs.rgba[r].chunks(STRIDE).flat_map(|row| &row[..W * 4]).copied().collect();
            let expected = RecordedFrame { width: W as u32, height: H as u32, format: PixelFormat::Rgba8 as u8, data: rows };
            assert_eq!(rec.cameras[0].as_ref(), Some(&expected));
            let bgr = RecordedFrame { width: W as u32, height: H as u32, format: PixelFormat::Bgr8 as u8, data: inputs.bgr[r].clone() };
            assert_eq!(rec.cameras[1], (r != 2).then_some(bgr));
            // As the policy takes it.
            let frames = rec.frames();
            let obs = rec.observation(&frames);
            let f = obs.cameras[0].unwrap();
            assert_eq!((f.width, f.height, f.stride, f.format, f.data), (W, H, W * 4, PixelFormat::Rgba8, &expected.data[..]));
            assert_eq!(obs.cameras[1].is_some(), r != 2);
            assert_eq!((obs.state, obs.noise), (&rec.state[..], rec.noise.as_deref()));
        }
        // Each prompt is stored once: in the first record it is in force for.
        let bytes = std::fs::read(&path).unwrap();
        for p in PROMPTS {
            assert_eq!(bytes.windows(p.len()).filter(|w| *w == p.as_bytes()).count(), 1, "{p}");
        }
    }

    #[test]
    fn truncated_and_corrupt_records_are_named_by_index() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.frtobs");
        write_log(&good, &inputs());
        let bytes = std::fs::read(&good).unwrap();
        let at = record_offsets(&bytes);
        let path = dir.path().join("bad.frtobs");
        let with = |data: &[u8]| std::fs::write(&path, data).unwrap();

        // Cut inside record 2's content, inside its length prefix, and at a record boundary.
        with(&bytes[..at[2] + 4 + 10]);
        let len = u32::from_le_bytes(bytes[at[2]..at[2] + 4].try_into().unwrap());
        assert!(first_error(&path, 2).ends_with(&format!("record 2 is truncated: 10 of {len} bytes")));
        with(&bytes[..at[2] + 2]);
        assert!(first_error(&path, 2).contains("record 2 is truncated: its length prefix has 2 of 4 bytes"));
        with(&bytes[..at[3]]);
        assert_eq!(read_all(&path).len(), 3);

        // A length beyond the limit is refused before anything is read or allocated.
        let mut data = bytes.clone();
        data[at[1]..at[1] + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        with(&data);
        assert!(first_error(&path, 1).contains("record 1 declares 4294967295 bytes, above the limit of 67108864"));
        // A length one short: record 1 decodes short of its content or misreads what follows.
        let mut data = bytes.clone();
        data[at[1]..at[1] + 4].copy_from_slice(&(u32::from_le_bytes(bytes[at[1]..at[1] + 4].try_into().unwrap()) - 1).to_le_bytes());
        with(&data);
        assert!(first_error(&path, 1).contains("record 1"));
        // One byte too many in the record's length: content left over.
        let mut data = bytes[..at[1]].to_vec();
        let record = &bytes[at[1] + 4..at[2]];
        data.extend_from_slice(&(record.len() as u32 + 1).to_le_bytes());
        data.extend_from_slice(record);
        data.push(0);
        with(&data);
        assert!(first_error(&path, 1).contains("record 1 has 1 bytes after its content"));

        // Content that decodes but does not fit: camera 0's width (the byte after the varint time,
        // the prompt's presence and length and text, the camera count and the Some tag).
        let mut data = bytes.clone();
        let first = at[0] + 4;
        let width_at = first + 1 + 1 + 1 + PROMPTS[0].len() + 1 + 1;
        assert_eq!(data[width_at], W as u8);
        data[width_at] = W as u8 + 1;
        with(&data);
        let e = first_error(&path, 0);
        assert!(e.contains("record 0, camera 0: 60 bytes, a 6x3 Rgba8 frame has 72"), "{e}");
        data[width_at] = W as u8;
        data[width_at + 2] = 9; // the format code
        with(&data);
        assert!(first_error(&path, 0).contains("record 0, camera 0: unknown pixel format code 9"));
    }

    #[test]
    fn newer_versions_and_other_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("obs.frtobs");
        let error = |data: &[u8]| {
            std::fs::write(&path, data).unwrap();
            ObservationLogReader::open(&path).err().expect("refused").to_string()
        };
        let mut newer = LogHeader::new("pi05", 2, 3, "");
        newer.version = 2;
        let mut data = MAGIC.to_vec();
        data.extend(postcard::to_allocvec(&newer).unwrap());
        let e = error(&data);
        assert!(e.contains("log version 2 is newer than this build reads (version 1)"), "{e}");
        assert!(e.contains("obs.frtobs"), "{e}");
        assert!(error(b"").contains("not an observation log"));
        assert!(error(b"{\"safetensors\": 1}").contains("not an observation log"));
        assert!(error(&MAGIC).contains("the header cannot be decoded"));
        let missing = dir.path().join("missing.frtobs");
        assert!(matches!(ObservationLogReader::open(&missing), Err(Error::Io { .. })));
        // The writer writes only its own version.
        assert!(ObservationLogWriter::create(&path, newer).is_err());
    }

    #[test]
    fn writer_refuses_observations_that_do_not_fit_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("obs.frtobs");
        let mut log = ObservationLogWriter::create(&path, LogHeader::new("pi05", 2, 3, "")).unwrap();
        let data = vec![0u8; W * H * 3];
        let frame = Frame::packed(&data, W, H, PixelFormat::Rgb8);
        let state = [0.0; 3];
        let e = log.append(&Observation { cameras: &[Some(frame)], state: &state, noise: None }, "a").unwrap_err();
        assert!(e.to_string().contains("observation.cameras: 1 given, the log holds 2"), "{e}");
        let e = log.append(&Observation { cameras: &[Some(frame), None], state: &state[..2], noise: None }, "a").unwrap_err();
        assert!(e.to_string().contains("observation.state"), "{e}");
        let short = Frame::packed(&data[..10], W, H, PixelFormat::Rgb8);
        let e = log.append(&Observation { cameras: &[None, Some(short)], state: &state, noise: None }, "a").unwrap_err();
        assert!(e.to_string().contains("observation.cameras[1]"), "{e}");
        log.append(&Observation { cameras: &[None, Some(frame)], state: &state, noise: None }, "a").unwrap();
        assert_eq!(log.finish().unwrap(), 1);
        assert_eq!(read_all(&path).len(), 1);
    }

    /// The fuzz seed that `fuzz/seeds.py` encodes from the format's description (the module docs)
    /// reads back as written there: the description and the code agree.
    #[test]
    fn a_log_encoded_from_the_format_description_reads_back() {
        let seed = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/checkpoint/slot16-0-replace")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seed.frtobs");
        std::fs::write(&path, &seed[2..]).unwrap();
        let reader = ObservationLogReader::open(&path).unwrap();
        assert_eq!(reader.header(), &LogHeader { created_unix_s: 1_764_000_000, ..LogHeader::new("pi05", 2, 3, "seed") });
        let records: Vec<_> = reader.map(Result::unwrap).collect();
        let summary: Vec<_> = records
            .iter()
            .map(|r| (r.time_ns, r.prompt.as_str(), r.cameras.iter().map(|c| c.as_ref().map(|f| (f.width, f.format))).collect::<Vec<_>>()))
            .collect();
        assert_eq!(
            summary,
            [
                (0, "pick up the cube", vec![Some((4, 0)), Some((2, 2))]),
                (20_000_000, "pick up the cube", vec![Some((4, 1)), None]),
                (40_000_000, "place it", vec![None, Some((1, 0))]),
            ]
        );
        assert_eq!((records[1].state[0], records[1].noise.as_deref()), (0.1, Some(&[0.5; 6][..])));
        assert_eq!(records[0].cameras[1].as_ref().unwrap().data, (0..16).collect::<Vec<u8>>());
    }

    /// A small real log, for the mutation test.
    fn small_log() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("obs.frtobs");
        let mut log = ObservationLogWriter::create(&path, LogHeader::new("pi05", 2, 2, "n")).unwrap();
        let data: Vec<u8> = (0..12).collect();
        for r in 0..3 {
            let frames = [
                Some(Frame::packed(&data, 2, 2, PixelFormat::Rgb8)),
                (r != 1).then(|| Frame::packed(&data[..4], 1, 1, PixelFormat::Rgba8)),
            ];
            let noise = [0.5; 2];
            let obs = Observation { cameras: &frames, state: &[1.0, -1.0], noise: (r == 2).then_some(&noise[..]) };
            log.append(&obs, ["a", "b"][r / 2]).unwrap();
        }
        log.finish().unwrap();
        std::fs::read(&path).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Random byte changes and truncations of a real log never panic the reader: each record
        /// comes back or an error ends the reading.
        #[test]
        fn mutated_logs_never_panic_the_reader(
            changes in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let mut data = small_log();
            for (at, byte) in changes {
                let i = at.index(data.len());
                data[i] = byte;
            }
            if let Some(cut) = cut {
                data.truncate(cut.index(data.len()));
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("obs.frtobs");
            std::fs::write(&path, &data).unwrap();
            if let Ok(reader) = ObservationLogReader::open(&path) {
                for record in reader.take(16) {
                    let Ok(record) = record else { break };
                    let frames = record.frames();
                    let obs = record.observation(&frames);
                    prop_assert_eq!(obs.cameras.len(), 2);
                }
            }
        }
    }
}

//! Safetensors checkpoints: one file, or shards listed by `model.safetensors.index.json`. Tensors
//! are looked up by their checkpoint names with an optional leading `model.` stripped, and
//! converted to f32 on request (f32, bf16 and f16 are accepted, and f64, which lerobot's processor
//! state files hold when dataset statistics were float64).
//!
//! Nothing here panics on a bad file: every failure names the file and the tensor.
//!
//! The files are read with positioned reads (`pread`), not memory-mapped: a file truncated while
//! it is being read then gives a short read, which is an error naming the file and tensor, where
//! a mapping would fault the process with SIGBUS. Conversions do not return that error one by one
//! (they run inside the models' weight folding); the first failed read is kept and
//! [`Checkpoint::reads_ok`] reports it, which `Policy::open` asks before it returns a policy. The
//! backends own every value once they are built, and the files are closed with the checkpoint.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use half::{bf16, f16};
use safetensors::Dtype;
use safetensors::tensor::Metadata;

use crate::error::{Error, Result};

/// Element types the runtime converts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F64,
    BF16,
    F16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// Converts little-endian `bytes` of this type into `out` (one value per element).
    pub fn convert(self, bytes: &[u8], out: &mut [f32]) {
        match self {
            DType::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            DType::F64 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                    *o = f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32;
                }
            }
            DType::BF16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            DType::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
        }
    }
}

/// A tensor of a checkpoint file: its element type and shape, read on request.
#[derive(Clone, Copy)]
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    ckpt: &'a Checkpoint,
    entry: &'a Entry,
}

/// Bytes read per positioned read while converting (a bounded scratch buffer).
const READ_CHUNK: usize = 1 << 20;

impl TensorRef<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size of the raw data in bytes.
    pub fn byte_len(&self) -> usize {
        self.entry.end - self.entry.start
    }

    /// The raw little-endian bytes (zeros where a read failed; see [`Checkpoint::reads_ok`]).
    pub fn read_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![0; self.byte_len()];
        self.read_at(0, &mut bytes);
        bytes
    }

    /// Reads `buf.len()` bytes from byte `offset` of the tensor's data. A short or failed read
    /// (the file changed after its header was read) leaves zeros and is recorded.
    fn read_at(&self, offset: usize, buf: &mut [u8]) {
        let (path, file) = &self.ckpt.files[self.entry.file];
        if let Err(e) = file.read_exact_at(buf, (self.entry.start + offset) as u64) {
            buf.fill(0);
            let _ = self.ckpt.read_failure.set(
                Error::checkpoint(
                    path,
                    format!(
                        "reading tensor {} ({} bytes at byte {}): {e} (was the file truncated or replaced while opening?)",
                        self.name,
                        buf.len(),
                        self.entry.start + offset
                    ),
                )
                .to_string(),
            );
        }
    }

    /// Converts `out.len()` elements starting at element `start` into `out` (f32).
    pub fn read_f32_into(&self, start: usize, out: &mut [f32]) {
        let size = self.dtype.size();
        let mut bytes = vec![0u8; (out.len() * size).min(READ_CHUNK)];
        let per_chunk = bytes.len() / size;
        for (i, part) in out.chunks_mut(per_chunk.max(1)).enumerate() {
            let bytes = &mut bytes[..part.len() * size];
            self.read_at((start + i * per_chunk) * size, bytes);
            self.dtype.convert(bytes, part);
        }
    }

    /// All elements as f32. Large tensors convert on every core: a full-size checkpoint holds
    /// 3.4 G values, and their conversion (with the reads and the page faults of the new
    /// vectors) is the bulk of open's host work.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.numel()];
        let threads = if out.len() < (1 << 22) { 1 } else { std::thread::available_parallelism().map_or(1, |n| n.get()).min(16) };
        if threads == 1 {
            self.read_f32_into(0, &mut out);
            return out;
        }
        let per = out.len().div_ceil(threads);
        std::thread::scope(|s| {
            for (i, chunk) in out.chunks_mut(per).enumerate() {
                s.spawn(move || self.read_f32_into(i * per, chunk));
            }
        });
        out
    }
}

struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    /// Byte range inside the file (header included in the offset).
    start: usize,
    end: usize,
}

/// The directory of a checkpoint path: the path itself, or a file's directory.
pub fn directory_of(path: &Path) -> &Path {
    if path.is_dir() { path } else { path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")) }
}

/// An opened checkpoint: the open files and an index of every tensor by normalized name.
pub struct Checkpoint {
    /// The path the user gave (file or directory), for error messages.
    path: PathBuf,
    files: Vec<(PathBuf, File)>,
    tensors: BTreeMap<String, Entry>,
    /// The first read that failed (see [`Checkpoint::reads_ok`]).
    read_failure: OnceLock<String>,
}

/// lerobot fine-tunes save every key under `model.` (Pi0.5) or `_groot_model.` (GR00T, the
/// policy's attribute); the base checkpoints do not.
fn normalize_name(name: &str) -> &str {
    name.strip_prefix("model.").or_else(|| name.strip_prefix("_groot_model.")).unwrap_or(name)
}

impl Checkpoint {
    /// Opens `path`: a `.safetensors` file, or a directory holding `model.safetensors` or a sharded
    /// `model.safetensors.index.json`.
    pub fn open(path: &Path) -> Result<Self> {
        let meta = std::fs::metadata(path).map_err(|source| Error::Io { path: path.into(), source })?;
        let files: Vec<PathBuf> = if meta.is_dir() {
            let index = path.join("model.safetensors.index.json");
            let single = path.join("model.safetensors");
            if index.exists() {
                shard_files(&index)?
            } else if single.exists() {
                vec![single]
            } else {
                return Err(Error::checkpoint(path, "directory holds neither model.safetensors nor model.safetensors.index.json"));
            }
        } else {
            vec![path.to_path_buf()]
        };

        let mut ckpt = Checkpoint { path: path.to_path_buf(), files: Vec::new(), tensors: BTreeMap::new(), read_failure: OnceLock::new() };
        for file in files {
            ckpt.add_file(file)?;
        }
        Ok(ckpt)
    }

    fn add_file(&mut self, file: PathBuf) -> Result<()> {
        let io = |source| Error::Io { path: file.clone(), source };
        let handle = File::open(&file).map_err(io)?;
        let file_len = handle.metadata().map_err(io)?.len();
        let (header_len, header) = read_header(&handle, file_len).map_err(|why| Error::checkpoint(&file, why))?;
        let data_len = file_len.saturating_sub(8 + header_len as u64);
        let metadata = match serde_json::from_slice::<Metadata>(&header) {
            Ok(m) if m.data_len() as u64 == data_len => m,
            parsed => {
                let why = match (diagnose_offsets(&header, data_len), parsed) {
                    (Some(tensors), _) => format!("tensor data does not fit the file ({file_len} bytes; truncated?): {tensors}"),
                    (None, Err(e)) => format!("not a readable safetensors file: {e}"),
                    (None, Ok(_)) => format!("file size {file_len} does not match the tensor data its header describes (truncated?)"),
                };
                return Err(Error::checkpoint(&file, why));
            }
        };
        let data_start = 8 + header_len;
        let file_index = self.files.len();
        let mut problems = Vec::new();
        for (name, info) in metadata.tensors() {
            let dtype = match info.dtype {
                Dtype::F32 => DType::F32,
                Dtype::F64 => DType::F64,
                Dtype::BF16 => DType::BF16,
                Dtype::F16 => DType::F16,
                other => {
                    problems.push(format!("{name}: unsupported dtype {other:?} (expected F32, F64, BF16 or F16)"));
                    continue;
                }
            };
            let (begin, end) = info.data_offsets;
            let numel: usize = info.shape.iter().product();
            if end - begin != numel * dtype.size() {
                problems.push(format!("{name}: {} bytes for shape {:?} of {dtype:?}", end - begin, info.shape));
                continue;
            }
            if (data_start + end) as u64 > file_len {
                problems.push(format!("{name}: data ends at byte {} but the file has {file_len} bytes (truncated?)", data_start + end));
                continue;
            }
            let key = normalize_name(&name).to_string();
            if self.tensors.contains_key(&key) {
                problems.push(format!("{name}: appears twice"));
                continue;
            }
            self.tensors.insert(
                key,
                Entry { file: file_index, dtype, shape: info.shape.clone(), start: data_start + begin, end: data_start + end },
            );
        }
        if !problems.is_empty() {
            return Err(Error::checkpoint(&file, problems.join("; ")));
        }
        self.files.push((file, handle));
        Ok(())
    }

    /// Whether every read so far returned what the headers promised; else an error naming the
    /// file and tensor of the first that did not (the file shrank or changed after its header was
    /// read). Conversions fill zeros where a read failed, so a caller that converted tensors must
    /// ask this before trusting them.
    pub fn reads_ok(&self) -> Result<()> {
        match self.read_failure.get() {
            None => Ok(()),
            Some(why) => Err(Error::checkpoint(&self.path, why.clone())),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory beside the weights (config.json, statistics, tokenizer): the path itself, or
    /// the parent of a lone `.safetensors` file.
    pub fn dir(&self) -> &Path {
        directory_of(&self.path)
    }

    /// SHA-256 over the weight files and the `.json` / `.safetensors` files beside them
    /// (config, normalization statistics, processor and tokenizer files), each as its file name,
    /// length and bytes, in order; files `skip` names by path and first bytes are left out. What
    /// an FP8 calibration is keyed by, so it is never used for other weights or statistics (a
    /// file rewritten in place included). Reads every byte (about a second per 2 GB).
    pub fn content_sha256(&self, skip: &dyn Fn(&Path, &[u8]) -> bool) -> Result<String> {
        use sha2::{Digest, Sha256};
        fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
            move |source| Error::Io { path: path.to_path_buf(), source }
        }
        let mut files: Vec<PathBuf> = self.files.iter().map(|(path, _)| path.clone()).collect();
        let dir = self.dir();
        let mut sidecars = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            let sidecar = matches!(path.extension().and_then(|e| e.to_str()), Some("json" | "safetensors"));
            if sidecar && path.is_file() && !files.contains(&path) {
                sidecars.push(path);
            }
        }
        sidecars.sort();
        files.extend(sidecars);
        let mut hash = Sha256::new();
        let mut chunk = vec![0u8; 8 << 20];
        for path in &files {
            let file = File::open(path).map_err(io(path))?;
            let len = file.metadata().map_err(io(path))?.len();
            let mut at = 0u64;
            while at < len {
                let part = &mut chunk[..(len - at).min(8 << 20) as usize];
                file.read_exact_at(part, at).map_err(io(path))?;
                if at == 0 && skip(path, part) {
                    break;
                }
                if at == 0 {
                    hash.update(path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
                    hash.update(len.to_le_bytes());
                }
                hash.update(&*part);
                at += part.len() as u64;
            }
        }
        Ok(format!("{:x}", hash.finalize()))
    }

    /// Names of all tensors (with any `model.` prefix removed), sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let (key, entry) = self.tensors.get_key_value(name)?;
        Some(TensorRef { name: key, dtype: entry.dtype, shape: &entry.shape, ckpt: self, entry })
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|e| e.shape.as_slice())
    }

    /// Total bytes of tensor data across all files.
    pub fn data_bytes(&self) -> usize {
        self.tensors.values().map(|e| e.end - e.start).sum()
    }
}

/// Reads the length prefix and the JSON header of a safetensors file of `file_len` bytes.
fn read_header(file: &File, file_len: u64) -> std::result::Result<(usize, Vec<u8>), String> {
    let mut prefix = [0u8; 8];
    file.read_exact_at(&mut prefix, 0).map_err(|e| format!("not a readable safetensors file: no 8-byte header length ({e})"))?;
    let n = u64::from_le_bytes(prefix);
    // The safetensors format's own limit on the header.
    const MAX_HEADER: u64 = 100_000_000;
    if n > MAX_HEADER || n > file_len.saturating_sub(8) {
        return Err(format!("not a readable safetensors file: header length {n} exceeds the file ({file_len} bytes) or {MAX_HEADER}"));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact_at(&mut header, 8).map_err(|e| format!("reading the {n}-byte header: {e}"))?;
    Ok((n as usize, header))
}

/// Names the tensors whose byte ranges are inconsistent with their shape or run past the end of
/// the file's `data_len` data bytes (the safetensors crate reports such errors without the
/// tensor's name).
fn diagnose_offsets(header: &[u8], data_len: u64) -> Option<String> {
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let mut problems = Vec::new();
    for (name, info) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let offsets: Vec<u64> = info.get("data_offsets")?.as_array()?.iter().filter_map(|v| v.as_u64()).collect();
        let numel: u64 = info.get("shape")?.as_array()?.iter().filter_map(|v| v.as_u64()).product();
        let elem = match info.get("dtype")?.as_str()? {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            _ => 1,
        };
        let &[begin, end] = offsets.as_slice() else { continue };
        if end > data_len {
            problems.push(format!("{name}: data ends at byte {end} of a {data_len}-byte data section"));
        } else if end.checked_sub(begin) != Some(numel * elem) {
            problems.push(format!("{name}: byte range {begin}..{end} does not hold {numel} elements of {elem} bytes"));
        }
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

fn shard_files(index: &Path) -> Result<Vec<PathBuf>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let text = std::fs::read_to_string(index).map_err(|source| Error::Io { path: index.into(), source })?;
    let parsed: Index = serde_json::from_str(&text).map_err(|e| Error::checkpoint(index, format!("bad shard index: {e}")))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = parsed.weight_map.values().map(|f| dir.join(f)).collect();
    files.sort();
    files.dedup();
    if files.is_empty() {
        return Err(Error::checkpoint(index, "shard index lists no files"));
    }
    Ok(files)
}

/// Expected tensors of a model: name → shape. The model file fills one of these; `check` compares
/// it with the checkpoint and reports every missing, unexpected and mis-shaped tensor at once.
#[derive(Default)]
pub struct Expected {
    tensors: BTreeMap<String, Vec<usize>>,
    /// Tensors that may be present and are ignored (e.g. the expert's unused `lm_head`).
    ignored: Vec<String>,
}

impl Expected {
    pub fn tensor(&mut self, name: impl Into<String>, shape: &[usize]) {
        self.tensors.insert(name.into(), shape.to_vec());
    }

    /// Expected tensors with their shapes, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &[usize])> {
        self.tensors.iter().map(|(n, s)| (n.as_str(), s.as_slice()))
    }

    pub fn ignore(&mut self, name: impl Into<String>) {
        self.ignored.push(name.into());
    }

    pub fn check(&self, ckpt: &Checkpoint) -> Result<()> {
        let mut problems = Vec::new();
        for (name, shape) in &self.tensors {
            match ckpt.shape(name) {
                None => problems.push(format!("missing tensor {name} (expected shape {shape:?})")),
                Some(found) if found != shape.as_slice() => {
                    problems.push(format!("tensor {name}: expected shape {shape:?}, found {found:?}"))
                }
                Some(_) => {}
            }
        }
        for name in ckpt.names() {
            if !self.tensors.contains_key(name) && !self.ignored.iter().any(|i| i == name) {
                problems.push(format!("unexpected tensor {name}"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::checkpoint(ckpt.path(), format!("{} problem(s): {}", problems.len(), problems.join("; "))))
        }
    }
}

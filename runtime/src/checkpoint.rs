//! Memory-mapped safetensors checkpoints: one file, or shards listed by
//! `model.safetensors.index.json`. Tensors are looked up by their checkpoint names with an optional
//! leading `model.` stripped, and converted to f32 on request (f32, bf16 and f16 are accepted, and
//! f64, which lerobot's processor state files hold when dataset statistics were float64).
//!
//! Nothing here panics on a bad file: every failure names the file and the tensor.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensorError, SafeTensors};

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
}

/// A tensor inside a mapped file: its element type, shape and raw little-endian bytes.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl TensorRef<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Converts `count` elements starting at element `start` into `out` (f32).
    pub fn read_f32_into(&self, start: usize, out: &mut [f32]) {
        let size = self.dtype.size();
        let bytes = &self.bytes[start * size..(start + out.len()) * size];
        match self.dtype {
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

    /// All elements as f32. Large tensors convert on every core: a full-size checkpoint holds
    /// 3.4 G values, and their conversion (with the page faults of the mapping and of the new
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
    /// Byte range inside the mapped file (header included in the offset).
    start: usize,
    end: usize,
}

/// An opened checkpoint: the mapped files and an index of every tensor by normalized name.
pub struct Checkpoint {
    /// The path the user gave (file or directory), for error messages.
    path: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
    tensors: BTreeMap<String, Entry>,
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

        let mut ckpt = Checkpoint { path: path.to_path_buf(), files: Vec::new(), tensors: BTreeMap::new() };
        for file in files {
            ckpt.add_file(file)?;
        }
        Ok(ckpt)
    }

    fn add_file(&mut self, file: PathBuf) -> Result<()> {
        let handle = File::open(&file).map_err(|source| Error::Io { path: file.clone(), source })?;
        // SAFETY: the mapping is read only while `Policy::open` runs: the CPU backend copies every
        // weight out of it and the CUDA backend uploads them, and the mapping is dropped before
        // `open` returns (tests/loading_and_errors.rs rewrites the file under an open policy). A
        // writer that truncates the file during `open` itself can still fault the process
        // (SIGBUS): the README states that contract.
        let map = unsafe { Mmap::map(&handle) }.map_err(|source| Error::Io { path: file.clone(), source })?;
        let (header_len, metadata) = SafeTensors::read_metadata(&map[..]).map_err(|e| {
            let why = match e {
                SafeTensorError::MetadataIncompleteBuffer | SafeTensorError::TensorInvalidInfo => match diagnose_offsets(&map) {
                    Some(tensors) => format!("tensor data does not fit the file ({} bytes; truncated?): {tensors}", map.len()),
                    None => format!("file size {} does not match the tensor data its header describes (truncated?)", map.len()),
                },
                other => format!("not a readable safetensors file: {other}"),
            };
            Error::checkpoint(&file, why)
        })?;
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
            if data_start + end > map.len() {
                problems.push(format!("{name}: data ends at byte {} but the file has {} bytes (truncated?)", data_start + end, map.len()));
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
        self.files.push((file, map));
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory beside the weights (config.json, statistics, tokenizer): the path itself, or
    /// the parent of a lone `.safetensors` file.
    pub fn dir(&self) -> &Path {
        if self.path.is_dir() { &self.path } else { self.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")) }
    }

    /// Names of all tensors (with any `model.` prefix removed), sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let (key, entry) = self.tensors.get_key_value(name)?;
        Some(TensorRef { name: key, dtype: entry.dtype, shape: &entry.shape, bytes: &self.files[entry.file].1[entry.start..entry.end] })
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|e| e.shape.as_slice())
    }

    /// Total bytes of tensor data across all files.
    pub fn data_bytes(&self) -> usize {
        self.tensors.values().map(|e| e.end - e.start).sum()
    }
}

/// Names the tensors whose byte ranges are inconsistent with their shape or run past the end of
/// the file (the safetensors crate reports such errors without the tensor's name).
fn diagnose_offsets(file: &[u8]) -> Option<String> {
    let n = u64::from_le_bytes(file.get(..8)?.try_into().ok()?) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(file.get(8..8usize.checked_add(n)?)?).ok()?;
    let data_len = file.len() - 8 - n;
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
        if end > data_len as u64 {
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

//! Random checkpoint weights for the models' synthesizers: a safetensors file streamed to disk,
//! each tensor from its own reproducible stream, so a full-size checkpoint (7 GB) never has to
//! fit in memory twice.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::Path;

use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RandomDtype {
    F32,
    Bf16,
}

impl RandomDtype {
    fn name_and_size(self) -> (&'static str, usize) {
        match self {
            RandomDtype::F32 => ("F32", 4),
            RandomDtype::Bf16 => ("BF16", 2),
        }
    }
}

/// Writes `tensors` (name, shape) to `path`, each value uniform with the `(mean, std)` that
/// `init(name)` gives; `progress` receives the bytes written so far.
pub fn write_random_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>)],
    dtype: RandomDtype,
    seed: u64,
    init: &dyn Fn(&str) -> (f32, f32),
    progress: &dyn Fn(u64),
) -> Result<()> {
    let io = |source| Error::Io { path: path.into(), source };
    let (dtype_name, elem) = dtype.name_and_size();
    let mut header = BTreeMap::new();
    let mut offset = 0usize;
    for (name, shape) in tensors {
        let bytes = shape.iter().product::<usize>() * elem;
        header.insert(name.clone(), serde_json::json!({"dtype": dtype_name, "shape": shape, "data_offsets": [offset, offset + bytes]}));
        offset += bytes;
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt", "producer": "flashrt synth"}));
    let mut json = serde_json::to_vec(&header).expect("header serializes");
    // The data section starts 8-byte aligned (padding with spaces, as the format allows).
    json.resize(json.len().next_multiple_of(8), b' ');

    let mut file = BufWriter::with_capacity(1 << 22, std::fs::File::create(path).map_err(io)?);
    file.write_all(&(json.len() as u64).to_le_bytes()).map_err(io)?;
    file.write_all(&json).map_err(io)?;
    let mut written = 0u64;
    let mut chunk = Vec::with_capacity(1 << 20);
    for (name, shape) in tensors {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ fxhash(name));
        let (mean, std) = init(name);
        // Uniform on ±√3·std has standard deviation std.
        let half_width = 3f32.sqrt() * std;
        let mut remaining: usize = shape.iter().product();
        while remaining > 0 {
            let n = remaining.min(1 << 18);
            chunk.clear();
            for _ in 0..n {
                let v = mean + half_width * (2.0 * rng.random::<f32>() - 1.0);
                match dtype {
                    RandomDtype::F32 => chunk.extend_from_slice(&v.to_le_bytes()),
                    RandomDtype::Bf16 => chunk.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
                }
            }
            file.write_all(&chunk).map_err(io)?;
            written += chunk.len() as u64;
            progress(written);
            remaining -= n;
        }
    }
    file.flush().map_err(io)
}

/// Stable 64-bit FNV-1a hash of a tensor name: every tensor gets its own reproducible stream.
fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

//! Where each weight of a plan takes its values from: computed at load, or read from the
//! checkpoint when a backend converts it. Models describe their weights this way; backends read
//! them without knowing which model made the plan.

use crate::checkpoint::Checkpoint;

/// Where a weight's values come from.
pub enum WeightData {
    /// Computed at load (folded, merged or precomputed), f32.
    Dense(Vec<f32>),
    /// Read straight from the checkpoint by name (the token embedding: only gathered rows are used).
    Checkpoint(String),
    /// The rows of checkpoint tensors stacked in order (`[Σ n_i, k]`, e.g. merged Q/K/V), each
    /// column scaled by `col_scale` (a folded `(1 + w)` norm weight) when given. Backends read
    /// it from the checkpoint file when they convert it (`read_into`), so the 3.4 G values of a
    /// full-size checkpoint are never all held in host memory as f32.
    Rows { tensors: Vec<String>, col_scale: Option<Vec<f32>> },
}

impl WeightData {
    /// Number of values.
    pub fn len(&self, ckpt: &Checkpoint) -> usize {
        let numel = |name: &String| ckpt.get(name).map_or(0, |t| t.numel());
        match self {
            WeightData::Dense(v) => v.len(),
            WeightData::Checkpoint(name) => numel(name),
            WeightData::Rows { tensors, .. } => tensors.iter().map(numel).sum(),
        }
    }

    /// Values `start .. start + out.len()` as f32.
    pub fn read_into(&self, ckpt: &Checkpoint, start: usize, out: &mut [f32]) {
        let tensor = |name: &str| ckpt.get(name).unwrap_or_else(|| unreachable!("{name} checked at open"));
        match self {
            WeightData::Dense(v) => out.copy_from_slice(&v[start..start + out.len()]),
            WeightData::Checkpoint(name) => tensor(name).read_f32_into(start, out),
            WeightData::Rows { tensors, col_scale } => {
                let (end, mut base) = (start + out.len(), 0);
                for name in tensors {
                    let t = tensor(name);
                    let (lo, hi) = (start.max(base), end.min(base + t.numel()));
                    if lo < hi {
                        t.read_f32_into(lo - base, &mut out[lo - start..hi - start]);
                    }
                    base += t.numel();
                }
                if let Some(scale) = col_scale {
                    for (i, w) in out.iter_mut().enumerate() {
                        *w *= scale[(start + i) % scale.len()];
                    }
                }
            }
        }
    }

    /// All values as f32 (the CPU backend keeps them).
    pub fn into_vec(self, ckpt: &Checkpoint) -> Vec<f32> {
        match self {
            WeightData::Dense(v) => v,
            other => {
                let mut out = vec![0.0; other.len(ckpt)];
                other.read_into(ckpt, 0, &mut out);
                out
            }
        }
    }
}

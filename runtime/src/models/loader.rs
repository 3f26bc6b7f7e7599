//! Reading a checkpoint's tensors while a model builds its plan, counting the bytes for the
//! progress bar. `Config::expected` has been checked first, so every name exists with its shape.

use crate::checkpoint::Checkpoint;
use crate::weights::WeightData;

pub(crate) struct Loader<'a> {
    pub ckpt: &'a Checkpoint,
    pub progress: &'a dyn Fn(usize),
}

impl Loader<'_> {
    /// A tensor's values as f32.
    pub fn get(&self, name: &str) -> Vec<f32> {
        let t = self.ckpt.get(name).unwrap_or_else(|| unreachable!("{name} checked at open"));
        (self.progress)(t.byte_len());
        t.to_f32()
    }

    /// Vectors stacked end to end (merged Q/K/V biases).
    pub fn stacked(&self, names: &[String]) -> Vec<f32> {
        names.iter().flat_map(|n| self.get(n)).collect()
    }

    /// A matrix of checkpoint rows (see [`WeightData::Rows`]), read when a backend converts it.
    pub fn rows(&self, names: &[String], col_scale: Option<Vec<f32>>) -> WeightData {
        for name in names {
            // Counted now: the bytes are read during the backend's upload right after the plan.
            (self.progress)(self.ckpt.get(name).map_or(0, |t| t.byte_len()));
        }
        WeightData::Rows { tensors: names.to_vec(), col_scale }
    }
}

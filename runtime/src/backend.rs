//! What a backend offers the policy: host-visible input and output buffers of the plan, and one
//! call that runs the whole plan. The CPU backend's host buffers are its arena; a GPU backend keeps
//! pinned copies of the plan's `HostIo` buffers and moves them inside its captured graph.

use crate::calibration::ProductProbe;
use crate::error::{Error, Result};
use crate::plan::{BufId, Plan};

/// Which backend executes the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// CUDA when a driver and GPU are present, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

/// Numeric precision of weights and activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// The backend's best: f32 on the CPU, bf16 on CUDA.
    #[default]
    Auto,
    F32,
    Bf16,
    Fp8,
}

pub trait Backend: Send {
    /// Short backend name ("cpu", "cuda").
    fn name(&self) -> &'static str;
    /// The device that runs the plan, e.g. "NVIDIA H200" or the CPU model.
    fn device_name(&self) -> String;
    fn plan(&self) -> &Plan;
    /// Bytes of weights and buffers held (device memory for a GPU backend).
    fn memory_bytes(&self) -> usize;
    /// Host view of an input buffer, written before [`Backend::run`].
    fn input_u8(&mut self, id: BufId) -> &mut [u8];
    fn input_i32(&mut self, id: BufId) -> &mut [i32];
    fn input_f32(&mut self, id: BufId) -> &mut [f32];
    /// Executes every op of the plan. Must not allocate.
    fn run(&mut self) -> Result<()>;
    /// Fault injection, for tests of what follows a device failure: the next [`Backend::run`]
    /// returns an error after starting its work, as a device that fails mid-step does (a GPU
    /// backend launches the step and reports the failure in place of waiting for it).
    fn fail_next_run(&mut self);
    /// Host view of an output buffer after [`Backend::run`].
    fn output_f32(&self, id: BufId) -> &[f32];
    /// How this backend runs the plan, for `explain()`: what it fused or launched differently
    /// from the plan's ops, what fell back and why, and its switches. Lines end with '\n'.
    fn lowering(&self) -> String;
    /// A copy of any f32 buffer by name, for tests and debugging (allocates; may synchronize).
    fn read_buffer(&self, name: &str) -> Option<Vec<f32>>;
    /// Runs the plan as [`Backend::run`] does, stopping after each phase to call `after_phase`
    /// with the phase's name and this backend, whose [`Backend::read_buffer`] then shows what
    /// later phases overwrite (each denoise step's chunk, say). For parity checks and debugging;
    /// may allocate. A backend that runs the plan as one captured graph cannot stop inside it and
    /// returns an error.
    fn run_traced(&mut self, after_phase: &mut dyn FnMut(&str, &dyn Backend)) -> Result<()>;
    /// Installs (`Some`) or removes (`None`) the probe that records each product's input range
    /// and FP8 error while calibrating, returning the one it replaces. Calibration runs on the
    /// CPU backend, in f32; others refuse.
    fn swap_product_probe(&mut self, _probe: Option<ProductProbe>) -> Result<Option<ProductProbe>> {
        Err(Error::Backend(format!("the {} backend cannot calibrate: calibrate on the CPU backend (f32)", self.name())))
    }
}

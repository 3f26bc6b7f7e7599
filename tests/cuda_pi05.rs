//! CUDA backend checks on a GPU machine (DESIGN.md §6; driven by tools/device/checks/cuda_checks.sh):
//!
//! - `every_op_matches_cpu`: each plan op, alone in a small plan with random shapes and inputs,
//!   against the CPU backend's op: normalized MSE `mse(gpu, cpu) / mse(cpu, 0)` ≤ 1e-5 for buffers
//!   the device holds in bf16, ≤ 1e-10 for those it holds in f32;
//! - `tiny_fixture_matches_cpu`: the committed tiny Pi0.5 on CUDA vs the CPU backend (actions) and
//!   lerobot (x₀), cosine ≥ 0.99999 and max-abs ≤ 1e-2, over prompts of different lengths, a
//!   resized frame and a missing camera, replaying the one captured graph;
//! - `real_time_chunking_matches_lerobot`, `groot_real_time_chunking_matches_lerobot`: RTC
//!   inside the graph (Pi0.5's guidance, GR00T's frozen prefix with a velocity ramp) against
//!   lerobot's f32 chunks, with no allocation in the continuing steps;
//! - `groot_embodiment_switch_matches_cpu`: GR00T's embodiment switched inside the one captured
//!   graph (a synthesized tiny checkpoint, two embodiments) against the CPU opened with each, no
//!   allocation, constant device memory;
//! - `prompt_buckets_match_the_whole_prompt`: the graph's prompt buckets (conditional nodes) give
//!   the actions of the whole prompt for prompts ending in every bucket, and only the picked
//!   bucket's prefix rows are recomputed;
//! - `step_allocates_nothing_and_device_memory_is_constant`: ≥ 1000 steps with changing inputs,
//!   zero heap allocations (counting allocator) and unchanged device memory;
//! - `a_device_fault_marks_the_policy_unusable_and_a_new_one_works`: an injected failure of a
//!   step's synchronization faults the policy (every later call refused at once), drop waits for
//!   the in-flight graph and frees its memory, and a new policy in the same process steps as before;
//! - `full_size_matches_lerobot`: with `FRT_FULL_PARITY_DIR` (made by tools/device/
//!   full_parity.py): a random full-size checkpoint vs lerobot 0.6.1 f32 on the same weights and
//!   inputs, cosine ≥ 0.99999 and relative L2 ≤ 5e-3, and a control copy with one weight 2 %
//!   off that must fail those bounds.
//!
//! Every test is `#[ignore]`d, so that `cargo test` on a machine without a GPU lists them as
//! ignored instead of passing them unrun. tools/device/checks/cuda_checks.sh runs them with
//! `--include-ignored` and fails unless each test it asked for reports `ok`; a test run without a
//! usable GPU (or, for the full-size check, without `FRT_FULL_PARITY_DIR`) fails. With
//! `FRT_RESULTS_DIR` set, each test writes its numbers there as JSON.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flashrt::backend::Backend;
use flashrt::calibration::{self, CalibrationSettings};
use flashrt::checkpoint::Checkpoint;
use flashrt::cpu::CpuBackend;
use flashrt::cuda::{CudaBackend, CudaOptions, Switches};
use flashrt::fp8::{self, ProductScales};
use flashrt::image::{Frame, PixelFormat};
use flashrt::plan::{Activation, BufId, BufType, HostIo, Op, Plan, RopeAxes, View, WeightId, WeightRole};
use flashrt::weights::WeightData;
use flashrt::{BackendKind, Continuation, Observation, Policy, PolicyConfig, Precision, RtcConfig, RtcSchedule};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use safetensors::SafeTensors;
use serde_json::json;

// ---- counting allocator (armed only around the measured steps) --------------------------------

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
#[path = "support/tolerance.rs"]
mod tolerance;

use tolerance::{
    CUDA_BUCKET_MAX_ABS, CUDA_FP8_TINY_COSINE, CUDA_FULL_COSINE, CUDA_FULL_REL_L2, CUDA_GROOT_FULL_COSINE, CUDA_GROOT_FULL_REL_L2,
    CUDA_GROOT_SWITCH_COSINE, CUDA_GROOT_SWITCH_REL_L2, CUDA_GROOT_TINY_COSINE, CUDA_GROOT_TINY_MAX_ABS, CUDA_TINY_COSINE,
    CUDA_TINY_MAX_ABS, OP_NMSE_BF16, OP_NMSE_F32, OP_NMSE_FP8_FAST_ACCUMULATION, OP_NMSE_FP8_REQUANTIZED,
    OP_NMSE_FP8_REQUANTIZED_FAST_ACCUMULATION, cosine, max_abs, nmse, rel_l2,
};

// ---- helpers ----------------------------------------------------------------------------------

/// Fails the test (it was asked for explicitly) when no CUDA device is usable.
fn require_gpu(test: &str) {
    match flashrt::cuda::probe(0) {
        Ok(name) => eprintln!("{test}: on {name}"),
        Err(why) => panic!("{test} needs a CUDA GPU: {why}"),
    }
}

fn write_result(file: &str, value: serde_json::Value) {
    if let Some(dir) = std::env::var_os("FRT_RESULTS_DIR") {
        let path = Path::new(&dir).join(file);
        std::fs::write(&path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
        eprintln!("wrote {}", path.display());
    }
}

/// The commit the binary was built from: FRT_COMMIT (tools/device/checks/cuda_checks.sh sets it from
/// the carried COMMIT file, since the GPU machine's copy of the tree may carry a stale .git),
/// else the checkout's HEAD.
fn commit() -> String {
    std::env::var("FRT_COMMIT")
        .ok()
        .or_else(|| {
            std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn fixture_dir() -> PathBuf {
    std::env::var_os("FRT_FIXTURE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pi05_tiny"))
}

// ---- (b) every op against the CPU op ----------------------------------------------------------

/// A small plan under construction: host inputs with their data, weights, and the buffers to
/// compare after one run.
struct Case {
    name: String,
    plan: Plan,
    weights: Vec<Vec<f32>>,
    /// Weight indices backed by the checkpoint tensor `embed` (the others are dense).
    embedding: Option<usize>,
    inputs: Vec<(BufId, Input)>,
    compare: Vec<String>,
    /// Lines the CUDA backend's lowering report must contain (the paths under test were taken).
    lowering_says: Vec<String>,
    /// Words it must not contain (a fallback under test was not taken).
    lowering_lacks: Vec<String>,
    rng: ChaCha8Rng,
}

enum Input {
    F32(Vec<f32>),
    I32(Vec<i32>),
    U8(Vec<u8>),
}

impl Case {
    fn new(name: String, seed: u64) -> Case {
        Case {
            name,
            plan: Plan::default(),
            weights: Vec::new(),
            embedding: None,
            inputs: Vec::new(),
            compare: Vec::new(),
            lowering_says: Vec::new(),
            lowering_lacks: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Random values that bf16 represents exactly: the GPU's bf16 copy of an input or weight
    /// then equals the CPU's f32 value, so each comparison measures the op, not input rounding.
    fn normal(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| StandardNormal.sample(&mut self.rng)).map(|v: f32| half::bf16::from_f32(v * std).to_f32()).collect()
    }

    /// A host-written f32 input copied into an internal buffer (whose element type the backend
    /// then chooses from its uses, as in the real plan).
    fn input(&mut self, name: &str, rows: usize, cols: usize) -> View {
        let data = self.normal(rows * cols, 1.0);
        self.input_of(name, rows, cols, data)
    }

    /// [`Case::input`] holding `data`.
    fn input_of(&mut self, name: &str, rows: usize, cols: usize, data: Vec<f32>) -> View {
        let host = self.plan.host_buffer(format!("{name}.host"), BufType::F32, rows * cols, HostIo::Input);
        self.inputs.push((host, Input::F32(data)));
        let src = View { buf: host, offset: 0, rows, cols, stride: cols };
        let dst = self.plan.matrix(name, rows, cols);
        self.plan.push(Op::Copy { src, dst });
        dst
    }

    fn host_i32(&mut self, name: &str, data: Vec<i32>) -> BufId {
        let id = self.plan.host_buffer(name, BufType::I32, data.len(), HostIo::Input);
        self.inputs.push((id, Input::I32(data)));
        id
    }

    fn matrix_weight(&mut self, n: usize, k: usize) -> WeightId {
        let data = self.normal(n * k, 1.0 / (k as f32).sqrt());
        self.weights.push(data);
        self.plan.weight(format!("w{}", self.weights.len()), WeightRole::Matrix { n, k })
    }

    fn vector_weight(&mut self, data: Vec<f32>) -> WeightId {
        self.weights.push(data);
        self.plan.weight(format!("v{}", self.weights.len()), WeightRole::Vector)
    }

    /// A GEMM reading `a`, which makes the backend keep `a` in bf16 as in the real plan.
    fn consume(&mut self, a: View) {
        let w = self.matrix_weight(8, a.cols);
        let out = self.plan.matrix(format!("{}.consumer", self.name(a.buf)), a.rows, 8);
        self.plan.push(Op::Gemm { a, w, bias: None, out, accumulate: false });
        self.compare.push(self.name(out.buf));
    }

    fn name(&self, id: BufId) -> String {
        self.plan.buffers[id.0].name.clone()
    }

    fn check(&mut self, v: View) {
        self.compare.push(self.name(v.buf));
    }

    /// The FP8 scales of the case's weights, as a calibration records them: each weight in
    /// `calibrated` with its input's largest magnitude, its own scale from its values; the rest
    /// `None` (bf16).
    fn fp8_scales(&self, calibrated: &[(WeightId, f32)]) -> Vec<Option<ProductScales>> {
        let mut scales = vec![None; self.plan.weights.len()];
        for &(w, activation_amax) in calibrated {
            let weight = fp8::scale_for(fp8::amax(&self.weights[w.0]));
            scales[w.0] = Some(ProductScales { activation: fp8::scale_for(activation_amax), weight, output: None });
        }
        scales
    }

    fn weight_data(&self) -> Vec<WeightData> {
        (0..self.weights.len())
            .map(|i| {
                if self.embedding == Some(i) { WeightData::Checkpoint("embed".into()) } else { WeightData::Dense(self.weights[i].clone()) }
            })
            .collect()
    }

    fn feed_and_run(&self, backend: &mut dyn Backend) {
        for (id, data) in &self.inputs {
            match data {
                Input::F32(v) => backend.input_f32(*id).copy_from_slice(v),
                Input::I32(v) => backend.input_i32(*id).copy_from_slice(v),
                Input::U8(v) => backend.input_u8(*id).copy_from_slice(v),
            }
        }
        backend.run().unwrap();
    }

    /// The CPU's f32 values of buffer `name` after one run.
    fn cpu_values(&self, ckpt: &Arc<Checkpoint>, name: &str) -> Vec<f32> {
        let mut cpu = CpuBackend::new(self.plan.clone(), self.weight_data(), ckpt, 1).expect("CPU backend");
        self.feed_and_run(&mut cpu);
        cpu.read_buffer(name).unwrap()
    }

    /// Runs the plan on both backends; returns (buffer, nmse, bound of its tier) per compared
    /// buffer. `fp8` (by weight id) runs those products in FP8 on the GPU, whatever their rows,
    /// and, with `cpu_emulates_fp8`, in the CPU's FP8 emulation.
    fn run(&self, ckpt: &Arc<Checkpoint>, fp8: &[Option<ProductScales>], cpu_emulates_fp8: bool) -> Vec<(String, f64, f64)> {
        self.run_with(ckpt, fp8, cpu_emulates_fp8, Switches::default())
    }

    /// [`Case::run`] with the CUDA backend's `switches`.
    fn run_with(
        &self,
        ckpt: &Arc<Checkpoint>,
        fp8: &[Option<ProductScales>],
        cpu_emulates_fp8: bool,
        switches: Switches,
    ) -> Vec<(String, f64, f64)> {
        let cpu = CpuBackend::new(self.plan.clone(), self.weight_data(), ckpt, 1).expect("CPU backend");
        let mut cpu: Box<dyn Backend> = if cpu_emulates_fp8 { Box::new(cpu.with_fp8(fp8)) } else { Box::new(cpu) };
        let options = CudaOptions { fp8_scales: fp8.to_vec(), fp8_min_rows: Some(1), switches, ..CudaOptions::default() };
        let gpu = CudaBackend::new(self.plan.clone(), self.weight_data(), ckpt.clone(), &options);
        let gpu = gpu.unwrap_or_else(|e| panic!("{}: CUDA backend: {e}", self.name));
        for line in &self.lowering_says {
            assert!(gpu.lowering().contains(line.as_str()), "{}: the lowering does not say {line:?}:\n{}", self.name, gpu.lowering());
        }
        for word in &self.lowering_lacks {
            assert!(!gpu.lowering().contains(word.as_str()), "{}: the lowering says {word:?}:\n{}", self.name, gpu.lowering());
        }
        // A buffer is an f32 path when the device holds it in f32 and every op writing it reads
        // only f32 paths (host inputs, weights, i32/u8 buffers included) and is not a product:
        // GEMMs and attention multiply bf16 operands on the tensor cores (an f32 `a` is converted
        // first). Everything else is held to the bf16 tier.
        let mut f32_path: Vec<bool> = self.plan.buffers.iter().map(|b| !gpu.holds_bf16(&b.name).unwrap()).collect();
        for op in &self.plan.ops {
            let access = op.accesses(&self.plan.buffers);
            let f32_op = !matches!(op, Op::Gemm { .. } | Op::Attention { .. }) && access.reads.iter().all(|r| f32_path[r.buf.0]);
            for w in &access.writes {
                f32_path[w.buf.0] &= f32_op;
            }
        }
        let bounds: Vec<f64> = self
            .compare
            .iter()
            .map(|name| if f32_path[self.plan.find_buffer(name).expect("compared buffer").0] { OP_NMSE_F32 } else { OP_NMSE_BF16 })
            .collect();
        let mut gpu: Box<dyn Backend> = Box::new(gpu);
        self.feed_and_run(&mut *cpu);
        self.feed_and_run(&mut *gpu);
        self.compare
            .iter()
            .zip(bounds)
            .map(|(name, bound)| {
                let (want, got) = (cpu.read_buffer(name).unwrap(), gpu.read_buffer(name).unwrap());
                assert!(got.iter().all(|v| v.is_finite()), "{}: {name} has non-finite values", self.name);
                // An all-zero reference would make the comparison vacuous (nothing ran).
                assert!(want.iter().any(|&v| v != 0.0), "{}: the CPU reference of {name} is all zeros", self.name);
                (name.clone(), nmse(&got, &want), bound)
            })
            .collect()
    }
}

/// `a` (`m × k`) times one `n × k` weight with bias three ways: into an f32 residual that
/// accumulates, into a bf16 output (kept bf16 by its consumer), and into a bf16 output with the
/// tanh GELU over it (SigLIP's fc1: cuBLASLt's GELU epilogue on CUDA). Returns the weight and the
/// residual.
fn push_gemm_products(c: &mut Case, m: usize, k: usize, n: usize) -> (WeightId, View) {
    let a = c.input("a", m, k);
    let w = c.matrix_weight(n, k);
    let bias_data = c.normal(n, 0.5);
    let bias = c.vector_weight(bias_data);
    let acc = c.input("acc", m, n);
    c.plan.push(Op::Gemm { a, w, bias: Some(bias), out: acc, accumulate: true });
    c.check(acc);
    let out = c.plan.matrix("out", m, n);
    c.plan.push(Op::Gemm { a, w, bias: Some(bias), out, accumulate: false });
    c.check(out);
    c.consume(out);
    let act = c.plan.matrix("act", m, n);
    c.plan.push(Op::Gemm { a, w, bias: Some(bias), out: act, accumulate: false });
    c.plan.push(Op::Activation { x: act, kind: Activation::GeluTanh });
    c.check(act);
    c.consume(act);
    (w, acc)
}

fn gemm_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (m, k, n) = (c.rng.random_range(1..300), c.rng.random_range(1..160) * 4, c.rng.random_range(1..100) * 8);
    c.name = format!("gemm (+ gelu) {m}x{k}x{n}");
    push_gemm_products(&mut c, m, k, n);
    c
}

/// The products of [`push_gemm_products`] and one reading the f32 residual, in FP8: N and K
/// multiples of 16, each product's scales from its weight's and input's ranges (the f32 input's
/// with room to grow).
fn fp8_gemm_case(seed: u64) -> (Case, Vec<Option<ProductScales>>) {
    let mut c = Case::new(String::new(), seed);
    let (m, k, n) = (c.rng.random_range(1..300), c.rng.random_range(1..40) * 16, c.rng.random_range(1..50) * 16);
    c.name = format!("fp8 gemm (+ gelu, f32 input) {m}x{k}x{n}");
    let (w, acc) = push_gemm_products(&mut c, m, k, n);
    let w_residual = c.matrix_weight(16, n);
    let out = c.plan.matrix("from_residual", m, 16);
    c.plan.push(Op::Gemm { a: acc, w: w_residual, bias: None, out, accumulate: false });
    c.check(out);
    let amax = |c: &Case, id: BufId| match &c.inputs.iter().find(|(b, _)| *b == id).unwrap().1 {
        Input::F32(v) => fp8::amax(v),
        _ => unreachable!("f32 inputs"),
    };
    let host = |name: &str| c.plan.find_buffer(&format!("{name}.host")).unwrap();
    let scales = c.fp8_scales(&[(w, amax(&c, host("a"))), (w_residual, 4.0 * amax(&c, host("acc")))]);
    (c, scales)
}

/// The device's e4m3 quantization code for code: the 5,017 inputs of PyTorch's table
/// (tests/data/fp8/e4m3_torch.safetensors: ties, their neighbours, subnormals, values past
/// ±448), read in f32, through an FP8 product with the weight 448 · I and unit scales into an f32
/// residual of zeros, whose output is then exactly 448 times each input's decoded code (the CPU
/// emulation's codes are PyTorch's, `fp8::tests`).
fn fp8_codes_case() -> (Case, Vec<Option<ProductScales>>) {
    const K: usize = 64;
    let table = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/fp8/e4m3_torch.safetensors")).unwrap();
    let table = SafeTensors::deserialize(&table).unwrap();
    let mut inputs: Vec<f32> = table
        .tensor("inputs")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .map(|x| if x.is_nan() { 0.0 } else { x })
        .collect();
    let rows = inputs.len().div_ceil(K);
    inputs.resize(rows * K, 0.0);
    let mut c = Case::new(format!("fp8 codes: {} inputs of PyTorch's e4m3 table", rows * K), 0);
    let host = c.plan.host_buffer("x.host", BufType::F32, rows * K, HostIo::Input);
    c.inputs.push((host, Input::F32(inputs)));
    let x = View { buf: host, offset: 0, rows, cols: K, stride: K };
    // 448 · I: its range maps onto e4m3's with scale 1, as the CPU emulation derives it.
    c.weights.push((0..K * K).map(|i| if i / K == i % K { fp8::E4M3_MAX } else { 0.0 }).collect());
    let identity = c.plan.weight("identity", WeightRole::Matrix { n: K, k: K });
    let out = c.input_of("out", rows, K, vec![0.0; rows * K]);
    c.plan.push(Op::Gemm { a: x, w: identity, bias: None, out, accumulate: true });
    c.check(out);
    (c, vec![Some(ProductScales { activation: 1.0, weight: 1.0, output: None })])
}

fn norm_case(seed: u64, kind: usize) -> Case {
    let mut c = Case::new(String::new(), seed);
    // Seed 1 takes rows that are not whole 16-byte pieces (the kernels' strided form).
    let (rows, cols) = (c.rng.random_range(1..200), c.rng.random_range(1..80) * 8 - 3 * (seed == 1) as usize);
    let x = c.input("x", rows, cols);
    for bf16_out in [false, true] {
        let out = c.plan.matrix(format!("out{}", bf16_out as u8), rows, cols);
        match kind {
            0 => {
                let (g, b) = (c.normal(cols, 0.2).iter().map(|v| 1.0 + v).collect(), c.normal(cols, 0.2));
                let affine = Some((c.vector_weight(g), c.vector_weight(b)));
                c.plan.push(Op::LayerNorm { x, out, affine, modulation: None, eps: 1e-6 });
            }
            1 => c.plan.push(Op::RmsNorm { x, out, weight: None, eps: 1e-6 }),
            2 => {
                let m = c.normal(3 * cols, 0.3);
                let modulation = c.vector_weight(m);
                c.plan.push(Op::AdaRmsNorm { x, out, modulation, eps: 1e-6 });
            }
            // The general forms: LayerNorm without affine weights and with an AdaLN modulation,
            // RMSNorm with a weight.
            3 => {
                let m = c.normal(2 * cols, 0.3);
                let modulation = Some(c.vector_weight(m));
                c.plan.push(Op::LayerNorm { x, out, affine: None, modulation, eps: 1e-6 });
            }
            4 => {
                let w = c.normal(cols, 0.2).iter().map(|v| 1.0 + v).collect();
                let weight = Some(c.vector_weight(w));
                c.plan.push(Op::RmsNorm { x, out, weight, eps: 1e-6 });
            }
            // Per-head RMSNorm (Qwen3's q/k norm) over the row as `heads` slices, one shared weight.
            _ => {
                let heads = [1, 2, 4, 8].into_iter().rev().find(|h| cols % h == 0).unwrap();
                let w = c.normal(cols / heads, 0.2).iter().map(|v| 1.0 + v).collect();
                let weight = c.vector_weight(w);
                c.plan.push(Op::HeadRmsNorm { x, out, heads, weight, eps: 1e-6 });
            }
        }
        c.check(out);
        if bf16_out {
            c.consume(out);
        }
    }
    c.name = format!(
        "{} {rows}x{cols}",
        ["layer_norm", "rms_norm", "ada_rms_norm", "layer_norm (adaptive, no affine)", "rms_norm (weighted)", "head_rms_norm"][kind]
    );
    c
}

/// Gated residual alone (y f32), and fused with the next adaRMS norm (y bf16), as the expert does.
fn residual_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (rows, cols) = (c.rng.random_range(1..100), c.rng.random_range(1..80) * 8 - 3 * (seed == 1) as usize);
    c.name = format!("gated_residual(+ada_rms_norm) {rows}x{cols}");
    let x = c.input("x", rows, cols);
    let y = c.input("y", rows, cols);
    let m1 = c.normal(3 * cols, 0.5);
    let gate = c.vector_weight(m1);
    c.plan.push(Op::GatedResidual { x, y, modulation: gate });
    let y2 = c.input("y2", rows, cols);
    c.consume(y2);
    let m2 = c.normal(3 * cols, 0.5);
    let (gate2, norm) = (c.vector_weight(m2.clone()), c.vector_weight(m2));
    c.plan.push(Op::GatedResidual { x, y: y2, modulation: gate2 });
    let out = c.plan.matrix("h", rows, cols);
    c.plan.push(Op::AdaRmsNorm { x, out, modulation: norm, eps: 1e-6 });
    c.consume(out);
    c.check(x);
    c.check(out);
    c
}

/// The denoise loop's step boundary (bench/NOTES.md item 66): a product over a narrow f32 input
/// and the adaRMS norm of its rows (the action-in product), then the gated residual, the final
/// norm and a narrow product accumulated into that input (the action-out product with the Euler
/// update). CUDA fuses each end into one row kernel where the shapes allow; seed 1's rows are not
/// whole 16-byte pieces, which keeps the ops unfused.
fn step_boundary_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let rows = c.rng.random_range(1..60);
    let cols = c.rng.random_range(1..128) * 8 - 3 * (seed == 1) as usize;
    // 32 (Pi0.5's action width): both ends fused; 24 fuses only the end (the start's kernel
    // takes inputs of exactly 32 columns).
    let narrow = if seed == 2 { 24 } else { 32 };
    c.name = format!("step boundary {rows}x{cols} over {narrow} columns");
    let xt = c.input("xt", rows, narrow);
    let (w_in, w_out) = (c.matrix_weight(cols, narrow), c.matrix_weight(narrow, cols));
    let (b_in, b_out) = (c.normal(cols, 0.5), c.normal(narrow, 0.5));
    let (b_in, b_out) = (c.vector_weight(b_in), c.vector_weight(b_out));
    let [m_in, m_gate, m_final] = [0; 3].map(|_| {
        let m = c.normal(3 * cols, 0.3);
        c.vector_weight(m)
    });
    let (x, h, h2) = (c.plan.matrix("x", rows, cols), c.plan.matrix("h", rows, cols), c.plan.matrix("h2", rows, cols));
    c.plan.push(Op::Gemm { a: xt, w: w_in, bias: Some(b_in), out: x, accumulate: false });
    c.plan.push(Op::AdaRmsNorm { x, out: h, modulation: m_in, eps: 1e-6 });
    c.consume(h);
    // The layers' stand-in: a bf16 branch added through the gate.
    let y = c.input("y", rows, cols);
    c.consume(y);
    c.plan.push(Op::GatedResidual { x, y, modulation: m_gate });
    c.plan.push(Op::AdaRmsNorm { x, out: h2, modulation: m_final, eps: 1e-6 });
    c.plan.push(Op::Gemm { a: h2, w: w_out, bias: Some(b_out), out: xt, accumulate: true });
    for v in [x, h, h2, xt] {
        c.check(v);
    }
    c
}

fn elementwise_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (rows, f) = (c.rng.random_range(1..120), c.rng.random_range(1..100) * 4);
    c.name = format!("activations (each alone and gated) / add_table / affine {rows}x{f}");
    for kind in Activation::ALL {
        let x = c.input(&format!("x.{}", kind.name()), rows, f);
        c.plan.push(Op::Activation { x, kind });
        c.check(x);
        let gate_up = c.input(&format!("gate_up.{}", kind.name()), rows, 2 * f);
        let out = c.plan.matrix(kind.gated_name(), rows, f);
        c.plan.push(Op::GatedActivation { gate_up, out, kind });
        c.check(out);
        c.consume(out);
    }
    let table_rows = c.rng.random_range(1..=rows);
    let t = c.normal(table_rows * f, 1.0);
    let table = c.vector_weight(t);
    let r = c.input("r", rows, f);
    c.plan.push(Op::AddTable { x: r, table, table_rows });
    c.check(r);
    let cols = c.rng.random_range(1..=f);
    let (s, o) = (c.normal(cols, 1.0), c.normal(cols, 1.0));
    let (scale, offset) = (c.vector_weight(s), c.vector_weight(o));
    let actions = c.plan.host_buffer("actions", BufType::F32, rows * cols, HostIo::Output);
    c.plan.push(Op::Affine { x: r.cols(0, cols), scale, offset, out: View { buf: actions, offset: 0, rows, cols, stride: cols } });
    c.compare.push("actions".into());
    c
}

/// Real-time chunking's guided Euler step: x, dt·v and the previous chunk in f32, row weights and
/// a shift as host inputs (rows past the previous chunk's end and columns past the prefix read 0).
fn rtc_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (rows, cols) = (c.rng.random_range(2..80), c.rng.random_range(1..40));
    let prefix = c.rng.random_range(1..=cols);
    let shift = c.rng.random_range(0..rows) as i32;
    c.name = format!("rtc_guide {rows}x{cols}, prefix {prefix} columns, shift {shift}");
    let x = c.input("x", rows, cols);
    let step = c.input("step", rows, cols);
    let prev = c.input("prev", rows, cols);
    let weights = c.plan.host_buffer("weights", BufType::F32, rows, HostIo::Input);
    let w: Vec<f32> = (0..rows).map(|r| if r % 3 == 2 { 0.0 } else { c.rng.random_range(0.0..1.0) }).collect();
    c.inputs.push((weights, Input::F32(w)));
    let shift = c.host_i32("shift", vec![shift]);
    let t = c.rng.random_range(0.1..1.0);
    c.plan.push(Op::RtcGuide {
        x,
        step,
        prev,
        weights,
        shift,
        cols: prefix,
        t,
        dt: -0.1,
        guidance: flashrt::rtc::guidance_weight(t, 10.0),
    });
    c.check(x);
    c
}

/// GR00T's real-time chunking: rows of the previous chunk into the first rows of x (its first
/// columns, 0 in the others), then an Euler step with a velocity strength per row, all f32; the
/// prefix rows and the strengths are host inputs.
fn groot_rtc_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (rows, width) = (c.rng.random_range(2..60), c.rng.random_range(1..140));
    let cols = c.rng.random_range(1..=width);
    let taken = c.rng.random_range(1..=rows);
    let first = c.rng.random_range(0..=rows - taken);
    c.name = format!("rtc_prefix + rtc_euler {rows}x{width}, rows {first}.. x{taken}, {cols} columns");
    let x = c.input("x", rows, width);
    let prev = c.input("prev", rows, width);
    let step = c.input("step", rows, width);
    let prefix = c.host_i32("prefix", vec![first as i32, taken as i32]);
    let strength = c.plan.host_buffer("strength", BufType::F32, rows, HostIo::Input);
    let s: Vec<f32> = (0..rows)
        .map(|r| {
            if r < taken / 2 {
                0.0
            } else if r >= taken {
                1.0
            } else {
                c.rng.random_range(0.0..1.0)
            }
        })
        .collect();
    c.inputs.push((strength, Input::F32(s)));
    c.plan.push(Op::RtcPrefix { x, prev, prefix, cols });
    c.plan.push(Op::RtcEuler { x, step, strength });
    c.check(x);
    c
}

/// The expert's MLP: gate/up product, GeGLU, down product (f32 out, as the residual reads it).
/// On sm_90a the CUDA backend runs it as one streamed launch (`mlp_stream_wgmma`); seed 2 takes
/// Pi0.5's own shape and input.
fn mlp_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (rows, width, hidden) = if seed == 2 {
        (50, 1024, 4096)
    } else {
        (c.rng.random_range(1..=64), 64 * c.rng.random_range(1..=16), 64 * c.rng.random_range(1..=32))
    };
    // A from a copy, from an RMS norm and, Pi0.5's seed 2, from the gated residual with the
    // adaRMS norm after it (as in the expert, whose norms the backend fuses with the residual).
    let sources = ["copy", "rms_norm", "gated_residual + ada_rms_norm"];
    c.name = format!("mlp (gate/up, gelu_tanh_mul, down) {rows}x{width}, hidden {hidden}, a from {}", sources[seed as usize % 3]);
    let a = match seed % 3 {
        0 => c.input("a", rows, width),
        1 => {
            let (x, a) = (c.input("x", rows, width), c.plan.matrix("a", rows, width));
            c.plan.push(Op::RmsNorm { x, out: a, weight: None, eps: 1e-6 });
            c.check(a);
            a
        }
        _ => {
            let (x, y, a) = (c.input("x", rows, width), c.input("y", rows, width), c.plan.matrix("a", rows, width));
            let (m1, m2) = (c.normal(3 * width, 0.5), c.normal(3 * width, 0.5));
            let (gate, norm) = (c.vector_weight(m1), c.vector_weight(m2));
            c.plan.push(Op::GatedResidual { x, y, modulation: gate });
            c.plan.push(Op::AdaRmsNorm { x, out: a, modulation: norm, eps: 1e-6 });
            c.check(a);
            a
        }
    };
    let (_, h) = push_mlp(&mut c, a, hidden);
    c.check(h);
    c
}

/// Gate/up, GeGLU and down over `a` (the form the backend streams): the output `out` compared;
/// returns the two weights and the GeGLU output.
fn push_mlp(c: &mut Case, a: View, hidden: usize) -> ([WeightId; 2], View) {
    let (rows, width) = (a.rows, a.cols);
    let (w_gate_up, w_down) = (c.matrix_weight(2 * hidden, width), c.matrix_weight(width, hidden));
    let (gate_up, h, out) =
        (c.plan.matrix("gate_up", rows, 2 * hidden), c.plan.matrix("hidden", rows, hidden), c.plan.matrix("out", rows, width));
    c.plan.push(Op::Gemm { a, w: w_gate_up, bias: None, out: gate_up, accumulate: false });
    c.plan.push(Op::GatedActivation { gate_up, out: h, kind: Activation::GeluTanh });
    c.plan.push(Op::Gemm { a: h, w: w_down, bias: None, out, accumulate: false });
    c.check(out);
    ([w_gate_up, w_down], h)
}

/// [`push_products`] in FP8 at the expert's QKV (seed 0: 50 rows, 1024 deep, 2560 wide) and
/// output projection (seed 1: 2048 deep, 1024 wide) shapes, or a random one in whole 128-column
/// chunks; scales from the ranges.
fn fp8_product_case(seed: u64) -> (Case, Vec<Option<ProductScales>>) {
    let mut c = Case::new(String::new(), seed);
    let (rows, k, n) = match seed {
        0 => (50, 1024, 2560),
        1 => (50, 2048, 1024),
        _ => (c.rng.random_range(1..=64), 128 * c.rng.random_range(1..=8), 64 * c.rng.random_range(1..=40)),
    };
    c.name = format!("fp8 few-row products {rows}x{k}x{n}");
    let a = c.input("a", rows, k);
    let a_amax = match &c.inputs[0].1 {
        Input::F32(v) => fp8::amax(v),
        _ => unreachable!("f32 input"),
    };
    let weights = push_products(&mut c, a, n);
    let scales = c.fp8_scales(&weights.map(|w| (w, a_amax)));
    (c, scales)
}

/// The streamed MLP in FP8 (sm_90a's e4m3 form of `mlp_stream`): seed 0 Pi0.5's expert shape
/// after its gated residual norm (which writes the input in e4m3), with a cuBLASLt FP8 product
/// of its down weight beside it (as the first denoise step's), others random in whole
/// 128-column chunks with the input quantized as it loads (an input, bf16-exact, so the device's
/// bf16 copy of it quantizes as the emulation's f32 does); each product's input scale from its input's range on
/// the CPU (gate/up: A; down: the GeGLU output), as the calibration takes them. The GeGLU output
/// holds e4m3 codes on the device, so only `out` is compared.
fn fp8_mlp_case(seed: u64, ckpt: &Arc<Checkpoint>) -> (Case, Vec<Option<ProductScales>>) {
    let mut c = Case::new(String::new(), seed);
    let (rows, width, hidden) = if seed == 0 {
        (50, 1024, 4096)
    } else {
        (c.rng.random_range(1..=64), 128 * c.rng.random_range(1..=16), 128 * c.rng.random_range(1..=32))
    };
    c.name = format!("fp8 streamed mlp {rows}x{width}, hidden {hidden}");
    let a = if seed == 0 {
        c.lowering_says.push("0 streamed QKV product and 1 streamed MLP input(s) written in e4m3 by their gated residual norm".into());
        push_gated_norm(&mut c, "a", rows, width)
    } else {
        c.input("a", rows, width)
    };
    let ([w_gate_up, w_down], _) = push_mlp(&mut c, a, hidden);
    let range = |name: &str| fp8::amax(&c.cpu_values(ckpt, name));
    let (a_amax, hidden_amax) = (range("a"), range("hidden"));
    if seed == 0 {
        // The first denoise step's down product: a few-row cuBLASLt product of the weight the
        // streamed kernel reads in e4m3 tiles, in FP8 from a row-major e4m3 copy of it (its input
        // in the GeGLU output's range, bf16-exact, as down's scale expects).
        c.name += " and a cuBLASLt product of its down weight";
        let data = c.normal(rows * hidden, hidden_amax / 4.0);
        let first_step_hidden = c.input_of("first_step_hidden", rows, hidden, data);
        let first_step_out = c.plan.matrix("first_step_out", rows, width);
        c.plan.push(Op::Gemm { a: first_step_hidden, w: w_down, bias: None, out: first_step_out, accumulate: false });
        c.check(first_step_out);
    }
    let scales = c.fp8_scales(&[(w_gate_up, a_amax), (w_down, hidden_amax)]);
    (c, scales)
}

/// FP8 products whose input the op before them writes in e4m3 (the CUDA lowering's
/// `fusion::e4m3_producers`): an affine LayerNorm before one (SigLIP's QKV), an RMS norm before
/// another (the prefix's), and a GeGLU before a third (the prefix's down product; its gate/up
/// values an input, bf16-exact, so both sides quantize the same f32 values). Outputs in bf16, so
/// none of them streams; each input scale from its input's range on the CPU, as the calibration
/// takes them. (Quantized from a bf16 copy instead, a value within half a bf16 step of an e4m3
/// tie, about 1 in 16, would land on the tie and might round the other way.)
fn fp8_producers_case(seed: u64, ckpt: &Arc<Checkpoint>) -> (Case, Vec<Option<ProductScales>>) {
    let mut c = Case::new(String::new(), seed);
    let (rows, width, n) = (c.rng.random_range(1..300), 16 * c.rng.random_range(1..40), 16 * c.rng.random_range(1..40));
    c.name = format!("fp8 inputs from their producers {rows}x{width}x{n}");
    let x = c.input("x", rows, width);
    let (layer_norm, rms_norm, hidden) =
        (c.plan.matrix("layer_norm", rows, width), c.plan.matrix("rms_norm", rows, width), c.plan.matrix("hidden", rows, width));
    let (g, b) = (c.normal(width, 0.2).iter().map(|v| 1.0 + v).collect(), c.normal(width, 0.2));
    let affine = Some((c.vector_weight(g), c.vector_weight(b)));
    c.plan.push(Op::LayerNorm { x, out: layer_norm, affine, modulation: None, eps: 1e-6 });
    let mut fp8_weights = Vec::new();
    let mut product = |c: &mut Case, a: View, name: &str| {
        let w = c.matrix_weight(n, width);
        let out = c.plan.matrix(name, rows, n);
        c.plan.push(Op::Gemm { a, w, bias: None, out, accumulate: false });
        c.check(out);
        c.consume(out);
        fp8_weights.push((w, c.name(a.buf)));
    };
    product(&mut c, layer_norm, "after_layer_norm");
    c.plan.push(Op::RmsNorm { x, out: rms_norm, weight: None, eps: 1e-6 });
    product(&mut c, rms_norm, "after_rms_norm");
    let gate_up = c.input("gate_up", rows, 2 * width);
    c.plan.push(Op::GatedActivation { gate_up, out: hidden, kind: Activation::GeluTanh });
    product(&mut c, hidden, "after_geglu");
    let calibrated: Vec<(WeightId, f32)> = fp8_weights.iter().map(|(w, input)| (*w, fp8::amax(&c.cpu_values(ckpt, input)))).collect();
    let scales = c.fp8_scales(&calibrated);
    c.lowering_says.push("pass FP8 producers: 3 of 3 cuBLASLt FP8 product input(s) written in e4m3".into());
    (c, scales)
}

/// An MLP as Pi0.5's prefix runs it (seed 0 at a narrowed prefix shape: 576 rows, 256 → 2 × 512
/// → 256; others random, over the 64 rows below which it is one streamed launch): an RMSNorm,
/// the gate/up product in FP8 storing its output in e4m3 with its own scale (from the output's
/// range on the CPU, as calibration takes it), the GeGLU reading that and writing the down
/// product's e4m3 input, the down product in FP8. Compared at the re-quantizing tiers: a
/// last-bits difference in a gate/up or GeGLU output now and then rounds to the neighbouring code.
fn fp8_gated_mlp_case(seed: u64, ckpt: &Arc<Checkpoint>) -> (Case, Vec<Option<ProductScales>>) {
    let mut c = Case::new(String::new(), seed);
    let (rows, width, hidden) = if seed == 0 {
        (576, 256, 512)
    } else {
        (c.rng.random_range(128..=300), 16 * c.rng.random_range(1..=24), 16 * c.rng.random_range(1..=48))
    };
    c.name = format!("fp8 gated MLP, gate/up stored in e4m3, {rows}x{width}, hidden {hidden}");
    let x = c.input("x", rows, width);
    let (h, gate_up) = (c.plan.matrix("h", rows, width), c.plan.matrix("gate_up", rows, 2 * hidden));
    let (mlp, y) = (c.plan.matrix("mlp", rows, hidden), c.plan.matrix("y", rows, width));
    c.plan.push(Op::RmsNorm { x, out: h, weight: None, eps: 1e-6 });
    let (w_gate_up, w_down) = (c.matrix_weight(2 * hidden, width), c.matrix_weight(width, hidden));
    c.plan.push(Op::Gemm { a: h, w: w_gate_up, bias: None, out: gate_up, accumulate: false });
    c.plan.push(Op::GatedActivation { gate_up, out: mlp, kind: Activation::GeluTanh });
    c.plan.push(Op::Gemm { a: mlp, w: w_down, bias: None, out: y, accumulate: false });
    c.check(y);
    let range = |input: &str| fp8::amax(&c.cpu_values(ckpt, input));
    let mut scales = c.fp8_scales(&[(w_gate_up, range("h")), (w_down, range("mlp"))]);
    scales[w_gate_up.0].as_mut().expect("calibrated above").output = Some(fp8::scale_for(range("gate_up")));
    c.lowering_says.push("e4m3 gate/up outputs: 1 FP8 product(s) store their output in e4m3".into());
    c.lowering_says.push("pass FP8 producers: 2 of 2 cuBLASLt FP8 product input(s) written in e4m3".into());
    (c, scales)
}

/// A feed-forward as GR00T's DiT runs it (seed 0 at its shape: 41 rows, 1536 → 6144 → 1536;
/// others random): an affine LayerNorm, fc1 with its bias and the tanh GELU, fc2 with its bias
/// adding into the f32 residual, both in FP8. fc1's cuBLASLt epilogue writes fc2's input in e4m3
/// (its f32 result times fc2's inverse input scale, rounded once as the emulation rounds it:
/// `fusion::after_their_fp8_gelu_product`), so no launch quantizes it; each input scale from its
/// input's range on the CPU. The residual is compared, at the re-quantizing tiers: a last-bits
/// difference in a GELU output now and then rounds it to the neighbouring code.
fn fp8_feed_forward_case(seed: u64, ckpt: &Arc<Checkpoint>) -> (Case, Vec<Option<ProductScales>>) {
    let mut c = Case::new(String::new(), seed);
    let (rows, width, hidden) = if seed == 0 {
        (41, 1536, 6144)
    } else {
        (c.rng.random_range(1..=200), 16 * c.rng.random_range(1..=40), 16 * c.rng.random_range(1..=80))
    };
    c.name = format!("fp8 feed-forward {rows}x{width}, hidden {hidden}");
    // A small residual (the norm takes its scale out), so the compared sum is mostly the
    // feed-forward's and its FP8 error shows against f32.
    let residual = c.normal(rows * width, 0.1);
    let x = c.input_of("x", rows, width, residual);
    let (h, ff) = (c.plan.matrix("h", rows, width), c.plan.matrix("ff", rows, hidden));
    let (g, b) = (c.normal(width, 0.2).iter().map(|v| 1.0 + v).collect(), c.normal(width, 0.2));
    let affine = Some((c.vector_weight(g), c.vector_weight(b)));
    c.plan.push(Op::LayerNorm { x, out: h, affine, modulation: None, eps: 1e-6 });
    let (fc1, fc2) = (c.matrix_weight(hidden, width), c.matrix_weight(width, hidden));
    let (b1, b2) = (c.normal(hidden, 0.3), c.normal(width, 0.3));
    let (b1, b2) = (c.vector_weight(b1), c.vector_weight(b2));
    c.plan.push(Op::Gemm { a: h, w: fc1, bias: Some(b1), out: ff, accumulate: false });
    c.plan.push(Op::Activation { x: ff, kind: Activation::GeluTanh });
    c.plan.push(Op::Gemm { a: ff, w: fc2, bias: Some(b2), out: x, accumulate: true });
    c.check(x);
    // Seed 1 calibrates fc2's input to half its range, as a robot's observation past the
    // calibration set would: those GELU outputs must saturate at ±448 in e4m3 (the emulation's
    // encoding), not turn into NaN (which the comparison refuses).
    let ff_range = if seed == 1 { 0.5 } else { 1.0 };
    if seed == 1 {
        c.name += ", fc2's input past its calibrated range";
    }
    let range = |input: &str| fp8::amax(&c.cpu_values(ckpt, input));
    let scales = c.fp8_scales(&[(fc1, range("h")), (fc2, ff_range * range("ff"))]);
    c.lowering_says.push("pass FP8 producers: 2 of 2 cuBLASLt FP8 product input(s) written in e4m3".into());
    // No launch quantizes fc2's input (cuBLASLt took the e4m3 output).
    c.lowering_lacks.push("quantize_e4m3".into());
    (c, scales)
}

/// The expert's gated residual (an f32 branch, as its streamed kernels write) and the adaRMS norm
/// after it, into a new `rows × width` matrix `name`.
fn push_gated_norm(c: &mut Case, name: &str, rows: usize, width: usize) -> View {
    let (x, y) = (c.input("x", rows, width), c.input("y", rows, width));
    let [gate, norm] = [0; 2].map(|_| {
        let m = c.normal(3 * width, 0.3);
        c.vector_weight(m)
    });
    let out = c.plan.matrix(name, rows, width);
    c.plan.push(Op::GatedResidual { x, y, modulation: gate });
    c.plan.push(Op::AdaRmsNorm { x, out, modulation: norm, eps: 1e-6 });
    out
}

/// The expert's layer start in FP8 (sm_90a: `qkv_rope_stream`, the QKV product and its RoPE in
/// one launch, its input written in e4m3 by the gated residual norm before it): the gated residual
/// (an f32 branch, as the streamed MLP writes) and the adaRMS norm, the QKV product, RoPE with
/// the K/V cache write; seed 0 at Pi0.5's shape, others random in whole 128-column chunks and
/// 64-column heads. qkv (rotated q, unrotated k and v) and both caches compared; the input
/// scale from the norm's output range on the CPU.
fn fp8_qkv_rope_case(seed: u64, ckpt: &Arc<Checkpoint>) -> (Case, Vec<Option<ProductScales>>) {
    let mut c = Case::new(String::new(), seed);
    let (rows, width, heads, head_dim) = if seed == 0 {
        (50, 1024, 8, 256)
    } else {
        (c.rng.random_range(1..=64), 128 * c.rng.random_range(1..=16), c.rng.random_range(1..=8), 64 * c.rng.random_range(1..=4))
    };
    c.name = format!("fp8 qkv product + rope {rows}x{width}, {heads} heads of {head_dim}");
    let h = push_gated_norm(&mut c, "h", rows, width);
    let w = push_qkv_rope(&mut c, h, heads, head_dim);
    let scales = c.fp8_scales(&[(w, fp8::amax(&c.cpu_values(ckpt, "h")))]);
    c.lowering_says.push("1 few-row FP8 product(s) as streamed launches, 1 of them QKV products with their RoPE".into());
    (c, scales)
}

/// The action tokens' attention and the FP8 output projection after it (sm_90a: the split merge
/// writes the projection's input in e4m3, and the streamed product loads it as it is and starts
/// under the merge): seed 0 at Pi0.5's shape (50 queries, 8 heads over 626 keys, 2048 into 1024),
/// others random, always over several key splits. The projection's f32 output compared; its input
/// scale from the attention's output range on the CPU. In seed 0 the projection's output is a
/// branch that holds values before: a gated residual norm reads it first (as the expert's norm
/// after the MLP reads the branch the next projection writes), leaves it zero, and the streamed
/// product adds into those zeros without a grid barrier. Each V column is a common value plus small
/// noise, so the device's bf16 softmax weights (the CPU keeps them in f32) move the attention's
/// output by ~1e-6 relative and both sides round it to the same e4m3 codes: with plain random V
/// they would move it by ~1e-3 and flip about one e4m3 rounding in a hundred.
fn fp8_attention_projection_case(seed: u64, ckpt: &Arc<Checkpoint>) -> (Case, Vec<Option<ProductScales>>) {
    const HEAD_DIM: usize = 256;
    let mut c = Case::new(String::new(), seed);
    let (queries, heads, keys, n) = if seed == 0 {
        (50, 8, 626, 1024)
    } else {
        (c.rng.random_range(1..=64), c.rng.random_range(1..=8), c.rng.random_range(65..=700), 64 * c.rng.random_range(1..=16))
    };
    c.name = format!("fp8 attention + output projection {queries}x{heads} over {keys} keys, into {n}");
    let out = c.plan.matrix("out", queries, n);
    if seed == 0 {
        let held = c.input("held", queries, n);
        c.plan.push(Op::Copy { dst: out, src: held });
        let (x, before) = (c.input("x", queries, n), c.plan.matrix("before", queries, n));
        let [gate, norm] = [0; 2].map(|_| {
            let m = c.normal(3 * n, 0.3);
            c.vector_weight(m)
        });
        c.plan.push(Op::GatedResidual { x, y: out, modulation: gate });
        c.plan.push(Op::AdaRmsNorm { x, out: before, modulation: norm, eps: 1e-6 });
        // (The norm is no FP8 product's: the every-op test compares it. Had it not left `out`
        // zero, `out` would hold `held` plus the product.)
        c.name += ", into a branch its gated norm read and zeroed";
        c.lowering_says.push("zeroed branches: 1 streamed product(s)".into());
    }
    let q = c.input("q", queries, heads * HEAD_DIM);
    let k = c.input("k", keys, HEAD_DIM);
    let (column, noise) = (c.normal(HEAD_DIM, 1.0), c.normal(keys * HEAD_DIM, 0.05));
    let v_values = noise.iter().enumerate().map(|(i, e)| half::bf16::from_f32(column[i % HEAD_DIM] + e).to_f32()).collect();
    let v = c.input_of("v", keys, HEAD_DIM, v_values);
    let attn = c.plan.matrix("attn", queries, heads * HEAD_DIM);
    let attention = Op::Attention {
        q,
        k,
        v,
        out: attn,
        heads,
        kv_heads: 1,
        head_dim: HEAD_DIM,
        groups: 1,
        key_valid: None,
        query_valid: None,
        causal: None,
    };
    c.plan.push(attention);
    let w = c.matrix_weight(n, heads * HEAD_DIM);
    c.plan.push(Op::Gemm { a: attn, w, bias: None, out, accumulate: false });
    c.check(out);
    let scales = c.fp8_scales(&[(w, fp8::amax(&c.cpu_values(ckpt, "attn")))]);
    c.lowering_says.push("1 streamed product input(s) written in e4m3 by the attention merge before them".into());
    (c, scales)
}

/// A heads attention writing its FP8 output projection's input in e4m3 (`attention_hd{48,64,72}`'s
/// e4m3 forms): seed 0 GR00T's DiT cross-attention at its shape (41 queries, 32 heads of 48, 201
/// keys, some masked; the projection with its bias adding into the f32 residual), seed 1 GR00T's
/// vision tower (two cameras of 256 rows, heads of 64, into a bf16 output), seed 2 SigLIP's (two
/// cameras of 256 rows, 16 heads of 72, the projection with its bias adding into the residual).
/// V is a common row plus small noise, as in `fp8_attention_projection_case`, but that does not
/// keep both sides on the same e4m3 codes here: these kernels multiply V by the bf16 softmax
/// weights and divide by the f32 sum of the unrounded ones, which moves the common row by ~1e-4
/// relative, so about one value in a thousand rounds to the neighbouring code (an H100: nmse
/// 8.4e-6 for seed 0, 1.5e-5 for seed 1, 7.8e-6 for seed 2, over `OP_NMSE_BF16`): the
/// re-quantized tier.
fn fp8_heads_attention_projection_case(seed: u64, ckpt: &Arc<Checkpoint>) -> (Case, Vec<Option<ProductScales>>) {
    let mut c = Case::new(String::new(), seed);
    let (head_dim, heads, groups, queries, keys) = match seed {
        0 => (48, 32, 1, 41, 201),
        1 => (64, 4, 2, 256, 256),
        _ => (72, 16, 2, 256, 256),
    };
    let width = heads * head_dim;
    c.name = format!("fp8 attention_hd{head_dim} into e4m3 + output projection, {groups}x{queries} over {keys} keys");
    let q = c.input("q", groups * queries, width);
    let k = c.input("k", groups * keys, width);
    let (row, noise) = (c.normal(width, 1.0), c.normal(groups * keys * width, 0.05));
    let v_values = noise.iter().enumerate().map(|(i, e)| half::bf16::from_f32(row[i % width] + e).to_f32()).collect();
    let v = c.input_of("v", groups * keys, width, v_values);
    let key_valid = (seed == 0).then(|| {
        let values: Vec<f32> = (0..keys).map(|j| if j % 7 == 3 { 0.0 } else { 1.0 }).collect();
        let host = c.plan.host_buffer("key_valid.host", BufType::F32, keys, HostIo::Input);
        c.inputs.push((host, Input::F32(values)));
        host
    });
    // The residual the DiT's and SigLIP's projections add into (its copy from the host comes
    // first: the projection must follow the attention directly).
    let residual = (seed != 1).then(|| {
        let values = c.normal(groups * queries * width, 0.1);
        c.input_of("x", groups * queries, width, values)
    });
    let attn = c.plan.matrix("attn", groups * queries, width);
    let (query_valid, causal) = (None, None);
    c.plan.push(Op::Attention { q, k, v, out: attn, heads, kv_heads: heads, head_dim, groups, key_valid, query_valid, causal });
    let w = c.matrix_weight(width, width);
    let out = if let Some(x) = residual {
        let bias = c.normal(width, 0.3);
        let bias = c.vector_weight(bias);
        c.plan.push(Op::Gemm { a: attn, w, bias: Some(bias), out: x, accumulate: true });
        x
    } else {
        let out = c.plan.matrix("out", groups * queries, width);
        c.plan.push(Op::Gemm { a: attn, w, bias: None, out, accumulate: false });
        c.consume(out);
        out
    };
    c.check(out);
    let scales = c.fp8_scales(&[(w, fp8::amax(&c.cpu_values(ckpt, "attn")))]);
    c.lowering_says.push("pass FP8 producers: 1 of 1 cuBLASLt FP8 product input(s) written in e4m3".into());
    c.lowering_lacks.push("quantize_e4m3".into());
    (c, scales)
}

/// Two few-row products of `a` without bias: one into an f32 output (the form the backend streams
/// in FP8 on sm_90a, K split over the blocks and the sums added), one into a bf16 output
/// (cuBLASLt's FP8 product). Returns their weights.
fn push_products(c: &mut Case, a: View, n: usize) -> [WeightId; 2] {
    let (w_f32, w_bf16) = (c.matrix_weight(n, a.cols), c.matrix_weight(n, a.cols));
    let (out_f32, out_bf16) = (c.plan.matrix("out_f32", a.rows, n), c.plan.matrix("out_bf16", a.rows, n));
    c.plan.push(Op::Gemm { a, w: w_f32, bias: None, out: out_f32, accumulate: false });
    c.plan.push(Op::Gemm { a, w: w_bf16, bias: None, out: out_bf16, accumulate: false });
    c.check(out_f32);
    c.check(out_bf16);
    c.consume(out_bf16);
    [w_f32, w_bf16]
}

/// The expert's QKV product and its RoPE with the K/V cache write (qkv, rotated q, caches
/// compared); seed 2 takes Pi0.5's own shape. RoPE reads its positions here; `attention_case`
/// covers the gathered table rows.
fn qkv_rope_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (rows, width, heads, head_dim) = if seed == 2 {
        (50, 1024, 8, 256)
    } else {
        (c.rng.random_range(1..=64), 64 * c.rng.random_range(1..=16), c.rng.random_range(1..=8), 64 * c.rng.random_range(1..=4))
    };
    c.name = format!("qkv product + rope {rows}x{width}, {heads} heads of {head_dim}");
    let a = c.input("a", rows, width);
    push_qkv_rope(&mut c, a, heads, head_dim);
    c
}

/// The QKV product of `a` (`heads` query heads and one K/V head of `head_dim`) and its RoPE at
/// scattered positions into rows 20.. of the K/V caches, all three compared. Returns the weight.
fn push_qkv_rope(c: &mut Case, a: View, heads: usize, head_dim: usize) -> WeightId {
    let slots = a.rows + 20;
    let positions = c.host_i32("positions", (0..slots as i32).map(|p| (p * 7) % slots as i32).collect());
    let w = c.matrix_weight((heads + 2) * head_dim, a.cols);
    let qkv = c.plan.matrix("qkv", a.rows, (heads + 2) * head_dim);
    let (k_cache, v_cache) = (c.plan.matrix("k_cache", slots, head_dim), c.plan.matrix("v_cache", slots, head_dim));
    c.plan.push(Op::Gemm { a, w, bias: None, out: qkv, accumulate: false });
    c.plan.push(Op::RopeQkv {
        qkv,
        heads,
        kv_heads: 1,
        head_dim,
        theta: 1e4,
        axes: RopeAxes::Single,
        positions,
        position_offset: 3,
        k_cache,
        v_cache,
        cache_row: 20,
    });
    for v in [qkv, k_cache, v_cache] {
        c.check(v);
    }
    w
}

fn embed_case(seed: u64, ckpt_dir: &Path) -> (Case, Arc<Checkpoint>) {
    let mut c = Case::new(String::new(), seed);
    let (vocab, width, rows) = (c.rng.random_range(8..600), c.rng.random_range(1..64) * 8, c.rng.random_range(1..200));
    c.name = format!("embed vocab {vocab} width {width} rows {rows}");
    let table = c.normal(vocab * width, 1.0);
    let bytes: Vec<u8> = table.iter().flat_map(|v| v.to_le_bytes()).collect();
    let path = ckpt_dir.join(format!("embed{seed}.safetensors"));
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![vocab, width], &bytes).unwrap();
    safetensors::serialize_to_file([("embed", view)], None, &path).unwrap();
    let ckpt = Arc::new(Checkpoint::open(&path).unwrap());
    // Out-of-range ids are clamped, as on the CPU.
    let ids: Vec<i32> = (0..rows).map(|i| if i % 17 == 5 { vocab as i32 + 3 } else { c.rng.random_range(0..vocab as i32) }).collect();
    let tokens = c.host_i32("tokens", ids);
    c.weights.push(Vec::new());
    c.embedding = Some(c.weights.len() - 1);
    let emb = c.plan.weight("embed", WeightRole::Embedding { vocab, width });
    for consumed in [false, true] {
        let out = c.plan.matrix(format!("emb{}", consumed as u8), rows, width);
        c.plan.push(Op::Embed { tokens, table: emb, scale: 3.5, out });
        c.check(out);
        if consumed {
            c.consume(out);
        }
    }
    (c, ckpt)
}

/// Positions, RoPE with the K/V-cache write, then masked multi-query attention of a prefix and
/// of a suffix over the whole cache (the Gemma pattern), and grouped multi-head attention (SigLIP).
fn attention_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    // Every seed a different head size; 256 with at most 64 queries runs the fused kernel, 40 (not
    // a multiple of 16) the strided RoPE. Seed 5 (head size 256) has 6 query heads, which do not
    // divide the Hopper kernel's 64-row tiles: its Q rows then come by cp.async, not a tensor map.
    let head_dim = [16, 40, 256][seed as usize % 3];
    let heads = if seed == 5 { 6 } else { 8 };
    // Seed 0 has a prompt long enough that the prefix's softmax rows (over 1024 keys) no longer fit
    // in registers (the kernel's three-pass path).
    let prompt_slots = if seed == 0 { 1000..1100 } else { 1..60 };
    let (cameras, tpi, prompt, suffix) =
        (c.rng.random_range(1..4), c.rng.random_range(1..40), c.rng.random_range(prompt_slots), c.rng.random_range(1..60));
    c.name = format!("positions/rope/attention hd {head_dim} heads {heads} cams {cameras}x{tpi} prompt {prompt} suffix {suffix}");
    let info: Vec<i32> = (0..cameras).flat_map(|i| [(i != 1) as i32, 224, 224, 0]).collect();
    let frame_info = c.host_i32("frame_info", info);
    let valid_prompt = c.rng.random_range(1..=prompt);
    let token_mask = c.host_i32("token_mask", (0..prompt).map(|i| (i < valid_prompt) as i32).collect());
    let prefix = cameras * tpi + prompt;
    let slots = prefix + suffix;
    let valid = c.plan.buffer("valid", BufType::F32, slots);
    let positions = c.plan.buffer("positions", BufType::I32, slots);
    c.plan.push(Op::Positions { frame_info, cameras, tokens_per_image: tpi, token_mask, prompt_len: prompt, suffix, valid, positions });
    c.compare.push("valid".into());
    let k_cache = c.plan.matrix("k_cache", slots, head_dim);
    let v_cache = c.plan.matrix("v_cache", slots, head_dim);
    for (part, rows, offset) in [("prefix", prefix, 0), ("suffix", suffix, prefix)] {
        let qkv = c.input(&format!("{part}_qkv"), rows, (heads + 2) * head_dim);
        c.plan.push(Op::RopeQkv {
            qkv,
            heads,
            kv_heads: 1,
            head_dim,
            theta: 1e4,
            axes: RopeAxes::Single,
            positions,
            position_offset: offset,
            k_cache,
            v_cache,
            cache_row: offset,
        });
        let (k, v) = if part == "prefix" { (k_cache.rows(0, prefix), v_cache.rows(0, prefix)) } else { (k_cache, v_cache) };
        let out = c.plan.matrix(format!("{part}_attn"), rows, heads * head_dim);
        let query_valid = (part == "prefix").then_some(valid);
        c.plan.push(Op::Attention {
            q: qkv.cols(0, heads * head_dim),
            k,
            v,
            out,
            heads,
            kv_heads: 1,
            head_dim,
            groups: 1,
            key_valid: Some(valid),
            query_valid,
            causal: None,
        });
        c.check(qkv);
        c.check(out);
    }
    c.check(k_cache);
    c.check(v_cache);
    // SigLIP-like: per-camera groups, 72-wide heads, one K/V head per query head, no masks.
    let (vheads, per) = (c.rng.random_range(1..5), c.rng.random_range(1..80));
    let vqkv = c.input("vision_qkv", cameras * per, 3 * vheads * 72);
    let w = vheads * 72;
    let vout = c.plan.matrix("vision_attn", cameras * per, w);
    c.plan.push(Op::Attention {
        q: vqkv.cols(0, w),
        k: vqkv.cols(w, w),
        v: vqkv.cols(2 * w, w),
        out: vout,
        heads: vheads,
        kv_heads: vheads,
        head_dim: 72,
        groups: cameras,
        key_valid: None,
        query_valid: None,
        causal: None,
    });
    c.check(vout);
    c
}

/// RoPE with Qwen3's base (θ = 1e6) and grouped K/V heads (8 and 2), beside a Gemma-based one in
/// the same plan: two tables, rows read through the positions (no gathered rows).
fn gqa_rope_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (heads, kv_heads, head_dim) = [(16, 8, 128), (4, 2, 64), (6, 2, 32)][seed as usize % 3];
    let rows = c.rng.random_range(1..80);
    c.name = format!("rope_qkv {heads}/{kv_heads}x{head_dim} theta 1e6 and 1e4, {rows} rows");
    let slots = rows + 2;
    // Positions out of order but inside the table (a position never exceeds its slot count).
    let positions = c.host_i32("positions", (0..slots).map(|i| (i * 7 % slots) as i32).collect());
    for (theta, name) in [(1e6f32, "qwen"), (1e4, "gemma")] {
        let qkv = c.input(&format!("{name}_qkv"), rows, (heads + 2 * kv_heads) * head_dim);
        let k_cache = c.plan.matrix(format!("{name}_k_cache"), slots, kv_heads * head_dim);
        let v_cache = c.plan.matrix(format!("{name}_v_cache"), slots, kv_heads * head_dim);
        c.plan.push(Op::RopeQkv {
            qkv,
            heads,
            kv_heads,
            head_dim,
            theta,
            axes: RopeAxes::Single,
            positions,
            position_offset: 2,
            k_cache,
            v_cache,
            cache_row: 2,
        });
        c.check(qkv);
        c.check(k_cache.rows(2, rows));
        c.check(v_cache.rows(2, rows));
    }
    c
}

/// Qwen3-VL's multi-axis RoPE: the text M-RoPE (interleaved t/h/w sections, grouped K/V heads,
/// θ = 5e6) and the vision 2D RoPE (row/column halves), after an in-place per-head q/k RMSNorm as
/// the Qwen3 decoder runs it; then image rows scattered into sequence slots, written and added.
fn qwen3_vl_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (heads, kv_heads, head_dim, sections) =
        [(16, 8, 128, [24, 20, 20]), (4, 2, 32, [6, 5, 5]), (6, 3, 64, [12, 10, 10])][seed as usize % 3];
    let rows = c.rng.random_range(2..60);
    c.name = format!("qwen3-vl rope {heads}/{kv_heads}x{head_dim} m-rope {sections:?} + vision 2d, scatter, {rows} rows");
    // Positions inside the tables (never past the rows), out of order.
    let positions = c.host_i32("positions", (0..3 * rows).map(|i| (i * 7 % rows) as i32).collect());
    for (axes, theta, name) in
        [(RopeAxes::Interleaved { sections, slots: rows }, 5e6f32, "mrope"), (RopeAxes::Rows2d { slots: rows }, 1e4, "vision")]
    {
        let qkv = c.input(&format!("{name}_qkv"), rows, (heads + 2 * kv_heads) * head_dim);
        if name == "mrope" {
            let (q, k) = (qkv.cols(0, heads * head_dim), qkv.cols(heads * head_dim, kv_heads * head_dim));
            let w = c.normal(head_dim, 0.2).iter().map(|v| 1.0 + v).collect();
            let w = c.vector_weight(w);
            c.plan.push(Op::HeadRmsNorm { x: q, out: q, heads, weight: w, eps: 1e-6 });
            c.plan.push(Op::HeadRmsNorm { x: k, out: k, heads: kv_heads, weight: w, eps: 1e-6 });
        }
        let k_cache = c.plan.matrix(format!("{name}_k"), rows, kv_heads * head_dim);
        let v_cache = c.plan.matrix(format!("{name}_v"), rows, kv_heads * head_dim);
        c.plan.push(Op::RopeQkv {
            qkv,
            heads,
            kv_heads,
            head_dim,
            theta,
            axes,
            positions,
            position_offset: 0,
            k_cache,
            v_cache,
            cache_row: 0,
        });
        c.check(qkv);
        c.check(k_cache);
        c.check(v_cache);
    }
    let src = c.input("scatter_src", rows, 48);
    let dst = c.input("scatter_dst", 2 * rows + 3, 48);
    let index = c.host_i32("scatter_index", (0..rows).map(|i| (2 * i + 1) as i32).collect());
    c.plan.push(Op::ScatterRows { src, index, dst, accumulate: false });
    c.plan.push(Op::ScatterRows { src: src.rows(0, rows / 2), index, dst, accumulate: true });
    c.check(dst);
    c
}

/// The general attention path (the Products lowering, on every architecture): grouped-query heads
/// (Qwen3's 16 over 8, and 4 over 1), causal self-attention over a masked sequence, and rows
/// appended after cached keys (causal offset), in groups; head dimensions 64 and 128, over more
/// keys per group than `attention_heads` holds.
fn general_attention_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (heads, kv_heads, head_dim) = [(16, 8, 128), (4, 1, 64), (6, 3, 64)][seed as usize % 3];
    let (groups, keys) = (c.rng.random_range(1..3), c.rng.random_range(330..420));
    let offset = [0, 0, c.rng.random_range(1..keys / 2 + 1)][seed as usize % 3];
    let queries = keys - offset;
    c.name = format!("attention {heads}/{kv_heads}x{head_dim} causal+{offset} groups {groups} keys {keys}");
    let q = c.input("q", groups * queries, heads * head_dim);
    let k = c.input("k", groups * keys, kv_heads * head_dim);
    let v = c.input("v", groups * keys, kv_heads * head_dim);
    let mask: Vec<f32> = (0..groups * keys).map(|i| if i % 7 == 3 { 0.0 } else { 1.0 }).collect();
    let host = c.plan.host_buffer("key_valid.host", BufType::F32, mask.len(), HostIo::Input);
    c.inputs.push((host, Input::F32(mask)));
    let out = c.plan.matrix("attn", groups * queries, heads * head_dim);
    c.plan.push(Op::Attention {
        q,
        k,
        v,
        out,
        heads,
        kv_heads,
        head_dim,
        groups,
        key_valid: Some(host),
        query_valid: None,
        causal: Some(offset),
    });
    c.check(out);
    c
}

/// `attention_heads` on GR00T N1.7's shapes, masks as the general path applies them: the Qwen3
/// decoder (16 heads over 8, head dim 128, causal, a masked first key that leaves row 0 with
/// none), VL self-attention (head dim 64, masked keys and queries) and the vision tower (per
/// camera, unmasked), the DiT's cross-attention (41 queries over masked VL rows, head dim 48) and
/// self-attention (causal offset on one seed), each against the CPU.
fn heads_attention_case(seed: u64) -> Case {
    /// One attention op: `queries` 0 means self-attention (as many queries as keys).
    struct Form {
        name: &'static str,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        groups: usize,
        queries: usize,
        keys: usize,
        causal: Option<usize>,
        key_mask: bool,
        query_mask: bool,
    }
    let mut c = Case::new(String::new(), seed);
    let form = |name, (heads, kv_heads, head_dim), (groups, queries, keys), causal, (key_mask, query_mask)| Form {
        name,
        heads,
        kv_heads,
        head_dim,
        groups,
        queries,
        keys,
        causal,
        key_mask,
        query_mask,
    };
    let forms = match seed % 3 {
        0 => [
            form("decoder", (16, 8, 128), (1, 0, c.rng.random_range(100..=256)), Some(0), (true, false)),
            form("decoder, 2 groups", (4, 2, 128), (2, 0, c.rng.random_range(8..60)), Some(0), (false, true)),
        ],
        1 => [
            form("vl self-attention", (4, 4, 64), (1, 0, c.rng.random_range(150..=320)), None, (true, true)),
            form("vision tower", (3, 3, 64), (2, 0, 256), None, (false, false)),
        ],
        _ => [
            form("dit cross", (5, 5, 48), (1, 41, c.rng.random_range(150..=320)), None, (true, false)),
            form("dit self, causal offset", (5, 5, 48), (1, 30, 41), Some(11), (false, false)),
        ],
    };
    let mut names = Vec::new();
    for (i, f) in forms.into_iter().enumerate() {
        let Form { name, heads, kv_heads, head_dim, groups, keys, causal, .. } = f;
        let queries = if f.queries == 0 { keys } else { f.queries };
        names.push(format!("{name} {heads}/{kv_heads}x{head_dim} {groups}x{queries} over {keys}"));
        let q = c.input(&format!("q{i}"), groups * queries, heads * head_dim);
        let k = c.input(&format!("k{i}"), groups * keys, kv_heads * head_dim);
        let v = c.input(&format!("v{i}"), groups * keys, kv_heads * head_dim);
        let mut mask = |name: &str, len: usize, on: bool| {
            on.then(|| {
                // Key 0 masked: with a causal mask row 0 then has no key (zeros, as the softmax).
                let values: Vec<f32> = (0..len).map(|j| if j % 7 == 0 || j % 11 == 5 { 0.0 } else { 1.0 }).collect();
                let host = c.plan.host_buffer(format!("{name}{i}.host"), BufType::F32, len, HostIo::Input);
                c.inputs.push((host, Input::F32(values)));
                host
            })
        };
        let key_valid = mask("key_valid", groups * keys, f.key_mask);
        let query_valid = mask("query_valid", groups * queries, f.query_mask);
        let out = c.plan.matrix(format!("attn{i}"), groups * queries, heads * head_dim);
        c.plan.push(Op::Attention { q, k, v, out, heads, kv_heads, head_dim, groups, key_valid, query_valid, causal });
        c.check(out);
    }
    c.name = format!("attention_heads: {}", names.join("; "));
    c
}

/// GR00T N1.7's image op: frames of several sizes and formats (smaller and larger than the 256²
/// target), letterboxed or not, one camera absent, against the CPU's (which matches lerobot to
/// the level).
fn qwen_image_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (max_w, max_h) = (400, 300);
    let cameras = 4;
    let stride = max_w * max_h * 4;
    // Seeds 0, 1: the bicubic path without and with letterbox; 2, 3: the albumentations path
    // with letterbox, and without it on square frames (the only ones it takes then).
    let area = seed >= 2;
    let letterbox = seed % 2 == 1 || seed == 2;
    let mut frames = vec![0u8; cameras * stride];
    let (mut info, mut desc) = (Vec::new(), Vec::new());
    for cam in 0..cameras {
        let format = [PixelFormat::Rgb8, PixelFormat::Bgr8, PixelFormat::Rgba8, PixelFormat::Rgb8][cam];
        let (w, h) = match cam {
            0 => (256, 256),
            _ if area && !letterbox => {
                let side = c.rng.random_range(20..=max_h);
                (side, side)
            }
            _ => (c.rng.random_range(20..=max_w), c.rng.random_range(20..=max_h)),
        };
        let present = cam != 3;
        for b in &mut frames[cam * stride..][..w * h * format.bytes_per_pixel()] {
            *b = c.rng.random();
        }
        info.extend([present as i32, w as i32, h as i32, format as i32]);
        desc.push(format!("{w}x{h}{}", if present { "" } else { " absent" }));
    }
    let path = if area { " albumentations" } else { "" };
    c.name = format!("qwen_image_patches{path}{} {}", if letterbox { " letterbox" } else { "" }, desc.join(", "));
    let frames_id = c.plan.host_buffer("frames", BufType::U8, frames.len(), HostIo::Input);
    c.inputs.push((frames_id, Input::U8(frames)));
    let frame_info = c.host_i32("frame_info", info);
    let image = flashrt::qwen_image::QwenImage {
        target: 256,
        edge: 256,
        crop_fraction: if area { 0.95 } else { 230.0 / 256.0 },
        letterbox,
        patch: 16,
        filter: if area { flashrt::qwen_image::Filter::Cv2Area } else { flashrt::qwen_image::Filter::TorchBicubic },
    };
    let per = image.patch_rows();
    let out = c.plan.matrix("patches", cameras * per, image.patch_cols());
    for camera in 0..cameras {
        let out = out.rows(camera * per, per);
        c.plan.push(Op::QwenImagePatches {
            camera,
            frames: frames_id,
            frame_stride: stride,
            frame_info,
            max_width: max_w,
            max_height: max_h,
            image,
            out,
        });
    }
    c.check(out);
    c.consume(out);
    c
}

fn image_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (size, patch) = (56, 14);
    let (max_w, max_h) = (160, 120);
    let cameras = 4;
    let stride = max_w * max_h * 4;
    let mut frames = vec![0u8; cameras * stride];
    let mut info = Vec::new();
    let mut desc = Vec::new();
    for cam in 0..cameras {
        let format = [PixelFormat::Rgb8, PixelFormat::Bgr8, PixelFormat::Rgba8, PixelFormat::Rgb8][cam];
        let (w, h) = if cam == 0 { (size, size) } else { (c.rng.random_range(8..=max_w), c.rng.random_range(8..=max_h)) };
        let present = cam != 3;
        for b in &mut frames[cam * stride..][..w * h * format.bytes_per_pixel()] {
            *b = c.rng.random();
        }
        info.extend([present as i32, w as i32, h as i32, format as i32]);
        desc.push(format!("{w}x{h}{}", if present { "" } else { " absent" }));
    }
    c.name = format!("image_patches {}", desc.join(", "));
    let frames_id = c.plan.host_buffer("frames", BufType::U8, frames.len(), HostIo::Input);
    c.inputs.push((frames_id, Input::U8(frames)));
    let frame_info = c.host_i32("frame_info", info);
    let per = (size / patch) * (size / patch);
    // Padded rows, as the model's (the pad columns stay zero).
    let out = c.plan.matrix("patches", cameras * per, 3 * patch * patch + 12);
    for camera in 0..cameras {
        c.plan.push(Op::ImagePatches {
            camera,
            frames: frames_id,
            frame_stride: stride,
            frame_info,
            size,
            patch,
            out: out.rows(camera * per, per).cols(0, 3 * patch * patch),
        });
    }
    c.check(out);
    c.consume(out);
    c
}

/// Weight selection (GR00T's embodiments): entry `index` (an i32 input; past the table it is
/// clamped to the last entry) of stacked tables copied into a product's weight and bias (16-byte
/// copies) and into a table added to f32 rows of odd width (4-byte copies), before they are read.
fn select_weight_case(seed: u64) -> Case {
    let mut c = Case::new(String::new(), seed);
    let (entries, m, k, n) =
        (c.rng.random_range(2..5), c.rng.random_range(1..60), c.rng.random_range(1..40) * 8, c.rng.random_range(1..30) * 8);
    let index = if seed == 2 { entries + 3 } else { c.rng.random_range(0..entries) };
    c.name = format!("select_weight entry {index} of {entries}, {m}x{k}x{n}");
    let index = c.host_i32("index", vec![index as i32]);
    let select = |c: &mut Case, name: &str, role: WeightRole, table_role: WeightRole, len: usize, std: f32| {
        let table = c.normal(entries * len, std);
        c.weights.push(table);
        let table = c.plan.weight(format!("{name}.table"), table_role);
        c.weights.push(vec![0.0; len]);
        let dst = c.plan.weight(name, role);
        c.plan.push(Op::SelectWeight { index, entries, table, dst });
        dst
    };
    let w = select(&mut c, "w", WeightRole::Matrix { n, k }, WeightRole::MatrixStack { entries, n, k }, n * k, 1.0 / (k as f32).sqrt());
    let bias = select(&mut c, "bias", WeightRole::Vector, WeightRole::Vector, n, 0.5);
    let cols = 2 * c.rng.random_range(1..20) + 1;
    let table = select(&mut c, "table", WeightRole::Vector, WeightRole::Vector, 3 * cols, 1.0);
    let a = c.input("a", m, k);
    // An f32 output (f32 bias) and a bf16 one (bf16 bias): the bias is selected in both types.
    let acc = c.input("acc", m, n);
    c.plan.push(Op::Gemm { a, w, bias: Some(bias), out: acc, accumulate: true });
    c.check(acc);
    let out = c.plan.matrix("out", m, n);
    c.plan.push(Op::Gemm { a, w, bias: Some(bias), out, accumulate: false });
    c.check(out);
    c.consume(out);
    let x = c.input("x", 6, cols);
    c.plan.push(Op::AddTable { x, table, table_rows: 3 });
    c.check(x);
    c
}

/// A one-tensor checkpoint for the plans whose weights are all dense.
fn dummy_checkpoint(dir: &Path) -> Arc<Checkpoint> {
    let path = dir.join("dummy.safetensors");
    let bytes = 0f32.to_le_bytes();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &bytes).unwrap();
    safetensors::serialize_to_file([("dummy", view)], None, &path).unwrap();
    Arc::new(Checkpoint::open(&path).unwrap())
}

#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn every_op_matches_cpu() {
    require_gpu("every_op_matches_cpu");
    let tmp = tempfile::tempdir().unwrap();
    // Ops that need no checkpoint share a dummy one.
    let dummy = dummy_checkpoint(tmp.path());
    let mut results = Vec::new();
    let (mut failures, mut worst_bf16, mut worst_f32) = (0, 0f64, 0f64);
    for seed in 0..3u64 {
        let mut cases: Vec<(Case, Arc<Checkpoint>)> = vec![
            (gemm_case(seed), dummy.clone()),
            (norm_case(seed, 0), dummy.clone()),
            (norm_case(seed, 1), dummy.clone()),
            (norm_case(seed, 2), dummy.clone()),
            (norm_case(seed, 3), dummy.clone()),
            (norm_case(seed, 4), dummy.clone()),
            (norm_case(seed, 5), dummy.clone()),
            (residual_case(seed), dummy.clone()),
            (step_boundary_case(seed), dummy.clone()),
            (elementwise_case(seed), dummy.clone()),
            (rtc_case(seed), dummy.clone()),
            (groot_rtc_case(seed), dummy.clone()),
            (select_weight_case(seed), dummy.clone()),
            (mlp_case(seed), dummy.clone()),
            (qkv_rope_case(seed), dummy.clone()),
            (attention_case(seed), dummy.clone()),
            (general_attention_case(seed), dummy.clone()),
            (heads_attention_case(seed), dummy.clone()),
            (gqa_rope_case(seed), dummy.clone()),
            (qwen3_vl_case(seed), dummy.clone()),
            (qwen_image_case(seed), dummy.clone()),
            (image_case(seed), dummy.clone()),
        ];
        cases.push(embed_case(seed, tmp.path()));
        if seed == 2 {
            // Head dimension 256 again, with 6 heads (see `attention_case`).
            cases.push((attention_case(5), dummy.clone()));
            cases.push((qwen_image_case(3), dummy.clone()));
        }
        for (case, ckpt) in &cases {
            for (buffer, err, bound) in case.run(ckpt, &[], false) {
                let (pass, bf16) = (err <= bound, bound == OP_NMSE_BF16);
                eprintln!(
                    "{:4} {:70} {buffer:24} {} nmse {err:.3e}",
                    if pass { "ok" } else { "FAIL" },
                    case.name,
                    if bf16 { "bf16" } else { "f32 " }
                );
                failures += !pass as usize;
                if bf16 {
                    worst_bf16 = worst_bf16.max(err)
                } else {
                    worst_f32 = worst_f32.max(err)
                }
                results.push(json!({"case": case.name, "buffer": buffer, "device_type": if bf16 { "bf16" } else { "f32" }, "nmse": err, "bound": bound, "pass": pass}));
            }
        }
    }
    write_result(
        "cuda_ops.json",
        json!({
            "check": "every op vs the CPU op (random shapes)",
            "bound": format!("nmse <= {OP_NMSE_BF16:e} for buffers held in bf16, <= {OP_NMSE_F32:e} for f32"),
            "worst_nmse_bf16": worst_bf16,
            "worst_nmse_f32": worst_f32,
            "commit": commit(),
            "results": results
        }),
    );
    assert_eq!(failures, 0, "{failures} buffers past their tier's bound (see the table above)");
}

/// FP8 products (e4m3 weights, inputs quantized on the device with their scales, cuBLASLt's FP8
/// product) against the CPU's FP8 emulation of the same products: first every code of PyTorch's
/// e4m3 table exactly ([`fp8_codes_case`]), then random products within the bf16 tier, as their
/// inputs are bf16-exact and both sides round the same e4m3 codes, the products whose input their
/// producer writes in e4m3, and the streamed MLP's and few-row products' FP8 forms (on sm_90a;
/// cuBLASLt's products elsewhere), the QKV product with its RoPE after its gated norm and the
/// output projection after its attention's merge included, at Pi0.5's expert shapes and random
/// ones. Each case runs twice: with the products summing in f32 as the emulation does
/// (`fp8_fast_accumulation` off) within those tiers, and as the backend runs by default (Hopper's
/// fast accumulation) within their own. The same GPU results against the CPU in f32 are an FP8
/// error away (> 10× the first run's tier): the products did run in e4m3.
#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn fp8_products_match_the_cpu_emulation() {
    require_gpu("fp8_products_match_the_cpu_emulation");
    let tmp = tempfile::tempdir().unwrap();
    let dummy = dummy_checkpoint(tmp.path());
    let (codes_case, unit_scales) = fp8_codes_case();
    let [(_, codes_err, _)] = codes_case.run(&dummy, &unit_scales, true)[..] else { unreachable!("one compared buffer") };
    eprintln!("e4m3 codes of PyTorch's table through the FP8 product with 448 · I: nmse {codes_err:e} (0: every code equal)");
    let (mut results, mut failures) = (vec![json!({"case": codes_case.name, "nmse_vs_emulation": codes_err, "pass": codes_err == 0.0})], 0);
    failures += (codes_err != 0.0) as usize;
    // The heads attention's e4m3 output, the feed-forward's GELU and the streamed MLP's GeGLU
    // re-quantize an intermediate the two sides compute apart: their own tiers. Each case's bound
    // with f32 accumulation, then with fast accumulation.
    let single = |(case, scales)| (case, scales, OP_NMSE_BF16, OP_NMSE_FP8_FAST_ACCUMULATION);
    let cases = (0..3)
        .map(fp8_gemm_case)
        .map(single)
        .chain((0..3).map(fp8_product_case).map(single))
        .chain((0..2).map(|seed| fp8_producers_case(seed, &dummy)).map(single))
        .chain((0..2).map(|seed| fp8_qkv_rope_case(seed, &dummy)).map(single))
        .chain((0..2).map(|seed| fp8_attention_projection_case(seed, &dummy)).map(single))
        .chain(
            (0..3)
                .map(|seed| fp8_heads_attention_projection_case(seed, &dummy))
                .chain((0..2).map(|seed| fp8_feed_forward_case(seed, &dummy)))
                .chain((0..2).map(|seed| fp8_mlp_case(seed, &dummy)))
                .chain((0..2).map(|seed| fp8_gated_mlp_case(seed, &dummy)))
                .map(|(case, scales)| (case, scales, OP_NMSE_FP8_REQUANTIZED, OP_NMSE_FP8_REQUANTIZED_FAST_ACCUMULATION)),
        );
    let f32_accumulation = Switches { fp8_fast_accumulation: false, ..Switches::default() };
    for (case, scales, bound, fast_bound) in cases {
        let emulated = case.run_with(&dummy, &scales, true, f32_accumulation);
        let fast = case.run(&dummy, &scales, true);
        let exact = case.run(&dummy, &scales, false);
        for (((buffer, err, _), (_, fast_err, _)), (_, f32_err, _)) in emulated.iter().zip(&fast).zip(&exact) {
            let pass = *err <= bound && *f32_err > 10.0 * bound && *fast_err <= fast_bound;
            failures += !pass as usize;
            eprintln!(
                "{:4} {:50} {buffer:24} nmse {err:.3e} vs the FP8 emulation (bound {bound:e}), {fast_err:.3e} with fast accumulation \
                 (bound {fast_bound:e}), {f32_err:.3e} vs f32",
                if pass { "ok" } else { "FAIL" },
                case.name
            );
            results.push(json!({"case": case.name, "buffer": buffer, "nmse_vs_emulation": err, "bound": bound,
                "nmse_vs_emulation_fast_accumulation": fast_err, "fast_accumulation_bound": fast_bound, "nmse_vs_f32": f32_err, "pass": pass}));
        }
    }
    write_result(
        "cuda_fp8_ops.json",
        json!({
            "check": "FP8 products (cuBLASLt e4m3, device quantization) vs the CPU FP8 emulation and vs f32",
            "bound": format!(
                "nmse vs the emulation <= {OP_NMSE_BF16:e} ({OP_NMSE_FP8_REQUANTIZED:e} where an intermediate is re-quantized: the heads \
                 attention's e4m3 output, the feed-forward's GELU, the MLPs' GeGLU and e4m3 gate/up output) with the products summing in f32, and > 10x that vs f32; <= {OP_NMSE_FP8_FAST_ACCUMULATION:e} \
                 ({OP_NMSE_FP8_REQUANTIZED_FAST_ACCUMULATION:e}) with Hopper's fast accumulation, the default"
            ),
            "commit": commit(),
            "results": results
        }),
    );
    assert_eq!(failures, 0, "{failures} FP8 buffers off (see the table above)");
}

// ---- (a) tiny fixture: CUDA vs CPU --------------------------------------------------------------

struct Golden(Vec<u8>);

impl Golden {
    fn load(dir: &Path) -> Golden {
        Golden(std::fs::read(dir.join("golden.safetensors")).expect("golden.safetensors"))
    }
    fn raw(&self, key: &str) -> (Vec<usize>, Vec<u8>) {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
        (t.shape().to_vec(), t.data().to_vec())
    }
    fn f32(&self, key: &str) -> Vec<f32> {
        self.raw(key).1.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    }
    fn tokens(&self, p: &str) -> Vec<i32> {
        let ids: Vec<i64> =
            self.raw(&format!("input.{p}.tokens")).1.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
        let mask = self.raw(&format!("input.{p}.token_mask")).1;
        ids.iter().zip(&mask).filter(|(_, m)| **m != 0).map(|(id, _)| *id as i32).collect()
    }
}

fn open(dir: &Path, backend: BackendKind) -> Policy {
    let mut config = PolicyConfig::new(dir);
    config.backend = backend;
    Policy::open(&config).unwrap_or_else(|e| panic!("{backend:?}: {e}"))
}

/// GR00T N1.7 (the tiny lerobot fixture) on the CUDA backend's general paths against the CPU and
/// lerobot: raw frames of two sizes, each golden case's prompt, state and noise.
#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn groot_tiny_matches_cpu() {
    require_gpu("groot_tiny_matches_cpu");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/groot_n17_tiny");
    let golden = std::fs::read(dir.join("golden.safetensors")).unwrap();
    let golden = SafeTensors::deserialize(&golden).unwrap();
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        golden.tensor(name).unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    };
    let open = |backend| {
        let mut config = PolicyConfig::new(&dir);
        (config.backend, config.embodiment, config.max_frame_width, config.max_frame_height) =
            (backend, Some("tiny_robot".into()), 320, 300);
        Policy::open(&config).unwrap_or_else(|e| panic!("{backend:?}: {e}"))
    };
    let (mut cpu, mut gpu) = (open(BackendKind::Cpu), open(BackendKind::Cuda));
    let (mut results, mut pass) = (Vec::new(), true);
    for (c, case) in meta["cases"].as_array().unwrap().iter().enumerate() {
        let frames: Vec<(Vec<u8>, usize, usize)> = (0..2)
            .map(|i| {
                let t = golden.tensor(&format!("case{c}.frame_{i}")).unwrap();
                (t.data().to_vec(), t.shape()[1], t.shape()[0])
            })
            .collect();
        let cameras: Vec<Option<Frame>> = frames.iter().map(|(d, w, h)| Some(Frame::packed(d, *w, *h, PixelFormat::Rgb8))).collect();
        let (state, noise) = (f32s(&format!("case{c}.raw_state")), f32s(&format!("case{c}.noise")));
        let mut outs = Vec::new();
        for policy in [&mut cpu, &mut gpu] {
            policy.set_prompt(case["prompt"].as_str().unwrap()).unwrap();
            let mut actions = vec![0.0; policy.actions_len()];
            policy.step(&Observation { cameras: &cameras, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
            outs.push((actions, policy.buffer("x_t").unwrap()));
        }
        let [(cpu_actions, cpu_x), (gpu_actions, gpu_x)] = [outs.remove(0), outs.remove(0)];
        let want = f32s(&format!("case{c}.action_pred"));
        let (cos, err) = (cosine(&gpu_actions, &cpu_actions), max_abs(&gpu_actions, &cpu_actions));
        let (lerobot_cos, lerobot_err) = (cosine(&gpu_x, &want), max_abs(&gpu_x, &want));
        let ok = cos >= CUDA_GROOT_TINY_COSINE && lerobot_cos >= CUDA_GROOT_TINY_COSINE && lerobot_err <= CUDA_GROOT_TINY_MAX_ABS;
        pass &= ok;
        eprintln!(
            "case {c}: actions cosine {cos:.6} max-abs {err:.3e} vs CPU; normalized chunk cosine {lerobot_cos:.6} max-abs {lerobot_err:.3e} vs lerobot (x0 vs CPU {:.6}) {}",
            cosine(&gpu_x, &cpu_x),
            if ok { "ok" } else { "FAIL" }
        );
        results.push(json!({"case": c, "actions_cosine": cos, "actions_max_abs": err, "chunk_vs_lerobot": {"cosine": lerobot_cos, "max_abs": lerobot_err}, "pass": ok}));
    }
    write_result(
        "cuda_groot_tiny_parity.json",
        json!({
            "check": "GR00T N1.7 tiny fixture, CUDA bf16 general paths vs CPU f32 (decoded actions) and lerobot-0.6.1 f32 (normalized chunk)",
            "device": gpu.info().device,
            "bound": format!("cosine >= {CUDA_GROOT_TINY_COSINE} against both, chunk max_abs <= {CUDA_GROOT_TINY_MAX_ABS:e} against lerobot"),
            "explain": gpu.explain().lines().filter(|l| l.trim_start().starts_with("pass") || l.contains("launches")).collect::<Vec<_>>(),
            "results": results,
            "commit": commit(),
        }),
    );
    assert!(pass, "GR00T tiny parity failed (see above)");
}

/// Switching GR00T's embodiment on CUDA (a synthesized tiny checkpoint with two embodiments of
/// different widths): after `set_embodiment` the same captured graph computes what the CPU opened
/// with that embodiment does, and back, with no allocation in the steps and no change of device
/// memory. Compared on the sampler's part of the chunk (x₀ − noise), which must also differ from
/// the other embodiment's (the selection matters).
#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn groot_embodiment_switch_matches_cpu() {
    use flashrt::models::groot_n17::synth::{Options, Size, synthesize_with};
    require_gpu("groot_embodiment_switch_matches_cpu");
    let dir = tempfile::tempdir().unwrap();
    synthesize_with(dir.path(), Size::Tiny, &Options { cameras: 2, embodiments: 2 }, 21, &|_| {}).unwrap();
    let open = |backend, tag: &str| {
        let mut config = PolicyConfig::new(dir.path());
        (config.backend, config.embodiment, config.max_frame_width, config.max_frame_height) = (backend, Some(tag.into()), 160, 120);
        let mut policy = Policy::open(&config).unwrap_or_else(|e| panic!("{backend:?} {tag}: {e}"));
        policy.set_prompt("put the red block in the bowl").unwrap();
        policy
    };
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let pixels: Vec<u8> = (0..160 * 120 * 3).map(|_| rng.random()).collect();
    let cameras = [
        Some(Frame::packed(&pixels, 160, 120, PixelFormat::Rgb8)),
        Some(Frame::packed(&pixels[..120 * 90 * 3], 120, 90, PixelFormat::Bgr8)),
    ];
    let mut gpu = open(BackendKind::Cuda, "robot");
    let noise: Vec<f32> = (0..gpu.noise_len()).map(|_| StandardNormal.sample(&mut rng)).collect();
    // The sampler's part of the chunk of one step (with the state width of `policy`'s embodiment),
    // counting the step's allocations.
    let sampled = |policy: &mut Policy| -> (Vec<f32>, usize) {
        let state: Vec<f32> = (0..policy.info().state_dim).map(|i| (i as f32 * 0.7).sin()).collect();
        let mut actions = vec![0.0; policy.actions_len()];
        let obs = Observation { cameras: &cameras, state: &state, noise: Some(&noise) };
        let (result, allocations) = counting_alloc::count(|| policy.step(&obs, &mut actions));
        result.unwrap();
        let x0 = policy.buffer("x_t").unwrap();
        (x0.iter().zip(&noise).map(|(x, n)| x - n).collect(), allocations)
    };
    let reference: Vec<(&str, Vec<f32>)> =
        ["robot", "robot_2"].iter().map(|&tag| (tag, sampled(&mut open(BackendKind::Cpu, tag)).0)).collect();
    sampled(&mut gpu); // warm-up
    let memory_before = flashrt::cuda::used_device_memory().expect("the policy's context is current");
    let (mut results, mut pass, mut allocations) = (Vec::new(), true, 0);
    for (i, tag) in ["robot", "robot_2", "robot"].into_iter().enumerate() {
        gpu.set_embodiment(tag).unwrap(); // not the hot path
        let (got, n) = sampled(&mut gpu);
        allocations += n;
        let want = &reference.iter().find(|(t, _)| *t == tag).unwrap().1;
        let other = &reference.iter().find(|(t, _)| *t != tag).unwrap().1;
        let (cos, rel, other_cos) = (cosine(&got, want), rel_l2(&got, want), cosine(&got, other));
        let ok = cos >= CUDA_GROOT_SWITCH_COSINE && rel <= CUDA_GROOT_SWITCH_REL_L2 && other_cos < 0.9;
        pass &= ok;
        eprintln!(
            "switch {i} to {tag}: x0 - noise cosine {cos:.6} rel-L2 {rel:.3e} vs CPU {tag}; cosine {other_cos:.4} vs the other embodiment {}",
            if ok { "ok" } else { "FAIL" }
        );
        results.push(
            json!({"embodiment": tag, "cosine": cos, "rel_l2": rel, "cosine_vs_other_embodiment": other_cos, "allocations": n, "pass": ok}),
        );
    }
    let memory_after = flashrt::cuda::used_device_memory().unwrap();
    write_result(
        "cuda_groot_embodiment_switch.json",
        json!({
            "check": "GR00T N1.7 embodiment switch inside one CUDA graph (synthesized tiny, 2 embodiments) vs CPU f32 opened with each",
            "device": gpu.info().device,
            "bound": format!("x0 - noise: cosine >= {CUDA_GROOT_SWITCH_COSINE}, rel-L2 <= {CUDA_GROOT_SWITCH_REL_L2:e}; cosine < 0.9 vs the other embodiment; no allocation; constant device memory"),
            "device_memory_used_before": memory_before,
            "device_memory_used_after": memory_after,
            "results": results,
            "commit": commit(),
        }),
    );
    assert!(pass, "an embodiment switch on CUDA differs from the CPU (see above)");
    assert_eq!(allocations, 0, "steps after switches allocated {allocations} times");
    assert_eq!(memory_before, memory_after, "device memory changed across switches");
}

#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn tiny_fixture_matches_cpu() {
    require_gpu("tiny_fixture_matches_cpu");
    let dir = fixture_dir();
    let golden = Golden::load(&dir);
    let (base_shape, base) = golden.raw("input.image.base_0_rgb");
    let (wrist_shape, wrist) = golden.raw("input.image.left_wrist_0_rgb");
    let noise = golden.f32("input.noise");
    let mut cpu = open(&dir, BackendKind::Cpu);
    let mut gpu = open(&dir, BackendKind::Cuda);
    let state = vec![0.5; cpu.info().state_dim];
    let mut results = Vec::new();
    let mut pass = true;
    // Prompts of different lengths, then a step with only the wrist camera: the same graph
    // replays every time (lengths and masks are device-side values).
    for (p, wrist_only) in [("a", false), ("b", false), ("a", true)] {
        let base_frame = Frame::packed(&base, base_shape[1], base_shape[0], PixelFormat::Rgb8);
        let cameras =
            [(!wrist_only).then_some(base_frame), Some(Frame::packed(&wrist, wrist_shape[1], wrist_shape[0], PixelFormat::Rgb8)), None];
        let mut outs = Vec::new();
        for policy in [&mut cpu, &mut gpu] {
            policy.set_prompt_tokens(&golden.tokens(p)).unwrap();
            let mut actions = vec![0.0; policy.actions_len()];
            policy.step(&Observation { cameras: &cameras, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
            outs.push((actions, policy.buffer("x_t").unwrap()));
        }
        let [(cpu_actions, cpu_x), (gpu_actions, gpu_x)] = [outs.remove(0), outs.remove(0)];
        let (cos, err) = (cosine(&gpu_actions, &cpu_actions), max_abs(&gpu_actions, &cpu_actions));
        // lerobot ran both cameras: its x₀ is the reference of the steps that have them.
        let lerobot = (!wrist_only).then(|| {
            let want = golden.f32(&format!("output.{p}.actions"));
            (cosine(&gpu_x, &want), max_abs(&gpu_x, &want))
        });
        let lerobot_ok = lerobot.is_none_or(|(c, e)| c >= CUDA_TINY_COSINE && e <= CUDA_TINY_MAX_ABS);
        let ok = cos >= CUDA_TINY_COSINE && err <= CUDA_TINY_MAX_ABS && lerobot_ok;
        pass &= ok;
        eprintln!(
            "prompt {p}{}: actions cosine {cos:.6} max-abs {err:.3e}; x0 cosine {:.6}; vs lerobot x0 max-abs {lerobot:?} {}",
            if wrist_only { " (wrist camera only)" } else { "" },
            cosine(&gpu_x, &cpu_x),
            if ok { "ok" } else { "FAIL" }
        );
        results.push(json!({"prompt": p, "wrist_only": wrist_only, "cosine": cos, "max_abs": err, "x0_cosine": cosine(&gpu_x, &cpu_x), "x0_vs_lerobot_f32": lerobot.map(|(c, e)| json!({"cosine": c, "max_abs": e})), "pass": ok}));
    }
    write_result(
        "cuda_tiny_parity.json",
        json!({
            "check": "tiny fixture, CUDA bf16 vs CPU f32 (actions)",
            "model": "pi05 tiny (tests/data/pi05_tiny)",
            "device": gpu.info().device,
            "backend": "cuda",
            "precision": "bf16",
            "reference": "flashrt CPU f32 (actions) and lerobot-0.6.1 f32 (x0)",
            "bound": format!("cosine >= {CUDA_TINY_COSINE}, max_abs <= {CUDA_TINY_MAX_ABS:e}, against both"),
            "results": results,
            "commit": commit(),
        }),
    );
    assert!(pass, "tiny fixture parity failed (see above)");
}

/// The tiny Pi0.5 opened in FP8 on the GPU with a synthetic calibration (every calibrated product
/// in e4m3: any row count, no streamed MLP, so the GPU's FP8 products are exactly the CPU
/// emulation's) against the CPU's FP8 emulation and f32, over the prompts and the missing camera
/// of `tiny_fixture_matches_cpu`; its actions differ from the bf16 graph's (FP8 ran), and its
/// steps allocate nothing. The GPU quantizes bf16 activations, the CPU f32 ones: an input within
/// half a bf16 step of an e4m3 rounding midpoint rounds the other way, so the bound is the FP8
/// tier's (tests/fp8.rs), not bf16's.
#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn tiny_fixture_fp8_matches_cpu_emulation() {
    require_gpu("tiny_fixture_fp8_matches_cpu_emulation");
    let dir = fixture_dir();
    let tmp = tempfile::tempdir().unwrap();
    let calibration_path = tmp.path().join("fp8.json");
    let config = |backend, precision| {
        let mut config = PolicyConfig::new(&dir);
        (config.backend, config.precision, config.threads) = (backend, precision, Some(4));
        config.tokenizer = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer/tokenizer.json"));
        config.fp8_calibration = Some(calibration_path.clone());
        Policy::open(&config).unwrap_or_else(|e| panic!("{backend:?} {precision:?}: {e}"))
    };
    let mut cpu = config(BackendKind::Cpu, Precision::F32);
    // Every product that qualifies in FP8 (the default would keep the vision tower in bf16).
    let settings = CalibrationSettings {
        steps: 3,
        measure_steps: 1,
        min_product_features: 32,
        keep_bf16: Some(vec![]),
        ..CalibrationSettings::default()
    };
    let calibration = calibration::calibrate_synthetic(&mut cpu, &settings, 7).unwrap();
    calibration.save(&calibration_path).unwrap();
    let fp8_weights = calibration.counts().0;
    let mut emulated = config(BackendKind::Cpu, Precision::Fp8);
    // SAFETY: no other thread reads the environment (cuda_checks.sh runs these tests on one
    // thread); the backend reads both settings at open only, and they are cleared right after.
    unsafe {
        std::env::set_var("FRT_FP8_MIN_ROWS", "1");
        std::env::set_var("FRT_NO_FUSED_MLP", "1");
    }
    let mut gpu = config(BackendKind::Cuda, Precision::Fp8);
    unsafe {
        std::env::remove_var("FRT_FP8_MIN_ROWS");
        std::env::remove_var("FRT_NO_FUSED_MLP");
    }
    let mut bf16 = config(BackendKind::Cuda, Precision::Auto);
    assert_eq!(gpu.info().precision, "fp8");
    let explain = gpu.explain();
    assert!(explain.contains(&format!("fp8: {fp8_weights} weights' products as cuBLASLt e4m3 products")), "{explain}");

    let golden = Golden::load(&dir);
    let (base_shape, base) = golden.raw("input.image.base_0_rgb");
    let (wrist_shape, wrist) = golden.raw("input.image.left_wrist_0_rgb");
    let noise = golden.f32("input.noise");
    let state = vec![0.5; gpu.info().state_dim];
    let (mut results, mut pass) = (Vec::new(), true);
    for (p, wrist_only) in [("a", false), ("b", false), ("a", true)] {
        let base_frame = Frame::packed(&base, base_shape[1], base_shape[0], PixelFormat::Rgb8);
        let cameras =
            [(!wrist_only).then_some(base_frame), Some(Frame::packed(&wrist, wrist_shape[1], wrist_shape[0], PixelFormat::Rgb8)), None];
        let mut outs = Vec::new();
        for policy in [&mut gpu, &mut emulated, &mut cpu, &mut bf16] {
            policy.set_prompt_tokens(&golden.tokens(p)).unwrap();
            let mut actions = vec![0.0; policy.actions_len()];
            policy.step(&Observation { cameras: &cameras, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
            outs.push(actions);
        }
        let (vs_emulation, vs_f32) = (cosine(&outs[0], &outs[1]), cosine(&outs[0], &outs[2]));
        let from_bf16 = max_abs(&outs[0], &outs[3]);
        let ok = vs_emulation >= CUDA_FP8_TINY_COSINE && vs_f32 >= CUDA_FP8_TINY_COSINE && from_bf16 > 1e-4;
        pass &= ok;
        eprintln!(
            "prompt {p}{}: FP8 actions cosine {vs_emulation:.6} vs the CPU emulation, {vs_f32:.6} vs f32 (emulation vs f32 {:.6}); max-abs {from_bf16:.3e} from bf16 {}",
            if wrist_only { " (wrist camera only)" } else { "" },
            cosine(&outs[1], &outs[2]),
            if ok { "ok" } else { "FAIL" }
        );
        results.push(json!({"prompt": p, "wrist_only": wrist_only, "cosine_vs_emulation": vs_emulation, "cosine_vs_f32": vs_f32, "max_abs_from_bf16": from_bf16, "pass": ok}));
    }
    drop((cpu, emulated, bf16));
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let frames = NoAllocFrames::new(&mut rng);
    let states: Vec<Vec<f32>> = (0..5).map(|_| (0..state.len()).map(|_| rng.random_range(-2.0..2.0)).collect()).collect();
    let prompts = [golden.tokens("a"), golden.tokens("b")];
    let no_alloc = assert_steps_allocate_nothing(
        &mut gpu,
        "pi05 tiny fp8",
        200,
        |p, k| p.set_prompt_tokens(&prompts[k % 2]).unwrap(),
        |i| (frames.cameras(i, false), &states[i % states.len()]),
    );
    write_result(
        "cuda_fp8_tiny_parity.json",
        json!({
            "check": "tiny fixture, CUDA FP8 (every calibrated product) vs the CPU FP8 emulation and f32 (actions)",
            "device": gpu.info().device,
            "fp8_weights": fp8_weights,
            "bound": format!("cosine >= {CUDA_FP8_TINY_COSINE} against both; max-abs from the bf16 graph > 1e-4"),
            "results": results,
            "no_alloc": no_alloc,
            "commit": commit(),
        }),
    );
    assert!(pass, "tiny FP8 parity failed (see above)");
}

/// Real-time chunking inside the graph: for each case of golden_rtc.safetensors (lerobot's
/// `RTCProcessor`, tools/golden/gen_rtc.py), chunk A then chunk B continuing it, on the device
/// against lerobot's f32 chunk, with the same graph replayed for every continuation (weights and
/// shift are device-side inputs) and no allocation in those steps.
#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn real_time_chunking_matches_lerobot() {
    require_gpu("real_time_chunking_matches_lerobot");
    let dir = fixture_dir();
    let golden = Golden::load(&dir);
    let rtc = Golden(std::fs::read(dir.join("golden_rtc.safetensors")).expect("golden_rtc.safetensors"));
    let (_, meta) = SafeTensors::read_metadata(&rtc.0).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&meta.metadata().as_ref().unwrap()["cases"]).unwrap();
    let (base_shape, base) = golden.raw("input.image.base_0_rgb");
    let (wrist_shape, wrist) = golden.raw("input.image.left_wrist_0_rgb");
    let cameras = [
        Some(Frame::packed(&base, base_shape[1], base_shape[0], PixelFormat::Rgb8)),
        Some(Frame::packed(&wrist, wrist_shape[1], wrist_shape[0], PixelFormat::Rgb8)),
        None,
    ];
    let (noise_a, noise_b) = (golden.f32("input.noise"), rtc.f32("input.rtc.noise"));
    let (mut results, mut pass, mut allocations) = (Vec::new(), true, 0);
    for (i, case) in cases.as_array().unwrap().iter().enumerate() {
        let field = |k: &str| case[k].as_u64().unwrap() as usize;
        let mut config = PolicyConfig::new(&dir);
        config.backend = BackendKind::Cuda;
        config.rtc = Some(RtcConfig {
            schedule: RtcSchedule::parse(case["schedule"].as_str().unwrap()).unwrap(),
            max_guidance_weight: case["max_guidance_weight"].as_f64().unwrap() as f32,
            execution_horizon: field("execution_horizon"),
        });
        let mut policy = Policy::open(&config).unwrap();
        let state = vec![0.5; policy.info().state_dim];
        let mut actions = vec![0.0; policy.actions_len()];
        policy.set_prompt_tokens(&golden.tokens("a")).unwrap();
        policy.step(&Observation { cameras: &cameras, state: &state, noise: Some(&noise_a) }, &mut actions).unwrap();
        policy.set_prompt_tokens(&golden.tokens("b")).unwrap();
        let continuation = Continuation { executed: field("executed"), inference_delay: field("inference_delay") };
        let obs = Observation { cameras: &cameras, state: &state, noise: Some(&noise_b) };
        let (r, n) = counting_alloc::count(|| policy.step_continuing(&obs, Some(continuation), &mut actions));
        r.unwrap();
        allocations += n;
        let (got, want) = (policy.buffer("x_t").unwrap(), rtc.f32(&format!("output.rtc.{i}")));
        let (cos, err) = (cosine(&got, &want), max_abs(&got, &want));
        let ok = cos >= CUDA_TINY_COSINE && err <= CUDA_TINY_MAX_ABS;
        pass &= ok;
        eprintln!("case {i} {case}: guided chunk vs lerobot f32 cosine {cos:.6} max-abs {err:.3e} {}", if ok { "ok" } else { "FAIL" });
        results.push(json!({"case": case, "cosine": cos, "max_abs": err, "pass": ok}));
    }
    write_result(
        "cuda_rtc_parity.json",
        json!({
            "check": "real-time chunking, CUDA bf16 vs lerobot-0.6.1 RTCProcessor f32 (guided x0 of the second chunk)",
            "model": "pi05 tiny (tests/data/pi05_tiny)",
            "backend": "cuda",
            "precision": "bf16",
            "bound": format!("cosine >= {CUDA_TINY_COSINE}, max_abs <= {CUDA_TINY_MAX_ABS:e}"),
            "allocations_in_continuing_steps": allocations,
            "results": results,
            "commit": commit(),
        }),
    );
    assert!(pass, "RTC parity on CUDA failed (see above)");
    assert_eq!(allocations, 0, "continuing steps allocated {allocations} times");
}

/// GR00T's real-time chunking inside the graph: for each case of the GR00T fixture's
/// golden_rtc.safetensors (lerobot's `GrootPolicy.predict_action_chunk`, tools/golden/
/// gen_groot_rtc.py), chunk A then chunk B continuing it, on the device against lerobot's f32
/// chunk, the same graph replayed for every continuation (the prefix rows and the strengths are
/// device-side inputs) and no allocation in those steps. Before any chunk there is nothing to
/// continue: the plain chunk.
#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn groot_real_time_chunking_matches_lerobot() {
    require_gpu("groot_real_time_chunking_matches_lerobot");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/groot_n17_tiny");
    let golden = Golden::load(&dir);
    let rtc = Golden(std::fs::read(dir.join("golden_rtc.safetensors")).expect("golden_rtc.safetensors"));
    let (_, meta) = SafeTensors::read_metadata(&rtc.0).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&meta.metadata().as_ref().unwrap()["cases"]).unwrap();
    let prompts: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    // Case c of golden.safetensors: its prompt, frames (data, width, height), raw state and noise.
    struct Inputs {
        prompt: String,
        frames: Vec<(Vec<u8>, usize, usize)>,
        state: Vec<f32>,
        noise: Vec<f32>,
    }
    let inputs: Vec<Inputs> = (0..2)
        .map(|c| Inputs {
            prompt: prompts["cases"][c]["prompt"].as_str().unwrap().to_string(),
            frames: (0..2)
                .map(|i| {
                    let (shape, data) = golden.raw(&format!("case{c}.frame_{i}"));
                    (data, shape[1], shape[0])
                })
                .collect(),
            state: golden.f32(&format!("case{c}.raw_state")),
            noise: golden.f32(&format!("case{c}.noise")),
        })
        .collect();
    let plain = golden.f32("case1.action_pred");
    let (mut results, mut pass, mut allocations) = (Vec::new(), true, 0);
    for (i, case) in cases.as_array().unwrap().iter().enumerate() {
        let field = |k: &str| case[k].as_u64().unwrap() as usize;
        let mut config = PolicyConfig::new(&dir);
        (config.backend, config.embodiment, config.max_frame_width, config.max_frame_height) =
            (BackendKind::Cuda, Some("tiny_robot".into()), 320, 300);
        config.rtc = Some(RtcConfig { schedule: RtcSchedule::Ramp, execution_horizon: field("execution_horizon"), ..RtcConfig::default() });
        let mut policy = Policy::open(&config).unwrap();
        let mut actions = vec![0.0; policy.actions_len()];
        let continuation = Continuation { executed: field("executed"), inference_delay: field("inference_delay") };
        let mut step = |policy: &mut Policy, c: usize, continuation: Option<Continuation>| {
            let Inputs { prompt, frames, state, noise } = &inputs[c];
            let cameras: Vec<Option<Frame>> = frames.iter().map(|(d, w, h)| Some(Frame::packed(d, *w, *h, PixelFormat::Rgb8))).collect();
            policy.set_prompt(prompt).unwrap();
            let obs = Observation { cameras: &cameras, state, noise: Some(noise) };
            let (r, n) = counting_alloc::count(|| policy.step_continuing(&obs, continuation, &mut actions));
            r.unwrap();
            (n, policy.buffer("x_t").unwrap())
        };
        let mut measured = |what: &str, got: &[f32], want: &[f32]| {
            let (cos, err) = (cosine(got, want), max_abs(got, want));
            let ok = cos >= CUDA_GROOT_TINY_COSINE && err <= CUDA_GROOT_TINY_MAX_ABS;
            pass &= ok;
            eprintln!("case {i} {case}: {what} vs lerobot f32 cosine {cos:.6} max-abs {err:.3e} {}", if ok { "ok" } else { "FAIL" });
            json!({"cosine": cos, "max_abs": err, "pass": ok})
        };
        let first = (i == 0).then(|| {
            let (_, got) = step(&mut policy, 1, Some(continuation));
            measured("first chunk (nothing to continue)", &got, &plain)
        });
        step(&mut policy, 0, None);
        let (n, got) = step(&mut policy, 1, Some(continuation));
        allocations += n;
        let continuing = measured("continuing chunk", &got, &rtc.f32(&format!("output.rtc.{i}")));
        results.push(json!({"case": case, "continuing": continuing, "first_chunk": first}));
    }
    write_result(
        "cuda_groot_rtc_parity.json",
        json!({
            "check": "GR00T N1.7 real-time chunking (ramp), CUDA bf16 vs lerobot-0.6.1 GrootPolicy f32 (the continuing chunk's normalized x0)",
            "model": "groot-n17 tiny (tests/data/groot_n17_tiny)",
            "backend": "cuda",
            "precision": "bf16",
            "bound": format!("cosine >= {CUDA_GROOT_TINY_COSINE}, max_abs <= {CUDA_GROOT_TINY_MAX_ABS:e}"),
            "allocations_in_continuing_steps": allocations,
            "results": results,
            "commit": commit(),
        }),
    );
    assert!(pass, "GR00T RTC parity on CUDA failed (see above)");
    assert_eq!(allocations, 0, "continuing steps allocated {allocations} times");
}

/// The prompt buckets on the device: for prompts ending in each bucket (and on both sides of
/// each boundary), the graph with buckets gives the actions of one opened without them, and the
/// IF node of the right bucket ran: the prefix rows past it keep the previous step's values.
#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn prompt_buckets_match_the_whole_prompt() {
    require_gpu("prompt_buckets_match_the_whole_prompt");
    let open_with = |prompt_buckets: bool| {
        let mut config = PolicyConfig::new(fixture_dir());
        config.backend = BackendKind::Cuda;
        config.prompt_buckets = prompt_buckets;
        Policy::open(&config).unwrap()
    };
    let (mut bucketed, mut whole) = (open_with(true), open_with(false));
    assert_eq!(bucketed.plan().prompt_buckets, [32, 64, 128, 200]);
    let frame: Vec<u8> = (0..64 * 48 * 3).map(|i| (i * 37 % 251) as u8).collect();
    let cameras = [Some(Frame::packed(&frame, 64, 48, PixelFormat::Rgb8)), None, Some(Frame::packed(&frame, 64, 48, PixelFormat::Rgb8))];
    let state = vec![0.25; bucketed.info().state_dim];
    let noise: Vec<f32> = (0..bucketed.noise_len()).map(|i| ((i * 13 % 17) as f32 - 8.0) / 8.0).collect();
    let tokens = |n: usize| (0..n).map(|i| (i * 7 % 250 + 2) as i32).collect::<Vec<i32>>();
    let step = |policy: &mut Policy, n: usize| {
        policy.set_prompt_tokens(&tokens(n)).unwrap();
        let mut actions = vec![0.0; policy.actions_len()];
        policy.step(&Observation { cameras: &cameras, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
        actions
    };
    let (image_rows, slots) = (3 * 256, 200);
    step(&mut bucketed, slots);
    let mut results = Vec::new();
    let mut pass = true;
    for n in [1, 32, 33, 64, 65, 128, 129, 200, 20] {
        let before = bucketed.buffer("prefix_x").unwrap();
        let (got, want) = (step(&mut bucketed, n), step(&mut whole, n));
        let after = bucketed.buffer("prefix_x").unwrap();
        let bucket = bucketed.plan().bucket_for(Some(n - 1)).unwrap();
        let width = before.len() / (image_rows + slots);
        let split = (image_rows + bucket) * width;
        let rows_past_kept = after[split..] == before[split..];
        let bucket_ran = bucket == slots || after[..split] != before[..split];
        let (cos, err) = (cosine(&got, &want), max_abs(&got, &want));
        let ok = err <= CUDA_BUCKET_MAX_ABS && rows_past_kept && bucket_ran;
        pass &= ok;
        eprintln!(
            "{n} prompt tokens, bucket {bucket}: cosine {cos:.6} max-abs {err:.3e}, rows past the bucket kept {rows_past_kept} {}",
            if ok { "ok" } else { "FAIL" }
        );
        results.push(json!({"prompt_tokens": n, "bucket": bucket, "cosine": cos, "max_abs": err, "rows_past_bucket_kept": rows_past_kept, "pass": ok}));
    }
    write_result(
        "cuda_prompt_buckets.json",
        json!({
            "check": "prompt buckets (conditional graph nodes) vs the whole prompt, tiny fixture, CUDA bf16 (actions)",
            "device": bucketed.info().device,
            "bound": format!("max_abs <= {CUDA_BUCKET_MAX_ABS:e}; prefix rows past the bucket untouched"),
            "results": results,
            "commit": commit(),
        }),
    );
    assert!(pass, "a prompt bucket differs from the whole prompt (see above)");
}

// ---- (d) no allocation, constant device memory ----------------------------------------------------

/// Steps `policy` `steps` times on `observation(i)` (changing its prompt every 100 steps with
/// `set_prompt(i)`, which is not the hot path) and checks that no step allocates and the device
/// memory in use stays the same; writes the result for `model`.
fn assert_steps_allocate_nothing<'a>(
    policy: &mut Policy,
    model: &str,
    steps: usize,
    mut set_prompt: impl FnMut(&mut Policy, usize),
    mut observation: impl FnMut(usize) -> ([Option<Frame<'a>>; 3], &'a [f32]),
) -> serde_json::Value {
    let mut actions = vec![0.0; policy.actions_len()];
    set_prompt(policy, 0);
    let (cams, state) = observation(0);
    policy.step(&Observation { cameras: &cams[..policy.info().cameras.len()], state, noise: None }, &mut actions).unwrap();
    let memory_before = flashrt::cuda::used_device_memory().expect("the policy's context is current");
    let mut allocations = 0;
    let started = std::time::Instant::now();
    for i in 1..=steps {
        if i % 100 == 0 {
            set_prompt(policy, i / 100);
        }
        let (cams, state) = observation(i);
        let obs = Observation { cameras: &cams[..policy.info().cameras.len()], state, noise: None };
        let (r, n) = counting_alloc::count(|| policy.step(&obs, &mut actions));
        allocations += n;
        r.unwrap();
        assert!(actions.iter().all(|a| a.is_finite()), "{model}, step {i}: non-finite action");
    }
    let elapsed = started.elapsed();
    let memory_after = flashrt::cuda::used_device_memory().unwrap();
    eprintln!(
        "{model}: {steps} steps in {elapsed:.2?}: {allocations} allocations; device memory in use {memory_before} -> {memory_after} bytes"
    );
    assert_eq!(allocations, 0, "{model}: step allocated {allocations} times over {steps} steps");
    assert_eq!(memory_before, memory_after, "{model}: device memory changed across steps");
    json!({
        "model": model,
        "steps": steps,
        "allocations": allocations,
        "device_memory_used_before": memory_before,
        "device_memory_used_after": memory_after,
        "pass": allocations == 0 && memory_before == memory_after,
    })
}

/// Frames of four sizes and three formats, one to three cameras present per step.
struct NoAllocFrames {
    sizes: [(usize, usize, PixelFormat); 4],
    pixels: Vec<Vec<u8>>,
}

impl NoAllocFrames {
    fn new(rng: &mut ChaCha8Rng) -> NoAllocFrames {
        let sizes =
            [(224, 224, PixelFormat::Rgb8), (640, 480, PixelFormat::Bgr8), (300, 200, PixelFormat::Rgba8), (96, 128, PixelFormat::Rgb8)];
        let pixels = sizes.iter().map(|(w, h, f)| (0..w * h * f.bytes_per_pixel()).map(|_| rng.random()).collect()).collect();
        NoAllocFrames { sizes, pixels }
    }

    fn frame(&self, i: usize) -> Frame<'_> {
        let (w, h, f) = self.sizes[i % self.sizes.len()];
        Frame::packed(&self.pixels[i % self.sizes.len()], w, h, f)
    }

    /// Step `i`'s cameras: the first always, the others on some steps (`all`: every camera, for a
    /// model that needs them all).
    fn cameras(&self, i: usize, all: bool) -> [Option<Frame<'_>>; 3] {
        [Some(self.frame(i)), (all || i % 3 != 0).then(|| self.frame(i + 1)), (all || i % 5 == 0).then(|| self.frame(i + 2))]
    }
}

#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn step_allocates_nothing_and_device_memory_is_constant() {
    require_gpu("step_allocates_nothing_and_device_memory_is_constant");
    const STEPS: usize = 1200;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let frames = NoAllocFrames::new(&mut rng);
    let open = |dir: &Path, embodiment: Option<&str>| {
        let mut config = PolicyConfig::new(dir);
        (config.backend, config.max_frame_width, config.max_frame_height) = (BackendKind::Cuda, 640, 480);
        config.embodiment = embodiment.map(str::to_string);
        Policy::open(&config).unwrap()
    };
    let states = |n: usize, rng: &mut ChaCha8Rng| -> Vec<Vec<f32>> {
        (0..5).map(|_| (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()).collect()
    };

    // Pi0.5: prompt token ids of four lengths, one to three cameras.
    let mut pi05 = open(&fixture_dir(), None);
    let pi05_states = states(pi05.info().state_dim, &mut rng);
    let prompts: Vec<Vec<i32>> =
        [3usize, 40, 120, 200].iter().map(|&n| std::iter::once(2).chain((1..n).map(|_| rng.random_range(4..1000))).collect()).collect();
    let pi05_result = assert_steps_allocate_nothing(
        &mut pi05,
        "pi05 tiny (tests/data/pi05_tiny)",
        STEPS,
        |p, k| p.set_prompt_tokens(&prompts[k % prompts.len()]).unwrap(),
        |i| (frames.cameras(i, false), &pi05_states[i % pi05_states.len()]),
    );
    let device = pi05.info().device.clone();
    drop(pi05);

    // GR00T N1.7: instructions of four lengths, both cameras every step (its frames are
    // required), raw frames of every size and format through the on-device image op.
    let groot_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/groot_n17_tiny");
    let mut groot = open(&groot_dir, Some("tiny_robot"));
    let groot_states = states(groot.info().state_dim, &mut rng);
    let texts = [
        "pick",
        "pick up the cup",
        "pick up the red cup and put it in the bowl",
        "stack the three blocks on the left side of the table from largest to smallest",
    ];
    let groot_result = assert_steps_allocate_nothing(
        &mut groot,
        "groot-n17 tiny (tests/data/groot_n17_tiny)",
        STEPS / 2,
        |p, k| p.set_prompt(texts[k % texts.len()]).unwrap(),
        |i| (frames.cameras(i, true), &groot_states[i % groot_states.len()]),
    );
    write_result(
        "cuda_no_alloc.json",
        json!({
            "check": "zero heap allocations in Policy::step and constant device memory (CUDA backend)",
            "device": device,
            "backend": "cuda",
            "results": [pi05_result, groot_result],
            "commit": commit(),
        }),
    );
    // The counter works: an allocation while armed is seen.
    let (_, n) = counting_alloc::count(|| std::hint::black_box(vec![1u8; 64]));
    assert_eq!(n, 1);
}

/// A device failure during a step (injected: the graph is launched, then its synchronization
/// reports an error while it may still run) marks the policy faulted: that step and every later
/// step or prompt call returns `Error::Faulted` at once, without touching the device; dropping the
/// policy waits for the in-flight graph and releases its device memory; a policy opened afresh in
/// the same process steps as before.
#[test]
#[ignore = "needs a CUDA GPU: tools/device/checks/cuda_checks.sh tests"]
fn a_device_fault_marks_the_policy_unusable_and_a_new_one_works() {
    require_gpu("a_device_fault_marks_the_policy_unusable_and_a_new_one_works");
    let dir = fixture_dir();
    let frame: Vec<u8> = (0..224 * 224 * 3).map(|i| (i * 7 % 251) as u8).collect();
    let cams = [Some(Frame::packed(&frame, 224, 224, PixelFormat::Rgb8)), None, None];
    let step = |policy: &mut Policy, actions: &mut [f32]| {
        let state = vec![0.2; policy.info().state_dim];
        let noise: Vec<f32> = (0..policy.noise_len()).map(|i| (i % 13) as f32 / 6.0 - 1.0).collect();
        policy.step(&Observation { cameras: &cams, state: &state, noise: Some(&noise) }, actions)
    };
    let mut policy = open(&dir, BackendKind::Cuda);
    policy.set_prompt_tokens(&[2, 300, 301, 302]).unwrap();
    let mut reference = vec![0.0; policy.actions_len()];
    step(&mut policy, &mut reference).unwrap();
    let memory_open = flashrt::cuda::used_device_memory().expect("the policy's context is current");
    let policy_bytes = policy.info().memory_bytes;

    policy.inject_fault();
    let mut actions = vec![f32::NAN; policy.actions_len()];
    let first = step(&mut policy, &mut actions).unwrap_err();
    assert!(matches!(first, flashrt::Error::Faulted(_)) && first.to_string().contains("injected fault"), "{first}");
    assert!(actions.iter().all(|a| a.is_nan()), "a faulted step writes no actions");
    let started = std::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(step(&mut policy, &mut actions).unwrap_err().to_string(), first.to_string());
    }
    assert_eq!(policy.set_prompt_tokens(&[2, 5]).unwrap_err().to_string(), first.to_string());
    assert!(started.elapsed() < std::time::Duration::from_millis(100), "refusals must not wait on the device");
    let started = std::time::Instant::now();
    drop(policy);
    let dropped_in = started.elapsed();
    assert!(dropped_in < std::time::Duration::from_secs(10), "drop took {dropped_in:?}");

    let mut policy = open(&dir, BackendKind::Cuda);
    policy.set_prompt_tokens(&[2, 300, 301, 302]).unwrap();
    step(&mut policy, &mut actions).unwrap();
    let memory_reopened = flashrt::cuda::used_device_memory().unwrap();
    let (cos, abs) = (cosine(&actions, &reference), max_abs(&actions, &reference));
    eprintln!(
        "fault: {first}; drop {dropped_in:?}; device memory {memory_open} -> {memory_reopened} bytes (policy {policy_bytes}); \
         reopened vs before: cosine {cos:.7}, max-abs {abs:.2e}"
    );
    write_result(
        "cuda_fault.json",
        json!({
            "check": "an injected device fault marks the policy faulted; drop releases it; a new policy steps as before",
            "model": "pi05 tiny (tests/data/pi05_tiny)",
            "device": policy.info().device,
            "backend": "cuda",
            "error": first.to_string(),
            "drop_ms": dropped_in.as_secs_f64() * 1e3,
            "device_memory_used_open": memory_open,
            "device_memory_used_reopened": memory_reopened,
            "policy_memory_bytes": policy_bytes,
            "cosine": cos,
            "max_abs": abs,
            "commit": commit(),
        }),
    );
    assert!(cos >= CUDA_TINY_COSINE && abs <= CUDA_TINY_MAX_ABS, "reopened policy: cosine {cos}, max-abs {abs}");
    // The faulted policy's weights and arena were released: at most half of it may remain (the
    // driver's own pools move a little between opens).
    assert!(
        memory_reopened < memory_open + policy_bytes / 2,
        "device memory {memory_open} -> {memory_reopened}: the faulted policy leaked"
    );
}

// ---- (c) full size vs lerobot f32 ---------------------------------------------------------------

/// GR00T N1.7 at full size (a `flashrt synth` checkpoint): the CUDA step against lerobot's f32
/// run of the same weights and inputs (tools/device/checks/groot_full_parity.py).
#[test]
#[ignore = "needs a CUDA GPU and lerobot's full-size outputs: tools/device/checks/cuda_checks.sh groot-full"]
fn groot_full_size_matches_lerobot() {
    let dir = std::env::var_os("FRT_GROOT_FULL_DIR")
        .map(PathBuf::from)
        .expect("FRT_GROOT_FULL_DIR: a synthesized full-size GR00T with lerobot's groot_golden.safetensors (cuda_checks.sh groot-full)");
    require_gpu("groot_full_size_matches_lerobot");
    let bytes = std::fs::read(dir.join("groot_golden.safetensors")).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().expect("prompt and embodiment in the metadata");
    let golden = SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        golden.tensor(name).unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    };
    let mut config = PolicyConfig::new(&dir);
    (config.backend, config.embodiment, config.max_frame_width, config.max_frame_height) =
        (BackendKind::Cuda, Some(meta["embodiment"].clone()), 320, 240);
    let mut policy = Policy::open(&config).unwrap();
    policy.set_prompt(&meta["prompt"]).unwrap();
    let frames: Vec<(Vec<u8>, usize, usize)> = (0..2)
        .map(|i| {
            let t = golden.tensor(&format!("frame_{i}")).unwrap();
            (t.data().to_vec(), t.shape()[1], t.shape()[0])
        })
        .collect();
    let cameras: Vec<Option<Frame>> = frames.iter().map(|(d, w, h)| Some(Frame::packed(d, *w, *h, PixelFormat::Rgb8))).collect();
    let (state, noise) = (f32s("state"), f32s("noise"));
    let mut actions = vec![0.0; policy.actions_len()];
    let step = policy.step(&Observation { cameras: &cameras, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
    let (got, want) = (policy.buffer("x_t").unwrap(), f32s("action_pred"));
    let (cos, rl2, err) = (cosine(&got, &want), rel_l2(&got, &want), max_abs(&got, &want));
    let pass = cos >= CUDA_GROOT_FULL_COSINE && rl2 <= CUDA_GROOT_FULL_REL_L2;
    eprintln!(
        "GR00T full size vs lerobot f32: cosine {cos:.7}, rel-L2 {rl2:.4e}, max-abs {err:.4e} over {} values, {} prompt tokens {}",
        got.len(),
        step.prompt_tokens,
        if pass { "ok" } else { "FAIL" }
    );
    write_result(
        "cuda_groot_full_parity.json",
        json!({
            "check": "GR00T N1.7 full size (flashrt synth, random weights), CUDA bf16 vs lerobot-0.6.1 f32 on the GPU, normalized action chunk [40 x 132]",
            "device": policy.info().device,
            "bound": format!("cosine >= {CUDA_GROOT_FULL_COSINE}, rel_l2 <= {CUDA_GROOT_FULL_REL_L2}"),
            "cosine": cos, "rel_l2": rl2, "max_abs": err, "prompt_tokens": step.prompt_tokens, "pass": pass,
            "commit": commit(),
        }),
    );
    assert!(pass, "GR00T full-size parity failed");
}

#[test]
#[ignore = "needs a CUDA GPU and lerobot's full-size outputs: tools/device/checks/cuda_checks.sh full"]
fn full_size_matches_lerobot() {
    let dir = std::env::var_os("FRT_FULL_PARITY_DIR")
        .map(PathBuf::from)
        .expect("FRT_FULL_PARITY_DIR: the directory of lerobot's full-size outputs (tools/device/checks/cuda_checks.sh full sets it)");
    require_gpu("full_size_matches_lerobot");
    let golden = Golden::load(&dir);
    let want = golden.f32("output.actions");
    let judge = |got: &[f32]| {
        let (cos, rl2, err) = (cosine(got, &want), rel_l2(got, &want), max_abs(got, &want));
        (cos, rl2, err, cos >= CUDA_FULL_COSINE && rl2 <= CUDA_FULL_REL_L2)
    };
    let (got, info, prompt_tokens) = full_size_x0(&dir, &golden);
    let (cos, rl2, err, pass) = judge(&got);
    eprintln!("full size vs lerobot f32: cosine {cos:.7}, rel-L2 {rl2:.4e}, max-abs {err:.4e} {}", if pass { "ok" } else { "FAIL" });

    // Control: the same check on a copy whose action_out_proj is 2 % larger must fail, or the bound
    // is too loose to see a wrong weight (the previous bound, rel-L2 ≤ 3e-2, let it pass).
    let control_dir = tempfile::tempdir_in(dir.parent().unwrap_or(Path::new("/tmp"))).unwrap();
    scaled_copy(&dir, control_dir.path(), "action_out_proj.weight", 1.02);
    let (control, _, _) = full_size_x0(control_dir.path(), &golden);
    let (c_cos, c_rl2, c_err, c_pass) = judge(&control);
    eprintln!(
        "control, action_out_proj.weight x1.02: cosine {c_cos:.7}, rel-L2 {c_rl2:.4e}, max-abs {c_err:.4e} {}",
        if c_pass { "PASSED: the bound is too loose" } else { "fails as it must" }
    );
    write_result(
        "cuda_full_parity.json",
        json!({
            "check": "full-size random checkpoint (std 0.02), CUDA bf16 vs lerobot f32, normalized action chunk x0 [50x32]",
            "model": "pi05 full size (flashrt synth --size full)",
            "device": info.device,
            "backend": "cuda",
            "precision": "bf16",
            "views": 2,
            "prompt_tokens": prompt_tokens,
            "steps": info.denoise_steps,
            "horizon": info.horizon,
            "reference": "lerobot-0.6.1 f32",
            "cosine": cos,
            "rel_l2": rl2,
            "max_abs": err,
            "bound": format!("cosine >= {CUDA_FULL_COSINE}, rel_l2 <= {CUDA_FULL_REL_L2:e}"),
            "pass": pass,
            "control": {"perturbation": "action_out_proj.weight scaled by 1.02", "cosine": c_cos, "rel_l2": c_rl2, "max_abs": c_err, "fails_the_bound": !c_pass},
            "commit": commit(),
        }),
    );
    assert!(pass, "full-size parity: cosine {cos}, rel-L2 {rl2}");
    assert!(!c_pass, "the control with a perturbed weight passed the bound (cosine {c_cos}, rel-L2 {c_rl2}): the bound is too loose");
}

/// The CUDA backend's x₀ for the full-size golden inputs in `dir`.
fn full_size_x0(dir: &Path, golden: &Golden) -> (Vec<f32>, flashrt::PolicyInfo, usize) {
    let mut policy = open(dir, BackendKind::Cuda);
    let cams = policy.info().cameras.len();
    let frames: Vec<(Vec<usize>, Vec<u8>)> = (0..2).map(|c| golden.raw(&format!("input.image{c}"))).collect();
    let mut cameras: Vec<Option<Frame>> = frames.iter().map(|(s, d)| Some(Frame::packed(d, s[1], s[0], PixelFormat::Rgb8))).collect();
    cameras.resize(cams, None);
    let tokens = golden.tokens("p");
    policy.set_prompt_tokens(&tokens).unwrap();
    let state = vec![0.0; policy.info().state_dim];
    let mut actions = vec![0.0; policy.actions_len()];
    let noise = golden.f32("input.noise");
    policy.step(&Observation { cameras: &cameras, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
    (policy.buffer("x_t").unwrap(), policy.info(), tokens.len())
}

/// Links every file of `src` into `dst` except `model.safetensors`, which is copied with tensor
/// `name` (bf16 or f32) multiplied by `factor`.
fn scaled_copy(src: &Path, dst: &Path, name: &str, factor: f32) {
    use std::io::{Read, Seek, SeekFrom, Write};
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let file_name = path.file_name().unwrap();
        if file_name != "model.safetensors" {
            std::os::unix::fs::symlink(&path, dst.join(file_name)).unwrap();
        }
    }
    let model = dst.join("model.safetensors");
    std::fs::copy(src.join("model.safetensors"), &model).unwrap();
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(&model).unwrap();
    let mut len = [0u8; 8];
    file.read_exact(&mut len).unwrap();
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    file.read_exact(&mut header).unwrap();
    let header: serde_json::Value = serde_json::from_slice(&header).unwrap();
    let tensor = &header[name];
    let offsets = tensor["data_offsets"].as_array().unwrap_or_else(|| panic!("{name} not in the checkpoint"));
    let (start, end) = (offsets[0].as_u64().unwrap(), offsets[1].as_u64().unwrap());
    let mut data = vec![0u8; (end - start) as usize];
    let at = SeekFrom::Start(8 + u64::from_le_bytes(len) + start);
    file.seek(at).unwrap();
    file.read_exact(&mut data).unwrap();
    match tensor["dtype"].as_str().unwrap() {
        "BF16" => data.chunks_exact_mut(2).for_each(|b| {
            let v = half::bf16::from_le_bytes([b[0], b[1]]).to_f32() * factor;
            b.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        }),
        "F32" => data.chunks_exact_mut(4).for_each(|b| {
            let v = f32::from_le_bytes(b.try_into().unwrap()) * factor;
            b.copy_from_slice(&v.to_le_bytes());
        }),
        other => panic!("{name}: dtype {other}"),
    }
    file.seek(at).unwrap();
    file.write_all(&data).unwrap();
}

//! What the backend measures about its own step: the fastest cuBLASLt algorithm per product shape
//! (at open), and the per-phase and per-kernel profile behind the benchmark (FRT_PROFILE).

use std::collections::HashMap;
use std::path::Path;

use super::device::{Graph, time_replays};
use super::graph::Launcher;
use super::steps::Step;
use crate::error::{Error, Result};

impl Launcher {
    /// Picks, for every distinct GEMM shape, the fastest of cuBLASLt's candidate algorithms
    /// (the heuristic's first choice is not always the fastest for the small-M products of the
    /// denoise loop). Each candidate is timed on all products of that shape in plan order, as a
    /// graph: the weights stream from memory as in a real step. (Timing one product replayed
    /// back to back keeps its weights in L2 and measured gains that a step never saw.) Runs
    /// before the warm-up: the products overwrite only buffers that every step rewrites before
    /// reading.
    pub(super) fn tune_gemms(&mut self) -> Result<()> {
        let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, m) in self.matmuls.iter().enumerate() {
            groups.entry(m.shape_key()).or_default().push(i);
        }
        let mut saved = 0.0;
        for members in groups.values() {
            let candidates = self.matmuls[members[0]].candidates();
            if candidates < 2 {
                continue;
            }
            let mut times = Vec::with_capacity(candidates);
            for c in 0..candidates {
                members.iter().for_each(|&m| self.matmuls[m].choose(c));
                let this = &*self;
                let graph = Graph::capture(this.stream.0, || {
                    members.iter().try_for_each(|&m| {
                        // SAFETY: as in `issue_all`.
                        unsafe { this.issue(&Step::Gemm { matmul: m, workspace: this.workspace }, this.stream.0) }
                    })
                });
                // A candidate that cannot run here is skipped, not fatal.
                times.push(graph.and_then(|g| time_replays(&g, this.stream.0, 3)).unwrap_or_else(|e| {
                    log::debug!("GEMM candidate {c} of {}: {e}", this.matmuls[members[0]].label());
                    f32::INFINITY
                }));
            }
            let best = (0..candidates).min_by(|&a, &b| times[a].total_cmp(&times[b])).unwrap_or(0);
            log::debug!("GEMM {} x{}: candidates {times:.4?} ms, best {best}", self.matmuls[members[0]].label(), members.len());
            if times[0].is_finite() {
                saved += times[0] - times[best];
            }
            members.iter().for_each(|&m| self.matmuls[m].choose(best));
        }
        log::info!("GEMM tuning: {} shapes, {saved:.3} ms per step faster than cuBLASLt's first choices", groups.len());
        self.synchronize("GEMM tuning")
    }

    /// Times every phase of the plan as its own graph (and its GEMMs alone), writes the table to
    /// `path` as JSON and logs it: the per-phase breakdown behind the benchmark (FRT_PROFILE, run
    /// after [`PROFILE_AFTER_RUNS`] steps so that real frames, prompt and state are in place:
    /// absent cameras and masked rows make several kernels cheaper).
    pub(super) fn profile_phases(&self, graph: &Graph, device_name: &str, path: &Path) -> Result<()> {
        const REPS: usize = 20;
        // These steps alone, captured as a graph and replayed.
        let time = |steps: &[&Step]| -> Result<f32> {
            // SAFETY: as in `issue_all`.
            // One stream: a phase's own time, without the overlap of the concurrent one.
            let graph = Graph::capture(self.stream.0, || steps.iter().try_for_each(|s| unsafe { self.issue(s, self.stream.0) }))?;
            time_replays(&graph, self.stream.0, REPS)
        };
        let phases = || {
            self.phase_steps.iter().enumerate().map(|(i, (name, first))| {
                let end = self.phase_steps.get(i + 1).map_or(self.steps.len(), |p| p.1);
                (name.as_str(), *first..end)
            })
        };
        let mut rows = Vec::new();
        for (name, range) in phases() {
            let gemms: Vec<&Step> = self.steps[range.clone()].iter().filter(|s| matches!(s, Step::Gemm { .. })).collect();
            let all: Vec<&Step> = self.steps[range.clone()].iter().collect();
            let (total, gemm) = (time(&all)?, if gemms.is_empty() { 0.0 } else { time(&gemms)? });
            log::info!(
                "phase {name:16} {total:8.3} ms: {:4} GEMMs {gemm:8.3} ms alone, {:4} other launches",
                gemms.len(),
                range.len() - gemms.len()
            );
            rows.push(serde_json::json!({"phase": name, "ms": total, "gemm_ms": gemm, "gemms": gemms.len(), "other_launches": range.len() - gemms.len()}));
        }
        // Where each phase's time goes: the launches of one kind (one kernel, or one GEMM
        // shape) of a phase, alone as a graph. The denoise steps are pooled.
        let mut kinds = Vec::new();
        for (name, range) in phases() {
            let phase = if name.starts_with("denoise") { "denoise" } else { name };
            for step in &self.steps[range] {
                let kind = self.step_kind(step);
                match kinds.iter_mut().find(|(p, k, _): &&mut (&str, String, Vec<&Step>)| *p == phase && *k == kind) {
                    Some((_, _, steps)) => steps.push(step),
                    None => kinds.push((phase, kind, vec![step])),
                }
            }
        }
        let mut by_kind = Vec::new();
        for (phase, kind, steps) in &kinds {
            let ms = time(steps)?;
            log::info!("  {phase:8} {kind:44} {:5} launches {ms:8.3} ms, {:6.2} us each", steps.len(), ms * 1e3 / steps.len() as f32);
            by_kind.push(serde_json::json!({"phase": phase, "kind": kind, "launches": steps.len(), "ms": ms}));
        }
        let whole = time_replays(graph, self.stream.0, REPS)?;
        // What a step pays on the host around the GPU time: the launch call itself, and launch
        // to synchronisation (as `run` does) one step at a time, without back-to-back overlap.
        let (mut launch_call, mut launch_to_sync) = (0.0, 0.0);
        for _ in 0..REPS {
            let t = std::time::Instant::now();
            graph.launch(self.stream.0)?;
            launch_call += t.elapsed().as_secs_f64() * 1e3 / REPS as f64;
            self.synchronize("profile")?;
            launch_to_sync += t.elapsed().as_secs_f64() * 1e3 / REPS as f64;
        }
        log::info!(
            "whole graph {whole:.3} ms per back-to-back replay; one step: launch call {launch_call:.3} ms, launch to sync {launch_to_sync:.3} ms"
        );
        let json = serde_json::json!({
            "device": device_name,
            "whole_graph_ms": whole,
            "launch_call_ms": launch_call,
            "launch_to_sync_ms": launch_to_sync,
            "phases": rows,
            "by_kind": by_kind,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json).expect("json")).map_err(|source| Error::Io { path: path.into(), source })
    }

    /// How many launches of each kernel (cuBLASLt products as one kind) the step makes, most
    /// first: what the lowering fused shows as the fused kernels' names.
    pub(super) fn launch_counts(&self) -> String {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for step in &self.steps {
            let kind = self.step_kind(step);
            let kind = kind.split(' ').next().unwrap_or_default();
            match counts.iter_mut().find(|(k, _)| k == kind) {
                Some((_, n)) => *n += 1,
                None => counts.push((kind.to_string(), 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        counts.iter().map(|(kind, n)| format!("{kind} x{n}")).collect::<Vec<_>>().join(", ")
    }

    /// A step's kernel (or cuBLASLt product shape), for the profile.
    fn step_kind(&self, step: &Step) -> String {
        match step {
            Step::Gemm { matmul, .. } => format!("cublaslt {}", self.matmuls[*matmul].label()),
            Step::Copy { .. } => "copy".into(),
            Step::QuantizeE4m3 { .. } => "quantize_e4m3".into(),
            Step::ScatterRows { .. } => "scatter_rows".into(),
            Step::QwenImagePatches(_) => "qwen_image_patches".into(),
            Step::ImagePatches { .. } => "image_patches".into(),
            Step::AddTable { .. } => "add_table".into(),
            Step::LayerNorm { out, .. } => format!("layer_norm{}", into_e4m3(out)),
            Step::RmsNorm { out, modulation, heads, .. } => {
                let kind = match (modulation.is_some(), *heads > 1) {
                    (true, _) => "ada_rms_norm",
                    (false, true) => "head_rms_norm",
                    (false, false) => "rms_norm",
                };
                format!("{kind}{}", into_e4m3(out))
            }
            Step::GatedResidual { .. } => "gated_residual".into(),
            Step::GatedResidualRmsNorm { out, .. } => format!("gated_residual_rms_norm{}", into_e4m3(out)),
            Step::GatedResidualRmsNormProduct { .. } => "gated_residual_rms_norm_product".into(),
            Step::ProductRmsNorm { .. } => "product_rms_norm".into(),
            Step::Activation { kind, .. } => kind.name().into(),
            Step::GatedActivation { out, gate_up, kind, .. } => {
                let from = if gate_up.dtype == flashrt_kernels::Dtype::E4m3 { " from e4m3" } else { "" };
                format!("{}{from}{}", kind.gated_name(), into_e4m3(out))
            }
            Step::StreamedMlp { fp8: None, .. } => "mlp_stream".into(),
            Step::StreamedMlp { fp8: Some(_), .. } => "mlp_stream e4m3".into(),
            Step::StreamedProduct { out, a, .. } => format!("product_stream {}x{} (k {}) e4m3", out.rows, out.cols, a.cols),
            Step::StreamedQkvRope { a, rope, .. } => format!("qkv_rope_stream {}x{} (k {}) e4m3", a.rows, rope.qkv.cols, a.cols),
            Step::Embed { .. } => "embed".into(),
            Step::Positions { .. } => "positions".into(),
            Step::Rope(a) if a.multi_axis.is_some() => "rope_qkv_axes".into(),
            Step::Rope(_) => "rope_qkv".into(),
            Step::FusedAttention(a) => format!("attention_mq256 {}x{} over {} keys", a.q.rows, a.heads, a.k.rows),
            Step::HeadsAttention(a) => format!(
                "attention_hd{} {}x{} over {} keys, {} groups{}{}",
                a.head_dim,
                a.q.rows / a.groups,
                a.heads,
                a.k.rows / a.groups,
                a.groups,
                if a.causal.is_some() { ", causal" } else { "" },
                into_e4m3(&a.out)
            ),
            Step::Softmax { rows, keys, .. } => format!("softmax {rows}x{keys}"),
            Step::Affine { .. } => "affine".into(),
            Step::RtcGuide { .. } => "rtc_guide".into(),
            Step::RtcPrefix { .. } => "rtc_prefix".into(),
            Step::RtcEuler { .. } => "rtc_euler".into(),
            Step::PromptBucket { .. } => "prompt_bucket".into(),
            Step::SelectWeights { .. } => "select_weights".into(),
            Step::CopyHostInputs { .. } => "copy_host_inputs".into(),
        }
    }
}

/// " into e4m3" for a step output written in e4m3 (an FP8 product's input), else nothing.
fn into_e4m3(out: &flashrt_kernels::Mat) -> &'static str {
    if out.dtype == flashrt_kernels::Dtype::E4m3 { " into e4m3" } else { "" }
}

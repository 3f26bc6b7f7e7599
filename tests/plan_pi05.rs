//! The structure of the Pi0.5 plan that the GPU backend schedules on two streams: the first
//! denoise step is a concurrent phase that needs the prefix only through each layer's K/V cache
//! rows, so it may start each layer as soon as the prefix has filled that layer's cache.

use std::path::Path;

use flashrt::plan::{Accesses, Op, cross_lane_waits};
use flashrt::{BackendKind, Policy, PolicyConfig};

fn tiny_plan_policy() -> Policy {
    let mut config = PolicyConfig::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pi05_tiny"));
    config.backend = BackendKind::Cpu;
    Policy::open(&config).expect("fixture opens")
}

#[test]
fn first_denoise_step_waits_for_each_prefix_layer_cache_and_nothing_later() {
    let policy = tiny_plan_policy();
    let plan = policy.plan();
    let lanes: Vec<usize> = plan.concurrent_ops().into_iter().map(usize::from).collect();
    let accesses: Vec<Accesses> = plan.ops.iter().map(|op| op.accesses(&plan.buffers)).collect();
    let waits = cross_lane_waits(&lanes, &accesses);
    let phase = |name: &str| plan.phase_ranges().into_iter().find(|(n, _)| *n == name).map(|(_, r)| r).expect(name);
    let (prefix, first, second) = (phase("prefix"), phase("denoise step 0"), phase("denoise step 1"));
    assert!(lanes[first.clone()].iter().all(|&l| l == 1), "the first denoise step is the concurrent phase");
    assert_eq!(lanes.iter().filter(|&&l| l == 1).count(), first.len(), "and the only one");

    let is_rope = |i: usize| matches!(plan.ops[i], Op::RopeQkv { .. });
    let prefix_ropes: Vec<usize> = prefix.clone().filter(|&i| is_rope(i)).collect();
    let step_attentions: Vec<usize> = first.clone().filter(|&i| matches!(plan.ops[i], Op::Attention { .. })).collect();
    assert_eq!(prefix_ropes.len(), step_attentions.len(), "one cache per layer");
    for i in first.clone() {
        for &w in &waits[i] {
            assert!(w < prefix.start || prefix_ropes.contains(&w), "op {i} of the first step waits for op {w}, not a cache fill");
        }
    }
    // Layer l's attention follows the prefix's layer-l cache fill, and no later prefix op.
    for (layer, &attention) in step_attentions.iter().enumerate() {
        let latest = (first.start..=attention).flat_map(|k| waits[k].iter().copied()).max();
        assert_eq!(latest, Some(prefix_ropes[layer]), "layer {layer}");
    }
    // The second step (main stream) starts after the first step's last op (the Euler update).
    let latest = (second.start..second.end).flat_map(|k| waits[k].iter().copied()).max();
    assert_eq!(latest, Some(first.end - 1));
}

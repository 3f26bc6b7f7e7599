//! The structure of the Pi0.5 plan that the GPU backend schedules: the prompt buckets (the prefix
//! and the first denoise step once per bucket of prompt slots, one bucket run per step) and, in
//! each bucket, the first denoise step as a concurrent phase that needs the prefix only through
//! each layer's K/V cache rows, so it may start each layer as soon as the prefix has filled that
//! layer's cache.

use std::path::Path;

use flashrt::image::{Frame, PixelFormat};
use flashrt::plan::{Accesses, Op, cross_lane_waits};
use flashrt::{BackendKind, Observation, Policy, PolicyConfig};

#[path = "support/tolerance.rs"]
mod tolerance;

use tolerance::{CPU_BUCKET_MAX_ABS, max_abs};

fn tiny_policy(prompt_buckets: bool) -> Policy {
    let mut config = PolicyConfig::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pi05_tiny"));
    config.backend = BackendKind::Cpu;
    config.prompt_buckets = prompt_buckets;
    Policy::open(&config).expect("fixture opens")
}

#[test]
fn first_denoise_step_waits_for_each_prefix_layer_cache_and_nothing_later() {
    let policy = tiny_policy(true);
    let plan = policy.plan();
    assert_eq!(plan.prompt_buckets, [32, 64, 128, 200], "the fixture's 200 prompt slots");
    let lanes: Vec<usize> = plan.concurrent_ops().into_iter().map(usize::from).collect();
    let accesses: Vec<Accesses> = plan.ops.iter().map(|op| op.accesses(&plan.buffers)).collect();
    let buckets: Vec<_> = plan.sections().into_iter().filter(|s| s.prompt_bucket.is_some()).collect();
    assert_eq!(buckets.iter().map(|s| s.prompt_bucket.unwrap()).collect::<Vec<_>>(), plan.prompt_buckets, "one section per bucket");

    let mut first_step_ops = 0;
    for section in &buckets {
        // A bucket runs as a whole after everything before it: its waits stay inside it.
        let r = section.range.clone();
        let waits = cross_lane_waits(&lanes[r.clone()], &accesses[r.clone()]);
        let phase = |name: &str| {
            let (_, p) = plan.phase_ranges().into_iter().find(|(n, p)| *n == name && r.contains(&p.start)).expect(name);
            p.start - r.start..p.end - r.start
        };
        let (prefix, first) = (phase("prefix"), phase("denoise step 0"));
        assert_eq!(first.end, r.len(), "the first denoise step ends its bucket");
        assert!(lanes[r.clone()][first.clone()].iter().all(|&l| l == 1), "the first denoise step is the concurrent phase");
        first_step_ops += first.len();

        let is_rope = |i: usize| matches!(plan.ops[r.start + i], Op::RopeQkv { .. });
        let prefix_ropes: Vec<usize> = prefix.clone().filter(|&i| is_rope(i)).collect();
        let step_attentions: Vec<usize> = first.clone().filter(|&i| matches!(plan.ops[r.start + i], Op::Attention { .. })).collect();
        assert_eq!(prefix_ropes.len(), step_attentions.len(), "one cache per layer");
        for i in first.clone() {
            for &w in &waits[i] {
                assert!(prefix_ropes.contains(&w), "op {i} of the first step waits for op {w}, not a cache fill");
            }
        }
        // Layer l's attention follows the prefix's layer-l cache fill, and no later prefix op.
        for (layer, &attention) in step_attentions.iter().enumerate() {
            let latest = (first.start..=attention).flat_map(|k| waits[k].iter().copied()).max();
            assert_eq!(latest, Some(prefix_ropes[layer]), "bucket {:?} layer {layer}", section.prompt_bucket);
        }
    }
    assert_eq!(lanes.iter().filter(|&&l| l == 1).count(), first_step_ops, "the first steps are the only concurrent ops");
}

#[test]
fn bucket_for_picks_the_smallest_bucket_that_holds_the_prompt() {
    let policy = tiny_policy(true);
    let plan = policy.plan();
    for (last_valid, bucket) in
        [(None, 32), (Some(0), 32), (Some(31), 32), (Some(32), 64), (Some(127), 128), (Some(128), 200), (Some(199), 200)]
    {
        assert_eq!(plan.bucket_for(last_valid), Some(bucket), "last valid slot {last_valid:?}");
    }
    assert_eq!(tiny_policy(false).plan().bucket_for(Some(3)), None, "no buckets when they are off");
}

/// Steps `policy` with `tokens` as the whole prompt (fixed frames, state and noise); returns the
/// actions.
fn step(policy: &mut Policy, tokens: &[i32]) -> Vec<f32> {
    let frame: Vec<u8> = (0..64 * 48 * 3).map(|i| (i * 37 % 251) as u8).collect();
    let cameras = [Some(Frame::packed(&frame, 64, 48, PixelFormat::Rgb8)), None, Some(Frame::packed(&frame, 64, 48, PixelFormat::Rgb8))];
    let state = vec![0.25; policy.info().state_dim];
    let noise: Vec<f32> = (0..policy.noise_len()).map(|i| ((i * 13 % 17) as f32 - 8.0) / 8.0).collect();
    policy.set_prompt_tokens(tokens).unwrap();
    let mut actions = vec![0.0; policy.actions_len()];
    policy.step(&Observation { cameras: &cameras, state: &state, noise: Some(&noise) }, &mut actions).unwrap();
    actions
}

#[test]
fn every_prompt_bucket_gives_the_actions_of_the_whole_prompt() {
    let (mut bucketed, mut whole) = (tiny_policy(true), tiny_policy(false));
    let image_rows = 3 * 256;
    let width = bucketed.info().prompt_capacity;
    assert_eq!(width, 200);
    // A full prompt first, so that every prefix row holds a value the shorter prompts must not read.
    let tokens = |n: usize| (0..n).map(|i| (i * 7 % 250 + 2) as i32).collect::<Vec<i32>>();
    step(&mut bucketed, &tokens(200));
    for n in [1, 32, 33, 64, 65, 128, 129, 200, 20] {
        let before = bucketed.buffer("prefix_x").unwrap();
        let (got, want) = (step(&mut bucketed, &tokens(n)), step(&mut whole, &tokens(n)));
        let err = max_abs(&got, &want);
        assert!(err <= CPU_BUCKET_MAX_ABS, "{n} prompt tokens: actions differ by {err:e} from the whole prompt's");
        // The bucket ran, not the whole prompt: the prefix rows past it were left as they were.
        let bucket = bucketed.plan().bucket_for(Some(n - 1)).unwrap();
        let lm_width = before.len() / (image_rows + width);
        let after = bucketed.buffer("prefix_x").unwrap();
        assert_eq!(
            after[(image_rows + bucket) * lm_width..],
            before[(image_rows + bucket) * lm_width..],
            "{n} tokens: rows past bucket {bucket}"
        );
        if bucket < width {
            assert_ne!(
                after[..(image_rows + bucket) * lm_width],
                before[..(image_rows + bucket) * lm_width],
                "{n} tokens: bucket {bucket} ran"
            );
        }
    }
}

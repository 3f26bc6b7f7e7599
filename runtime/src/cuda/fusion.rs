//! The fusion passes: which plan ops the lowering fuses or launches early, decided once at open
//! from the plan's shapes and op order — the attention kernel of each attention op, the MLPs run
//! as one streamed launch, and the launches that start as programmatic dependents of the one
//! before them. [`Fusions`] holds every pass's decision and reports them for `explain()`.

use std::fmt::Write as _;

use flashrt_kernels::{AttentionSplit, Kernels};

use super::arena::Elem;
use super::options::Switches;
use crate::plan::{Activation, BufId, Op, Plan, RopeAxes, Span, View, WeightId, WeightRole};

/// What the fusion passes decided for one plan on one device.
pub(super) struct Fusions {
    /// The kernel of each attention op, by op index (`None` for the other ops).
    attention: Vec<Option<AttentionLowering>>,
    /// Why attention ops on the general path took neither fused kernel, with how many did.
    attention_fallbacks: Vec<(String, usize)>,
    /// The first ops of the MLPs lowered as one streamed launch ([`fused_mlps`]), ascending.
    pub(super) mlps: Vec<usize>,
    /// Why MLPs of the streamed kernel's form were left as three launches, with how many.
    mlp_fallbacks: Vec<(String, usize)>,
    /// Those of `mlps` launched as programmatic dependents of their norm ([`after_their_norm`]).
    pub(super) early_mlps: Vec<usize>,
    /// The few-row products lowered as streamed launches ([`streamed_products`]), ascending.
    pub(super) products: Vec<usize>,
    /// Those of `products` launched as programmatic dependents of their norm.
    pub(super) early_products: Vec<usize>,
    /// Those of `products` that run with the RoPE op after them ([`rope_after`]), with its head
    /// dimension, ascending.
    pub(super) qkv_ropes: Vec<(usize, usize)>,
    /// The FP8 streamed MLPs whose input their gated residual norm writes in e4m3
    /// ([`mlps_after_their_gated_norm`]), ascending.
    pub(super) e4m3_mlps: Vec<usize>,
    /// Those of `products` whose input the action tokens' attention right before them writes
    /// through its split merge, in e4m3, and that start under that merge
    /// ([`after_their_attention_merge`]), ascending.
    pub(super) merge_fed_products: Vec<usize>,
    /// The attentions launched under their RoPE, with the keys it does not write
    /// ([`attentions_after_their_rope`]).
    pub(super) early_attentions: Vec<(usize, usize)>,
    /// The gated residual norms that leave their branch zero for the streamed product writing it
    /// next ([`zeroing_readers`]): (the norm's `GatedResidual` op, the product), ascending.
    pub(super) zeroing_readers: Vec<(usize, usize)>,
    /// The cuBLASLt FP8 products whose input the op before them writes in e4m3
    /// ([`e4m3_producers`]), ascending; `fp8_products` counts them all.
    pub(super) e4m3_producers: Vec<usize>,
    /// Those of them whose producer is another FP8 product ([`after_their_fp8_gelu_product`]).
    pub(super) e4m3_from_products: Vec<usize>,
    fp8_products: usize,
    switches: Switches,
}

/// Counts a reason in a `(reason, count)` list.
fn count(reasons: &mut Vec<(String, usize)>, why: String) {
    match reasons.iter_mut().find(|(r, _)| *r == why) {
        Some((_, n)) => *n += 1,
        None => reasons.push((why, 1)),
    }
}

impl Fusions {
    /// Runs every pass. `fused_kernels`: the device has the fused attention kernels (with enough
    /// shared memory); `mlp_runs(rows, width, hidden)`: the streamed MLP kernel runs that shape.
    pub(super) fn run(
        plan: &Plan,
        elems: &[Elem],
        op_lanes: &[usize],
        switches: Switches,
        fused_kernels: bool,
        multiprocessors: usize,
        mlp_runs: impl Fn(usize, usize, usize) -> bool,
    ) -> Fusions {
        let fused_attention = fused_kernels && switches.fused_attention;
        let mut attention_fallbacks = Vec::new();
        let attention = plan
            .ops
            .iter()
            .map(|op| {
                let Op::Attention { q, k, heads, kv_heads, head_dim, groups, causal, .. } = *op else {
                    return None;
                };
                let lowering = AttentionLowering::of(
                    q.rows,
                    k.rows,
                    heads,
                    kv_heads,
                    head_dim,
                    groups,
                    causal.is_some(),
                    fused_attention,
                    multiprocessors,
                );
                if lowering == AttentionLowering::Products {
                    let why = AttentionLowering::why_general(q.rows, k.rows, kv_heads, head_dim, groups, causal.is_some(), fused_attention);
                    count(&mut attention_fallbacks, why);
                }
                Some(lowering)
            })
            .collect();
        let (mlps, mlp_fallbacks) = if switches.fused_mlp {
            fused_mlps(plan, elems, |first, rows, width, hidden| {
                // Not on the second stream: beside the prefix's products its launches would wait
                // for every SM at once.
                if op_lanes[first] != 0 {
                    Some("on the second stream".to_string())
                } else if !mlp_runs(rows, width, hidden) {
                    Some(format!("no grid split of {rows} rows x {width} wide x {hidden} hidden on this device"))
                } else {
                    None
                }
            })
        } else {
            (Vec::new(), Vec::new())
        };
        let (early_mlps, early_attentions) = if switches.early_launch {
            (after_their_norm(plan, &mlps, op_lanes), attentions_after_their_rope(plan, op_lanes))
        } else {
            (Vec::new(), Vec::new())
        };
        Fusions {
            attention,
            attention_fallbacks,
            mlps,
            mlp_fallbacks,
            early_mlps,
            products: Vec::new(),
            early_products: Vec::new(),
            qkv_ropes: Vec::new(),
            merge_fed_products: Vec::new(),
            e4m3_mlps: Vec::new(),
            early_attentions,
            zeroing_readers: Vec::new(),
            e4m3_producers: Vec::new(),
            e4m3_from_products: Vec::new(),
            fp8_products: 0,
            switches,
        }
    }

    /// Which of the cuBLASLt FP8 products (`products`: their op indices) take their input in
    /// e4m3 from the op before them ([`e4m3_producers`]).
    pub(super) fn fp8_producers(&mut self, plan: &Plan, op_lanes: &[usize], products: &[usize]) {
        self.fp8_products = products.len();
        if self.switches.fp8_producers {
            self.e4m3_producers = e4m3_producers(plan, op_lanes, products);
            self.e4m3_from_products = after_their_fp8_gelu_product(plan, op_lanes, products).collect();
        }
    }

    /// The few-row products to stream (FP8 ones, chosen by `Fp8Products::choose` among
    /// [`streamed_products`]), with those launched under their norm.
    pub(super) fn stream_products(&mut self, plan: &Plan, op_lanes: &[usize], mut products: Vec<usize>) {
        products.sort_unstable();
        self.early_products = if self.switches.early_launch { after_their_norm(plan, &products, op_lanes) } else { Vec::new() };
        self.qkv_ropes = products.iter().filter_map(|&i| Some((i, rope_after(plan, op_lanes, i)?))).collect();
        self.merge_fed_products = if self.switches.fp8_expert_e4m3 && self.switches.early_launch {
            let merges = |op: usize| matches!(self.attention[op], Some(AttentionLowering::ActionTokens(split)) if split.splits > 1);
            after_their_attention_merge(plan, op_lanes, &products, merges)
        } else {
            Vec::new()
        };
        self.zeroing_readers = if self.switches.zeroed_branches { zeroing_readers(plan, op_lanes, &products) } else { Vec::new() };
        self.products = products;
    }

    /// The streamed product whose branch the gated residual norm with `GatedResidual` op `i`
    /// leaves zero, if it does.
    pub(super) fn zeroes_branch_for(&self, i: usize) -> Option<usize> {
        self.zeroing_readers.binary_search_by_key(&i, |&(reader, _)| reader).ok().map(|at| self.zeroing_readers[at].1)
    }

    /// Whether streamed product `i` takes its input in e4m3 from the attention merge before it
    /// and starts under it.
    pub(super) fn merge_fed(&self, i: usize) -> bool {
        self.merge_fed_products.binary_search(&i).is_ok()
    }

    /// Which of the FP8 streamed MLPs (`fp8_mlps`: first ops) take their input in e4m3 from their
    /// gated residual norm ([`mlps_after_their_gated_norm`]).
    pub(super) fn e4m3_mlp_inputs(&mut self, plan: &Plan, op_lanes: &[usize], fp8_mlps: &[usize]) {
        self.e4m3_mlps = if self.switches.fp8_expert_e4m3 { mlps_after_their_gated_norm(plan, op_lanes, fp8_mlps) } else { Vec::new() };
    }

    /// Whether op `i` is a streamed product or fused MLP whose e4m3 input the step before writes
    /// into the FP8 input scratch (a QKV product run with its RoPE or an FP8 MLP after its gated
    /// norm, an output projection after its attention's merge).
    pub(super) fn takes_e4m3_from_its_producer(&self, i: usize) -> bool {
        self.qkv_rope(i).is_some() || self.e4m3_mlps.binary_search(&i).is_ok() || self.merge_fed(i)
    }

    /// The head dimension of the RoPE that product `i` runs with, if it does.
    pub(super) fn qkv_rope(&self, i: usize) -> Option<usize> {
        self.qkv_ropes.binary_search_by_key(&i, |&(op, _)| op).ok().map(|at| self.qkv_ropes[at].1)
    }

    /// The kernel of attention op `op`.
    pub(super) fn attention(&self, op: usize) -> AttentionLowering {
        self.attention[op].expect("the attention pass saw every attention op")
    }

    /// Every pass and what it did, for `explain()`: a line each, fallbacks with their reasons.
    pub(super) fn describe(&self) -> String {
        let kernels = |want: fn(&AttentionLowering) -> bool| self.attention.iter().flatten().filter(|l| want(l)).count();
        let mut s = format!(
            "  pass attention kernels: {} op(s) as attention_mq256 (few queries, one K/V head, head dim 256), {} as attention_heads \
             (head dim 48, 64, 72 or 128 over at most 256-320 keys per group), {} as two cuBLASLt products around a softmax \
             (every other shape)\n",
            kernels(|l| matches!(l, AttentionLowering::ActionTokens(_))),
            kernels(|l| *l == AttentionLowering::Heads),
            kernels(|l| *l == AttentionLowering::Products),
        );
        for (why, n) in &self.attention_fallbacks {
            let _ = writeln!(s, "    {n} on the products: {why}");
        }
        let off = |on: bool| if on { "" } else { " (switched off)" };
        let _ = writeln!(s, "  pass streamed MLP: {} MLP(s) as one launch{}", self.mlps.len(), off(self.switches.fused_mlp));
        for (why, n) in &self.mlp_fallbacks {
            let _ = writeln!(s, "    {n} left as three launches: {why}");
        }
        let _ = writeln!(
            s,
            "  pass streamed products: {} few-row FP8 product(s) as streamed launches, {} of them QKV products with their RoPE{}",
            self.products.len(),
            self.qkv_ropes.len(),
            off(self.switches.fp8_streamed)
        );
        let _ = writeln!(
            s,
            "  pass FP8 producers: {} of {} cuBLASLt FP8 product input(s) written in e4m3 by their norm, gated activation, \
             attention or FP8 product with its GELU, the others quantized by a launch of their own{}; {} streamed QKV \
             product and {} streamed MLP input(s) written in e4m3 by their gated residual norm; {} streamed product input(s) \
             written in e4m3 by the attention merge before them{}",
            self.e4m3_producers.len(),
            self.fp8_products,
            off(self.switches.fp8_producers),
            self.qkv_ropes.len(),
            self.e4m3_mlps.len(),
            self.merge_fed_products.len(),
            off(self.switches.fp8_expert_e4m3)
        );
        let _ = writeln!(
            s,
            "  pass early launch: {} streamed MLP(s) and {} streamed product(s) under their norm, {} under their attention's merge, \
             {} attention(s) under their RoPE{}",
            self.early_mlps.len(),
            self.early_products.len(),
            self.merge_fed_products.len(),
            self.early_attentions.len(),
            off(self.switches.early_launch)
        );
        s
    }
}

/// How an attention op runs on the GPU. Decided once per op by [`AttentionLowering::of`], which
/// both the arena's scratch sizing and the lowering ask, so the two cannot disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AttentionLowering {
    /// [`Kernels::attention_mq256`] with this key split: multi-query, head dimension 256, one
    /// group, few queries (the 50 action tokens), no causal mask. Measured on the H200, it beats
    /// the two products around the softmax there; for the 712-token prefix it does not yet.
    ActionTokens(AttentionSplit),
    /// [`Kernels::attention_heads`]: a head dimension it has a form for, at most that form's
    /// keys per group, any masks (SigLIP; GR00T's vision tower, decoder, VL self-attention and
    /// DiT). One launch instead of three per group (per K/V head when grouped).
    Heads,
    /// Two batched cuBLASLt products around the masked softmax kernel, per group.
    Products,
}

impl AttentionLowering {
    /// `fused`: the device runs the fused kernels and they are not switched off.
    #[allow(clippy::too_many_arguments)] // the op's own fields, one to one
    pub(super) fn of(
        queries: usize,
        keys: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        groups: usize,
        causal: bool,
        fused: bool,
        multiprocessors: usize,
    ) -> AttentionLowering {
        if !fused {
            AttentionLowering::Products
        } else if misses_mq256(queries, kv_heads, head_dim, groups, causal).is_none() {
            AttentionLowering::ActionTokens(Kernels::attention_split(queries * heads, keys, multiprocessors))
        } else if misses_heads(head_dim, keys / groups).is_none() {
            AttentionLowering::Heads
        } else {
            AttentionLowering::Products
        }
    }

    /// Why an op on the general path takes neither fused kernel, for `explain()`: the first
    /// condition of each kernel it misses (the op's fields, `causal` and `fused` as for
    /// [`AttentionLowering::of`]).
    pub(super) fn why_general(
        queries: usize,
        keys: usize,
        kv_heads: usize,
        head_dim: usize,
        groups: usize,
        causal: bool,
        fused: bool,
    ) -> String {
        if !fused {
            return "the fused kernels are off or get too little shared memory here".into();
        }
        let mq256 = misses_mq256(queries, kv_heads, head_dim, groups, causal).unwrap_or_default();
        let heads = misses_heads(head_dim, keys / groups).unwrap_or_default();
        format!("{mq256}; attention_heads: {heads}")
    }
}

/// The first condition of [`Kernels::attention_mq256`] an op misses, `None` when it takes it:
/// head dimension 256, one K/V head, at most 64 queries in one group, no causal mask.
fn misses_mq256(queries: usize, kv_heads: usize, head_dim: usize, groups: usize, causal: bool) -> Option<String> {
    if head_dim != 256 {
        Some(format!("head dim {head_dim}"))
    } else if kv_heads != 1 {
        Some(format!("{kv_heads} K/V heads"))
    } else if queries > 64 || groups != 1 {
        Some(format!("{queries} queries (attention_mq256 takes at most 64, one group)"))
    } else if causal {
        Some("a causal mask".into())
    } else {
        None
    }
}

/// The first condition of [`Kernels::attention_heads`] an op misses, `None` when it takes it: a
/// head dimension of [`flashrt_kernels::HEADS_ATTENTION`], at most that form's keys per group.
fn misses_heads(head_dim: usize, keys_per_group: usize) -> Option<String> {
    match flashrt_kernels::heads_attention_max_keys(head_dim) {
        None => Some(format!("no form for head dim {head_dim}")),
        Some(max) if keys_per_group > max => Some(format!("{keys_per_group} keys per group (head dim {head_dim} takes at most {max})")),
        Some(_) => None,
    }
}

/// The MLPs the lowering runs as one [`Kernels::mlp_stream`] launch: the
/// index of each first op of a gate/up product (bf16 in, no bias), the GeGLU over its output and
/// the down product over that (f32 out, overwritten), in one phase, unless `refuses(first op,
/// rows, width, hidden)` says why not (the device cannot run the shape there). The fused kernel
/// never writes the gate/up output, so an MLP whose gate/up output some later op reads (before
/// anything writes that buffer again) is not fused. Also returns why the others of that form
/// were not fused, with how many.
pub(super) fn fused_mlps(
    plan: &Plan,
    elems: &[Elem],
    refuses: impl Fn(usize, usize, usize, usize) -> Option<String>,
) -> (Vec<usize>, Vec<(String, usize)>) {
    let starts_phase = |i: usize| plan.phase_starting_at(i).is_some();
    let matrix = |w: WeightId| match plan.weights[w.0].role {
        WeightRole::Matrix { n, k } => Some((n, k)),
        _ => None,
    };
    let mut fallbacks = Vec::new();
    // The MLPs of the kernel's form, each with its gate/up output and what the device says.
    let of_form = |i: usize| -> Option<(BufId, Option<String>)> {
        let [
            Op::Gemm { a, w: w_gate_up, bias: None, out: gate_up, accumulate: false },
            // The streamed kernel computes the tanh GELU.
            Op::GatedActivation { gate_up: g, out: hidden, kind: Activation::GeluTanh },
            Op::Gemm { a: h, w: w_down, bias: None, out, accumulate: false },
        ] = plan.ops.get(i..i + 3)?
        else {
            return None;
        };
        let (rows, width, hid) = (a.rows, a.cols, hidden.cols);
        let shapes = matrix(*w_gate_up) == Some((2 * hid, width))
            && matrix(*w_down) == Some((width, hid))
            && g == gate_up
            && h == hidden
            && (hidden.rows, out.rows, out.cols) == (rows, rows, width);
        let types = [elems[a.buf.0], elems[hidden.buf.0], elems[out.buf.0]] == [Elem::Bf16, Elem::Bf16, Elem::F32];
        (shapes && types && !starts_phase(i + 1) && !starts_phase(i + 2)).then(|| (gate_up.buf, refuses(i, rows, width, hid)))
    };
    let mut candidates: Vec<(usize, BufId)> = Vec::new();
    for i in 0..plan.ops.len() {
        match of_form(i) {
            Some((gate_up, None)) => candidates.push((i, gate_up)),
            Some((_, Some(why))) => count(&mut fallbacks, why),
            None => {}
        }
    }
    let firsts: Vec<usize> = candidates.iter().map(|c| c.0).collect();
    // Walking on from the MLP past other fused ones (which read nothing of it outside their own
    // kernel): the first op to touch the buffer must write it. Unfusing another MLP only turns
    // its product into such a write, so one pass decides.
    let mut fused = Vec::new();
    for &(i, gate_up) in &candidates {
        if unread_from(plan, i + 3, gate_up, &firsts) {
            fused.push(i);
        } else {
            count(&mut fallbacks, "a later op reads the gate/up output the kernel never writes".into());
        }
    }
    (fused, fallbacks)
}

/// Which shapes this device's streamed FP8 kernels run (`Kernels::mlp_stream_splits`,
/// `Kernels::product_stream_splits`, `Kernels::qkv_rope_stream_fits`).
pub(super) trait StreamedShapes {
    fn mlp(&self, rows: usize, width: usize, hidden: usize) -> bool;
    /// `Kernels::product_stream` into f32.
    fn product(&self, rows: usize, n: usize, k: usize) -> bool;
    /// `Kernels::qkv_rope_stream` with heads of `head_dim`.
    fn qkv_rope(&self, rows: usize, n: usize, k: usize, head_dim: usize) -> bool;
}

/// The few-row products the lowering can run as one streamed FP8 launch each: on the main
/// stream, outside the fused MLPs, bf16 A, no bias, of a weight no op selects (selection rewrites
/// the row-major form) and of a shape the kernel takes; either overwriting an f32 output
/// (`Kernels::product_stream`: the action expert's output projection) or a QKV product with the
/// RoPE after it ([`rope_after`], `Kernels::qkv_rope_stream`: the expert's QKV). In bf16 they
/// stay on cuBLASLt: a streamed bf16 form measured no faster there (QKV 6.2 against 5.5 µs, the
/// output projection 5.9 against 5.7 µs on an H100); in e4m3 the stream carries half the bytes
/// and cuBLASLt would need a quantizing launch before each.
pub(super) fn streamed_products(
    plan: &Plan,
    elems: &[Elem],
    op_lanes: &[usize],
    mlps: &[usize],
    streams: &dyn StreamedShapes,
) -> Vec<usize> {
    let in_mlp = |i: usize| mlps.iter().any(|&m| (m..m + 3).contains(&i));
    let selected = plan.selected_weights();
    (0..plan.ops.len())
        .filter(|&i| {
            let Op::Gemm { a, w, bias: None, out, accumulate: false } = plan.ops[i] else { return false };
            let WeightRole::Matrix { n, k } = plan.weights[w.0].role else { return false };
            let out_elem = elems[out.buf.0];
            op_lanes[i] == 0
                && !in_mlp(i)
                && !selected.contains(&w)
                && elems[a.buf.0] == Elem::Bf16
                && (n, k) == (out.cols, a.cols)
                && match out_elem {
                    Elem::F32 => streams.product(a.rows, n, k),
                    Elem::Bf16 => rope_after(plan, op_lanes, i).is_some_and(|head_dim| streams.qkv_rope(a.rows, n, k, head_dim)),
                    _ => false,
                }
        })
        .collect()
}

/// The head dimension of the RoPE op right after product `i` when the two run as one launch
/// (`Kernels::qkv_rope_stream`): the product's input comes from its gated residual norm
/// ([`from_gated_norm`]) and the single-axis RoPE of its whole output follows on the main stream
/// in the same phase (the expert's QKV).
pub(super) fn rope_after(plan: &Plan, op_lanes: &[usize], i: usize) -> Option<usize> {
    let [Op::Gemm { a, out, .. }, Op::RopeQkv { qkv, axes: RopeAxes::Single, head_dim, .. }] = plan.ops.get(i..i + 2)? else {
        return None;
    };
    let same_run = op_lanes[i + 1] == 0 && plan.phase_starting_at(i + 1).is_none();
    (qkv == out && same_run && from_gated_norm(plan, op_lanes, i, *a, i + 1, &[])).then_some(*head_dim)
}

/// Whether input `a` of op `i` (a product, or the first op of a fused MLP) is written whole by the
/// gated residual and adaRMS norm right before it (the action expert's layer pattern, one
/// `gated_residual_rms_norm` launch), all on the main stream and in one phase, and read by
/// nothing from op `after` on (passing over the fused MLPs at `skipped`) before something writes
/// it again: that norm may write it in e4m3 for an FP8 product.
fn from_gated_norm(plan: &Plan, op_lanes: &[usize], i: usize, a: View, after: usize, skipped: &[usize]) -> bool {
    let Some([Op::GatedResidual { x, .. }, Op::AdaRmsNorm { x: normed, out, .. }]) = i.checked_sub(2).and_then(|j| plan.ops.get(j..i))
    else {
        return false;
    };
    let same_run = (i - 2..=i).all(|j| op_lanes[j] == 0) && (i - 1..=i).all(|j| plan.phase_starting_at(j).is_none());
    x == normed && *out == a && same_run && unread_from(plan, after, a.buf, skipped)
}

/// Of the FP8 streamed MLPs (first ops `mlps`, ascending), those whose input comes from their
/// gated residual norm ([`from_gated_norm`]; the expert's MLPs but the first denoise step's):
/// that norm writes it in e4m3 and the MLP loads it as it is.
pub(super) fn mlps_after_their_gated_norm(plan: &Plan, op_lanes: &[usize], mlps: &[usize]) -> Vec<usize> {
    mlps.iter()
        .copied()
        .filter(|&i| matches!(plan.ops[i], Op::Gemm { a, .. } if from_gated_norm(plan, op_lanes, i, a, i + 3, mlps)))
        .collect()
}

/// The streamed launches (first ops in `firsts`: fused MLPs or products) that directly follow, on
/// the same stream and in the same phase, the RMS norm writing their whole A: launched as its
/// programmatic dependent, each streams its first weight stages while the norm runs.
pub(super) fn after_their_norm(plan: &Plan, firsts: &[usize], op_lanes: &[usize]) -> Vec<usize> {
    let norm_output = |op: &Op| match *op {
        Op::RmsNorm { out, .. } | Op::AdaRmsNorm { out, .. } => Some(out),
        _ => None,
    };
    firsts.iter().copied().filter(|&i| after_its_producer(plan, op_lanes, i, norm_output)).collect()
}

/// For each streamed product into an f32 output (`products`, ascending), the gated residual norm
/// that can leave that output zero for it (`Kernels::product_stream`'s `out_zeroed`, the norm's
/// `zero_y`): the last op before the product to touch the output's buffer must be the
/// `GatedResidual` of a gated residual and adaRMS norm pair whose branch is exactly that view, on
/// the same stream and in the same phase (so it runs before the product in every replay, the same
/// prompt bucket's included). Pairs (that `GatedResidual` op, the product), ascending: the action
/// expert's norm after its MLP and the next layer's output projection.
pub(super) fn zeroing_readers(plan: &Plan, op_lanes: &[usize], products: &[usize]) -> Vec<(usize, usize)> {
    products
        .iter()
        .filter_map(|&i| {
            let Op::Gemm { out, .. } = plan.ops[i] else { return None };
            let touches = |j: &usize| {
                let accesses = plan.ops[*j].accesses(&plan.buffers);
                accesses.reads.iter().chain(&accesses.writes).any(|span| span.buf == out.buf)
            };
            let j = (0..i).rev().find(touches)?;
            let Some([Op::GatedResidual { x, y, .. }, Op::AdaRmsNorm { x: normed, .. }]) = plan.ops.get(j..j + 2) else { return None };
            let same_run =
                op_lanes[j] == op_lanes[i] && op_lanes[j + 1] == op_lanes[i] && (j + 1..=i).all(|k| plan.phase_starting_at(k).is_none());
            (*y == out && x == normed && same_run).then_some((j, i))
        })
        .collect()
}

/// Of the streamed FP8 `products` (ascending), those whose whole input the attention op right
/// before them writes, on the main stream and in the same phase, through a split merge
/// (`merges(op)`: its lowering has several key splits), and that nothing after them reads before
/// something writes it again: the merge writes the input in e4m3 with the product's scale and
/// lets the product start at once, so its weights stream while the merge runs (the action
/// expert's output projection).
pub(super) fn after_their_attention_merge(
    plan: &Plan,
    op_lanes: &[usize],
    products: &[usize],
    merges: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let attention_output = |op: &Op| match *op {
        Op::Attention { out, .. } => Some(out),
        _ => None,
    };
    let mut fed = fed_whole_by(plan, op_lanes, products, attention_output);
    fed.retain(|&i| op_lanes[i] == 0 && merges(i - 1));
    fed
}

/// Of `products` (op indices of products), those whose whole input the op just before them
/// writes, on the same stream and in the same phase (an op of a kind `output` gives the written
/// view of), and nothing after them reads before something writes it again: that op may write
/// the input in the product's e4m3 in place of the buffer.
fn fed_whole_by(plan: &Plan, op_lanes: &[usize], products: &[usize], output: impl Fn(&Op) -> Option<View>) -> Vec<usize> {
    products
        .iter()
        .copied()
        .filter(|&i| {
            let Op::Gemm { a, .. } = plan.ops[i] else { return false };
            after_its_producer(plan, op_lanes, i, &output) && unread_from(plan, i + 1, a.buf, &[])
        })
        .collect()
}

/// Whether, from op `start` on, the first op to touch `buf` writes it (or none touches it): what
/// it held before `start` is read by nobody. The fused MLPs starting at `skipped` ops (three ops
/// each) are passed over: their kernel reads and writes none of its gate/up output.
fn unread_from(plan: &Plan, start: usize, buf: BufId, skipped: &[usize]) -> bool {
    let mut j = start;
    while j < plan.ops.len() {
        if skipped.contains(&j) {
            j += 3;
            continue;
        }
        let accesses = plan.ops[j].accesses(&plan.buffers);
        if accesses.reads.iter().any(|span| span.buf == buf) {
            return false;
        }
        if accesses.writes.iter().any(|span| span.buf == buf) {
            return true;
        }
        j += 1;
    }
    true
}

/// Whether product `i` directly follows, on the same stream and in the same phase, the op writing
/// its whole A, of a kind `output` gives the written view of.
fn after_its_producer(plan: &Plan, op_lanes: &[usize], i: usize, output: impl Fn(&Op) -> Option<View>) -> bool {
    let (Some(producer), Op::Gemm { a, .. }) = (i.checked_sub(1).map(|j| &plan.ops[j]), &plan.ops[i]) else {
        return false;
    };
    output(producer) == Some(*a) && op_lanes[i - 1] == op_lanes[i] && plan.phase_starting_at(i).is_none()
}

/// Of the FP8 `products` (op indices of cuBLASLt FP8 products, ascending), those whose whole
/// input is written, on the same stream and in the same phase, by the op just before them, a
/// layer norm, an RMS norm, a gated activation or an attention, and read by nothing after them
/// before something writes it again: that op writes the input in e4m3 with the product's scale
/// (an attention where its kernel has an e4m3 form: the lowering quantizes the rest), and the
/// buffer it wrote in bf16 is never written. (Vision's and the prefix's norms before the QKV and
/// gate/up products, the prefix's GeGLU before the down product, GR00T's attentions before their
/// output projections.) With them, ascending, the products fed so by another FP8 product and its
/// GELU ([`after_their_fp8_gelu_product`]).
pub(super) fn e4m3_producers(plan: &Plan, op_lanes: &[usize], products: &[usize]) -> Vec<usize> {
    let producer_output = |op: &Op| match *op {
        Op::LayerNorm { out, .. }
        | Op::RmsNorm { out, .. }
        | Op::AdaRmsNorm { out, .. }
        | Op::GatedActivation { out, .. }
        | Op::Attention { out, .. } => Some(out),
        _ => None,
    };
    let mut fed = fed_whole_by(plan, op_lanes, products, producer_output);
    fed.extend(after_their_fp8_gelu_product(plan, op_lanes, products));
    fed.sort_unstable();
    fed
}

/// Of the FP8 `products` (ascending), those whose whole input is the tanh GELU, just before them,
/// over the whole output of another FP8 product just before it (a feed-forward's fc1 → GELU →
/// fc2: GR00T's DiT; SigLIP's where its fc2 runs in FP8), all on one stream and in one phase, and
/// read by nothing after them before something writes it again. The lowering runs that GELU as
/// the first product's cuBLASLt epilogue, which can then write the second's input in e4m3 (D
/// scaled by the input's inverse scale) in place of a quantizing launch.
fn after_their_fp8_gelu_product<'a>(plan: &'a Plan, op_lanes: &'a [usize], products: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
    products.iter().copied().filter(move |&i| {
        let (Some(first), Op::Gemm { a, .. }) = (i.checked_sub(2), &plan.ops[i]) else {
            return false;
        };
        let (Op::Gemm { out, accumulate: false, .. }, Op::Activation { x, kind: Activation::GeluTanh }) =
            (&plan.ops[first], &plan.ops[first + 1])
        else {
            return false;
        };
        products.binary_search(&first).is_ok()
            && out == x
            && x == a
            && op_lanes[first..=i].iter().all(|&lane| lane == op_lanes[i])
            && (first + 1..=i).all(|j| plan.phase_starting_at(j).is_none())
            && unread_from(plan, i + 1, a.buf, &[])
    })
}

/// The attentions that directly follow, on the main stream and in the same phase, the RoPE op
/// writing their queries, each with how many leading keys of its K and V that op does not write:
/// launched as RoPE's programmatic dependent, the action tokens' attention loads those keys while
/// RoPE runs. Ascending by op. (On the second stream an attention also
/// waits for the prefix's cache rows, and the lowering keeps that stream's launches plain.)
pub(super) fn attentions_after_their_rope(plan: &Plan, op_lanes: &[usize]) -> Vec<(usize, usize)> {
    (1..plan.ops.len())
        .filter_map(|i| {
            // A multi-axis RoPE launches plainly (its kernel starts no dependent).
            let (Op::RopeQkv { qkv, axes: RopeAxes::Single, .. }, Op::Attention { q, k, v, key_valid, .. }) =
                (&plan.ops[i - 1], &plan.ops[i])
            else {
                return None;
            };
            if q.buf != qkv.buf || op_lanes[i - 1] != 0 || op_lanes[i] != 0 || plan.phase_starting_at(i).is_some() {
                return None;
            }
            let writes = plan.ops[i - 1].accesses(&plan.buffers).writes;
            let written = |s: Span| writes.iter().any(|w| w.overlaps(&s));
            if key_valid.is_some_and(|b| written(Span::whole(b, &plan.buffers))) {
                return None;
            }
            let first_written = |view: View| (0..view.rows).find(|&r| written(view.rows(r, 1).span())).unwrap_or(view.rows);
            Some((i, first_written(*k).min(first_written(*v))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::arena::element_types;
    use crate::cuda::fp8::Fp8Products;
    use crate::cuda::weights::{Tiling, stream_weight_tiling};
    use crate::plan::BufType;

    /// The expert's MLP shape in small: a → gate/up → GeGLU → down, `out` read by a residual
    /// (so f32); `extra` adds what must rule the fusion out.
    fn mlp_plan(extra: impl FnOnce(&mut Plan, WeightId, View)) -> (Plan, usize) {
        let mut plan = Plan::default();
        let (x, a, gate_up, hidden, out) = (
            plan.matrix("x", 4, 64),
            plan.matrix("a", 4, 64),
            plan.matrix("gate_up", 4, 256),
            plan.matrix("hidden", 4, 128),
            plan.matrix("out", 4, 64),
        );
        let (w_gate_up, w_down) =
            (plan.weight("gate_up", WeightRole::Matrix { n: 256, k: 64 }), plan.weight("down", WeightRole::Matrix { n: 64, k: 128 }));
        let modulation = plan.weight("modulation", WeightRole::Vector);
        plan.push(Op::RmsNorm { x, out: a, weight: None, eps: 1e-6 });
        let first = plan.ops.len();
        plan.push(Op::Gemm { a, w: w_gate_up, bias: None, out: gate_up, accumulate: false });
        plan.push(Op::GatedActivation { gate_up, out: hidden, kind: Activation::GeluTanh });
        plan.push(Op::Gemm { a: hidden, w: w_down, bias: None, out, accumulate: false });
        plan.push(Op::GatedResidual { x, y: out, modulation });
        extra(&mut plan, w_down, gate_up);
        (plan, first)
    }

    #[test]
    fn fp8_inputs_come_from_their_producer_only_where_nothing_else_reads_them() {
        let (plan, first) = mlp_plan(|_, _, _| {});
        // The norm before gate/up and the GeGLU before down write their product's whole input.
        let (gate_up, down) = (first, first + 2);
        let lanes = vec![0; plan.ops.len()];
        assert_eq!(e4m3_producers(&plan, &lanes, &[gate_up, down]), vec![gate_up, down]);
        // Only the FP8 products count; on another stream than its producer a product keeps its
        // own quantizing launch.
        assert_eq!(e4m3_producers(&plan, &lanes, &[down]), vec![down]);
        let mut split = lanes.clone();
        split[down] = 1;
        assert_eq!(e4m3_producers(&plan, &split, &[gate_up, down]), vec![gate_up]);
        // A later op reads the GeGLU output (it would find it unwritten): down quantizes it.
        let (plan, _) = mlp_plan(|plan, _, _| {
            let Op::GatedActivation { out: hidden, .. } = plan.ops[first + 1] else { unreachable!() };
            let y = plan.matrix("y", 4, 128);
            plan.push(Op::Copy { dst: y, src: hidden });
        });
        let lanes = vec![0; plan.ops.len()];
        assert_eq!(e4m3_producers(&plan, &lanes, &[gate_up, down]), vec![gate_up]);
        // Rewritten before anything reads it again (the next layer's norm): unread.
        let (plan, _) = mlp_plan(|plan, _, _| {
            let Op::RmsNorm { x, out: a, .. } = plan.ops[first - 1] else { unreachable!() };
            plan.push(Op::RmsNorm { x, out: a, weight: None, eps: 1e-6 });
            plan.push(Op::Copy { dst: x, src: a });
        });
        let lanes = vec![0; plan.ops.len()];
        assert_eq!(e4m3_producers(&plan, &lanes, &[gate_up, down]), vec![gate_up, down]);
    }

    /// A feed-forward as GR00T's DiT has it: norm → fc1 → GELU (in place) → fc2 adding into the
    /// residual `x`; `extra` adds what must rule the e4m3 input out. Returns fc1's op index.
    fn feed_forward_plan(extra: impl FnOnce(&mut Plan, View)) -> (Plan, usize) {
        let mut plan = Plan::default();
        let (x, h, ff) = (plan.matrix("x", 4, 64), plan.matrix("h", 4, 64), plan.matrix("ff", 4, 256));
        let (fc1, fc2) =
            (plan.weight("fc1", WeightRole::Matrix { n: 256, k: 64 }), plan.weight("fc2", WeightRole::Matrix { n: 64, k: 256 }));
        plan.push(Op::LayerNorm { x, out: h, affine: None, modulation: None, eps: 1e-6 });
        let first = plan.ops.len();
        plan.push(Op::Gemm { a: h, w: fc1, bias: None, out: ff, accumulate: false });
        plan.push(Op::Activation { x: ff, kind: Activation::GeluTanh });
        plan.push(Op::Gemm { a: ff, w: fc2, bias: None, out: x, accumulate: true });
        extra(&mut plan, ff);
        (plan, first)
    }

    #[test]
    fn an_fp8_product_writes_the_next_ones_input_in_e4m3_only_through_its_own_gelu() {
        let (plan, fc1) = feed_forward_plan(|_, _| {});
        let fc2 = fc1 + 2;
        let lanes = vec![0; plan.ops.len()];
        // The norm feeds fc1; fc1 with its GELU feeds fc2, when both run in FP8.
        assert_eq!(e4m3_producers(&plan, &lanes, &[fc1, fc2]), vec![fc1, fc2]);
        // A bf16 fc1 cannot write e4m3: fc2 quantizes its input.
        assert_eq!(e4m3_producers(&plan, &lanes, &[fc2]), Vec::<usize>::new());
        let mut split = lanes.clone();
        split[fc2] = 1;
        assert_eq!(e4m3_producers(&plan, &split, &[fc1, fc2]), vec![fc1]);
        // Something else reads the GELU output later: it must exist in bf16.
        let (plan, _) = feed_forward_plan(|plan, ff| {
            let y = plan.matrix("y", 4, 256);
            plan.push(Op::Copy { dst: y, src: ff });
        });
        assert_eq!(e4m3_producers(&plan, &lanes_of(&plan), &[fc1, fc2]), vec![fc1]);
        // Another activation than the tanh GELU (no cuBLASLt epilogue here), or a GELU over part
        // of fc1's output, leaves the quantizing launch.
        let (plan, _) = feed_forward_plan(|plan, ff| plan.ops[fc1 + 1] = Op::Activation { x: ff, kind: Activation::Silu });
        assert_eq!(e4m3_producers(&plan, &lanes_of(&plan), &[fc1, fc2]), vec![fc1]);
        let (plan, _) = feed_forward_plan(|plan, ff| plan.ops[fc1 + 1] = Op::Activation { x: ff.cols(0, 128), kind: Activation::GeluTanh });
        assert_eq!(e4m3_producers(&plan, &lanes_of(&plan), &[fc1, fc2]), vec![fc1]);
    }

    #[test]
    fn an_attention_writes_its_output_projections_input_in_e4m3_only_where_nothing_else_reads_it() {
        let attention_then_projection = |extra: &dyn Fn(&mut Plan, View)| {
            let mut plan = Plan::default();
            let (q, kv, attn, x) = (plan.matrix("q", 4, 96), plan.matrix("kv", 8, 96), plan.matrix("attn", 4, 96), plan.matrix("x", 4, 64));
            let o = plan.weight("o", WeightRole::Matrix { n: 64, k: 96 });
            let (heads, kv_heads, head_dim, groups) = (2, 2, 48, 1);
            let (key_valid, query_valid, causal) = (None, None, None);
            plan.push(Op::Attention { q, k: kv, v: kv, out: attn, heads, kv_heads, head_dim, groups, key_valid, query_valid, causal });
            plan.push(Op::Gemm { a: attn, w: o, bias: None, out: x, accumulate: true });
            extra(&mut plan, attn);
            plan
        };
        let plan = attention_then_projection(&|_, _| {});
        assert_eq!(e4m3_producers(&plan, &lanes_of(&plan), &[1]), vec![1]);
        let plan = attention_then_projection(&|plan, attn| {
            let y = plan.matrix("y", 4, 96);
            plan.push(Op::Copy { dst: y, src: attn });
        });
        assert_eq!(e4m3_producers(&plan, &lanes_of(&plan), &[1]), Vec::<usize>::new());
    }

    fn lanes_of(plan: &Plan) -> Vec<usize> {
        vec![0; plan.ops.len()]
    }

    #[test]
    fn the_expert_mlp_fuses_only_where_nothing_else_needs_its_parts() {
        let refuse = |runs: bool| move |_, _, _, _| (!runs).then(|| "cannot".to_string());
        let fused = |plan: &Plan, runs: bool| fused_mlps(plan, &element_types(plan), refuse(runs)).0;
        let (plan, first) = mlp_plan(|_, _, _| {});
        assert_eq!(fused(&plan, true), vec![first]);
        let (w_gate_up, w_down) = (WeightId(0), WeightId(1));
        let tiling = |plan: &Plan| -> Vec<(WeightId, usize, bool)> {
            stream_weight_tiling(plan, &[first], &[], &[], &Fp8Products::default())
                .iter()
                .map(|t| (t.w, t.paired_half, t.in_place))
                .collect()
        };
        assert_eq!(tiling(&plan), vec![(w_gate_up, 128, true), (w_down, 0, true)]);
        // The kernel cannot run the shape or on that stream: named as the reason.
        assert_eq!(fused_mlps(&plan, &element_types(&plan), refuse(false)), (vec![], vec![("cannot".to_string(), 1)]));
        // The down weight serves another product too: fused, with a tiled copy of it.
        let (plan, _) = mlp_plan(|plan, w_down, _| {
            let (h, y) = (plan.matrix("h2", 4, 128), plan.matrix("y2", 4, 64));
            plan.push(Op::Gemm { a: h, w: w_down, bias: None, out: y, accumulate: false });
        });
        assert_eq!(fused(&plan, true), vec![first]);
        assert_eq!(tiling(&plan), vec![(w_gate_up, 128, true), (w_down, 0, false)]);
        // In FP8 the fused kernel reads e4m3 tiles, which nothing else reads (the other product
        // stays bf16 under the row bound): both tiled in place over their e4m3 upload.
        let scales = Some(crate::fp8::ProductScales { activation: 0.5, weight: 0.25, output: None });
        let every_shape = Shapes { mlp: true, product: true };
        let fp8 = Fp8Products::choose(&plan, &[scales, scales], &[first], &[], 128, false, &every_shape);
        let e4m3 = |w: WeightId, paired_half: usize| Tiling { w, paired_half, elem: Elem::E4m3, in_place: true };
        assert_eq!(stream_weight_tiling(&plan, &[first], &[], &[], &fp8), vec![e4m3(w_gate_up, 128), e4m3(w_down, 0)]);
        assert!(fp8.chosen.is_empty() && fp8.kept.is_empty(), "{fp8:?}");
        // With the first denoise step in FP8 the other product runs on cuBLASLt in FP8, under the
        // row bound, from a row-major e4m3 copy beside the tiles: down is uploaded in e4m3 only.
        let fp8 = Fp8Products::choose(&plan, &[scales, scales], &[first], &[], 128, true, &every_shape);
        assert_eq!(fp8.chosen.keys().collect::<Vec<_>>(), vec![&w_down.0]);
        let copy = Tiling { in_place: false, ..e4m3(w_down, 0) };
        assert_eq!(stream_weight_tiling(&plan, &[first], &[], &[], &fp8), vec![e4m3(w_gate_up, 128), copy]);
        let uses = crate::cuda::weights::weight_uses(&plan, &element_types(&plan), &fp8);
        assert_eq!(uses.iter().filter(|u| u.0 == w_down.0).collect::<Vec<_>>(), vec![&(w_down.0, Elem::E4m3)]);
        // Unfused, the other product of down streams too: down tiled once, and in place.
        let products = [first, first + 2, first + 4];
        let fp8 = Fp8Products::choose(&plan, &[scales, scales], &[], &products, 128, false, &every_shape);
        assert_eq!(stream_weight_tiling(&plan, &[], &products, &[], &fp8), vec![e4m3(w_gate_up, 0), e4m3(w_down, 0)]);
        // A QKV product run with its RoPE pairs each head's halves.
        assert_eq!(stream_weight_tiling(&plan, &[], &products[..1], &[(products[0], 64)], &fp8), vec![e4m3(w_gate_up, 32)]);
        // Another op reads the gate/up output the fused kernel never writes.
        let (plan, _) = mlp_plan(|plan, _, gate_up| plan.push(Op::Activation { x: gate_up, kind: Activation::GeluTanh }));
        let (none, why) = fused_mlps(&plan, &element_types(&plan), refuse(true));
        assert!(none.is_empty() && why[0].0.contains("reads the gate/up output"), "{why:?}");
        // An unfused MLP after it (as on the second stream) writes the buffer before its GeGLU reads it.
        let mut second = 0;
        let (plan, first) = mlp_plan(|plan, _, gate_up| {
            let (a, hidden, out) = (plan.matrix("a2", 4, 64), plan.matrix("hidden2", 4, 128), plan.matrix("out2", 4, 64));
            let (w1, w2) =
                (plan.weight("gate_up2", WeightRole::Matrix { n: 256, k: 64 }), plan.weight("down2", WeightRole::Matrix { n: 64, k: 128 }));
            second = plan.ops.len();
            plan.push(Op::Gemm { a, w: w1, bias: None, out: gate_up, accumulate: false });
            plan.push(Op::GatedActivation { gate_up, out: hidden, kind: Activation::GeluTanh });
            plan.push(Op::Gemm { a: hidden, w: w2, bias: None, out, accumulate: false });
        });
        let only = |op: usize| move |i: usize, _, _, _| (i != op).then(|| "not this one".to_string());
        assert_eq!(fused_mlps(&plan, &element_types(&plan), only(first)).0, vec![first]);
        assert_eq!(fused_mlps(&plan, &element_types(&plan), only(second)).0, vec![second]);
        assert_eq!(fused(&plan, true), vec![first, second]);
        // A phase starting inside the sequence.
        let mut plan = Plan::default();
        let (a, gate_up, hidden, out) =
            (plan.matrix("a", 4, 64), plan.matrix("gate_up", 4, 256), plan.matrix("hidden", 4, 128), plan.matrix("out", 4, 64));
        let (w1, w2) =
            (plan.weight("gate_up", WeightRole::Matrix { n: 256, k: 64 }), plan.weight("down", WeightRole::Matrix { n: 64, k: 128 }));
        plan.push(Op::Gemm { a, w: w1, bias: None, out: gate_up, accumulate: false });
        plan.push(Op::GatedActivation { gate_up, out: hidden, kind: Activation::GeluTanh });
        plan.phase("next");
        plan.push(Op::Gemm { a: hidden, w: w2, bias: None, out, accumulate: false });
        assert!(fused(&plan, true).is_empty());
    }

    #[test]
    fn the_passes_report_what_they_fused_and_why_the_rest_fell_back() {
        let (plan, first) = mlp_plan(|_, _, _| {});
        let (elems, lanes) = (element_types(&plan), vec![0; plan.ops.len()]);
        let run = |switches: Switches, lanes: &[usize], runs: bool| Fusions::run(&plan, &elems, lanes, switches, true, 132, |_, _, _| runs);
        let all = run(Switches::default(), &lanes, true);
        assert_eq!((all.mlps.clone(), all.early_mlps.clone()), (vec![first], vec![first]));
        let text = all.describe();
        assert!(
            text.contains("pass streamed MLP: 1 MLP(s) as one launch\n")
                && text.contains(
                    "1 streamed MLP(s) and 0 streamed product(s) under their norm, 0 under their attention's merge, 0 attention(s) \
                     under their RoPE"
                ),
            "{text}"
        );
        let refused = run(Switches::default(), &lanes, false).describe();
        assert!(refused.contains("1 left as three launches: no grid split of 4 rows x 64 wide x 128 hidden"), "{refused}");
        let mut second = lanes.clone();
        second[first] = 1;
        assert!(run(Switches::default(), &second, true).describe().contains("1 left as three launches: on the second stream"));
        let off = run(Switches { fused_mlp: false, early_launch: false, ..Switches::default() }, &lanes, true);
        assert!(off.mlps.is_empty() && off.early_mlps.is_empty());
        assert!(off.describe().contains("0 MLP(s) as one launch (switched off)"), "{}", off.describe());
        // Unfused, its two products may stream (the FP8 choice picks them): gate/up right after
        // its norm starts under it, when early launches are on.
        let mut unfused = run(Switches { fused_mlp: false, ..Switches::default() }, &lanes, true);
        unfused.stream_products(&plan, &lanes, vec![first + 2, first]);
        assert_eq!((unfused.products.clone(), unfused.early_products.clone()), (vec![first, first + 2], vec![first]));
        assert!(
            unfused.describe().contains("pass streamed products: 2 few-row FP8 product(s) as streamed launches, 0 of them QKV"),
            "{}",
            unfused.describe()
        );
        let mut late = run(Switches { fused_mlp: false, early_launch: false, ..Switches::default() }, &lanes, true);
        late.stream_products(&plan, &lanes, vec![first]);
        assert!(late.early_products.is_empty());
        assert!(run(Switches { fp8_streamed: false, ..Switches::default() }, &lanes, true).describe().contains("(switched off)"));
    }

    /// A device whose streamed kernels take every shape (or none).
    struct Shapes {
        mlp: bool,
        product: bool,
    }

    impl StreamedShapes for Shapes {
        fn mlp(&self, _: usize, _: usize, _: usize) -> bool {
            self.mlp
        }
        fn product(&self, _: usize, _: usize, _: usize) -> bool {
            self.product
        }
        fn qkv_rope(&self, _: usize, _: usize, _: usize, _: usize) -> bool {
            self.product
        }
    }

    #[test]
    fn only_plain_few_row_products_of_unselected_weights_stream() {
        let streamed =
            |plan: &Plan, lanes: &[usize]| streamed_products(plan, &element_types(plan), lanes, &[], &Shapes { mlp: false, product: true });
        let (plan, first) = mlp_plan(|_, _, _| {});
        let lanes = vec![0; plan.ops.len()];
        // Down (into f32); not gate/up, whose bf16 output no RoPE follows.
        assert_eq!(streamed(&plan, &lanes), vec![first + 2]);
        // Inside a fused MLP: the MLP's kernel runs them.
        assert!(streamed_products(&plan, &element_types(&plan), &lanes, &[first], &Shapes { mlp: true, product: true }).is_empty());
        // Not on the second stream, nor where the kernel refuses the shape.
        let mut second = lanes.clone();
        second[first + 2] = 1;
        assert!(streamed(&plan, &second).is_empty());
        assert!(streamed_products(&plan, &element_types(&plan), &lanes, &[], &Shapes { mlp: false, product: false }).is_empty());
        // Not with a bias, nor accumulating, nor of a selected weight.
        let mut plain = plan.clone();
        let bias = plain.weight("bias", WeightRole::Vector);
        if let Op::Gemm { bias: b, .. } = &mut plain.ops[first] {
            *b = Some(bias);
        }
        if let Op::Gemm { accumulate, .. } = &mut plain.ops[first + 2] {
            *accumulate = true;
        }
        assert!(streamed(&plain, &lanes).is_empty());
        let (mut selecting, _) = mlp_plan(|_, _, _| {});
        let table = selecting.weight("table", WeightRole::MatrixStack { entries: 2, n: 64, k: 128 });
        let index = selecting.host_buffer("index", BufType::I32, 1, crate::plan::HostIo::Input);
        selecting.ops.insert(0, Op::SelectWeight { index, entries: 2, table, dst: WeightId(1) });
        assert!(streamed(&selecting, &vec![0; selecting.ops.len()]).is_empty());
    }

    #[test]
    fn an_fp8_mlp_takes_its_input_in_e4m3_only_from_its_gated_residual_norm() {
        // mlp_plan's plain RMS norm before the MLP: no.
        let (plan, first) = mlp_plan(|_, _, _| {});
        let lanes = vec![0; plan.ops.len()];
        assert!(mlps_after_their_gated_norm(&plan, &lanes, &[first]).is_empty());
        // The expert's gated residual and adaRMS norm before it: yes, unless on the second stream
        // or something after the MLP reads the norm's output.
        let gated = |extra: bool| {
            let (mut plan, first) = mlp_plan(|plan, _, _| {
                if extra {
                    let (a, w, out) = (plan.find_buffer("a").unwrap(), WeightId(0), plan.matrix("late", 4, 256));
                    plan.push(Op::Gemm {
                        a: View { buf: a, offset: 0, rows: 4, cols: 64, stride: 64 },
                        w,
                        bias: None,
                        out,
                        accumulate: false,
                    });
                }
            });
            let Op::RmsNorm { x, out, eps, .. } = plan.ops[first - 1] else { panic!("mlp_plan has the norm before the MLP") };
            let (y, modulation) = (plan.matrix("y", 4, 64), plan.weight("m", WeightRole::Vector));
            plan.ops[first - 1] = Op::AdaRmsNorm { x, out, modulation, eps };
            plan.ops.insert(first - 1, Op::GatedResidual { x, y, modulation });
            (plan, first + 1)
        };
        let (plan, first) = gated(false);
        let lanes = vec![0; plan.ops.len()];
        assert_eq!(mlps_after_their_gated_norm(&plan, &lanes, &[first]), vec![first]);
        let mut second = lanes.clone();
        second[first - 2] = 1;
        assert!(mlps_after_their_gated_norm(&plan, &second, &[first]).is_empty());
        let (reread, first) = gated(true);
        assert!(mlps_after_their_gated_norm(&reread, &vec![0; reread.ops.len()], &[first]).is_empty());
    }

    /// The expert's layer boundary in small: the gated residual over an f32 branch and the
    /// adaRMS norm, an op between that leaves the branch alone, then a product into the branch
    /// (the next output projection); `change` alters it before the pass looks.
    fn branch_plan(change: impl FnOnce(&mut Plan)) -> (Plan, usize) {
        let mut plan = Plan::default();
        let (x, h, a) = (plan.matrix("x", 4, 128), plan.matrix("h", 4, 128), plan.matrix("a", 4, 128));
        let branch = plan.buffer("branch", BufType::F32, 4 * 128);
        let branch = View { buf: branch, offset: 0, rows: 4, cols: 128, stride: 128 };
        let (gate, norm) = (plan.weight("gate", WeightRole::Vector), plan.weight("norm", WeightRole::Vector));
        let w = plan.weight("o_proj", WeightRole::Matrix { n: 128, k: 128 });
        plan.push(Op::GatedResidual { x, y: branch, modulation: gate });
        plan.push(Op::AdaRmsNorm { x, out: h, modulation: norm, eps: 1e-6 });
        plan.push(Op::Copy { dst: a, src: h });
        plan.push(Op::Gemm { a, w, bias: None, out: branch, accumulate: false });
        change(&mut plan);
        let product = plan.ops.iter().rposition(|op| matches!(op, Op::Gemm { .. })).unwrap();
        (plan, product)
    }

    #[test]
    fn a_gated_norm_zeroes_the_branch_only_for_the_product_that_writes_it_next() {
        let readers = |plan: &Plan, lanes: &[usize], product: usize| zeroing_readers(plan, lanes, &[product]);
        let (plan, product) = branch_plan(|_| {});
        let lanes = vec![0; plan.ops.len()];
        assert_eq!(readers(&plan, &lanes, product), vec![(0, product)]);
        // Not when another op touches the branch in between (it would read the zeros), nor on
        // another stream, nor across a phase boundary (another prompt bucket's body, or a
        // phase of its own), nor for a product into only part of what the norm read.
        let (between, later) = branch_plan(|plan| {
            let branch = plan.find_buffer("branch").unwrap();
            let (src, dst) = (View { buf: branch, offset: 0, rows: 4, cols: 128, stride: 128 }, plan.matrix("peek", 4, 128));
            plan.ops.insert(2, Op::Copy { dst, src });
        });
        assert!(readers(&between, &vec![0; between.ops.len()], later).is_empty());
        let mut other_stream = lanes.clone();
        other_stream[product] = 1;
        assert!(readers(&plan, &other_stream, product).is_empty());
        let (phased, _) = branch_plan(|plan| {
            plan.phase("projection");
            plan.phases.last_mut().unwrap().first_op = 3;
        });
        assert!(readers(&phased, &lanes, product).is_empty());
        let (part, _) = branch_plan(|plan| {
            let Op::Gemm { out, .. } = &mut plan.ops[3] else { unreachable!() };
            out.rows = 2;
        });
        assert!(readers(&part, &lanes, product).is_empty());
        // With no norm before it the product zeroes the branch itself.
        let (alone, first) = branch_plan(|plan| {
            plan.ops.drain(0..2);
        });
        assert!(readers(&alone, &vec![0; alone.ops.len()], first).is_empty());
        // The pass and its switch.
        let fusions_with = |switches: Switches| {
            let mut fusions = Fusions::run(&plan, &element_types(&plan), &lanes, switches, false, 132, |_, _, _| false);
            fusions.stream_products(&plan, &lanes, vec![3]);
            fusions
        };
        let on = fusions_with(Switches::default());
        assert_eq!((on.zeroes_branch_for(0), on.zeroes_branch_for(1)), (Some(3), None));
        assert_eq!(fusions_with(Switches { zeroed_branches: false, ..Switches::default() }).zeroes_branch_for(0), None);
    }

    /// The expert's layer start in small: gated residual, adaRMS norm, QKV product, RoPE (two
    /// query heads of 64 and one K/V head), then an attention reading the queries; `change`
    /// alters it before the pass looks.
    fn qkv_rope_plan(change: impl FnOnce(&mut Plan)) -> (Plan, usize) {
        let mut plan = Plan::default();
        let (x, y, h, qkv) = (plan.matrix("x", 4, 128), plan.matrix("y", 4, 128), plan.matrix("h", 4, 128), plan.matrix("qkv", 4, 256));
        let (k_cache, v_cache, out) = (plan.matrix("k", 4, 64), plan.matrix("v", 4, 64), plan.matrix("out", 4, 128));
        let positions = plan.buffer("positions", BufType::I32, 4);
        let (gate, norm) = (plan.weight("gate", WeightRole::Vector), plan.weight("norm", WeightRole::Vector));
        let w = plan.weight("qkv", WeightRole::Matrix { n: 256, k: 128 });
        plan.push(Op::GatedResidual { x, y, modulation: gate });
        plan.push(Op::AdaRmsNorm { x, out: h, modulation: norm, eps: 1e-6 });
        let first = plan.ops.len();
        plan.push(Op::Gemm { a: h, w, bias: None, out: qkv, accumulate: false });
        let rope = Op::RopeQkv {
            qkv,
            heads: 2,
            kv_heads: 1,
            head_dim: 64,
            theta: 1e4,
            axes: RopeAxes::Single,
            positions,
            position_offset: 0,
            k_cache,
            v_cache,
            cache_row: 0,
        };
        plan.push(rope);
        let (q, heads, kv_heads, head_dim, groups) = (qkv.cols(0, 128), 2, 1, 64, 1);
        let attention = Op::Attention {
            q,
            k: k_cache,
            v: v_cache,
            out,
            heads,
            kv_heads,
            head_dim,
            groups,
            key_valid: None,
            query_valid: None,
            causal: None,
        };
        plan.push(attention);
        change(&mut plan);
        (plan, first)
    }

    #[test]
    fn a_qkv_product_streams_with_its_rope_only_between_its_norm_and_that_rope() {
        let streamed = |plan: &Plan| {
            let lanes = vec![0; plan.ops.len()];
            let products = streamed_products(plan, &element_types(plan), &lanes, &[], &Shapes { mlp: false, product: true });
            (products, (0..plan.ops.len()).filter_map(|i| rope_after(plan, &lanes, i)).collect::<Vec<_>>())
        };
        let (plan, first) = qkv_rope_plan(|_| {});
        assert_eq!(streamed(&plan), (vec![first], vec![64]));
        let mut fusions =
            Fusions::run(&plan, &element_types(&plan), &vec![0; plan.ops.len()], Switches::default(), false, 132, |_, _, _| false);
        fusions.stream_products(&plan, &vec![0; plan.ops.len()], vec![first]);
        assert_eq!(
            (fusions.qkv_ropes.clone(), fusions.qkv_rope(first), fusions.early_products.clone()),
            (vec![(first, 64)], Some(64), vec![first])
        );
        assert!(fusions.describe().contains("1 few-row FP8 product(s) as streamed launches, 1 of them QKV products with their RoPE"));
        // Not when something later reads the norm's output, nor without the RoPE right after,
        // nor with the norm in another phase, nor after a plain norm (no gated residual).
        let (reread, _) = qkv_rope_plan(|plan| {
            let (h, w) = (plan.find_buffer("h").unwrap(), plan.weight("reader", WeightRole::Matrix { n: 8, k: 128 }));
            let out = plan.matrix("reader.out", 4, 8);
            let a = View { buf: h, offset: 0, rows: 4, cols: 128, stride: 128 };
            plan.push(Op::Gemm { a, w, bias: None, out, accumulate: false });
        });
        let (products, ropes) = streamed(&reread);
        assert!(!products.contains(&first) && ropes.is_empty(), "{products:?}");
        let (no_rope, _) = qkv_rope_plan(|plan| {
            plan.ops.remove(first + 1);
        });
        assert!(streamed(&no_rope).0.is_empty());
        let (phased, _) = qkv_rope_plan(|plan| {
            plan.phase("qkv");
            plan.phases.last_mut().unwrap().first_op = first;
        });
        assert!(streamed(&phased).0.is_empty());
        let (plain_norm, _) = qkv_rope_plan(|plan| {
            plan.ops.remove(first - 2);
        });
        assert!(streamed(&plain_norm).0.is_empty());
    }

    #[test]
    fn an_output_projection_takes_e4m3_from_the_attention_merge_only_right_after_it() {
        // qkv_rope_plan's attention, then its output projection into an f32 branch.
        let with_projection = |change: fn(&mut Plan, usize)| {
            qkv_rope_plan(|plan| {
                let (attention_out, w) = (plan.find_buffer("out").unwrap(), plan.weight("o_proj", WeightRole::Matrix { n: 128, k: 128 }));
                let a = View { buf: attention_out, offset: 0, rows: 4, cols: 128, stride: 128 };
                let branch = plan.buffer("branch", BufType::F32, 4 * 128);
                let out = View { buf: branch, offset: 0, rows: 4, cols: 128, stride: 128 };
                plan.push(Op::Gemm { a, w, bias: None, out, accumulate: false });
                change(plan, plan.ops.len() - 1);
            })
            .0
        };
        let fed = |plan: &Plan, lanes: &[usize], split: bool| {
            let projection = plan.ops.iter().rposition(|op| matches!(op, Op::Gemm { .. })).unwrap();
            let merges = |op: usize| split && matches!(plan.ops[op], Op::Attention { .. });
            after_their_attention_merge(plan, lanes, &[projection], merges)
        };
        let plan = with_projection(|_, _| {});
        let lanes = vec![0; plan.ops.len()];
        let projection = plan.ops.len() - 1;
        assert_eq!(fed(&plan, &lanes, true), vec![projection]);
        // Not without a merge (one key split), nor on the second stream, nor into another phase,
        // nor when something else reads the attention's output, nor after anything but the attention.
        assert!(fed(&plan, &lanes, false).is_empty());
        let mut second = lanes.clone();
        second[projection - 1] = 1;
        assert!(fed(&plan, &second, true).is_empty());
        let phased = with_projection(|plan, projection| {
            plan.phase("o_proj");
            plan.phases.last_mut().unwrap().first_op = projection;
        });
        assert!(fed(&phased, &vec![0; phased.ops.len()], true).is_empty());
        let reread = with_projection(|plan, _| {
            let (out, w) = (plan.find_buffer("out").unwrap(), plan.weight("reader", WeightRole::Matrix { n: 8, k: 128 }));
            let a = View { buf: out, offset: 0, rows: 4, cols: 128, stride: 128 };
            let reader_out = plan.matrix("reader.out", 4, 8);
            plan.push(Op::Gemm { a, w, bias: None, out: reader_out, accumulate: false });
        });
        let first_projection = reread.ops.len() - 2;
        let merges = |op: usize| matches!(reread.ops[op], Op::Attention { .. });
        assert!(after_their_attention_merge(&reread, &vec![0; reread.ops.len()], &[first_projection], merges).is_empty());
        let apart = with_projection(|plan, projection| {
            let attention_out = plan.find_buffer("out").unwrap();
            let a = View { buf: attention_out, offset: 0, rows: 4, cols: 128, stride: 128 };
            let copy = plan.matrix("copy", 4, 128);
            plan.ops.insert(projection, Op::Copy { src: a, dst: copy });
        });
        assert!(fed(&apart, &vec![0; apart.ops.len()], true).is_empty());
    }

    #[test]
    fn a_fused_mlp_starts_early_only_right_after_the_norm_of_its_a() {
        let (plan, first) = mlp_plan(|_, _, _| {});
        let lanes = vec![0; plan.ops.len()];
        assert_eq!(after_their_norm(&plan, &[first], &lanes), vec![first]);
        // Not across streams, nor into a phase, nor after anything but an RMS norm of the whole A.
        let mut other_lane = lanes.clone();
        other_lane[first - 1] = 1;
        assert!(after_their_norm(&plan, &[first], &other_lane).is_empty());
        let mut phased = plan.clone();
        phased.phase("mlp");
        phased.phases.last_mut().unwrap().first_op = first;
        assert!(after_their_norm(&phased, &[first], &lanes).is_empty());
        let mut copied = plan.clone();
        let Op::RmsNorm { x, out, .. } = copied.ops[first - 1] else { panic!("mlp_plan has the norm before the MLP") };
        copied.ops[first - 1] = Op::Copy { src: x, dst: out };
        assert!(after_their_norm(&copied, &[first], &lanes).is_empty());
        let mut partial = plan.clone();
        if let Op::RmsNorm { out, .. } = &mut partial.ops[first - 1] {
            *out = out.cols(0, 32);
        }
        assert!(after_their_norm(&partial, &[first], &lanes).is_empty());
    }

    #[test]
    fn an_attention_starts_early_only_right_after_its_rope_and_before_the_rows_rope_writes() {
        // Four action tokens, two query heads of 8, over 12 cached keys and their own 4 (rows 12-15).
        let mut plan = Plan::default();
        let qkv = plan.matrix("qkv", 4, 4 * 8);
        let (positions, valid) = (plan.buffer("positions", BufType::I32, 16), plan.buffer("valid", BufType::F32, 16));
        let (k_cache, v_cache, out) = (plan.matrix("k", 16, 8), plan.matrix("v", 16, 8), plan.matrix("out", 4, 16));
        plan.push(Op::RopeQkv {
            qkv,
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
            theta: 1e4,
            axes: RopeAxes::Single,
            positions,
            position_offset: 12,
            k_cache,
            v_cache,
            cache_row: 12,
        });
        let attention = Op::Attention {
            q: qkv.cols(0, 16),
            k: k_cache,
            v: v_cache,
            out,
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
            groups: 1,
            key_valid: Some(valid),
            query_valid: None,
            causal: None,
        };
        plan.push(attention);
        let lanes = vec![0; plan.ops.len()];
        assert_eq!(attentions_after_their_rope(&plan, &lanes), vec![(1, 12)]);
        // A V cache that RoPE fills from an earlier row bounds the keys too.
        let mut early_v = plan.clone();
        if let Op::Attention { v, .. } = &mut early_v.ops[1] {
            *v = v_cache.rows(4, 12);
        }
        assert_eq!(attentions_after_their_rope(&early_v, &lanes), vec![(1, 8)]);
        // Not on the second stream, nor into a phase, nor after another op, nor when RoPE writes
        // the key mask or another buffer holds the queries.
        assert!(attentions_after_their_rope(&plan, &[0, 1]).is_empty());
        assert!(attentions_after_their_rope(&plan, &[1, 1]).is_empty());
        let mut phased = plan.clone();
        phased.phase("attention");
        phased.phases.last_mut().unwrap().first_op = 1;
        assert!(attentions_after_their_rope(&phased, &lanes).is_empty());
        let mut copied = plan.clone();
        copied.ops[0] = Op::Copy { src: out, dst: out };
        assert!(attentions_after_their_rope(&copied, &lanes).is_empty());
        let mut masked_by_cache = plan.clone();
        let cache_buf = k_cache.buf;
        if let Op::Attention { key_valid, .. } = &mut masked_by_cache.ops[1] {
            *key_valid = Some(cache_buf);
        }
        assert!(attentions_after_their_rope(&masked_by_cache, &lanes).is_empty());
        let mut other_q = plan.clone();
        if let Op::Attention { q, .. } = &mut other_q.ops[1] {
            *q = out;
        }
        assert!(attentions_after_their_rope(&other_q, &lanes).is_empty());
    }

    #[test]
    fn the_general_path_says_why_each_fused_kernel_passed() {
        // Pi0.5's prefix: 800 queries of head dim 256 over one K/V head, masked.
        let why = AttentionLowering::why_general(800, 812, 1, 256, 1, false, true);
        assert_eq!(why, "800 queries (attention_mq256 takes at most 64, one group); attention_heads: no form for head dim 256");
        // GR00T's decoder over a prompt too long for the head-dim-128 form.
        let why = AttentionLowering::why_general(300, 300, 8, 128, 1, true, true);
        assert_eq!(why, "head dim 128; attention_heads: 300 keys per group (head dim 128 takes at most 256)");
        assert!(AttentionLowering::why_general(30, 30, 16, 72, 1, false, false).contains("off"));
    }

    #[test]
    fn each_attention_gets_its_kernel() {
        use AttentionLowering::{ActionTokens, Heads, Products};
        let of = |queries, keys, heads, kv_heads, head_dim, groups, causal, fused| {
            AttentionLowering::of(queries, keys, heads, kv_heads, head_dim, groups, causal, fused, 132)
        };
        // Pi0.5: the 50 action tokens over a 2-camera prefix and themselves, split over about 132
        // blocks; the 712-token prefix keeps the products.
        match of(50, 762, 8, 1, 256, 1, false, true) {
            ActionTokens(split) => {
                assert!(split.splits > 1 && split.splits * split.keys_per_split >= 762, "{split:?}");
                assert_eq!(split.partial_lens, (split.splits * 400 * 256, split.splits * 400 * 2));
            }
            other => panic!("action tokens lowered as {other:?}"),
        }
        assert_eq!(of(712, 712, 8, 1, 256, 1, false, true), Products);
        // SigLIP, two cameras of 256 tokens; too many keys per camera falls back.
        assert_eq!(of(512, 512, 16, 16, 72, 2, false, true), Heads);
        assert_eq!(of(257, 257, 16, 16, 72, 1, false, true), Products);
        // GR00T N1.7 at 2 cameras: vision (64, per camera), decoder (128, grouped, causal), VL
        // self-attention (64), DiT self (48) and cross (48, 41 queries over the 201 VL rows).
        assert_eq!(of(512, 512, 16, 16, 64, 2, false, true), Heads);
        assert_eq!(of(201, 201, 16, 8, 128, 1, true, true), Heads);
        assert_eq!(of(201, 201, 32, 32, 64, 1, false, true), Heads);
        assert_eq!(of(41, 41, 32, 32, 48, 1, false, true), Heads);
        assert_eq!(of(41, 201, 32, 32, 48, 1, false, true), Heads);
        // Three cameras: 265 VL rows still fit the head-dim-64 and 48 forms, not the decoder's.
        assert_eq!(of(265, 265, 32, 32, 64, 1, false, true), Heads);
        assert_eq!(of(265, 265, 16, 8, 128, 1, true, true), Products);
        // Everything takes the products with the fused kernels off.
        assert_eq!(of(50, 762, 8, 1, 256, 1, false, false), Products);
        assert_eq!(of(512, 512, 16, 16, 72, 2, false, false), Products);
    }
}

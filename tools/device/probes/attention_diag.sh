#!/usr/bin/env bash
# On the GPU machine: where the time of attention_mq256_wgmma's split kernel goes (bench/NOTES.md
# item 40). Writes a copy of kernels/cuda/attention_mq256.cu into a temporary directory with the
# kernel's parts behind -D switches (DIAG_NO_KV: no K/V copies nor waits, DIAG_NO_Q: no Q copies
# (the bench's 8 heads: its tensor-map copy),
# DIAG_NO_MMA: no wgmma, DIAG_NO_STORE: no output rows; each gives wrong results, timing only),
# then times tools/device/benches/attention_bench.cu (-DBENCH_WGMMA -DBENCH_NO_COMBINE) against that copy
# for each set in DIAGS (';'-separated). Caveat measured there: without the output rows ptxas drops
# the P V products and their softmax too, so DIAG_NO_STORE removes more than the stores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-/tmp/out}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/attention_mq256.cu" <<'PY'
import sys
s = open("kernels/cuda/attention_mq256.cu").read()
def guard(text, flag):
    global s
    assert text in s, text
    s = s.replace(text, f"#ifndef {flag}\n{text}\n#endif")
guard("    if (threadIdx.x == 0) {\n        attw_load_operand(k_tile, k_map, c0, 0, k_bar, true);\n"
      "        attw_load_operand(v_tile, v_map, c0, 0, v_bar, true);\n    }", "DIAG_NO_KV")
guard("        attw_barrier_wait(bars + 8 * buf, parity);", "DIAG_NO_KV")
guard("        attw_barrier_wait(bars + 16 + 8 * buf, parity);", "DIAG_NO_KV")
guard("        if (threadIdx.x == 0) attw_load_operand(q_tile, q_map, 0, row0 / heads, bars, false);", "DIAG_NO_Q")
guard("                attw_mma_ss(&s[0][0], attw_desc(q_tile + at, 16, 1024), attw_desc(k_tile + at, 16, 1024));", "DIAG_NO_MMA")
guard("                attw_mma_rs(&o[8 * nb][0], p[kk], attw_desc(v_tile + nb * ATTW_TILE_BYTES + kk * 2048, ATTW_V_LBO, ATTW_V_SBO));", "DIAG_NO_MMA")
last = "    att_write_rows(o, m, l, out, out_stride, query_valid, rows, heads, partial_o, partial_ml);\n}\n#define ATTENTION_MQ256_WGMMA"
assert last in s
s = s.replace(last, "#ifndef DIAG_NO_STORE\n" + last.replace("partial_ml);\n}", "partial_ml);\n#endif\n}"))
open(sys.argv[1], "w").write(s)
PY
IFS=';' read -ra diags <<<"${DIAGS:-;-DDIAG_NO_KV;-DDIAG_NO_Q;-DDIAG_NO_KV -DDIAG_NO_Q;-DDIAG_NO_MMA;-DDIAG_NO_STORE}"
for i in "${!diags[@]}"; do
    flags=${diags[$i]}
    # shellcheck disable=SC2086  # the flags are words
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DBENCH_WGMMA -DBENCH_NO_COMBINE $flags -I "$dir" -I kernels/cuda \
        tools/device/benches/attention_bench.cu -lcuda -o "$dir/bench_$i"
    "$dir/bench_$i" denoise | sed "s|^{|{\"diag\": \"$flags\", |" | tee -a "$out/attention-diag.jsonl"
done

#!/usr/bin/env bash
# Builds, on the x86_64 build host, the binaries tools/device/checks/cuda_checks.sh runs on the GPU
# machine, into .device-carry/ (gitignored; pass it in the device tool's `carry`): the `flashrt`
# CLI and the cuda_pi05 test binary, release, stripped, plus the commit they were built from.
# cudarc loads CUDA at run time, so no CUDA toolkit is needed here.
set -euo pipefail
cd "$(dirname "$0")/../../.."
# Default features (cuda-13); FEATURES=cuda-12 builds the CUDA 12 flavour instead.
flavour=()
[ -n "${FEATURES:-}" ] && flavour=(--no-default-features --features "$FEATURES")
cargo build --release -p flashrt "${flavour[@]}" --bin flashrt
test_bin=$(cargo test --release -p flashrt "${flavour[@]}" --test cuda_pi05 --no-run --message-format=json \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda_pi05" and m.get("executable"):
        print(m["executable"])')
mkdir -p .device-carry
cp target/release/flashrt .device-carry/flashrt
cp "$test_bin" .device-carry/cuda_pi05
strip .device-carry/flashrt .device-carry/cuda_pi05
git describe --always --dirty --abbrev=12 > .device-carry/COMMIT
ls -la .device-carry

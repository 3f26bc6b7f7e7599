#!/usr/bin/env bash
# Why does cuBLASLt refuse the runtime's FP8 products at launch (issue 30)? On the GPU machine:
#   1. fp8_gemm_probe.cu against the cuBLASLt the runtime loads: which configurations launch;
#   2. the FP8 GPU tests (carry .device-carry from tools/device/checks/build_carry.sh) with
#      cuBLASLt's error log and API trace, which name the descriptor it refused.
# Writes probe.txt, fp8-tests.log and cublaslt-trace.log.gz under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/flashrt_device_out}"
mkdir -p "$OUT"
# The runtime's library search, so the probe links the cuBLASLt the runtime loads.
source tools/device/checks/cuda_libs.sh
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
{
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    "$nvcc" -O2 -std=c++17 -arch=sm_90 tools/device/probes/fp8_gemm_probe.cu -lcublasLt -o /tmp/fp8_gemm_probe
    ldd /tmp/fp8_gemm_probe | grep -i cublas
    CUBLASLT_LOG_LEVEL=1 /tmp/fp8_gemm_probe
} > "$OUT/probe.txt" 2>&1
tail -n 1 "$OUT/probe.txt"
CUBLASLT_LOG_MASK=17 CUBLASLT_LOG_FILE=/tmp/cublaslt-trace.log \
    bash tools/device/checks/cuda_checks.sh fp8-tests > "$OUT/fp8-tests.log" 2>&1
grep -E "^test |FAILED|NOT_SUPPORTED" "$OUT/fp8-tests.log" | head -n 20
gzip -c /tmp/cublaslt-trace.log > "$OUT/cublaslt-trace.log.gz" 2> /dev/null || true

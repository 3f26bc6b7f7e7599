#!/usr/bin/env bash
# Compiles every nvcc-built device bench and probe in tools/device (and each bench's variants) on a machine
# without a GPU or a CUDA toolkit: nvcc 13.0, NVVM, the runtime, CRT and CCCL headers and cuBLAS
# (for cublasLt.h) come from their PyPI wheels into target/cuda13-wheels (~550 MB, once). Compile
# only (-c): the benches run on the GPU machine. Catches what NVRTC cannot, i.e. host code.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PYTHON="${PYTHON:-python3}"
dir=target/cuda13-wheels
top="$dir/nvidia/cu13"
if [ ! -f "$dir/.installed" ]; then
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --target "$dir" \
        nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14
    # nvcc finds its toolkit at bin/.. and the headers under targets/x86_64-linux/include.
    mkdir -p "$top/targets"
    ln -sfn .. "$top/targets/x86_64-linux"
    chmod +x "$top"/bin/* "$top"/nvvm/bin/*
    touch "$dir/.installed"
fi
nvcc="$top/bin/nvcc"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
build() { # name flags...
    local name=$1
    shift
    echo "-- $name $*"
    "$nvcc" -O3 -std=c++17 -c "$@" -o "$out/bench.o"
}
for flags in "" "-DATT_KEYS=32" "-DBENCH_NO_COMBINE" "-DBENCH_WGMMA" "-DBENCH_WGMMA -DATT_MERGE_DIMS=8"; do
    # shellcheck disable=SC2086  # the flags are words
    build attention_bench -gencode arch=compute_90a,code=sm_90a $flags -I kernels/cuda tools/device/benches/attention_bench.cu
done
for flags in "" "-DVA_SPLIT=4"; do
    # shellcheck disable=SC2086
    build vision_attention_bench -arch=sm_90 $flags -I kernels/cuda tools/device/benches/vision_attention_bench.cu
done
build grid_barrier_bench -arch=sm_90 tools/device/benches/grid_barrier_bench.cu
build launch_cost_bench -gencode arch=compute_90a,code=sm_90a -I kernels/cuda tools/device/benches/launch_cost_bench.cu
build gemm_algos_bench -arch=sm_90 tools/device/benches/gemm_algos_bench.cu
build gemm_ksplit_bench -arch=sm_90 tools/device/benches/gemm_ksplit_bench.cu
build gemm_output_bench -arch=sm_90 tools/device/benches/gemm_output_bench.cu
build l2_policy_bench -arch=sm_90 tools/device/benches/l2_policy_bench.cu
build sysmem_read_bench -arch=sm_90 tools/device/benches/sysmem_read_bench.cu
build ingest_bench -gencode arch=compute_90a,code=sm_90a tools/device/benches/ingest_bench.cu
build gemm_wgmma_bench -gencode arch=compute_90a,code=sm_90a tools/device/benches/gemm_wgmma_bench.cu
for flags in "" "-DPHASES" "-DBF16_ACT" "-DPHASES -DFLAGS" "-DPHASES -DMLP" "-DPHASES -DMLP -DA_TILED"; do
    # shellcheck disable=SC2086
    build expert_stream_bench -gencode arch=compute_90a,code=sm_90a $flags tools/device/benches/expert_stream_bench.cu
done
build fp8_gemm_probe -arch=sm_90 tools/device/probes/fp8_gemm_probe.cu
echo "every device bench and probe compiles"

#!/usr/bin/env bash
# What CI runs for the CUDA kernels and backend; no GPU and no CUDA toolkit needed. Called by
# .ci/run (which also sets FRT_REQUIRE_ALL=1: a missing NVRTC then fails instead of skipping).
#
# 1. NVRTC from PyPI for both CUDA flavours, into target/ (a clean clone has neither). Only the
#    NVRTC wheels: the kernels include no toolkit header, so the runtime wheels' headers are not
#    needed.
# 2. `flashrt` type-checks with the cuda-12 flavour (cudarc cuda-12060, JetPack 6). The cuda-13
#    flavour (cudarc cuda-13000, the default: JetPack 7, the H200) is built by the workspace tests.
# 3. Every kernel compiles with NVRTC: sm_87, sm_89, sm_90 and sm_90a with NVRTC 12.6; sm_87, sm_89, sm_90, sm_90a and sm_110
#    with NVRTC 13.0 (kernels/tests/nvrtc_compile.rs), plus the crate's unit tests; with NVRTC 13.0,
#    ptxas's report of the sm_90a build names no warpgroup MMA it serializes.
#
# Options (tools/test.sh passes both when it runs the Jetson cross-builds):
#   --reuse-workspace-build  run the NVRTC 13.0 test binary that the caller's `cargo test
#       --workspace` built (it lists the test as ignored there) instead of building the crate again
#       with `cargo test -p flashrt-kernels`, which resolves other dependency features. It runs
#       beside the NVRTC 12.6 test: each compiles on one thread.
#   --cuda-12-built-elsewhere  skip step 2: the caller builds the cuda-12 flavour in full (the
#       Orin package of jetson/ci.sh compiles and links flashrt with cudarc cuda-12060), which
#       proves everything the type check would.
set -euo pipefail
cd "$(dirname "$0")/.."
reuse=0
check_cuda_12=1
for arg in "$@"; do
  case "$arg" in
    --reuse-workspace-build) reuse=1 ;;
    --cuda-12-built-elsewhere) check_cuda_12=0 ;;
    *) echo "usage: kernels/ci.sh [--reuse-workspace-build] [--cuda-12-built-elsewhere]" >&2; exit 2 ;;
  esac
done
export FRT_REQUIRE_ALL="${FRT_REQUIRE_ALL:-1}"
PYTHON="${PYTHON:-python3}"

install() { # dir packages...
    local dir=$1
    shift
    [ -f "$dir/.installed" ] && return
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --target "$dir" "$@"
    touch "$dir/.installed"
}
install target/nvrtc-cu13 nvidia-cuda-nvrtc==13.0.88
install target/nvrtc-cu12 nvidia-cuda-nvrtc-cu12==12.6.85
cu13="$PWD/target/nvrtc-cu13/nvidia/cu13/lib"
cu12="$PWD/target/nvrtc-cu12/nvidia/cuda_nvrtc/lib"

if [ "$check_cuda_12" = 1 ]; then
    echo "== flashrt with CUDA 12 (cuda-12): cargo check"
    cargo check --locked -p flashrt --no-default-features --features cuda-12
fi

cu12_test=(cargo test --locked -p flashrt-kernels --no-default-features --features cuda-12)
if [ "$reuse" = 1 ]; then
    exe="$(cargo test --workspace --locked --no-run --message-format=json |
        grep '"name":"nvrtc_compile"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')"
    [ -x "$exe" ] || { echo "kernels/ci.sh: no nvrtc_compile test binary in the workspace build" >&2; exit 1; }
    "${cu12_test[@]}" --no-run
    log="$(mktemp)"
    trap 'rm -f "$log"' EXIT
    LD_LIBRARY_PATH="$cu13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$exe" --include-ignored --nocapture > "$log" 2>&1 &
    cu13_pid=$!
else
    echo "== NVRTC 13.0: every kernel for sm_87, sm_89, sm_90, sm_90a, sm_110"
    LD_LIBRARY_PATH="$cu13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --locked -p flashrt-kernels -- --include-ignored --nocapture
fi
echo "== NVRTC 12.6: every kernel for sm_87, sm_89, sm_90, sm_90a"
LD_LIBRARY_PATH="$cu12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "${cu12_test[@]}" -- --include-ignored --nocapture
if [ "$reuse" = 1 ]; then
    cu13_status=0
    wait "$cu13_pid" || cu13_status=$?
    echo "== NVRTC 13.0: every kernel for sm_87, sm_89, sm_90, sm_90a, sm_110 (ran beside the 12.6 test)"
    cat "$log"
    [ "$cu13_status" = 0 ] || { echo "kernels/ci.sh: the NVRTC 13.0 test failed (status $cu13_status)" >&2; exit 1; }
fi

#!/usr/bin/env bash
# The project's test command (the README's): formatting, lints, every workspace test, and the
# component checks (C ABI, CUDA kernels through NVRTC, ROS 2 interop, Jetson cross-builds).
# Components whose tools are missing skip with a visible message; with FRT_REQUIRE_ALL=1 (as
# .ci/run sets) they fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/timing.sh
. tools/timing.sh

disk_free() { df -h --output=avail,target . | tail -n1 | awk '{print "disk: " $1 " free on " $2 " (" l ")"}' l="$1"; }
disk_free "start"

timed "cargo fmt --check" cargo fmt --all --check
timed "cargo clippy -D warnings" cargo clippy --workspace --all-targets --locked -- -D warnings
# Includes the C ABI tests (C/C++ under valgrind) and the ROS 2 interop test.
# flashrt-kernels runs in kernels/ci.sh, which puts the PyPI NVRTC libraries on the library path.
timed "workspace tests" cargo test --workspace --locked --exclude flashrt-kernels
timed "C ABI: install, pkg-config and CMake builds, C++ controller example" bash ffi/ci.sh --no-cargo-test
timed "CUDA: both cudarc flavours build, every kernel compiles with NVRTC for sm_87/sm_90/sm_90a/sm_110" bash kernels/ci.sh
timed "ROS 2: interop with the cyclonedds peer in an isolated network namespace" bash ros2_bridge/ci.sh
if [ "${FRT_CI_PRUNE:-0}" = 1 ]; then
  # CI only (.ci/run sets it): every later step builds into target/release or target/aarch64-cross.
  du -sh target/debug 2> /dev/null || true
  rm -rf target/debug
fi
disk_free "before the Jetson cross-builds"
if [ "${FRT_REQUIRE_ALL:-0}" = 1 ] || command -v aarch64-linux-gnu-gcc > /dev/null; then
  timed "Jetson: aarch64 cross-builds, tests under qemu" bash jetson/ci.sh
else
  echo "SKIP Jetson cross-builds: no aarch64 toolchain (jetson/build.sh installs it; FRT_REQUIRE_ALL=1 runs it)"
fi
timed "README main job" cargo run --release --locked -p flashrt -- demo --steps 20

disk_free "end"
print_timings

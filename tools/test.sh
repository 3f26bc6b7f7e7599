#!/usr/bin/env bash
# The project's test command (the README's): formatting, lints, every workspace test, and the
# component checks (C ABI, fuzzing, CUDA kernels through NVRTC, ROS 2 interop, Jetson cross-builds).
# Components whose tools are missing skip with a visible message; with FRT_REQUIRE_ALL=1 (as
# .ci/run sets) they fail instead.
#
# The whole run must stay within FRT_CI_BUDGET_MIN minutes of the dev machine, scaled by this
# machine's measured speed (tools/timing.sh): CI is killed at 90 minutes on a machine up to 2x
# slower than a developer's, so a slow creep fails here, with the per-step table, long before it
# meets that wall. The table is also written as JSON to
# target/ci-timing.json (bench/results/ci-timing.json keeps a measured one).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/timing.sh
. tools/timing.sh

disk_free() { df -h --output=avail,target . | tail -n1 | awk '{print "disk: " $1 " free on " $2 " (" l ")"}' l="$1"; }
disk_free "start"

timed "cargo fmt --check" cargo fmt --all --check
timed "cargo clippy -D warnings" cargo clippy --workspace --all-targets --locked -- -D warnings
# Includes the C ABI tests (C/C++ under valgrind) and the ROS 2 interop test with the cyclonedds
# peer (it re-runs itself under `unshare -n`, in a network namespace with only loopback;
# ros2_bridge/ci.sh runs the same crate tests on their own). The NVRTC compile test is listed as
# ignored here: kernels/ci.sh runs this build's binary of it with the PyPI NVRTC libraries on the
# library path. The later steps reuse this build's libraries, CLI and test binaries: a cargo call
# that selects other packages resolves other dependency features and compiles much of the tree
# again.
timed "workspace tests (C ABI under valgrind, ROS 2 interop in a network namespace)" cargo test --workspace --locked
timed "C ABI: install, pkg-config and CMake builds, C++ controller example" bash ffi/ci.sh --no-cargo-test
# libFuzzer on every parser and boundary, 30 s per target from the committed seeds (SECURITY.md);
# its own instrumented build under target/fuzz.
timed "fuzzing: 6 targets x ${FRT_FUZZ_SECONDS:-30} s (checkpoint, tokenizer, observation, C ABI, ROS 2 messages, server requests)" bash fuzz/ci.sh
# The Jetson step below builds the cuda-12 flavour in full (the Orin package), so kernels/ci.sh
# need not type-check it as well when that step runs.
jetson=0
if [ "${FRT_REQUIRE_ALL:-0}" = 1 ] || command -v aarch64-linux-gnu-gcc > /dev/null; then
  jetson=1
fi
kernels_args=(--reuse-workspace-build)
[ "$jetson" = 0 ] || kernels_args+=(--cuda-12-built-elsewhere)
timed "CUDA: both cudarc flavours build, every kernel compiles with NVRTC for sm_87/sm_89/sm_90/sm_90a/sm_110" bash kernels/ci.sh "${kernels_args[@]}"
# The README's main job, from the dev-profile CLI the tests built (a release build of the host
# would be a third full compile; the release profile is built and its demo run by the Jetson step).
timed "README main job (flashrt demo)" target/debug/flashrt demo --steps 20
if [ "${FRT_CI_PRUNE:-0}" = 1 ]; then
  # CI only (.ci/run sets it): every later step builds into target/release or target/aarch64-cross.
  du -sh target/debug target/fuzz 2> /dev/null || true
  rm -rf target/debug target/fuzz
fi
disk_free "before the Jetson cross-builds"
if [ "$jetson" = 1 ]; then
  timed "Jetson: aarch64 cross-builds, tests under qemu" bash jetson/ci.sh
else
  echo "SKIP Jetson cross-builds: no aarch64 toolchain (jetson/build.sh installs it; FRT_REQUIRE_ALL=1 runs it)"
fi
disk_free "end"
print_timings
check_budget

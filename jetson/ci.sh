#!/usr/bin/env bash
# What CI runs for the Jetson builds (called from .ci/run through tools/test.sh):
#   1. jetson/build.sh for Orin (cuda-12060) and Thor (cuda-13000). Each build checks glibc <= 2.35
#      and that libflashrt.so exports only the frt_* C API. Between the two, one release build of
#      every aarch64 test binary below with the Thor package's packages and features (build.sh
#      --print-cargo-args): it reuses every dependency the Orin build compiled (only the flashrt
#      crates differ) and compiles the Thor flavour of the runtime, C ABI and node beside their
#      unit tests, so the Thor build then finds every crate compiled and only packs;
#   2. under qemu-aarch64-static, the runtime's CPU tests: golden
#      parity (every parity test but the 77-run perturbation test), the unit tests of the runtime,
#      the C ABI and the ROS 2 node, the loading/error tests and the zero-allocation test
#      (tests/no_alloc_pi05.rs, 30 steps: every combination of its schedule);
#   3. the C ABI under qemu: its zero-allocation test (ffi/tests/no_alloc.rs, 6 steps through
#      frt_policy_step), tests/c/abi_test.c (Pi0.5 micro and the tiny GR00T fixture) against the packed libflashrt.so and
#      tests/c/hpp_test.cpp against libflashrt.a, cross-compiled with aarch64-linux-gnu-gcc;
#   (the zero-allocation, C ABI and ROS 2 tests run the micro synthesized model: a step of the
#   tiny one costs seconds here);
#   4. from both tarballs under qemu: the README's main job (`flashrt demo --steps 2`) and the
#      packed C++ example (`cpp_controller --ticks 3`);
#   5. the ROS 2 node's interop test (ros2_bridge/tests/interop.rs: the aarch64 node and test under
#      qemu, the x86_64 cyclonedds peer, in a network namespace with only loopback). It needs qemu
#      >= 10 (DDS sets a multicast socket option older qemu-user lacks; Debian 12 ships 7.2): qemu
#      10's qemu-aarch64 from bookworm-backports is fetched once into target/qemu10 (apt-get
#      download + dpkg -x, no system package changes); every other step uses the system qemu.
# The two zero-allocation tests are the longest qemu steps (a model step costs seconds there).
# `jetson/ci.sh --full` adds the golden perturbation test (77 model runs, too slow for the CI
# budget). Times: jetson/README.md.
#
# qemu runs with `-L /`: with `-L /usr/aarch64-linux-gnu` threaded programs hang.
set -euo pipefail
full=0
[ "${1:-}" = --full ] && full=1
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
TIMING_PREFIX="jetson: "
# shellcheck source=tools/timing.sh
. "$root/tools/timing.sh"

if ! command -v qemu-aarch64-static > /dev/null; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends qemu-user-static > /dev/null
fi
qemu=(qemu-aarch64-static -L /)

# qemu 10 for the ROS 2 interop test only, from bookworm-backports (its qemu-user package has static
# binaries; only qemu-aarch64 is kept). A private apt source list, lists and cache under target/:
# the system's apt configuration and packages are untouched.
qemu10_dir="$root/target/qemu10"
qemu10="$qemu10_dir/qemu-aarch64"
fetch_qemu10() {
  if [ ! -x "$qemu10" ]; then
    local tmp="$qemu10_dir.tmp" apt_opts
    rm -rf "$tmp"
    mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
    echo 'deb http://deb.debian.org/debian bookworm-backports main' > "$tmp/sources.list"
    apt_opts=(-o Dir::Etc::SourceList="$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    apt-get "${apt_opts[@]}" update -qq
    (cd "$tmp" && apt-get "${apt_opts[@]}" download -qq qemu-user/bookworm-backports)
    dpkg -x "$tmp"/qemu-user_*.deb "$tmp/root"
    mkdir -p "$qemu10_dir"
    cp "$tmp/root/usr/bin/qemu-aarch64" "$qemu10.part"
    mv "$qemu10.part" "$qemu10"
    rm -rf "$tmp"
  fi
  "$qemu10" --version | head -n1
  "$qemu10" --version | grep -q 'version \(1[0-9]\|[2-9][0-9]\)\.' || { echo "jetson/ci.sh: $qemu10 is not qemu >= 10" >&2; return 1; }
}

out="$root/target/jetson"
timed "cross-build orin (JetPack 6, cuda-12060)" jetson/build.sh --board orin --out "$out"

# Same environment as build.sh (which installed the toolchain above).
# shellcheck source=jetson/cross-env.sh
. "$root/jetson/cross-env.sh"
test_cargo=("${cargo_aarch64[@]}" test --locked --release --target aarch64-unknown-linux-gnu)

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
stage="$CARGO_TARGET_DIR/stage"

# Every test binary that runs under qemu, from one cargo call with the Thor package's packages and
# features exactly (build.sh --print-cargo-args): the runtime, C ABI and node libraries and binaries
# it compiles are the Thor build's, which then compiles nothing (with the packages' default
# features instead, the same flavour, cargo counts `default` as another feature set and compiles
# the three crates and their binaries again: ~115 s of CPU). The binaries run directly under qemu;
# `test_exe SRC` names the one built from SRC. (`--test no_alloc` also builds the ROS 2 node's
# test of that name, which runs natively only.)
test_sources="$CARGO_TARGET_DIR/test-binaries.tsv"
build_tests() {
  local args thor targets=(--lib --test golden_pi05 --test no_alloc_pi05 --test loading_and_errors)
  args="$(jetson/build.sh --board thor --print-cargo-args)"
  read -r -a thor <<< "$args"
  [ ! -f ffi/Cargo.toml ] || targets+=(--test no_alloc)
  [ ! -f ros2_bridge/Cargo.toml ] || targets+=(--test interop)
  "${test_cargo[@]}" "${thor[@]}" "${targets[@]}" --no-run --message-format=json-render-diagnostics |
    python3 -c '
import json, os, sys
root = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m.get("executable"):
        print(os.path.relpath(m["target"]["src_path"], root) + "\t" + m["executable"])' "$root" > "$test_sources"
}
test_exe() { # source path of the test target, relative to the repository root
  local exe
  exe="$(awk -F'\t' -v src="$1" '$1 == src { print $2 }' "$test_sources")"
  [ -x "$exe" ] || { echo "jetson/ci.sh: no aarch64 test binary built from $1" >&2; return 1; }
  echo "$exe"
}
qemu_test() { # source, test arguments...
  local exe
  exe="$(test_exe "$1")"
  shift
  "${qemu[@]}" "$exe" "$@"
}

# Under emulation a Pi0.5 step costs seconds of CPU (the NEON GEMM runs through qemu's
# floating-point helpers, ~60x native). The zero-allocation tests are the long ones; each runs as
# few steps as cover its whole schedule of inputs (asserted by the test) with two CPU threads, one
# after the other: run beside a build or another test, two threads on an over-committed core wait
# for each other at every op (one CI run: 12 steps took 332 s beside the builds). Only the golden
# perturbation test (77 more model runs) is --full only.
timed "build every test that runs under qemu (runtime, C ABI, ROS 2 node; the Thor flavour)" build_tests
timed "cross-build thor (JetPack 7, cuda-13000)" jetson/build.sh --board thor --out "$out"
timed "qemu: golden parity with lerobot" qemu_test tests/golden_pi05.rs --skip perturb
unit_tests() {
  qemu_test runtime/src/lib.rs
  qemu_test tests/loading_and_errors.rs
  [ ! -f ffi/Cargo.toml ] || qemu_test ffi/src/lib.rs
  [ ! -f ros2_bridge/Cargo.toml ] || qemu_test ros2_bridge/src/lib.rs
}
timed "qemu: unit tests (runtime, C ABI, ROS 2 node), loading/error tests" unit_tests
timed "qemu: runtime zero-allocation test" qemu_test tests/no_alloc_pi05.rs
if [ -f ffi/Cargo.toml ]; then
  timed "qemu: C ABI zero-allocation test" qemu_test ffi/tests/no_alloc.rs
fi

# The ROS 2 node against the x86_64 cyclonedds peer ($FRT_PYTHON), both under qemu 10: the test
# binary runs in a fresh network namespace with only loopback (multicast on, the multicast route
# through it), so it does not re-run itself under `unshare -n`, and starts the node through
# FRT_NODE_RUNNER (no binfmt_misc here: an aarch64 program cannot be exec'd directly). A step costs
# seconds under qemu, so the peer gets 300 s instead of 60 for its 10
# trajectories.
ros2_interop() {
  fetch_qemu10
  if ! unshare -n true 2> /dev/null; then
    [ "${FRT_REQUIRE_ALL:-0}" = 1 ] && { echo "jetson/ci.sh: cannot create a network namespace (unshare -n needs root)" >&2; return 1; }
    echo "SKIPPED the ROS 2 interop test under qemu: cannot create a network namespace (unshare -n needs root)"
    return 0
  fi
  local exe
  exe="$(test_exe ros2_bridge/tests/interop.rs)"
  # The peer script and the node binary are found through paths compiled into the test.
  (cd ros2_bridge && FRT_NODE_RUNNER="$qemu10 -L /" FRT_INTEROP_TIMEOUT_S=300 unshare -n bash -euo pipefail -c '
    ip link set lo up
    ip link set lo multicast on
    ip route add 224.0.0.0/4 dev lo
    exec "$@"' bash "$qemu10" -L / "$exe" --nocapture)
}
if [ -f ros2_bridge/Cargo.toml ]; then
  timed "qemu 10: ROS 2 node <-> cyclonedds peer (interop test)" ros2_interop
fi
if [ "$full" = 1 ]; then
  # The perturbation test re-runs the model 77 times; it checks the parity check itself.
  timed "qemu: golden perturbation test" qemu_test tests/golden_pi05.rs perturb
fi

if [ -f ffi/Cargo.toml ]; then
  c_abi() {
    local pkg="$stage/flashrt-$version-thor-aarch64" tmp
    tmp="$(mktemp -d)"
    IFS=. read -r major minor patch <<< "$version"
    local defines=(-DEXPECTED_MAJOR="$major" -DEXPECTED_MINOR="$minor" -DEXPECTED_PATCH="$patch" -DEXPECTED_VERSION="\"$version\"")
    aarch64-linux-gnu-gcc -std=c99 -O1 -Wall -Wextra -Werror -pedantic "${defines[@]}" -I "$pkg/include" tests/c/abi_test.c \
      -o "$tmp/abi_test" -L "$pkg/lib" -lflashrt -lm
    mkdir "$tmp/scratch"
    # The smallest synthesized model (as ffi/tests/c_api.rs uses): a tiny-model step costs seconds
    # under qemu, and the programs test the ABI, not the model.
    "${qemu[@]}" "$pkg/bin/flashrt" synth --size micro --seed 7 --out "$tmp/micro" > /dev/null
    LD_LIBRARY_PATH="$pkg/lib" "${qemu[@]}" "$tmp/abi_test" "$tmp/micro" "$tmp/micro/tokenizer.json" "$tmp/scratch" "$PWD/tests/data/groot_n17_tiny"
    if [ -f tests/c/hpp_test.cpp ]; then
      # The static library's system dependencies, as the packed CMake/pkg-config files list them.
      local deps
      deps="$(sed -n 's/^Libs.private: //p' "$pkg/lib/pkgconfig/flashrt.pc")"
      # shellcheck disable=SC2086 # deps is a list of -l flags
      aarch64-linux-gnu-g++ -std=c++17 -O1 -Wall -Wextra -Werror -pedantic -I "$pkg/include" tests/c/hpp_test.cpp \
        -o "$tmp/hpp_test" "$pkg/lib/libflashrt.a" $deps
      "${qemu[@]}" "$tmp/hpp_test" "$tmp/micro" "$tmp/micro/tokenizer.json"
    fi
    rm -rf "$tmp"
  }
  timed "qemu: C ABI programs against the packed libflashrt (.so and .a)" c_abi
fi

demo() { # board
  local pkg="$stage/flashrt-$version-$1-aarch64"
  "${qemu[@]}" "$pkg/bin/flashrt" demo --steps 2
  if [ -x "$pkg/bin/flashrt-ros2" ]; then
    "${qemu[@]}" "$pkg/bin/flashrt-ros2" --help > /dev/null
  fi
  if [ -x "$pkg/bin/cpp_controller" ]; then
    # The packed C++ example finds libflashrt through $ORIGIN/../lib.
    "${qemu[@]}" "$pkg/bin/cpp_controller" --checkpoint tests/data/pi05_tiny --tokenizer tests/data/tokenizer/tokenizer.json --ticks 3
  fi
}
timed "qemu: README main job (flashrt demo --steps 2) and the C++ example from the orin tarball" demo orin
timed "qemu: README main job (flashrt demo --steps 2) and the C++ example from the thor tarball" demo thor

print_timings
ls -l "$out"

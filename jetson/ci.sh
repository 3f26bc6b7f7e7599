#!/usr/bin/env bash
# What CI runs for the Jetson builds (called from .ci/run):
#   1. jetson/build.sh for Orin (cuda-12060) and Thor (cuda-13000); the second reuses every
#      dependency of the first from the shared target dir, only the flashrt crates rebuild;
#   2. under qemu-aarch64-static: golden parity (every parity test but the 77-run perturbation
#      test);
#   3. the C ABI under qemu: tests/c/abi_test.c against the packed libflashrt.so and
#      tests/c/hpp_test.cpp against libflashrt.a, cross-compiled with aarch64-linux-gnu-gcc;
#   4. from both tarballs under qemu: the README's main job (`flashrt demo --steps 5`) and the
#      packed C++ example (`cpp_controller --ticks 3`).
# `jetson/ci.sh --full` adds the zero-allocation tests (runtime and C ABI), the runtime's unit
# tests, the loading/error tests and the perturbation test under qemu (too slow for the CI budget).
# The ROS 2 node is built and packed but not run: under emulation it needs qemu >= 10 (a multicast
# socket option), Debian 12 ships 7.2 (see jetson/README.md).
#
# qemu runs with `-L /`: with `-L /usr/aarch64-linux-gnu` threaded programs hang.
set -euo pipefail
full=0
[ "${1:-}" = --full ] && full=1
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
started=$SECONDS
timings=()
timed() { # label command...
  local label="$1" t0=$SECONDS
  shift
  printf '\n=== jetson: %s\n' "$label"
  "$@"
  timings+=("$(printf '%4ds  %s' $((SECONDS - t0)) "$label")")
}

if ! command -v qemu-aarch64-static > /dev/null; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends qemu-user-static > /dev/null
fi
qemu=(qemu-aarch64-static -L /)

out="$root/target/jetson"
timed "cross-build orin (JetPack 6, cuda-12060)" jetson/build.sh --board orin --out "$out"
timed "cross-build thor (JetPack 7, cuda-13000)" jetson/build.sh --board thor --out "$out"

# Same environment as build.sh (which installed the toolchain above).
# shellcheck source=jetson/cross-env.sh
. "$root/jetson/cross-env.sh"
# Release profile and the Thor flavour (flashrt's default), as the packed build: most compiled
# dependencies are shared with it.
test_cargo=("${cargo_aarch64[@]}" test --locked --release --target aarch64-unknown-linux-gnu)

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
stage="$CARGO_TARGET_DIR/stage"

# Under emulation one step of the synthesized tiny model costs about 4-5 s of CPU (the NEON GEMM
# runs through qemu's floating-point helpers, ~60x native): CI runs golden parity (the lerobot
# fixture is smaller, 12 s); --full adds the rest (see jetson/README.md). The zero-allocation test
# takes 570 s under qemu and currently fails on aarch64 (2 allocations in 120 steps).
timed "qemu: golden parity with lerobot" "${test_cargo[@]}" -p flashrt --test golden_pi05 -- --skip perturb
if [ "$full" = 1 ]; then
  timed "qemu: zero-allocation step" "${test_cargo[@]}" -p flashrt --test no_alloc_pi05
  timed "qemu: runtime unit tests, loading/error tests" "${test_cargo[@]}" -p flashrt --lib --test loading_and_errors
  # The perturbation test re-runs the model 77 times; it checks the parity check itself.
  timed "qemu: golden perturbation test" "${test_cargo[@]}" -p flashrt --test golden_pi05 -- perturb
  if [ -f ffi/Cargo.toml ]; then
    timed "qemu: C ABI zero-allocation test" "${test_cargo[@]}" -p flashrt-ffi --test no_alloc
  fi
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
    LD_LIBRARY_PATH="$pkg/lib" "${qemu[@]}" "$tmp/abi_test" tests/data/pi05_tiny tests/data/tokenizer/tokenizer.json "$tmp/scratch"
    if [ -f tests/c/hpp_test.cpp ]; then
      # The static library's system dependencies, as the packed CMake/pkg-config files list them.
      local deps
      deps="$(sed -n 's/^Libs.private: //p' "$pkg/lib/pkgconfig/flashrt.pc")"
      # shellcheck disable=SC2086 # deps is a list of -l flags
      aarch64-linux-gnu-g++ -std=c++17 -O1 -Wall -Wextra -Werror -pedantic -I "$pkg/include" tests/c/hpp_test.cpp \
        -o "$tmp/hpp_test" "$pkg/lib/libflashrt.a" $deps
      "${qemu[@]}" "$tmp/hpp_test" tests/data/pi05_tiny tests/data/tokenizer/tokenizer.json
    fi
    rm -rf "$tmp"
  }
  timed "qemu: C ABI programs against the packed libflashrt (.so and .a)" c_abi
fi

demo() { # board
  local pkg="$stage/flashrt-$version-$1-aarch64"
  "${qemu[@]}" "$pkg/bin/flashrt" demo --steps 5
  if [ -x "$pkg/bin/flashrt-ros2" ]; then
    "${qemu[@]}" "$pkg/bin/flashrt-ros2" --help > /dev/null
  fi
  if [ -x "$pkg/bin/cpp_controller" ]; then
    # The packed C++ example finds libflashrt through $ORIGIN/../lib.
    "${qemu[@]}" "$pkg/bin/cpp_controller" --checkpoint tests/data/pi05_tiny --tokenizer tests/data/tokenizer/tokenizer.json --ticks 3
  fi
}
timed "qemu: README main job (flashrt demo --steps 5) and the C++ example from the orin tarball" demo orin
timed "qemu: README main job (flashrt demo --steps 5) and the C++ example from the thor tarball" demo thor

printf '\n=== jetson: timings\n'
printf '%s\n' "${timings[@]}"
printf '%4ds  total\n' $((SECONDS - started))
ls -l "$out"

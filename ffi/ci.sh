#!/usr/bin/env bash
# Everything CI runs for the C ABI (issue #4), from the repository root: bash ffi/ci.sh
#
# Needs, installed by the caller (.ci/run), never by this script:
#   apt:   gcc g++ cmake valgrind pkg-config binutils (nm, readelf)
#   cargo: nothing extra (cbindgen is an exactly pinned dev-dependency of flashrt-ffi)
# With FRT_REQUIRE_ALL=1 (CI) a missing tool fails instead of skipping.
#
# 1. cargo test -p flashrt-ffi: header drift check against the pinned cbindgen, C99 and C++17
#    -Wall -Wextra -Werror -pedantic compiles of flashrt.h, the C test of every function and error
#    path (libflashrt.so) and the C++ wrapper test (libflashrt.a), both under valgrind memcheck,
#    the export list and soname, the no-allocation test of frt_policy_step.
# 2. ffi/install.sh into a temporary prefix (dev profile: reuses step 1's build), then a
#    pkg-config build of a C program and the CMake build of examples/cpp_controller against it.
# 3. Bounded runs of the controller against a synthesized tiny checkpoint on the CPU backend, one
#    stepping the policy itself, one through the action stream.
#
# --no-cargo-test skips step 1 when the caller's `cargo test --workspace` already ran it
# (tools/test.sh), and installs the libraries and uses the CLI that build left in target/debug.
set -euo pipefail
cd "$(dirname "$0")/.."
run_cargo_test=1
case "${1:-}" in
  --no-cargo-test) run_cargo_test=0 ;;
  "") ;;
  *) echo "usage: ffi/ci.sh [--no-cargo-test]" >&2; exit 2 ;;
esac

skip_or_fail() {
  if [ "${FRT_REQUIRE_ALL:-0}" = 1 ]; then echo "ffi/ci.sh: $1 not found and FRT_REQUIRE_ALL=1" >&2; exit 1; fi
  echo "SKIP: $1 not found: $2"
}

if [ "$run_cargo_test" = 1 ]; then
  echo "== ffi: cargo tests (header drift, header compiles, C/C++ tests under valgrind, exports, no-alloc)"
  cargo test -p flashrt-ffi
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "== ffi: install"
# With --no-cargo-test the caller's workspace tests built the libraries: install those.
install_args=(--prefix "$tmp/prefix" --profile dev)
[ "$run_cargo_test" = 1 ] || install_args+=(--no-build)
ffi/install.sh "${install_args[@]}"
# The installed shared library exports the C API only.
if command -v nm >/dev/null; then
  if nm -D --defined-only --format=just-symbols "$tmp/prefix/lib/libflashrt.so" | grep -v '^frt_'; then
    echo "ffi/ci.sh: installed libflashrt.so exports non-frt symbols (above)" >&2; exit 1
  fi
fi

if command -v pkg-config >/dev/null && command -v gcc >/dev/null; then
  echo "== ffi: pkg-config"
  export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
  want="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
  got="$(pkg-config --modversion flashrt)"
  [ "$got" = "$want" ] || { echo "ffi/ci.sh: pkg-config says $got, Cargo.toml $want" >&2; exit 1; }
  printf '#include <flashrt.h>\n#include <stdio.h>\n#include <string.h>\nint main(void) { puts(frt_version()); return strcmp(frt_version(), "%s") != 0; }\n' "$want" > "$tmp/pc.c"
  # shellcheck disable=SC2046
  gcc -std=c99 -Wall -Wextra -Werror "$tmp/pc.c" -o "$tmp/pc" $(pkg-config --cflags --libs flashrt) \
    -Wl,-rpath,"$(pkg-config --variable=libdir flashrt)"
  "$tmp/pc"
else
  skip_or_fail "pkg-config or gcc" "pkg-config check not run"
fi

if ! command -v cmake >/dev/null; then
  skip_or_fail cmake "example build and run not done"
  exit 0
fi
echo "== ffi: examples/cpp_controller (CMake, find_package(flashrt))"
cmake -S examples/cpp_controller -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_CXX_FLAGS=-Werror
cmake --build "$tmp/build" -j 2

# A synthesized checkpoint (tokenizer.json included), made by the CLI the tests built
# (`cargo run -p flashrt` would resolve other features and rebuild).
flashrt=target/debug/flashrt
[ "$run_cargo_test" = 0 ] && [ -x "$flashrt" ] || { cargo build -q -p flashrt; }
"$flashrt" synth --model pi05 --size tiny --out "$tmp/pi05_tiny"
ckpt=(--checkpoint "$tmp/pi05_tiny")
echo "== ffi: bounded controller run"
"$tmp/build/cpp_controller" "${ckpt[@]}" --backend cpu --hz 50 --replan 10 --ticks 100
echo "== ffi: bounded controller run, action stream (inference on the library's thread)"
"$tmp/build/cpp_controller" "${ckpt[@]}" --backend cpu --hz 50 --ticks 100 --stream
echo "ffi/ci.sh: all C ABI checks passed"

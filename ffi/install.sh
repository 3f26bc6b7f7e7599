#!/usr/bin/env bash
# Installs FlashRT's C API under a prefix:
#   PREFIX/include/flashrt.h, flashrt.hpp
#   PREFIX/lib/libflashrt.so.VERSION (soname = the exact version), libflashrt.so -> it
#   PREFIX/lib/libflashrt.a
#   PREFIX/lib/cmake/flashrt/flashrtConfig.cmake, flashrtConfigVersion.cmake  (find_package)
#   PREFIX/lib/pkgconfig/flashrt.pc                                           (pkg-config)
#
# Usage: ffi/install.sh --prefix DIR [--profile release|dev] [--no-build]
#   --profile   cargo profile to build and install (default release).
#   --no-build  install the libraries the last build of that profile left in target/ (CI: the
#               workspace tests built them; a `cargo build -p flashrt-ffi` would resolve other
#               dependency features and compile much of the tree again).
# Needs cargo; builds only the flashrt-ffi crate and what it depends on.
set -euo pipefail

prefix=""
profile="release"
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "install.sh: --prefix DIR is required" >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
case "$profile" in
  release) dir=release ;;
  dev) dir=debug ;;
  *) echo "install.sh: --profile must be release or dev" >&2; exit 2 ;;
esac
target="${CARGO_TARGET_DIR:-$root/target}/$dir"

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)"
IFS=. read -r major minor _patch <<< "$version"
# System libraries behind libflashrt.a (rustc --print native-static-libs, Linux).
static_deps="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
static_deps_cmake="$(echo "$static_deps" | sed 's/-l//g; s/ /;/g')"

if [ "$build" = 1 ]; then
  (cd "$root" && cargo build --profile "$profile" -p flashrt-ffi)
fi
# `cargo build` copies the libraries up to target/<profile>; `cargo test` leaves them in deps/.
libs="$target"
[ "$build" = 1 ] || [ -f "$libs/libflashrt_ffi.so" ] || libs="$target/deps"
for lib in libflashrt_ffi.so libflashrt_ffi.a; do
  [ -f "$libs/$lib" ] || { echo "install.sh: $libs/$lib is missing (build it, or drop --no-build)" >&2; exit 1; }
done

mkdir -p "$prefix/include" "$prefix/lib/cmake/flashrt" "$prefix/lib/pkgconfig"
prefix="$(cd "$prefix" && pwd)"
install -m 644 "$root/include/flashrt.h" "$root/include/flashrt.hpp" "$prefix/include/"
install -m 755 "$libs/libflashrt_ffi.so" "$prefix/lib/libflashrt.so.$version"
ln -sf "libflashrt.so.$version" "$prefix/lib/libflashrt.so"
install -m 644 "$libs/libflashrt_ffi.a" "$prefix/lib/libflashrt.a"
fill() {
  sed -e "s/@VERSION@/$version/g" -e "s/@MAJOR@/$major/g" -e "s/@MINOR@/$minor/g" \
      -e "s/@STATIC_DEPS@/$static_deps/g" -e "s/@STATIC_DEPS_CMAKE@/$static_deps_cmake/g" "$1" > "$2"
}
fill "$root/ffi/cmake/flashrtConfig.cmake.in" "$prefix/lib/cmake/flashrt/flashrtConfig.cmake"
fill "$root/ffi/cmake/flashrtConfigVersion.cmake.in" "$prefix/lib/cmake/flashrt/flashrtConfigVersion.cmake"
fill "$root/ffi/cmake/flashrt.pc.in" "$prefix/lib/pkgconfig/flashrt.pc"
echo "installed flashrt $version ($profile) under $prefix"

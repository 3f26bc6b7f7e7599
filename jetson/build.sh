#!/usr/bin/env bash
# Cross-compiles FlashRT for a Jetson board on an x86_64 Debian 12 host and packs a tarball:
#   bin/      flashrt (CLI), flashrt-ros2 (ROS 2 node), cpp_controller (C++ example)
#   include/  flashrt.h, flashrt.hpp
#   lib/      libflashrt.so.VERSION (+ libflashrt.so link), libflashrt.a, cmake/flashrt/, pkgconfig/
#   share/flashrt/  board profile, example sources and configs
#   lib/systemd/system/flashrt-ros2.service, install.sh, MANIFEST.json
# Components that do not exist in this checkout (ffi/, ros2_bridge/, examples/cpp_controller/) are
# left out and listed as such in the manifest.
#
# Usage: jetson/build.sh --board orin|thor [--out DIR] [--no-install] [--print-cargo-args]
#   --board       which profile of jetson/boards/ to build for (picks cudarc's CUDA flavour)
#   --out         where the tarball goes (default target/jetson)
#   --no-install  fail instead of installing a missing toolchain with apt
#   --print-cargo-args  print the board's packages and features (`-p ... --no-default-features
#                 --features ...`) and exit: jetson/ci.sh builds its tests with them, so that
#                 build and this one share every compiled crate
#
# The toolchain is Debian's rustc-web 1.96 with its aarch64 std (libstd-rust-web-dev:arm64) and
# gcc-aarch64-linux-gnu: rustup's toolchain has no aarch64 std here, and the two cannot be mixed in
# one build, so this uses /usr/bin/cargo and /usr/bin/rustc explicitly with its own target dir.
# Every binary must need glibc <= 2.35 (JetPack 6 is Ubuntu 22.04); the build fails otherwise.
set -euo pipefail

board=""
out=""
install_missing=1
print_cargo_args=0
while [ $# -gt 0 ]; do
  case "$1" in
    --board) board="${2:-}"; shift 2 ;;
    --out) out="${2:-}"; shift 2 ;;
    --no-install) install_missing=0; shift ;;
    --print-cargo-args) print_cargo_args=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
profile="$root/jetson/boards/$board.toml"
[ -n "$board" ] && [ -f "$profile" ] || {
  echo "build.sh: --board must name a profile in jetson/boards/ (orin, thor), got '${board}'" >&2
  exit 2
}
out="${out:-$root/target/jetson}"
glibc_limit="2.35"
triple="aarch64-unknown-linux-gnu"
started=$SECONDS

say() { printf '[jetson/build %s %3ds] %s\n' "$board" $((SECONDS - started)) "$*"; }
# A string value of the board profile (the same file the runtime compiles in).
field() { sed -n "s/^$1 = \"\(.*\)\"/\1/p" "$profile"; }
feature="$(field cargo_feature)"
cudarc_feature="$(field cudarc_feature)"
ros2_distro="$(field ros2_distro)"

# --- packages and features -------------------------------------------------------------------
# One cargo invocation for every package, so cargo unifies their features once and the runtime and
# its dependencies compile once (separate invocations rebuild them for each feature set).
# Each package gets its own `cuda-12`/`cuda-13` feature with the defaults off (the default is
# cuda-13, and cudarc cannot hold two flavours). A crate without these features that depends on
# flashrt's defaults would pull in cuda-13 anyway: check_flavour catches that before building.
cargo_packages=()
flavour_features=()
components=()
add() { # package manifest
  cargo_packages+=(-p "$1")
  components+=("$1")
  if grep -q "^$feature = " "$2"; then
    flavour_features+=("$1/$feature")
  fi
}
add flashrt "$root/runtime/Cargo.toml"
have_ffi=0
if [ -f "$root/ffi/Cargo.toml" ]; then
  have_ffi=1
  add flashrt-ffi "$root/ffi/Cargo.toml"
fi
have_ros2=0
if [ -f "$root/ros2_bridge/Cargo.toml" ]; then
  have_ros2=1
  add flashrt-ros2 "$root/ros2_bridge/Cargo.toml"
  # The distribution is a default feature of the node; with the defaults off, name it.
  if grep -q "^$ros2_distro = " "$root/ros2_bridge/Cargo.toml"; then
    flavour_features+=("flashrt-ros2/$ros2_distro")
  fi
fi
features=(--no-default-features --features "$(IFS=,; echo "${flavour_features[*]}")")
if [ "$print_cargo_args" = 1 ]; then
  echo "${cargo_packages[*]} ${features[*]}"
  exit 0
fi

# --- toolchain -----------------------------------------------------------------------------------
toolchain_packages=(rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu g++-aarch64-linux-gnu
  binutils-aarch64-linux-gnu cmake)
missing=()
for p in "${toolchain_packages[@]}"; do
  dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$install_missing" = 1 ] || { echo "build.sh: missing packages: ${missing[*]}" >&2; exit 1; }
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  say "installing ${missing[*]}"
  dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

# shellcheck source=jetson/cross-env.sh
. "$root/jetson/cross-env.sh"
cargo=("${cargo_aarch64[@]}")
say "$("${cargo[0]}" --version), $($RUSTC --version); target dir $CARGO_TARGET_DIR"

# --- cargo builds --------------------------------------------------------------------------------
# Fails unless the cudarc that `cargo tree` resolves for these arguments has exactly this board's
# flavour; prints "none" when the package does not use cudarc at all.
check_flavour() {
  local tree
  local err
  err="$(mktemp)"
  if ! tree="$("${cargo[@]}" tree --locked --target "$triple" -e features -i cudarc "$@" 2> "$err")"; then
    # The one expected failure: the package does not use cudarc (no CUDA backend in its graph).
    if grep -q "did not match any packages" "$err"; then
      rm -f "$err"
      echo "none"
      return
    fi
    cat "$err" >&2
    exit 1
  fi
  rm -f "$err"
  local flavours
  flavours="$(grep -o 'cudarc feature "cuda-[0-9]*"' <<< "$tree" | sort -u | grep -o 'cuda-[0-9]*' | tr '\n' ' ')"
  if [ "$flavours" != "$cudarc_feature " ]; then
    echo "build.sh: $* resolves cudarc flavour(s) '${flavours% }', the $board needs $cudarc_feature" >&2
    echo "build.sh: the crate must depend on flashrt with default-features = false and forward $feature" >&2
    exit 1
  fi
  echo "$cudarc_feature"
}

release="$CARGO_TARGET_DIR/$triple/release"
# Checked before building: resolving the graph takes a second, a wrong build many minutes.
flavour="$(check_flavour "${cargo_packages[@]}" "${features[@]}")"
say "cargo build --release ${cargo_packages[*]} ${features[*]} --lib --bins  (cudarc flavour: $flavour)"
"${cargo[@]}" build --locked --release --target "$triple" "${cargo_packages[@]}" "${features[@]}" --lib --bins

# --- stage ---------------------------------------------------------------------------------------
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)"
IFS=. read -r major minor _patch <<< "$version"
name="flashrt-$version-$board-aarch64"
stage="$CARGO_TARGET_DIR/stage/$name"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/share/flashrt/boards" "$stage/lib/systemd/system"
install -m 755 "$release/flashrt" "$stage/bin/"
install -m 644 "$profile" "$stage/share/flashrt/boards/"

if [ "$have_ffi" = 1 ]; then
  # The layout and the filled templates of ffi/install.sh, from the cross-built libraries.
  mkdir -p "$stage/include" "$stage/lib/cmake/flashrt" "$stage/lib/pkgconfig"
  install -m 644 "$root"/include/flashrt.h* "$stage/include/"
  install -m 755 "$release/libflashrt_ffi.so" "$stage/lib/libflashrt.so.$version"
  ln -sf "libflashrt.so.$version" "$stage/lib/libflashrt.so"
  install -m 644 "$release/libflashrt_ffi.a" "$stage/lib/libflashrt.a"
  static_deps="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
  static_deps_cmake="$(echo "$static_deps" | sed 's/-l//g; s/ /;/g')"
  fill() {
    sed -e "s/@VERSION@/$version/g" -e "s/@MAJOR@/$major/g" -e "s/@MINOR@/$minor/g" \
      -e "s/@STATIC_DEPS@/$static_deps/g" -e "s/@STATIC_DEPS_CMAKE@/$static_deps_cmake/g" "$1" > "$2"
  }
  fill "$root/ffi/cmake/flashrtConfig.cmake.in" "$stage/lib/cmake/flashrt/flashrtConfig.cmake"
  fill "$root/ffi/cmake/flashrtConfigVersion.cmake.in" "$stage/lib/cmake/flashrt/flashrtConfigVersion.cmake"
  fill "$root/ffi/cmake/flashrt.pc.in" "$stage/lib/pkgconfig/flashrt.pc"
fi

if [ "$have_ros2" = 1 ]; then
  install -m 755 "$release/flashrt-ros2" "$stage/bin/"
  mkdir -p "$stage/share/flashrt/ros2"
  install -m 644 "$root"/ros2_bridge/examples/*.toml "$stage/share/flashrt/ros2/"
fi
install -m 644 "$root/jetson/flashrt-ros2.service" "$stage/lib/systemd/system/"
install -m 755 "$root/jetson/install.sh" "$stage/"

# The C++ example, configured against the staged package exactly as a user would (find_package).
have_example=0
example="$root/examples/cpp_controller"
if [ "$have_ffi" = 1 ] && [ -f "$example/CMakeLists.txt" ]; then
  have_example=1
  say "cmake: examples/cpp_controller for aarch64"
  cmake_dir="$CARGO_TARGET_DIR/cmake-cpp_controller-$board"
  rm -rf "$cmake_dir"
  # The binary is packed beside lib/: it finds libflashrt through $ORIGIN, not through this host's
  # staging directory.
  cmake -S "$example" -B "$cmake_dir" -DCMAKE_TOOLCHAIN_FILE="$root/jetson/aarch64-toolchain.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$stage" \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' > "$cmake_dir.log" 2>&1 || { cat "$cmake_dir.log"; exit 1; }
  cmake --build "$cmake_dir" -j 2 >> "$cmake_dir.log" 2>&1 || { cat "$cmake_dir.log"; exit 1; }
  find "$cmake_dir" -maxdepth 1 -type f -perm -u+x -exec install -m 755 {} "$stage/bin/" \;
  mkdir -p "$stage/share/flashrt/examples"
  cp -r "$example" "$stage/share/flashrt/examples/"
  components+=("cpp_controller:$(cd "$cmake_dir" && find . -maxdepth 1 -type f -perm -u+x -printf '%f ' | sed 's/ $//')")
fi

# --- glibc check ---------------------------------------------------------------------------------
# The highest GLIBC_x.y symbol version any shipped ELF file requires. Rust's std resolves newer
# functions at run time (weak symbols), so the Debian 12 build host (glibc 2.36) is not the bound.
glibc_max="0"
report=""
while IFS= read -r -d '' f; do
  # Static archives and files without a dynamic symbol table have no requirement of their own.
  need="$( (aarch64-linux-gnu-objdump -T "$f" 2> /dev/null || true) | (grep -o 'GLIBC_[0-9][0-9.]*' || true) | sed 's/GLIBC_//' | sort -uV | tail -n1)"
  [ -n "$need" ] || continue
  report+="  ${f#"$stage"/}: GLIBC_$need"$'\n'
  glibc_max="$(printf '%s\n%s\n' "$glibc_max" "$need" | sort -V | tail -n1)"
done < <(find "$stage/bin" "$stage/lib" -maxdepth 1 -type f -print0)
printf 'glibc required per file:\n%s' "$report"
if [ "$(printf '%s\n%s\n' "$glibc_max" "$glibc_limit" | sort -V | tail -n1)" != "$glibc_limit" ]; then
  echo "build.sh: the binaries need glibc $glibc_max, JetPack 6 (Ubuntu 22.04) has $glibc_limit. Symbols above it:" >&2
  find "$stage/bin" "$stage/lib" -maxdepth 1 -type f -exec sh -c 'aarch64-linux-gnu-objdump -T "$1" 2>/dev/null | grep -E "GLIBC_2\.(3[6-9]|[4-9][0-9])" | sed "s|^|$1: |"' _ {} \; >&2
  exit 1
fi
say "glibc required: $glibc_max (limit $glibc_limit)"

# --- exports of libflashrt.so --------------------------------------------------------------------
# The C API and nothing else, as ffi/tests/c_api.rs checks on x86_64: only frt_* symbols, and every
# function flashrt.h declares. (A gold-linked build once leaked nine Rust thread-local symbols.)
if [ "$have_ffi" = 1 ]; then
  so="$stage/lib/libflashrt.so.$version"
  exports="$(aarch64-linux-gnu-nm -D --defined-only --format=just-symbols "$so")"
  foreign="$(grep -v '^frt_' <<< "$exports" || true)"
  if [ -n "$foreign" ]; then
    printf 'build.sh: libflashrt.so exports symbols outside the C API:\n%s\n' "$foreign" >&2
    exit 1
  fi
  for fn in $(grep -o 'frt_[A-Za-z0-9_]*(' "$stage/include/flashrt.h" | tr -d '(' | sort -u); do
    grep -qx "$fn" <<< "$exports" || { echo "build.sh: $fn is declared in flashrt.h but not exported" >&2; exit 1; }
  done
  aarch64-linux-gnu-readelf -d "$so" | grep -qF "[libflashrt.so.$version]" || { echo "build.sh: soname of $so is not libflashrt.so.$version" >&2; exit 1; }
  say "libflashrt.so exports the C API only: $(wc -l <<< "$exports") frt_* symbols, soname libflashrt.so.$version"
fi

# --- manifest and tarball ------------------------------------------------------------------------
commit="$(git -C "$root" rev-parse HEAD 2> /dev/null || echo unknown)"
dirty=false
git -C "$root" diff --quiet HEAD 2> /dev/null || dirty=true
json_list() { # quoted, comma-separated
  local first=1
  for x in "$@"; do
    [ $first = 1 ] || printf ', '
    printf '"%s"' "$x"
    first=0
  done
}
absent=()
[ "$have_ffi" = 1 ] || absent+=("libflashrt (no ffi/ in this checkout)")
[ "$have_ros2" = 1 ] || absent+=("flashrt-ros2 (no ros2_bridge/ in this checkout)")
[ "$have_example" = 1 ] || absent+=("cpp_controller (no examples/cpp_controller/CMakeLists.txt or no ffi/)")
files=()
while IFS= read -r f; do
  files+=("$(cd "$stage" && sha256sum "$f" | sed 's/  / /')")
done < <(cd "$stage" && find . -type f ! -name MANIFEST.json -printf '%P\n' | sort)
cat > "$stage/MANIFEST.json" << EOF
{
  "name": "flashrt",
  "version": "$version",
  "commit": "$commit",
  "dirty": $dirty,
  "board": "$board",
  "board_description": "$(field description)",
  "target": "$triple",
  "arch": "$(field arch)",
  "cuda": "$(field cuda)",
  "cudarc_flavour": "$cudarc_feature",
  "cargo_feature": "$feature",
  "ros2_distro": "$ros2_distro",
  "components": [$(json_list "${components[@]}")],
  "cudarc_flavour_resolved": "$flavour",
  "absent": [$(json_list "${absent[@]}")],
  "glibc_required": "$glibc_max",
  "glibc_limit": "$glibc_limit",
  "rustc": "$($RUSTC --version)",
  "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "sha256": [$(json_list "${files[@]}")]
}
EOF
mkdir -p "$out"
tarball="$out/$name.tar.gz"
tar -C "$(dirname "$stage")" -czf "$tarball" "$name"
say "wrote $tarball ($(du -h "$tarball" | cut -f1)); components: ${components[*]}"

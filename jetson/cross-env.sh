# Environment for cross-compiling to aarch64-unknown-linux-gnu with Debian's rustc-web (sourced by
# build.sh and ci.sh; `root` is the repository root). rustup's toolchain cannot build aarch64 here
# and cannot share a target dir with this one, hence the explicit paths and the own target dir.
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_DIR="${FRT_JETSON_TARGET_DIR:-$root/target/aarch64-cross}"
# The cross gcc with GNU ld: rustc's own version script keeps libflashrt.so's exports to frt_*.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# `-L /`: with `-L /usr/aarch64-linux-gnu` threaded programs hang under qemu-user.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
cargo_aarch64=(/usr/bin/cargo)

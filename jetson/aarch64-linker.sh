#!/bin/sh
# The linker cargo uses for aarch64-unknown-linux-gnu (see cross-env.sh): the cross gcc with gold.
# GNU ld (bfd) 2.40 refuses a cdylib with two anonymous version scripts, rustc's own export list
# plus ffi/exports.map ("anonymous version tag cannot be combined with other version tags"); gold
# merges them, as LLD does for rustup's x86_64 toolchain.
exec aarch64-linux-gnu-gcc -fuse-ld=gold "$@"

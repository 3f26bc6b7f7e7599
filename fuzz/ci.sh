#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, a cargo-fuzz crate) of every parser and boundary: builds the
# targets in fuzz/ and runs each for FRT_FUZZ_SECONDS (default 30) from its committed seed
# corpus. Fails on any crash, panic, timeout or out-of-memory; the failing input is left under
# target/fuzz-artifacts/<target>/ (reproduce: the printed command with that file as argument).
#
# Toolchain: stable Rust. The targets build with plain cargo and the flags `cargo fuzz build`
# (cargo-fuzz 0.13.1) passes, so CI does not compile cargo-fuzz itself (~30 s of a clean run);
# `cargo fuzz run <target>` works on this crate as well.
# Sanitizer: none by default (the coverage instrumentation needs only stable flags); with
# FRT_FUZZ_SANITIZER=address the build adds -Zsanitizer=address, which stable 1.95 accepts
# under RUSTC_BOOTSTRAP=1 (set below; its ASan runtime ships with the toolchain, no -Zbuild-std:
# checked on a probe target that reads out of bounds). Slower; for long runs.
# Missing tools (a C++ compiler for libFuzzer) skip with a message, or fail under FRT_REQUIRE_ALL=1.
#
# Usage: fuzz/ci.sh [TARGET...]     FRT_FUZZ_SECONDS=3600 fuzz/ci.sh checkpoint  (a long run)
set -euo pipefail
cd "$(dirname "$0")/.."
TIMING_PREFIX="fuzz: "
# shellcheck source=tools/timing.sh
. tools/timing.sh

seconds="${FRT_FUZZ_SECONDS:-30}"
sanitizer="${FRT_FUZZ_SANITIZER:-none}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(checkpoint tokenizer observation c_abi ros2_msg serve_msg)

missing() {
  if [ "${FRT_REQUIRE_ALL:-0}" = 1 ]; then
    echo "fuzz/ci.sh: $1 (FRT_REQUIRE_ALL=1)" >&2
    exit 1
  fi
  echo "SKIP fuzzing: $1"
  exit 0
}
command -v c++ > /dev/null || missing "no C++ compiler (libFuzzer is C++; install build-essential)"

# Outside the workspace, so the workspace's fmt check does not see it.
timed "cargo fmt --check (fuzz crate)" cargo fmt --manifest-path fuzz/Cargo.toml --check

export RUSTC_BOOTSTRAP=1
# The build `cargo fuzz build --sanitizer $sanitizer --codegen-units 16` runs, with cargo-fuzz
# 0.13.1's defaults: SanitizerCoverage with inline 8-bit counters, PC table, compare tracing and
# stack depth for libFuzzer, branch folding off, `--cfg fuzzing`, debug assertions; --target keeps
# them off build scripts and proc macros; a caller's RUSTFLAGS come last, as cargo fuzz appends
# them. One difference: cargo fuzz also turns on line tables (profile.release.debug), which this
# build leaves off as the fuzz crate's profile says (debug = 0): ~13% of the build's CPU time, and
# a panic still names its file and line. The fuzz build has its own target directory (every crate
# is instrumented); 16 codegen units and the fuzz crate's release profile (opt-level 2) keep it
# cheap.
rustflags=(-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing
  -Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Cllvm-args=-sanitizer-coverage-stack-depth
  -Cdebug-assertions -Ccodegen-units=16)
[ "$sanitizer" = none ] || rustflags+=("-Zsanitizer=$sanitizer")
host="$(rustc -vV | sed -n 's/^host: //p')"
out="$PWD/target/fuzz"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
timed "build ${targets[*]} (sanitizer: $sanitizer)" \
  env RUSTFLAGS="${rustflags[*]} ${RUSTFLAGS:-}" cargo build --locked --manifest-path fuzz/Cargo.toml \
  --target "$host" --release --target-dir "$out" "${bins[@]}"
bin="$out/$host/release"

# One fuzzer is one process on one core: FRT_FUZZ_JOBS (default: the core count) run side by side,
# each for its whole budget, so the targets get the same time as one after the other in less wall
# time.
fuzz_one() { # target
  local t=$1
  # New inputs go to a scratch corpus under target/; the committed seeds are only read.
  local work="$PWD/target/fuzz-corpus/$t" artifacts="$PWD/target/fuzz-artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  "$bin/$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts" "$work" "fuzz/corpus/$t" > "$PWD/target/fuzz-$t.log" 2>&1
}
fuzz_batch() { # targets...
  local pids=() i failed=0
  for t in "$@"; do
    echo "reproduce a failure: $bin/$t -rss_limit_mb=2048 <input>"
    fuzz_one "$t" &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    local t="${*:i+1:1}"
    if ! wait "${pids[$i]}"; then
      tail -n 60 "$PWD/target/fuzz-$t.log" >&2
      echo "fuzz/ci.sh: $t failed; the input is under target/fuzz-artifacts/$t/ (log: target/fuzz-$t.log)" >&2
      failed=1
    fi
  done
  return $failed
}
jobs="${FRT_FUZZ_JOBS:-$(nproc)}"
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  batch=("${targets[@]:i:jobs}")
  timed "fuzz ${batch[*]} for ${seconds}s each, side by side" fuzz_batch "${batch[@]}"
done
summary=()
for t in "${targets[@]}"; do
  log="$PWD/target/fuzz-$t.log"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n1 | cut -d' ' -f2)
  summary+=("$t: ${runs:-?} runs, ${cov:-?} coverage points, no crash")
done
printf '%s\n' "${summary[@]}"
print_timings

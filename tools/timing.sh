# Sourced by the CI scripts: `timed LABEL COMMAND...` runs COMMAND under a banner and records its
# wall time; `print_timings` lists them with the total since sourcing. TIMING_PREFIX names the
# script in the banners (empty for the top-level test command).
timing_started=$SECONDS
timings=()
timed() { # label command...
  local label="$1" t0=$SECONDS
  shift
  printf '\n=== %s%s\n' "${TIMING_PREFIX:-}" "$label"
  "$@"
  timings+=("$(printf '%5ds  %s' $((SECONDS - t0)) "$label")")
}
print_timings() {
  printf '\n=== %stimings\n' "${TIMING_PREFIX:-}"
  printf '%s\n' "${timings[@]}"
  printf '%5ds  total\n' $((SECONDS - timing_started))
}

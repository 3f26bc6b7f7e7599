# Sourced by the CI scripts: `timed LABEL COMMAND...` runs COMMAND under a banner and records its
# wall time; `print_timings` lists them with the total since sourcing. TIMING_PREFIX names the
# script in the banners (empty for the top-level test command). `check_budget` fails the run when
# the total exceeds FRT_CI_BUDGET_MIN minutes and writes the table to target/ci-timing.json.

# The one place the CI time budget is set (minutes on a developer's 2-core machine; CI's 90-minute
# wall is on a machine up to 2x slower).
FRT_CI_BUDGET_MIN="${FRT_CI_BUDGET_MIN:-35}"
timing_started=$SECONDS
# One "SECONDS<TAB>LABEL" record per timed step; the table and the JSON are both made from it.
timings=()
timed() { # label command...
  local label="$1" t0=$SECONDS
  shift
  printf '\n=== %s%s\n' "${TIMING_PREFIX:-}" "$label"
  "$@"
  timings+=("$((SECONDS - t0))"$'\t'"$label")
}
print_timings() {
  printf '\n=== %stimings\n' "${TIMING_PREFIX:-}"
  local record
  for record in "${timings[@]}"; do
    printf '%5ds  %s\n' "${record%%$'\t'*}" "${record#*$'\t'}"
  done
  printf '%5ds  total\n' $((SECONDS - timing_started))
}
check_budget() {
  local total=$((SECONDS - timing_started)) budget=$((FRT_CI_BUDGET_MIN * 60))
  mkdir -p target
  {
    printf '{\n  "commit": "%s",\n  "date": "%s",\n  "machine": "%s cores",\n' \
      "$(git rev-parse --short=12 HEAD 2> /dev/null || echo unknown)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(nproc)"
    printf '  "total_s": %d,\n  "budget_s": %d,\n  "steps": [\n' "$total" "$budget"
    local record label
    for record in "${timings[@]}"; do
      label="${record#*$'\t'}"
      printf '    {"step": "%s", "seconds": %d}\n' "${label//\"/\\\"}" "${record%%$'\t'*}"
    done | sed '$!s/$/,/' # comma-separate the steps
    printf '  ]\n}\n'
  } > target/ci-timing.json
  if [ "$total" -gt "$budget" ]; then
    echo "tools/test.sh: the run took ${total}s, over the budget of ${FRT_CI_BUDGET_MIN} minutes (FRT_CI_BUDGET_MIN in tools/timing.sh)." >&2
    echo "tools/test.sh: CI is killed at 90 minutes on a machine up to 2x slower: make the slow steps above cheaper (smaller fixtures, fewer repetitions), never by dropping a check." >&2
    return 1
  fi
  echo "within the CI budget: ${total}s of ${budget}s (target/ci-timing.json)"
}

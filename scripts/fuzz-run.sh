#!/usr/bin/env bash
# Runs the libFuzzer targets (built by `make fuzz`) for a fixed time each and
# prints, per target, the executions, crashes and coverage libFuzzer reports.
#
# Usage: scripts/fuzz-run.sh SECONDS [TARGET...]
#   SECONDS  run time of each target (-max_total_time)
#   TARGET   target names without _fuzz (default: every fuzz/<name>_fuzz.cc)
# Environment: FUZZ_DIR (default build-fuzz), FUZZ_ARGS (extra libFuzzer flags),
#   FUZZ_JOBS (default 1): how many targets run at once. Each libFuzzer run is
#   one process on one core, so on a 2-core machine FUZZ_JOBS=2 halves the
#   wall time and every target still runs SECONDS (make fuzz-run passes JOBS).
# Leaks inside system libraries are suppressed by fuzz/lsan.supp (each says why).
#
# Each target reads its committed seeds fuzz/corpus/<name>/ read-only and
# writes what it discovers to a scratch corpus FUZZ_DIR/fuzz-run/corpus/<name>/
# (kept between runs, so a later run starts from everything found before);
# the committed corpus is never grown in place. Crash, timeout and OOM
# inputs are written to FUZZ_DIR/fuzz-run/artifacts/<name>/, the log of each
# run to FUZZ_DIR/fuzz-run/<name>.log, and the table printed at the end also
# goes to FUZZ_DIR/fuzz-run/summary.txt. A target that crashes stops there
# (libFuzzer's behaviour) and the others still run.
# Exit status: 0 when every target ran without a crash, 1 otherwise, 2 on bad
# usage or a missing binary.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
  echo "usage: $0 SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift
fuzz_dir=${FUZZ_DIR:-build-fuzz}
out=$fuzz_dir/fuzz-run

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for src in fuzz/*_fuzz.cc; do
    name=$(basename "$src" _fuzz.cc)
    targets+=("$name")
  done
fi

mkdir -p "$out"
summary=$out/summary.txt
header=$(printf '%-16s %12s %9s %7s %7s %8s %10s %s' target executions exec/s cov ft corpus crashes "")
jobs=${FUZZ_JOBS:-1}
[[ "$jobs" =~ ^[0-9]+$ && "$jobs" -ge 1 ]] || jobs=1

for name in "${targets[@]}"; do
  if [[ ! -x "$fuzz_dir/fuzz/${name}_fuzz" ]]; then
    echo "fuzz-run: no binary $fuzz_dir/fuzz/${name}_fuzz (run make fuzz)" >&2
    exit 2
  fi
done

# run_target NAME: runs one target, writes its table row to $out/NAME.row;
# exit status 1 when it crashed.
run_target() {
  local name=$1
  local bin=$fuzz_dir/fuzz/${name}_fuzz
  local seeds=fuzz/corpus/$name
  local corpus=$out/corpus/$name
  local artifacts=$out/artifacts/$name
  local log=$out/$name.log
  mkdir -p "$corpus" "$artifacts"
  local seed_dirs=()
  [[ -d "$seeds" ]] && seed_dirs+=("$seeds")
  echo "fuzz-run: $name for ${seconds} s ($(ls "$seeds" 2>/dev/null | wc -l) seeds, $(ls "$corpus" | wc -l) in scratch corpus)"
  # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
  LSAN_OPTIONS="suppressions=$PWD/fuzz/lsan.supp ${LSAN_OPTIONS:-}" \
  "$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=30 \
      -artifact_prefix="$artifacts/" ${FUZZ_ARGS:-} "$corpus" "${seed_dirs[@]}" >"$log" 2>&1
  local rc=$?
  local execs rate last cov ft corp crash_files crashes note="" failed=0
  execs=$(awk '/^stat::number_of_executed_units:/ {print $2}' "$log" | tail -1)
  rate=$(awk '/^stat::average_exec_per_sec:/ {print $2}' "$log" | tail -1)
  # The last status line carries the final coverage: "#N DONE cov: C ft: F corp: U/B ...".
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1/p' <<<"$last")
  crash_files=$(sed -nE 's/.*Test unit written to (.*)$/\1/p' "$log")
  crashes=$(grep -c 'Test unit written to' "$log")
  if [[ $rc -ne 0 || $crashes -gt 0 ]]; then
    failed=1
    [[ $crashes -eq 0 ]] && crashes=1  # died without writing an input
    note="FAILED (exit $rc); log $log"
    [[ -n "$crash_files" ]] && note+="; input $crash_files"
    { echo "fuzz-run: $name failed; the end of its log:"
      grep -E 'ERROR|SUMMARY|deadly|Test unit|==[0-9]+==' "$log" | tail -15; } >&2
  fi
  local row
  row=$(printf '%-16s %12s %9s %7s %7s %8s %10s %s' "$name" "${execs:-?}" "${rate:-?}" \
      "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes" "$note")
  printf '%s\n' "$row" >"$out/$name.row"
  echo "fuzz-run: $row"
  return $failed
}

# At most $jobs targets at once; the table keeps the targets' order.
failed=0
running=0
for name in "${targets[@]}"; do
  if [[ $running -ge $jobs ]]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  rm -f "$out/$name.row"
  run_target "$name" &
  running=$((running + 1))
done
while [[ $running -gt 0 ]]; do
  wait -n || failed=1
  running=$((running - 1))
done
rows=()
for name in "${targets[@]}"; do
  if [[ -f "$out/$name.row" ]]; then
    rows+=("$(cat "$out/$name.row")")
  else
    failed=1
    rows+=("$(printf '%-16s %s' "$name" "FAILED (no result)")")
  fi
done

{
  echo "fuzz-run: ${seconds} s per target, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "$header"
  printf '%s\n' "${rows[@]}"
} | tee "$summary"
exit $failed

#!/usr/bin/env bash
# The GPU suite, on a machine with a GPU: the whole GoogleTest GPU binary, then compute-sanitizer's
# memcheck and racecheck on shrunk cases (FLASHCUTE_TEST_SMALL / FLASHCUTE_TEST_MAX_CASES). Prints a
# summary last and exits non-zero if any step fails.
#   scripts/run_gpu_suite.sh <build dir> [log dir]   (log dir: $OUT/gpu-suite if $OUT is set)
set -uo pipefail
BUILD_DIR=${1:?usage: scripts/run_gpu_suite.sh <build dir> [log dir]}
LOG_DIR=${2:-${OUT:+$OUT/gpu-suite}}
LOG_DIR=${LOG_DIR:-$BUILD_DIR/gpu-suite}
TESTS="$BUILD_DIR/bin/flashcute_gpu_tests"
mkdir -p "$LOG_DIR"
if [[ ! -x "$TESTS" ]]; then
  echo "run_gpu_suite: $TESTS not found; build the flashcute_gpu_tests target first" >&2
  exit 2
fi
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

failed=0
summary=()
step() {  # step <name> <command...>: runs it with its output in <log dir>/<name>.log
  local name=$1 start=$SECONDS result
  shift
  echo "== $name: $*"
  if "$@" >"$LOG_DIR/$name.log" 2>&1; then result=PASS; else result=FAIL; failed=1; fi
  tail -n 3 "$LOG_DIR/$name.log"
  summary+=("$(printf '%-10s %s  %4ds  %s' "$name" "$result" $((SECONDS - start)) "$LOG_DIR/$name.log")")
}

step gtest "$TESTS" --gtest_output="xml:$LOG_DIR/gtest.xml"

# Small shapes under the sanitizers; the 2^31-element and repeatability tests are left to the
# plain run above (they only add time there).
MEMCHECK_FILTER='GpuReference.*:Coverage.*:Features.*:Edges.EmptyBatch*:Edges.NoKeys*:Edges.RowsAbove*:Edges.Refusals*:Edges.TensorsOnAnotherDevice:Backward.*:Kvcache.*-Kvcache.RepeatedCalls*'
RACECHECK_FILTER='Coverage.*:Features.Combinations:Edges.NoKeys*:Backward.AllPairs:Backward.VariableLength*:Kvcache.AllPairs:Kvcache.PackedQueries*'
if [[ -x "$SANITIZER" ]]; then
  step memcheck env FLASHCUTE_TEST_SMALL=1 "$SANITIZER" --tool memcheck --error-exitcode 1 \
    "$TESTS" --gtest_filter="$MEMCHECK_FILTER"
  step racecheck env FLASHCUTE_TEST_SMALL=1 FLASHCUTE_TEST_MAX_CASES=16 "$SANITIZER" \
    --tool racecheck --error-exitcode 1 "$TESTS" --gtest_filter="$RACECHECK_FILTER"
else
  summary+=("sanitizers FAIL  compute-sanitizer not found")
  failed=1
fi

echo
echo "GPU suite summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)):"
printf '  %s\n' "${summary[@]}"
exit $failed

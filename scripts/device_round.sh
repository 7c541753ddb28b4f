#!/usr/bin/env bash
# One whole round on the GPU machine, for binaries built elsewhere and carried over:
#   scripts/device_round.sh <build dir> [steps...]   steps: runner suite pytest bench sweep (default all)
# Logs and results go to $OUT (or ./device-out); a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:?usage: scripts/device_round.sh <build dir> [steps...]}
shift
STEPS=${*:-runner suite pytest bench}
# The benchmark records the commit measured; the copied tree may lack .git, so pass it in.
export FLASHCUTE_COMMIT=${FLASHCUTE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
RUN="$BUILD_DIR/bin/flashcute_run"
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

has() { [[ " $STEPS " == *" $1 "* ]]; }

if has runner; then
  # The seed's default problem, its runner's flags, then causal, fp16 and the automatic tile.
  for flags in "" "--is_causal" "--dtype Float16" "--dtype Float16 --is_causal" "--auto_tile" \
               "--auto_tile --is_causal"; do
    echo "== flashcute_run $flags" | tee -a "$OUT/runner.log"
    timeout 120 "$RUN" $flags 2>&1 | tee -a "$OUT/runner.log" | tail -n 4
    summary+=("runner ${flags:-(defaults)}: $(grep -E 'TFLOP' "$OUT/runner.log" | tail -n 1)")
  done
fi

if has suite; then
  timeout 420 bash tests/run_gpu_suite.sh "$BUILD_DIR" "$OUT/gpu-suite" >"$OUT/suite.log" 2>&1
  rc=$?
  tail -n 8 "$OUT/suite.log"
  summary+=("gpu suite: exit $rc")
fi

if has pytest && ls .whl/flashcute-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashcute-*.whl
  PYTHONPATH=/tmp/site timeout 420 python3 -m pytest -q -rs python/tests >"$OUT/pytest.log" 2>&1
  rc=$?
  tail -n 5 "$OUT/pytest.log"
  summary+=("pytest: exit $rc ($(tail -n 1 "$OUT/pytest.log"))")
fi

if has sweep && ls .whl/flashcute-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashcute-*.whl
  PYTHONPATH=/tmp/site timeout 300 python3 bench/tile_sweep.py --out "$OUT" ${SWEEP_FLAGS:-} 2>&1 |
    tee "$OUT/sweep.log" | tail -n 40
fi

if has bench && ls .whl/flashcute-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashcute-*.whl
  PYTHONPATH=/tmp/site timeout 420 python3 bench/bench.py --out "$OUT" ${BENCH_FLAGS:-} 2>&1 |
    tee "$OUT/bench.log" | tail -n 60
fi

echo
echo "== summary"
printf '  %s\n' "${summary[@]}"

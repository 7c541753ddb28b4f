#!/usr/bin/env bash
# One whole round on the GPU machine, for binaries built elsewhere and carried over:
#   scripts/device_round.sh <build dir> [steps...]
# Steps, run in the order given (default: runner suite pytest bench):
#   runner  the seed's default problem through flashcute_run (checked, timed)
#   suite   scripts/run_gpu_suite.sh: the GPU GoogleTest suite, memcheck and racecheck
#   pytest  the Python package's tests (wheel from .whl/)
#   bench   bench/bench.py: ours beside PyTorch SDPA's backends -> h200.json, h200.png
#   ab      bench/ab.py: this build's library against AB_OLD_LIB (another build's libflashcute.so)
#           in one process, new / old per row (AB_FLAGS: more bench/ab.py flags) -> <gpu>-ab.json
#   cycles  bench/cycles_ab.py: this build's library against AB_OLD_LIB, cycles per call under
#           Nsight Compute (CYCLES_FLAGS: more bench/cycles_ab.py flags) -> cycles/<gpu>-cycles.json
#   accuracy bench/accuracy.py: each family's and SDPA's error against fp64 -> <gpu>-accuracy.json
#   rows    bench.py's plain forward rows (about 7 minutes), merged into a copy of the tree's
#           h200.json -> $OUT/h200.json (a library carried without a wheel is enough); ROWS, a
#           regular expression over bench.py's row labels, keeps some (e.g. 'plain.*d128 bf16':
#           a third of them), so that a short call measures the furthest rows first (a later
#           call merges into the tree's h200.json: copy the earlier call's there first)
#   features bench.py's other forward kinds (ROWS too) and the host rows, merged the same way
#           (in a call of its own: with the plain rows it would pass a device command's 10 minutes)
#   seed    bench/seed_probe.py: the seed's own kernel (cubins in SEED_DIR, default .carry/seed)
#           beside ours_sm80 and SDPA flash in one process -> seed.log
#   host    bench/host_cost.py: calls per ms of a tiny call, ours beside SDPA -> h200.json (host rows)
#   venv    the wheel (VENV_WHEEL, default .whl/) in a fresh virtual environment, one forward
#           checked against SDPA
#   sweep   bench/tile_sweep.py: every compiled tile of a family (SWEEP_FLAGS: --family sm90 ...)
#   profile Nsight Compute on one runner problem (PROFILE_FLAGS) -> profile-*.txt/csv
#   peers   Nsight Compute on one benchmark row, ours beside cuDNN (PEERS_FLAGS: bench/profile_row.py
#           flags; PEERS_IMPLS: the implementations, default "torch_cudnn ours"; "fa3" needs
#           FLASHCUTE_FA3_LIB) -> peers-details.txt: launch shape, registers, throughputs of each
#           kernel; peers-sass.csv: stall samples per instruction (scripts/sass_stalls.py reads it)
#   bwdpeers Nsight Compute (every section) on one backward row (BWD_ROW, bench/bwd_kernels.py's
#           B:S:H:D[:HK][:causal]): our main kernel, then cuDNN's -> bwd-{ours,cudnn}-*.txt/csv
#   bwdab   bench/ab.py --kind bwd: the backward of this build against AB_OLD_LIB in one process
#           (default rows: d 128 with s >= 2k; AB_FLAGS: more bench/ab.py flags) -> bwdab.log
# bench and rows add FlashAttention-3's forward ("fa3") to the plain, gqa and packed rows when
# FLASHCUTE_FA3_LIB names the library scripts/build_fa3_peer.sh builds.
# Nsight Compute runs with --clock-control none: the card's clocks are left as they are.
# Each step has a time cap (STEP_TIMEOUT_<step>, seconds). Logs and results go to $OUT (or
# ./device-out); a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:?usage: scripts/device_round.sh <build dir> [steps...]}
shift
STEPS=${*:-runner suite pytest bench}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
# The benchmark records the commit measured; the copied tree may lack .git, so pass it in.
export FLASHCUTE_COMMIT=${FLASHCUTE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

# The package under test: the wheel in .whl/ if one was carried, else this tree's python/ with the
# build's own library (carrying <build dir>/lib is then enough).
install_wheel() {
  if compgen -G ".whl/flashcute-*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site \
      .whl/flashcute-*.whl && export PYTHONPATH=/tmp/site
  elif [ -f "$BUILD_DIR/lib/libflashcute.so" ]; then
    FLASHCUTE_LIB=$(realpath "$BUILD_DIR/lib/libflashcute.so")
    export PYTHONPATH=$PWD/python FLASHCUTE_LIB
  else
    echo "no wheel in .whl/ and no $BUILD_DIR/lib/libflashcute.so" >&2
    return 1
  fi
}

step_runner() {
  # The seed's default problem with its runner's flags, then causal, fp16 and the automatic tile.
  for flags in "" "--is_causal" "--dtype Float16" "--auto_tile" "--auto_tile --is_causal"; do
    echo "== flashcute_run $flags" | tee -a "$OUT/runner.log"
    timeout "${STEP_TIMEOUT_runner:-120}" "$BUILD_DIR/bin/flashcute_run" $flags 2>&1 |
      tee -a "$OUT/runner.log" | tail -n 4
    summary+=("runner ${flags:-(defaults)}: $(grep -E 'TFLOP' "$OUT/runner.log" | tail -n 1)")
  done
}

step_suite() {
  timeout "${STEP_TIMEOUT_suite:-420}" bash scripts/run_gpu_suite.sh "$BUILD_DIR" "$OUT/gpu-suite" \
    >"$OUT/suite.log" 2>&1
  local rc=$?
  tail -n 8 "$OUT/suite.log"
  summary+=("gpu suite: exit $rc")
}

step_pytest() {
  install_wheel || return
  timeout "${STEP_TIMEOUT_pytest:-420}" python3 -m pytest -q -rs python/tests >"$OUT/pytest.log" 2>&1
  local rc=$?
  tail -n 5 "$OUT/pytest.log"
  summary+=("pytest: exit $rc ($(tail -n 1 "$OUT/pytest.log"))")
}

step_bench() {
  install_wheel || return
  timeout "${STEP_TIMEOUT_bench:-420}" python3 bench/bench.py --out "$OUT" ${BENCH_FLAGS:-} 2>&1 |
    tee "$OUT/bench.log" | tail -n 60
}

# bench.py's rows of the given kinds for this build in the sustained state, merged into a copy of
# the results file in this tree: $OUT/h200.json replaces bench/results/h200.json once checked.
#   merge_rows KINDS TIMEOUT_S LOG
merge_rows() {
  install_wheel || return
  cp bench/results/h200.json "$OUT/h200.json"
  timeout "$2" python3 bench/bench.py --kinds "$1" ${ROWS:+--rows "$ROWS"} --warmup 5 --iters 20 \
    --no-plot --merge "$OUT/h200.json" --out "$OUT/h200.json" >"$OUT/$3" 2>&1
}

step_rows() {
  # The plain rows: each timing spans a second of calls, about 7 minutes in all.
  merge_rows plain "${STEP_TIMEOUT_rows:-540}" rows-plain.log
  summary+=("rows plain: exit $?")
}

step_features() {
  # The feature kinds and the host rows (carry the plain rows' h200.json into the tree first when
  # both are wanted).
  merge_rows gqa,varlen,varlen_short,window,lse,softcap,alibi "${STEP_TIMEOUT_features:-300}" \
    rows-features.log
  summary+=("rows features: exit $?")
  step_host "$OUT/h200.json"
}

# This build's library against AB_OLD_LIB's through one of bench/'s comparison scripts, its log in
# $OUT/<step>.log:
#   compare_builds <step> <time cap, s> <lines shown> <script and its flags...>
compare_builds() {
  local step=$1 cap=$2 lines=$3
  shift 3
  if [[ -z ${AB_OLD_LIB:-} ]]; then
    echo "$step: AB_OLD_LIB (the library to compare against) is not set" >&2
    summary+=("$step: not run (AB_OLD_LIB not set)")
    return
  fi
  install_wheel || return
  timeout "$cap" python3 "$@" --old "$AB_OLD_LIB" --new "$BUILD_DIR/lib/libflashcute.so" 2>&1 |
    tee "$OUT/$step.log" | tail -n "$lines"
  summary+=("$step: exit ${PIPESTATUS[0]}")
}

step_cycles() {
  compare_builds cycles "${STEP_TIMEOUT_cycles:-300}" 40 bench/cycles_ab.py --out "$OUT/cycles" \
    ${CYCLES_FLAGS:-}
}

step_accuracy() {
  install_wheel || return
  timeout "${STEP_TIMEOUT_accuracy:-300}" python3 bench/accuracy.py --out "$OUT" 2>&1 |
    tee "$OUT/accuracy.log" | tail -n 14
}

step_ab() {
  compare_builds ab "${STEP_TIMEOUT_ab:-420}" 40 bench/ab.py --out "$OUT" ${AB_FLAGS:-}
}

step_host() {
  # Host cost of a tiny call against SDPA; the host rows replace those of the results file given
  # (default: the committed one), written to $OUT/h200.json.
  install_wheel || return
  timeout "${STEP_TIMEOUT_host:-180}" python3 bench/host_cost.py --profile \
    --merge "${1:-bench/results/h200.json}" --out "$OUT" 2>&1 | tee "$OUT/host.log" |
    grep -E "calls/ms|costs|us per call|wrote"
  summary+=("host: $(grep -E '^ *ours costs' "$OUT/host.log" | tr -s ' ' | paste -sd ';')")
}

step_venv() {
  # The wheel installed into a fresh virtual environment that sees torch (the machine's python3
  # is itself a venv, so a .pth file points at its site-packages) and nothing else, then one
  # forward against SDPA.
  local venv=/tmp/flashcute-venv site torch_site
  rm -rf "$venv" && python3 -m venv "$venv" &&
    site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])') &&
    torch_site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))') &&
    echo "$torch_site" >"$site/machine-torch.pth" &&
    "$venv/bin/python" -m pip install -q --no-index --no-deps ${VENV_WHEEL:-.whl/flashcute-*.whl} &&
    (cd /tmp && "$venv/bin/python" -c '
import flashcute, torch, torch.nn.functional as F
print(flashcute.__file__, flashcute.build_info())
q, k, v = (torch.randn(2, 256, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out = flashcute.flash_attn_func(q, k, v, causal=True)
ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
err = ((out.float() - ref.transpose(1, 2).float()).norm() / ref.float().norm()).item()
print(f"fresh venv forward: rel L2 against SDPA {err:.2e}")
assert err < 2e-2
') 2>&1 | tee "$OUT/venv.log" | tail -n 3
  summary+=("venv: $(tail -n 1 "$OUT/venv.log")")
}

step_sweep() {
  install_wheel || return
  timeout "${STEP_TIMEOUT_sweep:-300}" python3 bench/tile_sweep.py --out "$OUT" ${SWEEP_FLAGS:-} 2>&1 |
    tee "$OUT/sweep.log" | tail -n 40
}

step_profile() {
  # Nsight Compute on one runner problem (PROFILE_FLAGS, default: the Hopper kernel on a short
  # d 128 problem): every section, then the per-instruction SASS view with its stall samples.
  local flags=${PROFILE_FLAGS:-"--family sm90 --auto_tile --batch_size 32 --seqlen_q 512 --seqlen_k 512"}
  local ncu
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout "${STEP_TIMEOUT_profile:-240}" "$ncu" --clock-control none --set full --import-source no -k regex:forward_kernel \
    --launch-skip 2 -c 1 -f -o "$OUT/profile" "$BUILD_DIR/bin/flashcute_run" $flags \
    --skip_ref_check --warmup_iterations 2 --iterations 1 >"$OUT/profile.log" 2>&1
  "$ncu" --import "$OUT/profile.ncu-rep" --page details >"$OUT/profile-details.txt" 2>&1
  "$ncu" --import "$OUT/profile.ncu-rep" --page source --print-source sass --csv \
    >"$OUT/profile-sass.csv" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Stall" \
    "$OUT/profile-details.txt" | head -n 20
  summary+=("profile ($flags): $(grep -m1 -E '^ +Duration' "$OUT/profile-details.txt")")
}

step_peers() {
  install_wheel || return
  local flags=${PEERS_FLAGS:-"--b 32 --s 512 --h 32 --d 64 --causal"}
  local ncu ranges=()
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  local impls=${PEERS_IMPLS:-"torch_cudnn ours"}
  for impl in $impls; do ranges+=(--nvtx-include "$impl/"); done
  timeout "${STEP_TIMEOUT_peers:-240}" "$ncu" --clock-control none --nvtx "${ranges[@]}" \
    --section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section SourceCounters --import-source no \
    -f -o "$OUT/peers" python3 bench/profile_row.py $flags --impls $impls >"$OUT/peers.log" 2>&1
  "$ncu" --import "$OUT/peers.ncu-rep" --page details >"$OUT/peers-details.txt" 2>&1
  "$ncu" --import "$OUT/peers.ncu-rep" --page source --print-source sass --csv \
    >"$OUT/peers-sass.csv" 2>&1
  grep -E "^  [a-z_]|Duration|Grid Size|Block Size|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Achieved Occupancy|L2 Hit" \
    "$OUT/peers-details.txt" | head -n 60
  summary+=("peers ($flags): see peers-details.txt")
}

step_bwdpeers() {
  install_wheel || return
  local row=${BWD_ROW:-2:8192:16:128} ncu
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  # Ours runs before the peers in bwd_kernels.py, so each profile takes the first matching
  # launches: our main kernel; cuDNN's forward (for its output) and then its backward kernels.
  for who in ours cudnn; do
    local kernel=regex:backward_kernel peers=--no-peers count=1
    [[ $who == cudnn ]] && kernel="regex:cudnn|sdpa|fmha" && peers=--peers && count=4
    timeout "${STEP_TIMEOUT_bwdpeers:-200}" "$ncu" --clock-control none --set full \
      --import-source no -k "$kernel" -c $count -f -o "$OUT/bwd-$who" \
      python3 bench/bwd_kernels.py --rows "$row" --family sm90 $peers >"$OUT/bwd-$who.log" 2>&1
    "$ncu" --import "$OUT/bwd-$who.ncu-rep" --page details >"$OUT/bwd-$who-details.txt" 2>&1
    "$ncu" --import "$OUT/bwd-$who.ncu-rep" --page raw --csv >"$OUT/bwd-$who-raw.csv" 2>&1
    "$ncu" --import "$OUT/bwd-$who.ncu-rep" --page source --print-source sass --csv \
      >"$OUT/bwd-$who-sass.csv" 2>&1
    grep -E "^  [a-z_]|Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|L1/TEX Hit|Shared" \
      "$OUT/bwd-$who-details.txt" | head -n 14
  done
  summary+=("bwdpeers ($row): see bwd-*-details.txt")
}

step_bwdab() {
  compare_builds bwdab "${STEP_TIMEOUT_bwdab:-420}" 18 bench/ab.py --kind bwd --rows quick \
    --impls ours --rounds 4 --warmup 5 --iters 20 --out "$OUT/bwdab" ${AB_FLAGS:-}
}

step_seed() {
  # The seed's own kernel (cubins from scripts/compile_seed_cubin.py in SEED_DIR, each with its
  # entry's name in <stem>.name, or in that of its stem without the last -tag) beside ours_sm80
  # and SDPA flash, one process per cubin. A stem says the mask (causal...) and fp16 if it is.
  install_wheel || return
  local dir=${SEED_DIR:-.carry/seed} cubin stem name flags
  for cubin in "$dir"/*.cubin; do
    stem=$(basename "$cubin" .cubin)
    name="$dir/$stem.name"
    [[ -f $name ]] || name="$dir/${stem%-*}.name"
    flags=""
    [[ $stem == causal* ]] && flags+=" --causal"
    [[ $stem == *fp16* ]] && flags+=" --dtype fp16"
    echo "== $cubin" | tee -a "$OUT/seed.log"
    timeout "${STEP_TIMEOUT_seed:-120}" python3 bench/seed_probe.py --cubin "$cubin" \
      --kernel "$(cat "$name")" $flags 2>&1 | tee -a "$OUT/seed.log" | tail -n 4
  done
  summary+=("seed: $(grep -c '^seed / torch_flash' "$OUT/seed.log") cubins timed")
}

for step in $STEPS; do
  "step_$step"
done

echo
echo "== summary"
printf '  %s\n' "${summary[@]}"

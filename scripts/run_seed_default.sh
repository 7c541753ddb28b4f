#!/usr/bin/env bash
# Sets up and runs the main job: the seed's default problem (bf16, batch 4, seqlen 8192, 16 heads,
# head_dim 128, tiles 128x64 with 128 threads) on the GPU, checked against a GPU fp32 reference
# and timed. Extra arguments go to the runner (e.g. --is_causal, --dtype Float16, --use_cold_l2).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

if ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1); then
  echo "No CUDA GPU found on this machine: the main job needs one (sm_80 or newer)." >&2
  echo "The test suites that need no GPU run with: bash scripts/run_tests.sh" >&2
  exit 1
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  -DFLASHCUTE_CUDA_ARCHS="${FLASHCUTE_CUDA_ARCHS:-80;90a}" \
  -DFLASHCUTE_TILE_SET="${FLASHCUTE_TILE_SET:-minimal}" -DFLASHCUTE_BUILD_TESTS=OFF
cmake --build "$BUILD_DIR" -j "$(nproc)" --target flashcute_run
"$BUILD_DIR/bin/flashcute_run" "$@"

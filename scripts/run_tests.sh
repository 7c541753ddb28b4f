#!/usr/bin/env bash
# Sets up and runs the test suites that need no GPU: configure (the CUTLASS headers are fetched by
# the build), compile every kernel source for sm_80 and sm_90a (minimal instantiation set), run the
# CPU GoogleTest suite, then build the Python wheel from that library and run its CPU tests.
# On a machine with a GPU the GPU suite runs too (tests/run_gpu_suite.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-ci}
JOBS=${JOBS:-$(nproc)}

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  -DFLASHCUTE_CUDA_ARCHS="${FLASHCUTE_CUDA_ARCHS:-80;90a}" \
  -DFLASHCUTE_TILE_SET="${FLASHCUTE_TILE_SET:-minimal}"
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" -L cpu --output-on-failure

python3 -m venv "$BUILD_DIR/venv"
"$BUILD_DIR/venv/bin/python" -m pip install --quiet --upgrade pip
FLASHCUTE_PREBUILT_LIB="$PWD/$BUILD_DIR/lib/libflashcute.so" \
  "$BUILD_DIR/venv/bin/python" -m pip install --quiet "./python[test]"
"$BUILD_DIR/venv/bin/python" -m pytest -q python/tests

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  bash tests/run_gpu_suite.sh "$BUILD_DIR"
else
  echo "No GPU on this machine: the GPU suite (tests/run_gpu_suite.sh) was not run."
fi

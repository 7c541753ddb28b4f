#!/usr/bin/env bash
# Everything that needs no GPU (CI's run), in order, stopping at the first failure:
#   1. format: every C++/CUDA source against .clang-format (scripts/check_format.sh);
#   2. lint: ruff over the Python code, in a virtual environment with the pinned tools
#      (scripts/ci-requirements.txt);
#   3. build: configure (the CUTLASS headers are fetched by the build) and compile every kernel
#      source for sm_80 and sm_90a (minimal instantiation set; without a GPU in bf16 alone, as the
#      fp16 instances differ only in the element type), libstdc++ linked in as in the wheels
#      users get;
#   4. the CPU GoogleTest cases (ctest -L cpu);
#   5. the SASS of the Hopper kernels in the library (scripts/check_sm90_sass.py);
#   6. that library packed into a manylinux wheel (scripts/build_wheel.sh, no second compile),
#      installed into a fresh virtual environment, and the Python CPU tests run against it.
# On a machine with a GPU the GPU suite runs too (scripts/run_gpu_suite.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-ci}
JOBS=${JOBS:-$(nproc)}
VENV="$BUILD_DIR/venv"
LIB="$BUILD_DIR/lib/libflashcute.so"
ARCHS="${FLASHCUTE_CUDA_ARCHS:-80;90a}"

echo "== format"
if ! command -v clang-format >/dev/null 2>&1; then
  sudo=$([[ $(id -u) -eq 0 ]] || echo sudo)
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang-format >/dev/null
fi
bash scripts/check_format.sh

echo "== lint"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r scripts/ci-requirements.txt
"$VENV/bin/ruff" check python bench scripts cmake

echo "== build"
# Without a GPU no kernel runs: one dtype shows that every kernel source compiles, and keeps the
# build (most of CI's time on 2 cores) about half as long.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  DTYPES="fp16;bf16"
else
  DTYPES=bf16
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  -DFLASHCUTE_CUDA_ARCHS="$ARCHS" \
  -DFLASHCUTE_TILE_SET="${FLASHCUTE_TILE_SET:-minimal}" \
  -DFLASHCUTE_SM80_DTYPES="${FLASHCUTE_SM80_DTYPES:-$DTYPES}" \
  -DFLASHCUTE_SM90_DTYPES="${FLASHCUTE_SM90_DTYPES:-$DTYPES}" \
  -DFLASHCUTE_STATIC_LIBSTDCXX=ON
cmake --build "$BUILD_DIR" -j "$JOBS"

echo "== CPU tests"
ctest --test-dir "$BUILD_DIR" -L cpu --output-on-failure

echo "== sm90 SASS"
# The toolkit's cuobjdump where it has one, else the pinned one from PyPI (nvdisasm beside it).
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
if [[ ! -x $CUOBJDUMP ]]; then
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  CUOBJDUMP="$site/nvidia/cu13/bin/cuobjdump"
fi
elf_files=$("$CUOBJDUMP" --list-elf "$LIB")
if [[ $elf_files == *sm_90a* ]]; then
  python3 scripts/check_sm90_sass.py "$LIB" --cuobjdump "$CUOBJDUMP"
else
  echo "The library has no sm_90a code (see FLASHCUTE_CUDA_ARCHS): SASS check skipped."
fi

echo "== Python wheel"
rm -rf "$BUILD_DIR/dist"
WHEEL_DIR="$BUILD_DIR/dist" CUOBJDUMP="$CUOBJDUMP" bash scripts/build_wheel.sh "$BUILD_DIR"
wheel=$(ls "$BUILD_DIR"/dist/flashcute-*-py3-none-manylinux_*.whl)

echo "== Python CPU tests (the wheel in a fresh virtual environment)"
WHEEL_VENV="$BUILD_DIR/venv-wheel"
rm -rf "$WHEEL_VENV"
python3 -m venv "$WHEEL_VENV"
"$WHEEL_VENV/bin/python" -m pip install --quiet --upgrade pip
"$WHEEL_VENV/bin/python" -m pip install --quiet "${wheel}[test]"
# From outside the repository, so that python/ cannot stand in for the installed package.
(cd "$WHEEL_VENV" && bin/python -c 'import flashcute; print(flashcute.build_info())')
FLASHCUTE_REQUIRE_LIB=1 FLASHCUTE_EXPECT_ARCHS="$ARCHS" FLASHCUTE_CUOBJDUMP="$CUOBJDUMP" \
  "$WHEEL_VENV/bin/python" -m pytest -q python/tests

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  bash scripts/run_gpu_suite.sh "$BUILD_DIR"
else
  echo "No GPU on this machine: the GPU suite (scripts/run_gpu_suite.sh) was not run."
fi

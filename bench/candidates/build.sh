#!/usr/bin/env bash
# Builds main and prefixes of the patch series here, each with the bf16 d 128 / 256 Hopper kernels
# alone, into OUT/<name>/lib/libflashcute.so for bench/ab.py on the device:
#   bench/candidates/build.sh [N ...]    (N: the last patch of a prefix, e.g. 1; default all)
# OUT defaults to .carry (ignored by git, carried to the device); main's build is OUT/main, a
# prefix's OUT/p<N>. The series is applied in a scratch worktree, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
out=$(realpath -m "${OUT:-.carry}")
patches=("$repo"/bench/candidates/0*.patch)
if [[ $# -gt 0 ]]; then prefixes=("$@"); else mapfile -t prefixes < <(seq "${#patches[@]}"); fi
work=$(mktemp -d)
cleanup() {
  git -C "$repo" worktree remove --force "$work/tree" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
git worktree add -q --detach "$work/tree" HEAD
git -C "$work/tree" am -q "${patches[@]}"
tip=$(git -C "$work/tree" rev-parse HEAD)
build() {  # <commit> <name>
  git -C "$work/tree" checkout -q "$1"
  cmake -S "$work/tree" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DFLASHCUTE_TILE_SET=minimal -DFLASHCUTE_BUILD_TESTS=OFF -DFLASHCUTE_BUILD_TOOLS=OFF \
    -DFLASHCUTE_CUDA_ARCHS=90a -DFLASHCUTE_SM80_DTYPES=bf16 -DFLASHCUTE_SM80_HEAD_DIMS=128 \
    -DFLASHCUTE_SM80_BACKWARD_HEAD_DIMS= -DFLASHCUTE_SM80_DECODE_DTYPES=bf16 \
    -DFLASHCUTE_SM80_DECODE_HEAD_DIMS= -DFLASHCUTE_SM90_DTYPES=bf16 \
    "-DFLASHCUTE_SM90_HEAD_DIMS=128;256" -DFLASHCUTE_SM90_MODIFIER_DTYPES= \
    -DFLASHCUTE_SM90_BACKWARD_DTYPES=bf16 -DFLASHCUTE_SM90_BACKWARD_HEAD_DIMS= \
    ${CUTLASS_DIR:+-DCUTLASS_DIR="$CUTLASS_DIR"} >/dev/null
  cmake --build "$work/build" -j "$(nproc)" >"$work/$2.log" 2>&1 ||
    { tail -n 20 "$work/$2.log"; return 1; }
  if grep -qE 'C7515|C7520' "$work/$2.log"; then
    echo "$2: ptxas serialised wgmmas (C7515 / C7520)" >&2
    return 1
  fi
  mkdir -p "$out/$2/lib"
  cp "$work/build/lib/libflashcute.so" "$out/$2/lib/"
  echo "$2 ($(git -C "$work/tree" rev-parse --short HEAD)) -> $out/$2/lib/libflashcute.so"
}
build "$tip~${#patches[@]}" main
for n in "${prefixes[@]}"; do
  build "$tip~$((${#patches[@]} - n))" "p$n"
done

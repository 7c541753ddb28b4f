#!/usr/bin/env bash
# Builds FlashAttention-3's Hopper forward as a benchmark peer: its bf16 forward kernels for head
# dims 64, 128 and 256 (one split, no paging, softcap, local window or GQA packing), its
# packed-batch prepare kernel and bench/peers/fa3_peer.cu, into one shared library that
# bench/fa3_peer.py loads (FLASHCUTE_FA3_LIB) to add an "fa3" column to bench.py's rows.
#   scripts/build_fa3_peer.sh <flash-attention checkout> <CUTLASS include dir> <output dir>
# Use the CUTLASS commit the checkout pins (its csrc/cutlass submodule), as its own build does.
# Nothing here is part of the library or of CI. About 5 minutes on two cores (sm_90a only).
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 <flash-attention checkout> <CUTLASS include dir> <output dir>" >&2
  exit 2
fi
fa_root=$(cd "$1" && pwd)
cutlass_include=$(cd "$2" && pwd)
out=$3
hopper=$fa_root/hopper
repo=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
for f in "$hopper/flash.h" "$cutlass_include/cute/tensor.hpp"; do
  [[ -f $f ]] || { echo "missing $f" >&2; exit 2; }
done
mkdir -p "$out/obj"

# FlashAttention-3's own compile flags (hopper/setup.py) and those PyTorch's extension builder
# adds to them, with every feature the peer does not call compiled out.
flags=(-O3 -std=c++17 --use_fast_math -DNDEBUG -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
  -DCUTLASS_ENABLE_GDC_FOR_SM90 -DCUTLASS_DEBUG_TRACE_LEVEL=0 --expt-relaxed-constexpr
  -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
  -D__CUDA_NO_HALF2_OPERATORS__
  -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC --resource-usage)
for feature in BACKWARD PAGEDKV SPLIT APPENDKV LOCAL SOFTCAP PACKGQA FP16 FP8 SM8x \
  HDIMDIFF64 HDIMDIFF192 HDIM96 HDIM192; do
  flags+=("-DFLASHATTENTION_DISABLE_$feature")
done
flags+=(-I"$hopper" -I"$cutlass_include")

sources=("$hopper/flash_prepare_scheduler.cu" "$repo/bench/peers/fa3_peer.cu")
for d in 64 128 256; do
  sources+=("$hopper/instantiations/flash_fwd_hdim${d}_bf16_sm90.cu")
done

compile() {
  local src=$1 obj
  obj=$out/obj/$(basename "${src%.cu}").o
  "$nvcc" "${flags[@]}" -c "$src" -o "$obj" > "$obj.log" 2>&1 || { cat "$obj.log" >&2; return 1; }
  echo "compiled $(basename "$src")"
}
export -f compile
export nvcc out
export FLAGS_FILE=$out/obj/flags
printf '%s\n' "${flags[@]}" > "$FLAGS_FILE"
# Two compilations at a time (each takes several GB of memory).
printf '%s\n' "${sources[@]}" | xargs -P "${JOBS:-2}" -I{} bash -c \
  'mapfile -t flags < "$FLAGS_FILE"; compile "$1"' _ {}

"$nvcc" -shared -cudart static -gencode arch=compute_90a,code=sm_90a "$out"/obj/*.o \
  -o "$out/libfa3peer.so"
grep -h "spill" "$out"/obj/*.log | sort | uniq -c || true
echo "wrote $out/libfa3peer.so"

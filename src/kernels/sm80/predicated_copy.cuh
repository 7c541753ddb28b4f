// Global<->shared tile copies that respect the problem's edges: rows past the sequence end and
// columns past head_dim are zero-filled on the way in (stale shared memory must never reach the
// scores or P.V) and skipped on the way out.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute::sm80 {

// src/dst: (CPY, CPY_ROWS, CPY_COLS) partitions; coords: the same partition of the tile's
// identity tensor; col_ok: per CPY_COLS, whether the column lies inside head_dim. Without
// kCheckRows the caller guarantees every row of the tile is valid.
template <bool kCheckRows, class TiledCopy, class Src, class Dst, class Coords, class ColPred>
__device__ void copy_tile_in(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                             Coords const& coords, ColPred const& col_ok, int valid_rows) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const bool row_ok = !kCheckRows || int(get<0>(coords(0, m, 0))) < valid_rows;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      if (row_ok && col_ok(k)) {
        copy(tiled_copy, src(_, m, k), dst(_, m, k));
      } else {
        clear(dst(_, m, k));
      }
    }
  }
}

template <class TiledCopy, class Src, class Dst, class Coords, class ColPred>
__device__ void copy_tile_out(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                              Coords const& coords, ColPred const& col_ok, int valid_rows) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (int(get<0>(coords(0, m, 0))) < valid_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) {
        if (col_ok(k)) copy(tiled_copy, src(_, m, k), dst(_, m, k));
      }
    }
  }
}

}  // namespace flashcute::sm80

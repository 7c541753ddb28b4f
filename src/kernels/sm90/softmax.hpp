// Online softmax in the exp2 domain over one consumer thread's rows. A wgmma accumulator row is
// spread over the 4 threads of a quad, so row reductions are two xor-shuffles. The row sums stay
// per-thread partial until the end (one reduction per tile instead of one per block).
#pragma once

#include <cmath>
#include <cute/tensor.hpp>

#include "kernels/sm90/fragment.hpp"

namespace flashcute::sm90 {

using namespace cute;

CUTE_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

CUTE_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

CUTE_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

template <int kRows>
struct OnlineSoftmax {
  // A row's reference maximum moves only when a block's maximum passes it by more than this
  // (log2 domain), so probabilities stay below 2^kMaxSlack = 256 (exact in fp32 sums, far from
  // the 16-bit types' limits) and, after a row's first blocks, O is almost never rescaled.
  static constexpr float kMaxSlack = 8.f;
  // Row maxima and sums run over this many interleaved partial results: a single running value
  // is a dependency chain as long as the row (32 steps at 128 keys), which the warpgroup, alone
  // on the SM sub-partitions during its softmax turn, would wait out.
  static constexpr int kChains = 4;

  // Reference maximum of the scaled (log2-domain) scores; -inf before any key.
  float row_max[kRows];
  // This thread's share of the running sum of exp2(score - row_max).
  float row_sum[kRows];

  CUTE_DEVICE void init() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // s: (rows, cols) raw scores (-inf where masked), overwritten with exp2(scale * s - row_max).
  // scale must be > 0 (any other softmax scale is applied beforehand, with scale 1 here): then
  // the maximum of the raw scores, times scale, is the maximum of the scaled ones, one multiply
  // per row instead of one per score, and -inf stays -inf. Writes in `correction` the factor that
  // rescales what was accumulated under the previous reference maximum (1 where it stayed) and
  // returns whether any of this thread's rows moved it.
  template <class Tensor>
  CUTE_DEVICE bool update(Tensor& s, float scale, float (&correction)[kRows]) {
    static_assert(decltype(size<0>(s))::value == kRows);
    constexpr int kCols = decltype(size<1>(s))::value;
    static_assert(kCols % kChains == 0);
    static_assert(kChains == 4, "the chains are joined below as a two-level tree of four");
    bool moved_any = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float partial[kChains];
      CUTE_UNROLL
      for (int i = 0; i < kChains; ++i) partial[i] = s(r, i);
      CUTE_UNROLL
      for (int c = kChains; c < kCols; ++c)
        partial[c % kChains] = fmaxf(partial[c % kChains], s(r, c));
      float const block_max =
          quad_max(fmaxf(fmaxf(partial[0], partial[1]), fmaxf(partial[2], partial[3]))) * scale;
      // -inf + slack is -inf: a row's first visible key always moves it; a block with no
      // visible key (max -inf) never does.
      bool const moved = block_max > row_max[r] + kMaxSlack;
      correction[r] = moved ? fast_exp2(row_max[r] - block_max) : 1.f;
      if (moved) row_max[r] = block_max;
      moved_any |= moved;
      // A row that has seen only hidden keys keeps max -inf; subtract 0 then so that its
      // probabilities are exp2(-inf) = 0 rather than NaN.
      float const m_ref = row_max[r] == -INFINITY ? 0.f : row_max[r];
      CUTE_UNROLL
      for (int i = 0; i < kChains; ++i) partial[i] = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        float const p = fast_exp2(fmaf(s(r, c), scale, -m_ref));
        s(r, c) = p;
        partial[c % kChains] += p;
      }
      float const sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
      row_sum[r] = row_sum[r] * correction[r] + sum;
    }
    return moved_any;
  }

  // Total row sums across the quad; returns 1/sum (0 for a row that saw no key) and writes the
  // natural-log log-sum-exp (+inf for such a row).
  CUTE_DEVICE void finish(float (&inv_sum)[kRows], float (&lse)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float sum = quad_sum(row_sum[r]);
      bool empty = sum == 0.f;
      inv_sum[r] = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? INFINITY : (row_max[r] + __log2f(sum)) * float(M_LN2);
    }
  }
};

// Multiplies every score by scale (the path of a softmax scale that is not positive, whose
// maximum cannot be taken over the raw scores).
template <class Tensor>
CUTE_DEVICE void scale_scores(Tensor& s, float scale) {
  CUTE_UNROLL
  for (int i = 0; i < size(s); ++i) s(i) *= scale;
}

// Hides (row, key) pairs outside the mask with -inf and leaves the visible scores as they are.
// coords: the identity tensor of the tile partitioned like s, giving (row, column) within the
// tile. Column c holds key key0 + c. Row i sees keys key_lo <= j < seqlen_k with
// i + diag - window_left <= j <= i + diag + window_right (a negative bound is unbounded); keys
// below key_lo are rows of a shifted last block that belong to the block before (tile_info.hpp).
// A thread's columns are its first column plus offsets known at compile time, so the bounds are
// moved onto the offsets once per row and each score costs one compare with an immediate and a
// select (two compares where a lower bound applies).
template <class Tensor, class Coords>
CUTE_DEVICE void mask_scores(Tensor& s, Coords const& coords, int row0, int key0, int key_lo,
                             int seqlen_k, int window_left, int window_right, int diag) {
  int const first_col = get<1>(coords(0, 0));
  int const first_key = key0 + first_col;
  auto mask = [&](auto two_sided) {
    CUTE_UNROLL
    for (int r = 0; r < size<0>(s); ++r) {
      int const row = row0 + get<0>(coords(r, 0));
      int limit = seqlen_k;
      if (window_right >= 0) limit = min(limit, row + diag + window_right + 1);
      int const hi = limit - first_key;  // offsets from hi on are hidden
      int lo = key_lo - first_key;       // offsets below lo are hidden
      if (window_left >= 0) lo = max(lo, row + diag - window_left - first_key);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        int const offset = get<1>(coords(r, c)) - first_col;
        bool visible = offset < hi;
        if constexpr (decltype(two_sided)::value) visible = visible && offset >= lo;
        s(r, c) = visible ? s(r, c) : -INFINITY;
      }
    }
  };
  // A lower bound: a left window, or a packed sequence's shifted last block (key_lo > key0).
  if (window_left >= 0 || key_lo > key0) {
    mask(cute::true_type{});
  } else {
    mask(cute::false_type{});
  }
}

}  // namespace flashcute::sm90

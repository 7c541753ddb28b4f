// The Hopper family's use of the shared online softmax (kernels/common/online_softmax.hpp) and its
// element mask. Four interleaved chains keep the row reductions short while a warpgroup runs its
// softmax alone. A row's reference maximum moves only when a block's maximum passes it by more
// than 1 (log2 domain), which skips most of O's rescales; a wider slack costs accuracy, because
// the row's largest probability is then rarely exactly 1 (exact in the 16-bit P of the PV GEMM)
// while, on random data, the few largest probabilities carry most of the output (the trade
// between error and speed per slack is in bench/NOTES.md). The scale is positive (any other is
// applied to the scores first, scale_scores).
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/mask.hpp"
#include "kernels/common/online_softmax.hpp"

namespace flashcute::sm90 {

using namespace cute;

using SoftmaxPolicySm90 = SoftmaxPolicy<4, 1, false>;

template <int kRows>
using Softmax = OnlineSoftmax<kRows, SoftmaxPolicySm90>;

// Multiplies every score by scale (the path of a softmax scale that is not positive, whose
// maximum cannot be taken over the raw scores).
template <class Tensor>
CUTE_DEVICE void scale_scores(Tensor& s, float scale) {
  CUTE_UNROLL
  for (int i = 0; i < size(s); ++i) s(i) *= scale;
}

// Sets to -inf every element of s whose column index lies outside its row's interval. coords: the
// identity tensor of the tile partitioned like s, giving (row, column) within the tile; row r of
// the tile has index row0 + r, column c index col0 + c, and interval_of(row index) gives the
// visible [begin, end) of column indices; indices below col_lo are hidden too. A thread's columns
// are its first column plus offsets known at compile time, so the bounds are moved onto the
// offsets once per row and each element costs one compare with an immediate and a select (two
// compares when two_sided: a lower bound may cut the row).
template <class Tensor, class Coords, class IntervalOf>
CUTE_DEVICE void mask_outside(Tensor& s, Coords const& coords, int row0, int col0, int col_lo,
                              bool two_sided, IntervalOf const& interval_of) {
  int const first_col = get<1>(coords(0, 0));
  int const first_index = col0 + first_col;
  auto apply = [&](auto is_two_sided) {
    CUTE_UNROLL
    for (int r = 0; r < size<0>(s); ++r) {
      auto const visible_cols = interval_of(row0 + get<0>(coords(r, 0)));
      int const hi = visible_cols.end - first_index;  // offsets from hi on are hidden
      int const lo = geometry_max(col_lo, visible_cols.begin) - first_index;  // and below lo
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        int const offset = get<1>(coords(r, c)) - first_col;
        bool visible = offset < hi;
        if constexpr (decltype(is_two_sided)::value) visible = visible && offset >= lo;
        s(r, c) = visible ? s(r, c) : -INFINITY;
      }
    }
  };
  if (two_sided) {
    apply(cute::true_type{});
  } else {
    apply(cute::false_type{});
  }
}

// Forward: hides (row, key) pairs outside the mask with -inf. Column c holds key key0 + c; keys
// below key_lo are rows of a shifted last block that belong to the block before (tile_info.hpp).
template <class Tensor, class Coords>
CUTE_DEVICE void mask_scores(Tensor& s, Coords const& coords, int row0, int key0, int key_lo,
                             AttentionMask const& mask) {
  mask_outside(s, coords, row0, key0, key_lo, mask.left >= 0 || key_lo > key0,
               [&](int row) { return mask.row_keys(row); });
}

}  // namespace flashcute::sm90

// Register-fragment helpers for wgmma accumulators: a (row, column) view for the softmax, the
// re-view of a converted accumulator as the A operand of the next wgmma, and one warpgroup GEMM.
#pragma once

#include <cutlass/numeric_conversion.h>
#include <cute/tensor.hpp>

namespace flashcute::sm90 {

using namespace cute;

// A wgmma accumulator is ((2 columns, 2 rows 8 apart, N/8 column groups), MMA_M, MMA_N) per thread.
// Rows are (2, MMA_M); columns (2, N/8, MMA_N).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol_layout(Layout const& l) {
  static_assert(rank<0>(Layout{}) == 3 && rank(Layout{}) == 3);
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                     make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

template <class Tensor>
CUTE_DEVICE auto rowcol_view(Tensor&& t) {
  return make_tensor(t.data(), rowcol_layout(t.layout()));
}

// The accumulator of S = Q K^T holds exactly the values a 16-bit A fragment of O += P V needs in
// the same thread: each k16 slice of P is two adjacent 8-column groups of S. Regroup the column
// groups in pairs to get ((2, 2, 2), MMA_M, N/16).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_as_a_operand(Layout const& l) {
  auto groups = logical_divide(get<0, 2>(l), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(l), get<0, 1>(l), get<0, 0>(groups)), get<1>(l),
                     coalesce(make_layout(get<0, 1>(groups), get<2>(l))));
}

// Elementwise fp32 -> To with the packed conversion instructions.
template <class To, class Tensor>
CUTE_DEVICE auto convert_fragment(Tensor const& t) {
  using From = typename Tensor::value_type;
  constexpr int N = decltype(size(t))::value;
  auto out = make_tensor_like<To>(t);
  cutlass::NumericArrayConverter<To, From, N> convert;
  *reinterpret_cast<cutlass::Array<To, N>*>(out.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, N> const*>(t.data()));
  return out;
}

// C (+)= A B over the K modes (the first kKSlices of them when kKSlices >= 0), issued
// asynchronously by the whole warpgroup. kWait >= 0 waits until at most kWait wgmma batches are
// still in flight; -1 returns at once.
template <bool kZeroInit, int kWait, int kKSlices = -1, class TiledMma, class TA, class TB,
          class TC>
CUTE_DEVICE void warpgroup_gemm(TiledMma& mma, TA const& a, TB const& b, TC& c) {
  constexpr bool kRegisterA =
      !std::is_same_v<typename TA::iterator, GMMA::DescriptorIterator>;  // RS rather than SS
  constexpr int kSlices = kKSlices >= 0 ? kKSlices : int(decltype(size<2>(a))::value);
  static_assert(kSlices <= decltype(size<2>(a))::value);
  if constexpr (kRegisterA) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait >= 0) warpgroup_wait<kWait>();
  warpgroup_fence_operand(c);
  if constexpr (kRegisterA) warpgroup_fence_operand(const_cast<TA&>(a));
}

}  // namespace flashcute::sm90

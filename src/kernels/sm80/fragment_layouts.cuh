// Views of mma.sync accumulator fragments. An m16n8 accumulator holds, per thread, values
// (column pair, row half) for each (MMA_M, MMA_N) repeat; softmax wants them as (rows, columns)
// and the P.V product wants them as the A operand of the next m16n8k16.
#pragma once

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cute/tensor.hpp>

namespace flashcute::sm80 {

// ((2 cols, 2 rows), MMA_M, MMA_N) -> ((2 rows, MMA_M), (2 cols, MMA_N))
template <class Layout>
__host__ __device__ constexpr auto accumulator_rowcol_layout(Layout layout) {
  using namespace cute;
  static_assert(rank(Layout{}) == 3 && rank(get<0>(Layout{})) == 2, "expects an mma accumulator");
  return make_layout(make_layout(get<0, 1>(layout), get<1>(layout)),
                     make_layout(get<0, 0>(layout), get<2>(layout)));
}

template <class Tensor>
__host__ __device__ constexpr auto rowcol_view(Tensor&& t) {
  return cute::make_tensor(t.data(), accumulator_rowcol_layout(t.layout()));
}

// Two neighbouring n8 accumulators make one k16 A operand:
// ((2,2), MMA_M, MMA_N) -> (((2,2),2), MMA_M, MMA_N/2)
template <class Layout>
__host__ __device__ constexpr auto accumulator_as_a_operand_layout(Layout layout) {
  using namespace cute;
  auto n_split = logical_divide(get<2>(layout), Shape<_2>{});  // ((2, MMA_N/2))
  return make_layout(make_layout(get<0>(layout), get<0, 0>(n_split)), get<1>(layout),
                     get<0, 1>(n_split));
}

// Element-wise conversion of a register fragment, using the packed converters (cvt.*x2).
template <class Src, class Dst>
__device__ void convert_fragment(Src const& src, Dst& dst) {
  using From = typename std::remove_cv_t<std::remove_reference_t<Src>>::value_type;
  using To = typename std::remove_cv_t<std::remove_reference_t<Dst>>::value_type;
  constexpr int kSize = decltype(cute::size(src))::value;
  static_assert(kSize == decltype(cute::size(dst))::value, "fragment sizes differ");
  cutlass::NumericArrayConverter<To, From, kSize> converter;
  *reinterpret_cast<cutlass::Array<To, kSize>*>(dst.data()) =
      converter(*reinterpret_cast<const cutlass::Array<From, kSize>*>(src.data()));
}

}  // namespace flashcute::sm80

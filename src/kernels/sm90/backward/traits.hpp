// Compile-time shape of one Hopper backward kernel: one CTA owns kBlockN keys of one KV head (64
// per consumer warpgroup) and walks the query blocks that see them, kBlockM rows per step. The
// shared-memory layouts, the three warpgroup MMAs and the TMA copy of Q and dO are fixed here;
// kernel/backward_kernel.hpp adds what depends on their sum.
#pragma once

#include <cutlass/numeric_types.h>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

namespace flashcute::sm90 {

using namespace cute;

// The widest K-major swizzle whose row (128, 64 or 32 bytes) divides `width` elements.
template <class Element, int kWidth>
using KMajorSwizzleAtom =
    std::conditional_t<kWidth % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                       std::conditional_t<kWidth % 32 == 0, GMMA::Layout_K_SW64_Atom<Element>,
                                          GMMA::Layout_K_SW32_Atom<Element>>>;

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_>
struct BackwardTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kStages = kStages_;  // Q / dO pipeline depth
  static constexpr int kConsumerWarpgroups = kBlockN / 64;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static constexpr int kThreads = kConsumerThreads + 128;  // plus one producer warpgroup
  // dQ's GEMM has one warpgroup M tile of 64 query rows and splits the head dim between the
  // warpgroups.
  static_assert(kBlockM == 64 && kBlockN % 64 == 0 && kHeadDim % (16 * kConsumerWarpgroups) == 0);

  // Q, dO and V: head_dim contiguous, the widest swizzle the head dim allows. K too, but its
  // swizzle row must divide one warpgroup's share of the head dim: dQ = dS K reads K transposed,
  // each warpgroup a column slice, which must be whole swizzle atoms.
  using SmemAtomQ = KMajorSwizzleAtom<Element, kHeadDim>;
  using SmemAtomK = KMajorSwizzleAtom<Element, kHeadDim / kConsumerWarpgroups>;
  using SmemLayoutQ =
      decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  // (head_dim, row, stage) views of the same bytes: the MN-major B operands of dV += P^T dO and
  // dK += dS^T Q.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // dS of a step as (query, key), queries contiguous: the MN-major A operand of dQ = dS K. Two
  // buffers, so a step writes one while the other warpgroups' dQ may still read the last.
  using SmemLayoutDs = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{},
                                              Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  // The same bytes as (key, query, buffer): where the consumers write dS^T from registers.
  using SmemLayoutDst = decltype(composition(
      SmemLayoutDs{},
      make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));

  // S^T = K Q^T and dP^T = V dO^T: (key, query) tiles, the warpgroups stacked along the keys.
  using KeyWarpgroups = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(),
      KeyWarpgroups{}));
  // dV += P^T dO and dK += dS^T Q: P^T and dS^T straight from the registers of S^T and dP^T.
  using TiledMmaDkv = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      KeyWarpgroups{}));
  // dQ = dS K: (query, head_dim), the warpgroups side by side along the head dim.
  using TiledMmaDq = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kHeadDim / kConsumerWarpgroups>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kConsumerWarpgroups>, _1>>{}));

  // Q and dO are (seqlen, head_dim, heads, batch) in global memory; the TMA box is one block.
  using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemLayout = Layout<GmemShape, Stride<int64_t, _1, int64_t, int64_t>>;
  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      take<0, 2>(SmemLayoutQ{}), Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));

  // K and V arrive once per CTA through the consumers' own 16-byte cp.async loads, which zero-fill
  // keys past the sequence and columns past head_dim.
  static constexpr int kThreadsPerRow = kHeadDim / 8;
  using GmemTiledCopyKV = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element>{},
      Layout<Shape<Int<kConsumerThreads / kThreadsPerRow>, Int<kThreadsPerRow>>,
             Stride<Int<kThreadsPerRow>, _1>>{},
      Layout<Shape<_1, _8>>{}));

  // dK and dV leave in 16-byte rows read from their staging in the K and V buffers.
  using GmemTiledCopyOut = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<uint128_t>, Element>{},
      Layout<Shape<Int<kConsumerThreads / kThreadsPerRow>, Int<kThreadsPerRow>>,
             Stride<Int<kThreadsPerRow>, _1>>{},
      Layout<Shape<_1, _8>>{}));

  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesStats = kBlockM * sizeof(float);  // one row statistic
  // One stage: Q, dO, the LSE and rowsum(dO * O) of the block.
  static constexpr uint32_t kBytesStage = 2 * kBytesQ + 2 * kBytesStats;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;
};

}  // namespace flashcute::sm90

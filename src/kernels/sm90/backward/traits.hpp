// Compile-time shape of one Hopper backward kernel: one CTA owns kBlockN keys of one KV head and
// walks the query blocks that see them, kBlockM rows per step. How its two consumer warpgroups
// share a step (BackwardSplit), the shared-memory layouts, the warpgroup MMAs and the TMA copy of
// Q and dO are fixed here; kernel/backward_kernel.hpp adds what depends on their sum.
#pragma once

#include <cutlass/numeric_types.h>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include <type_traits>

namespace flashcute::sm90 {

using namespace cute;

// The widest K-major swizzle whose row (128, 64 or 32 bytes) divides `width` elements.
template <class Element, int kWidth>
using KMajorSwizzleAtom =
    std::conditional_t<kWidth % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                       std::conditional_t<kWidth % 32 == 0, GMMA::Layout_K_SW64_Atom<Element>,
                                          GMMA::Layout_K_SW32_Atom<Element>>>;

// How the consumer warpgroups share a step.
enum class BackwardSplit {
  // Each warpgroup owns 64 keys: its S^T and dP^T rows, and dK and dV of those keys over the whole
  // head dim in registers (P^T and dS^T feed dV and dK from registers). dK and dV take
  // 2 x 64 x head_dim / 128 registers per thread: head dims up to 128.
  kKeys,
  // The warpgroups share the block's 64 keys: each computes S^T and dP^T for half of the step's
  // queries, P^T and dS^T meet in shared memory, and each accumulates dK and dV (and computes dQ)
  // for half of the head dim: half the registers of kKeys at the same head dim (head dim 256).
  kHeadDim,
};

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_,
          BackwardSplit kSplit_ = BackwardSplit::kKeys>
struct BackwardTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kStages = kStages_;  // Q / dO pipeline depth
  static constexpr BackwardSplit kSplit = kSplit_;
  static constexpr bool kSplitHeadDim = kSplit == BackwardSplit::kHeadDim;
  static constexpr int kConsumerWarpgroups = kSplitHeadDim ? 2 : kBlockN / 64;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static constexpr int kThreads = kConsumerThreads + 128;  // plus one producer warpgroup
  // dQ's GEMM repeats its warpgroup M tile of 64 query rows and splits the head dim between the
  // warpgroups; under kHeadDim so do dK's and dV's, whose N slices must be whole 64-column
  // swizzle atoms of Q and dO.
  static_assert(kBlockM % 64 == 0 && kBlockN % 64 == 0 &&
                kHeadDim % (16 * kConsumerWarpgroups) == 0);
  static_assert(!kSplitHeadDim || (kBlockN == 64 && kHeadDim % (64 * kConsumerWarpgroups) == 0));

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

  // P^T of a step as (key, query), queries contiguous (kHeadDim split only): the K-major A
  // operand of dV += P^T dO, which reads every query of it. Two buffers, as dS.
  using SmemLayoutPt = decltype(tile_to_shape(KMajorSwizzleAtom<Element, kBlockM>{},
                                              Shape<Int<kBlockN>, Int<kBlockM>, _2>{}));

  // The warpgroups stacked along M (keys), or side by side along N.
  using AlongM = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  using AlongN = Layout<Shape<_1, Int<kConsumerWarpgroups>, _1>>;
  // S^T = K Q^T and dP^T = V dO^T: (key, query) tiles, split by keys or by queries.
  static constexpr int kSdPQueries = kSplitHeadDim ? kBlockM / kConsumerWarpgroups : kBlockM;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kSdPQueries>, Int<kHeadDim>>>(),
      std::conditional_t<kSplitHeadDim, AlongN, AlongM>{}));
  // dV += P^T dO and dK += dS^T Q: (key, head_dim). Split by keys, P^T and dS^T come straight
  // from the registers of S^T and dP^T; split by head dim, from shared memory.
  using TiledMmaDkv = std::conditional_t<
      kSplitHeadDim,
      decltype(make_tiled_mma(
          GMMA::ss_op_selector<Element, Element, float,
                               Shape<_64, Int<kHeadDim / kConsumerWarpgroups>, Int<kBlockM>>,
                               GMMA::Major::K, GMMA::Major::MN>(),
          AlongN{})),
      decltype(make_tiled_mma(
          GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>,
                               GMMA::Major::K, GMMA::Major::MN>(),
          AlongM{}))>;
  // dQ = dS K: (query, head_dim), the warpgroups side by side along the head dim.
  using TiledMmaDq = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kHeadDim / kConsumerWarpgroups>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      AlongN{}));

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

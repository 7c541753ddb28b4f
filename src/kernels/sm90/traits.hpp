// Compile-time shape of one Hopper forward kernel: tile sizes, shared-memory layouts, the two
// warpgroup MMAs, the TMA copy types and the K/V pipeline. The collectives and the kernel type are
// written against it; the kernel type adds what depends on their sum (shared storage, registers).
#pragma once

// wgmma N values that are not multiples of 16/32 (80, 176, ...) live behind this switch.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

namespace flashcute::sm90 {

using namespace cute;

// Whether rows [64 w, 64 w + 64) of the layout Full are the layout Slice shifted by w * offset,
// for each of `slices` warpgroups. One element per 16-byte chunk is compared: within a chunk both
// layouts are contiguous (no swizzle splits 16 bytes).
template <class Full, class Slice>
constexpr bool rows_are_shifted_slices(int slices, int head_dim, int offset) {
  for (int w = 0; w < slices; ++w) {
    for (int r = 0; r < 64; ++r) {
      for (int c = 0; c < head_dim; c += 8) {
        if (Full{}(64 * w + r, c) != w * offset + Slice{}(r, c)) return false;
      }
    }
  }
  return true;
}

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kPingPong_,
          int kCtasPerSm_ = 1, int kClusterM_ = 1>
struct Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per CTA tile, 64 per consumer warpgroup
  static constexpr int kBlockN = kBlockN_;  // key rows per main-loop step
  static constexpr int kStages = kStages_;  // K and V pipeline depth
  // The lower part of a key block (half of it, rounded up to the k16 slices of the PV GEMM): all
  // that a warpgroup multiplies where the mask hides the rest of the block from every one of its
  // rows (collective/mainloop_fwd.hpp).
  static constexpr int kBlockNLower = (kBlockN / 2 + 15) / 16 * 16;
  static constexpr bool kPingPong = kPingPong_ && kBlockM == 128;  // see turn_taking.hpp
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static constexpr int kThreads = kConsumerThreads + 128;  // plus one producer warpgroup
  // CTAs resident on one SM, each walking its own tiles of the persistent grid: with one consumer
  // warpgroup per CTA, the others' GEMMs run while one is in its softmax or between tiles.
  static constexpr int kCtasPerSm = kCtasPerSm_;
  // CTAs of a cluster, which run vertically adjacent tiles of one (batch, head) side by side and
  // load each K/V block once for all of them: each CTA loads a 1 / kClusterM slice and multicasts
  // it to every CTA of the cluster, so a block crosses from L2 once per cluster. Only problems
  // where those tiles visit the same key blocks (no mask) run such a kernel.
  static constexpr int kClusterM = kClusterM_;
  static_assert(kBlockM % 64 == 0 && kBlockN % 16 == 0 && kHeadDim % 16 == 0);
  static_assert(kClusterM == 1 || (kClusterM == 2 && kCtasPerSm == 1));

  // The widest swizzle whose 128/64/32-byte row fits the head dimension: TMA writes it and wgmma
  // reads it without bank conflicts.
  using SmemAtom =
      std::conditional_t<kHeadDim % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                         std::conditional_t<kHeadDim % 32 == 0, GMMA::Layout_K_SW64_Atom<Element>,
                                            GMMA::Layout_K_SW32_Atom<Element>>>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  // O is staged like Q (in V's buffer when it has none of its own: kernel/forward_kernel.hpp).
  using SmemLayoutO = SmemLayoutQ;
  // One consumer warpgroup's 64 rows of O, which it stores on its own: warpgroup w's rows
  // [64 w, 64 w + 64) of SmemLayoutO are this layout shifted by w * kOWarpgroupOffset elements
  // (checked below). The shift is a whole number of swizzle atoms, so the bytes of every slice are
  // swizzled alike and one TMA store descriptor serves every warpgroup.
  using SmemLayoutOWarpgroup = decltype(composition(
      SmemLayoutO{}, Layout<Shape<_64, Int<kHeadDim>>, Stride<_1, Int<kBlockM>>>{}));
  static constexpr int kOWarpgroupOffset = 64 * int(size<1>(SmemAtom{}));
  static_assert(kOWarpgroupOffset % int(size(SmemAtom{})) == 0);
  static_assert(rows_are_shifted_slices<SmemLayoutO, SmemLayoutOWarpgroup>(kConsumerWarpgroups,
                                                                           kHeadDim,
                                                                           kOWarpgroupOffset));
  using SmemLayoutKV =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // The first kBlockNLower rows of every K stage, with the stages' own strides.
  using SmemLayoutKLower = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<Int<kBlockNLower>, Int<kHeadDim>, Int<kStages>>{},
                                  Stride<_1, Int<kBlockN>, Int<kBlockN * kHeadDim>>{})));
  // V is stored like K (head_dim contiguous). For O += P V it is the B operand with N = head_dim,
  // so read the same bytes through a (head_dim, key) view: an MN-major operand, which 16-bit wgmma
  // accepts directly, so no transpose pass is needed.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  // Consumer warpgroups stack along M; each owns 64 query rows.
  using MmaAtomLayout = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      MmaAtomLayout{}));
  // The lower part of a K block (kBlockNLower keys), whose S accumulator is the first registers
  // of the whole block's, column group for column group.
  using TiledMmaQKLower = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockNLower>, Int<kHeadDim>>>(),
      MmaAtomLayout{}));
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      MmaAtomLayout{}));

  // Global tensors are (seqlen, head_dim, heads, batch); the TMA box is one tile of the first two.
  using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemLayout = Layout<GmemShape, GmemStride>;
  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}), SmemLayoutQ{},
      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using CopyOpKV = std::conditional_t<kClusterM == 1, SM90_TMA_LOAD, SM90_TMA_LOAD_MULTICAST>;
  using TmaKV = decltype(make_tma_copy(
      CopyOpKV{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      take<0, 2>(SmemLayoutKV{}), Shape<Int<kBlockN>, Int<kHeadDim>>{}, Int<kClusterM>{}));

  // O leaves by TMA store, one box of 64 rows per warpgroup (dense problems;
  // collective/epilogue_fwd.hpp).
  using TmaO = decltype(make_tma_copy(
      SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), GmemLayout{}),
      SmemLayoutOWarpgroup{}, Shape<_64, Int<kHeadDim>>{}, _1{}));

  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = kBlockN * kHeadDim * sizeof(Element);

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using ClusterShape = Shape<Int<kClusterM>, _1, _1>;
  using PipelineState = typename Pipeline::PipelineState;
};

}  // namespace flashcute::sm90

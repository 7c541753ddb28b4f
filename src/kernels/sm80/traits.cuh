// Compile-time description of one SM80-family kernel: tile sizes, shared-memory layouts, the tiled
// mma.sync and the copy atoms. Warps are stacked along M, each owning 16-row slices of the Q tile.
#pragma once

#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>

#include "kernels/sm80/smem_layouts.cuh"

namespace flashcute::sm80 {

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNThreads_>
struct KernelTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;  // padded: a multiple of 32
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNThreads = kNThreads_;
  static constexpr int kNWarps = kNThreads / 32;

  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head_dim bucket");
  static_assert(kBlockM % (16 * kNWarps) == 0, "each warp needs whole 16-row mma slices");
  static_assert(kBlockN % 16 == 0, "P.V consumes key blocks in k16 steps");

  // Shared memory is read in k-blocks of 64 columns when the padded head_dim allows it, else 32
  // (SwizzledLayout); global memory moves in the same k-blocks.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;

  using MmaOp = Mma16816<Element>;
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<MmaOp>,
                                  cute::Layout<cute::Shape<cute::Int<kNWarps>, cute::_1, cute::_1>>,
                                  cute::Tile<cute::Int<16 * kNWarps>, cute::_16, cute::_16>>;

  using SmemLayoutQ = SwizzledLayout<kBlockM, kHeadDim>;
  using SmemLayoutKV = SwizzledLayout<kBlockN, kHeadDim>;
  // V read as the (head_dim, n) B operand of P.V.
  using SmemLayoutVt = TransposedLayout<SmemLayoutKV, kBlockN, kHeadDim>;
  using SmemLayoutVtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutVt{}));

  using SmemCopyAtom = LdsmCopyAtom<Element>;
  using SmemCopyAtomTransposed = LdsmTransposedCopyAtom<Element>;
  using SmemCopyAtomO = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // Global memory moves in 16-byte vectors; a row of the k-block is covered by kGmemThreadsPerRow
  // threads, and the block's threads cover kGmemRowsPerPass rows per pass.
  static constexpr int kGmemElemsPerLoad = 16 / sizeof(Element);
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  static constexpr int kGmemRowsPerPass = kNThreads / kGmemThreadsPerRow;
  static_assert(kBlockM % kGmemRowsPerPass == 0 && kBlockN % kGmemRowsPerPass == 0,
                "the copy layout must tile the Q and K/V tiles exactly");
  using GmemThreadLayout =
      cute::Layout<cute::Shape<cute::Int<kGmemRowsPerPass>, cute::Int<kGmemThreadsPerRow>>,
                   cute::Stride<cute::Int<kGmemThreadsPerRow>, cute::_1>>;
  using GmemValueLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<kGmemElemsPerLoad>>>;
  using GmemTiledCopyQKV = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
      GmemThreadLayout{}, GmemValueLayout{}));
  using GmemTiledCopyO = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, GmemThreadLayout{},
      GmemValueLayout{}));

  static constexpr int kSmemBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kSmemBytesKV = kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kSmemBytes = kSmemBytesQ + 2 * kSmemBytesKV;
};

// Whether a tile configuration is worth compiling for a head_dim: the copy layout tiles it, and
// the fp32 accumulators of S (m x n) and O (m x d) fit in the register file without spilling.
template <int kHeadDim, int kBlockM, int kBlockN, int kNThreads>
constexpr bool tile_config_fits() {
  constexpr int warps = kNThreads / 32;
  constexpr int k_smem = kHeadDim % 64 == 0 ? 64 : 32;
  constexpr int rows_per_pass = kNThreads / (k_smem / 8);
  constexpr int acc_floats = (kBlockM * kBlockN + kBlockM * kHeadDim) / kNThreads;
  return kBlockM % (16 * warps) == 0 && kBlockM % rows_per_pass == 0 &&
         kBlockN % rows_per_pass == 0 && acc_floats <= 192;
}

}  // namespace flashcute::sm80

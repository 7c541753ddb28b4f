// Compile-time description of one SM80-family backward configuration. A thread block owns a key
// block (kBlockN keys) and walks query blocks (kBlockM rows); three GEMM shapes meet there, each
// with its own arrangement of the 8 warps:
//   S = Q K^T and dP = dO V^T   (kBlockM x kBlockN, k = head_dim)       MmaSdP
//   dV += P^T dO, dK += dS^T Q  (kBlockN x head_dim, k = kBlockM)       MmaDkv
//   dQ = dS K                   (kBlockM x head_dim, k = kBlockN)       MmaDq
// P and dS pass through shared memory, where the transposed operands are the same bytes read by
// ldmatrix.trans.
#pragma once

#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>

#include "kernels/backward/dq_fragments.cuh"
#include "kernels/sm80/smem_layouts.cuh"

namespace flashcute::sm80::backward {

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarpsMSdP, int kWarpsMDkv,
          int kWarpsMDq, int kStagesQ_>
struct BackwardTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;  // padded: a multiple of 32
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = 8;
  static constexpr int kNThreads = kNWarps * 32;
  // Query and output-gradient tiles in flight: 2 loads the next query block during this one.
  static constexpr int kStagesQ = kStagesQ_;

  using MmaOp = Mma16816<Element>;
  // Warps (kWarpsM x 8 / kWarpsM); each warp covers 16 rows and, per pass, 16 columns so that one
  // ldmatrix.x4 feeds two n8 MMAs.
  template <int kWarpsM>
  using TiledMmaOf = cute::TiledMMA<
      cute::MMA_Atom<MmaOp>,
      cute::Layout<cute::Shape<cute::Int<kWarpsM>, cute::Int<kNWarps / kWarpsM>, cute::_1>>,
      cute::Tile<cute::Int<16 * kWarpsM>, cute::Int<16 * (kNWarps / kWarpsM)>, cute::_16>>;
  using TiledMmaSdP = TiledMmaOf<kWarpsMSdP>;
  using TiledMmaDkv = TiledMmaOf<kWarpsMDkv>;
  using TiledMmaDq = TiledMmaOf<kWarpsMDq>;
  using DqBlocks =
      ::flashcute::backward::DqFragments<Element, TiledMmaDq, kBlockM, kHeadDim, kNThreads>;
  static_assert(kBlockM % (16 * kWarpsMSdP) == 0 && kBlockN % (16 * (8 / kWarpsMSdP)) == 0);
  static_assert(kBlockN % (16 * kWarpsMDkv) == 0 && kHeadDim % (16 * (8 / kWarpsMDkv)) == 0);
  static_assert(kBlockM % (16 * kWarpsMDq) == 0 && kHeadDim % (16 * (8 / kWarpsMDq)) == 0);

  using SmemLayoutQ = SwizzledLayout<kBlockM, kHeadDim>;  // also dO
  using SmemLayoutKV = SwizzledLayout<kBlockN, kHeadDim>;
  using SmemLayoutP = SwizzledLayout<kBlockM, kBlockN>;  // also dS
  using SmemLayoutQt = TransposedLayout<SmemLayoutQ, kBlockM, kHeadDim>;
  using SmemLayoutKt = TransposedLayout<SmemLayoutKV, kBlockN, kHeadDim>;
  using SmemLayoutPt = TransposedLayout<SmemLayoutP, kBlockM, kBlockN>;
  // Fragments are shaped from the unswizzled layouts (only their shapes matter there).
  using SmemLayoutQtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutQt{}));
  using SmemLayoutKtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutKt{}));
  using SmemLayoutPtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutPt{}));

  using SmemCopyAtom = LdsmCopyAtom<Element>;
  using SmemCopyAtomTransposed = LdsmTransposedCopyAtom<Element>;
  using SmemCopyAtomStore =
      cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // Global loads: 16-byte cp.async vectors, 8 threads per 64-element row slice.
  static constexpr int kGmemElemsPerLoad = 16 / sizeof(Element);
  static constexpr int kGmemThreadsPerRow = (kHeadDim % 64 == 0 ? 64 : 32) / kGmemElemsPerLoad;
  static constexpr int kGmemRowsPerPass = kNThreads / kGmemThreadsPerRow;
  static_assert(kBlockM % kGmemRowsPerPass == 0 && kBlockN % kGmemRowsPerPass == 0);
  using GmemTiledCopy = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
      cute::Layout<cute::Shape<cute::Int<kGmemRowsPerPass>, cute::Int<kGmemThreadsPerRow>>,
                   cute::Stride<cute::Int<kGmemThreadsPerRow>, cute::_1>>{},
      cute::Layout<cute::Shape<cute::_1, cute::Int<kGmemElemsPerLoad>>>{}));

  static constexpr int kSmemBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kSmemBytesKV = kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kSmemBytesP = kBlockM * kBlockN * sizeof(Element);
  // The dK/dV kernel: Q and dO per stage, K and V, P and dS.
  static constexpr int kSmemBytes = 2 * kStagesQ * kSmemBytesQ + 2 * kSmemBytesKV + 2 * kSmemBytesP;
  // The deterministic dQ kernel streams K and V instead: Q and dO, K and V per stage, dS. Two
  // stages where they fit the smallest shared memory the tiles are sized for (sm_80's 163 KB).
  static constexpr int kStagesKVDq =
      2 * kSmemBytesQ + 4 * kSmemBytesKV + kSmemBytesP <= 160 * 1024 ? 2 : 1;
  static constexpr int kSmemBytesDq =
      2 * kSmemBytesQ + 2 * kStagesKVDq * kSmemBytesKV + kSmemBytesP;
};

}  // namespace flashcute::sm80::backward

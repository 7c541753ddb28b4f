// Compile-time description of the SM80-family decode kernel: a block of kWarps warps serves 16
// packed query rows (one m16 MMA); each warp streams its own key tiles of kWarpKeys keys through a
// kStages-deep cp.async pipeline with its own online softmax, and the warps merge at the end.
// Decode reads each cache element once and does little math per byte, so what matters is bytes in
// flight: kWarps * (kStages - 1) tiles of K and V per block.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/sm80/smem_layouts.cuh"

namespace flashcute::sm80::decode {

template <class Element_, int kHeadDim_, int kWarps_, int kStages_>
struct DecodeTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;  // bucket: 64, 128 or 256
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = kStages_;
  static constexpr int kBlockM = 16;
  // 4096 elements (8 KB) of K per warp tile whatever the head_dim.
  static constexpr int kWarpKeys = 4096 / kHeadDim;
  static constexpr int kBlockKeys = kWarps * kWarpKeys;  // keys a block consumes per round
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim bucket");
  static_assert(kWarpKeys % 16 == 0, "P.V consumes keys in k16 steps");
  static_assert(kThreads % kBlockM == 0 && kHeadDim % (kThreads / kBlockM * 8) == 0,
                "the merge gives each thread whole 16-byte chunks of one row");

  using MmaOp = Mma16816<Element>;
  // One warp: each warp multiplies its own tiles.
  using TiledMma =
      cute::TiledMMA<cute::MMA_Atom<MmaOp>, cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>,
                     cute::Tile<cute::_16, cute::_16, cute::_16>>;

  using SmemLayoutQ = SwizzledLayout<kBlockM, kHeadDim>;
  using SmemLayoutKV = SwizzledLayout<kWarpKeys, kHeadDim>;
  using SmemLayoutVt = TransposedLayout<SmemLayoutKV, kWarpKeys, kHeadDim>;
  using SmemLayoutVtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutVt{}));

  using SmemCopyAtom = LdsmCopyAtom<Element>;
  using SmemCopyAtomTransposed = LdsmTransposedCopyAtom<Element>;

  static constexpr int kTileElems = kWarpKeys * kHeadDim;
  static constexpr int kSmemElemsQ = kBlockM * kHeadDim;
  // Per warp and stage: a K tile, then a V tile.
  static constexpr int kSmemElemsStage = 2 * kTileElems;
  static constexpr int kSmemBytesPipeline =
      (kSmemElemsQ + kWarps * kStages * kSmemElemsStage) * int(sizeof(Element));
  // The merge reuses the pipeline's memory: each warp's fp32 output, row maxima and row sums.
  static constexpr int kSmemBytesMerge = kWarps * kBlockM * (kHeadDim + 2) * int(sizeof(float));
  static constexpr int kSmemBytes =
      kSmemBytesPipeline > kSmemBytesMerge ? kSmemBytesPipeline : kSmemBytesMerge;
};

}  // namespace flashcute::sm80::decode

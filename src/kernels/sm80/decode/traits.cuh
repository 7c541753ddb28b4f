// Compile-time description of the SM80-family decode kernel: a block of kWarps warps serves 16
// packed query rows (one m16 MMA); each warp streams its own key tiles of kWarpKeys keys through a
// kStages-deep cp.async pipeline with its own online softmax, and the warps merge at the end.
// Decode reads each cache element once and does little math per byte, so what matters is bytes in
// flight: kWarps * (kStages - 1) tiles of K and V per block.
#pragma once

#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>

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

  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kBlockKSmem == 64 ? 3 : 2;

  using MmaOp =
      std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                         cute::SM80_16x8x16_F32F16F16F32_TN, cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  // One warp: each warp multiplies its own tiles.
  using TiledMma =
      cute::TiledMMA<cute::MMA_Atom<MmaOp>, cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>,
                     cute::Tile<cute::_16, cute::_16, cute::_16>>;

  using SmemLayoutAtom =
      decltype(cute::composition(cute::Swizzle<kSwizzleBits, 3, 3>{},
                                 cute::Layout<cute::Shape<cute::_8, cute::Int<kBlockKSmem>>,
                                              cute::Stride<cute::Int<kBlockKSmem>, cute::_1>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kWarpKeys>, cute::Int<kHeadDim>>{}));
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kWarpKeys>>{},
                                        cute::GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutVt{}));

  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;

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

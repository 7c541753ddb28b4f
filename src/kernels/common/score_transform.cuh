// From raw q.k products to exp2-domain logits: scale (or tanh softcap), ALiBi bias, then the mask.
// Scaling comes before the row maximum is taken, so a negative softmax scale is handled like any
// other. Each modifier is a separate unrolled pass behind a block-uniform branch, so the plain
// path costs one multiply per score.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/mask.cuh"

namespace flashcute {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct ScoreTransform {
  float scale_log2;      // softmax_scale * log2(e), used without softcap
  float softcap_inner;   // softmax_scale / softcap
  float softcap_outer;   // softcap * log2(e); 0 = no softcap
  float alibi_slope_log2;  // slope * log2(e); 0 = no ALiBi

  __device__ ScoreTransform(const AttentionParams& p, int batch, int head) {
    scale_log2 = p.scale_log2;
    softcap_outer = p.softcap > 0.f ? p.softcap * kLog2e : 0.f;
    softcap_inner = p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f;
    alibi_slope_log2 =
        p.alibi_slopes ? p.alibi_slopes[batch * p.alibi_batch_stride + head] * kLog2e : 0.f;
  }

  // scores: (rows, cols) view of an accumulator; coords: the same view of its (row, col)
  // coordinates within the tile, offset by (row0, col0) to absolute positions.
  template <class Scores, class Coords>
  __device__ void apply(Scores& scores, Coords const& coords, int row0, int col0,
                        const AttentionMask& mask, bool masked) const {
    using namespace cute;
    if (softcap_outer != 0.f) {
      CUTE_UNROLL
      for (int i = 0; i < size(scores); ++i) {
        scores(i) = softcap_outer * tanh_approx(scores(i) * softcap_inner);
      }
    } else {
      CUTE_UNROLL
      for (int i = 0; i < size(scores); ++i) scores(i) *= scale_log2;
    }
    if (alibi_slope_log2 != 0.f) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(scores); ++r) {
        const int row = row0 + get<0>(coords(r, 0)) + mask.diag;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          scores(r, c) -= alibi_slope_log2 * fabsf(float(row - (col0 + get<1>(coords(0, c)))));
        }
      }
    }
    if (masked) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(scores); ++r) {
        const int row = row0 + get<0>(coords(r, 0));
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          if (!mask.visible(row, col0 + get<1>(coords(0, c)))) scores(r, c) = -INFINITY;
        }
      }
    }
  }
};

}  // namespace flashcute

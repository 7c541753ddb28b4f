// The online softmax over key blocks, in the exp2 domain, for accumulator rows spread over the four
// threads of an mma quad (mma.sync and wgmma lay rows out alike): row reductions are two
// xor-shuffles, and row sums stay per-thread partial until the end (one reduction per tile).
// What differs between kernel families is a policy:
// - kChains: row maxima and sums run over this many interleaved partial results. One running value
//   is a dependency chain as long as the row; a warpgroup alone on its SM sub-partitions during
//   its softmax turn waits that chain out.
// - kMaxSlack: a row's reference maximum moves only when a block's maximum passes it by more than
//   this (log2 domain), so probabilities stay below 2^kMaxSlack and, after a row's first blocks,
//   the output is almost never rescaled. 0: it follows the maximum exactly.
// - kAnySignScale: the scale may be negative (the row extreme of the raw scores is then their
//   minimum); otherwise the caller passes a positive scale and applies any other beforehand.
// The running maximum stays -inf until a row sees a key; exponents are then taken against 0, so a
// row whose first blocks are masked keeps full precision when its real, possibly very negative,
// scores arrive, and a row that never sees a key ends with sum 0: output 0, log-sum-exp +inf.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/score_modifiers.hpp"

namespace flashcute {

template <int kChains_, int kMaxSlack_, bool kAnySignScale_>
struct SoftmaxPolicy {
  static constexpr int kChains = kChains_;
  static constexpr float kMaxSlack = float(kMaxSlack_);
  static constexpr bool kAnySignScale = kAnySignScale_;
};

CUTE_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

CUTE_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

CUTE_DEVICE float quad_min(float x) {
  x = fminf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fminf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

CUTE_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// A fixed reduction tree over the chains, so that results do not depend on the compiler.
template <int kChains, class Op>
CUTE_DEVICE float join_chains(float const (&partial)[kChains], Op op) {
  static_assert(kChains == 1 || kChains == 2 || kChains == 4, "chains are joined as a tree");
  if constexpr (kChains == 1) {
    return partial[0];
  } else if constexpr (kChains == 2) {
    return op(partial[0], partial[1]);
  } else {
    return op(op(partial[0], partial[1]), op(partial[2], partial[3]));
  }
}

// How the softmax reads a score x, as a logit map: logit(x) is its logit (log2 domain) and
// shifted_logit(x, m) that logit less m. The map is monotonic, so that a row's largest logit is
// the map of its extreme score (the largest when increasing(), else the smallest).
// row(r) gives the map of row r; a map may differ between rows and between the threads of a quad
// by a constant added to the scores (RowBiasedScores), which across_quad(x) adds to this thread's
// extreme score before the quad compares them (logit then maps the quad's extreme).
struct ScaledScores {
  float scale;
  CUTE_DEVICE ScaledScores row(int) const { return *this; }
  CUTE_DEVICE float across_quad(float x) const { return x; }
  CUTE_DEVICE bool increasing() const { return scale > 0.f; }
  CUTE_DEVICE float logit(float x) const { return x * scale; }
  CUTE_DEVICE float shifted_logit(float x, float reference) const {
    return fmaf(x, scale, -reference);
  }
};

template <int kRows, class Policy>
struct OnlineSoftmax {
  static constexpr int kChains = Policy::kChains;

  float row_max[kRows];  // reference maximum of the scaled scores (log2 domain); -inf before a key
  float row_sum[kRows];  // this thread's share of the running sum of exp2(score - row_max)

  CUTE_DEVICE void init() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // s: (rows, cols) scores whose logits are scale * s (masked: the infinity that scale turns into
  // -inf), overwritten with exp2(scale * s - row_max). Writes in `correction` the factor that
  // rescales what was accumulated under the previous reference maximum (1 where it stayed) and
  // returns whether any of this thread's rows moved it. The maximum of the raw scores times the
  // scale is the maximum of the logits: one multiply per row instead of one per score.
  template <class Tensor>
  CUTE_DEVICE bool update(Tensor& s, float scale, float (&correction)[kRows]) {
    return update(s, ScaledScores{scale}, correction);
  }

  // The same for scores whose logits are map.logit(s) (LogitMap: see ScaledScores).
  template <class Tensor, class LogitMap>
  CUTE_DEVICE bool update(Tensor& s, LogitMap const& map, float (&correction)[kRows]) {
    using namespace cute;
    static_assert(decltype(size<0>(s))::value == kRows, "row count mismatch");
    constexpr int kCols = decltype(size<1>(s))::value;
    static_assert(kCols % kChains == 0, "columns split evenly over the chains");
    bool moved_any = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      auto const row_map = map.row(r);
      float extreme;
      if (!Policy::kAnySignScale || row_map.increasing()) {
        extreme = quad_max(
            row_map.across_quad(row_reduce(s, r, [](float a, float b) { return fmaxf(a, b); })));
      } else {
        extreme = quad_min(
            row_map.across_quad(row_reduce(s, r, [](float a, float b) { return fminf(a, b); })));
      }
      float const block_max = row_map.logit(extreme);
      float m_ref;
      if constexpr (Policy::kMaxSlack == 0.f) {
        // The exact maximum; the correction is 1 exactly where it did not move.
        float const new_max = fmaxf(row_max[r], block_max);
        m_ref = new_max == -INFINITY ? 0.f : new_max;
        correction[r] = fast_exp2(row_max[r] - m_ref);
        moved_any |= correction[r] != 1.f;
        row_max[r] = new_max;
      } else {
        // -inf + slack is -inf: a row's first visible key always moves it; a block with no
        // visible key (maximum -inf) never does.
        bool const moved = block_max > row_max[r] + Policy::kMaxSlack;
        correction[r] = moved ? fast_exp2(row_max[r] - block_max) : 1.f;
        if (moved) row_max[r] = block_max;
        moved_any |= moved;
        m_ref = row_max[r] == -INFINITY ? 0.f : row_max[r];
      }
      float partial[kChains];
      CUTE_UNROLL
      for (int i = 0; i < kChains; ++i) partial[i] = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        float const p = fast_exp2(row_map.shifted_logit(s(r, c), m_ref));
        s(r, c) = p;
        partial[c % kChains] += p;
      }
      float const sum = join_chains<kChains>(partial, [](float a, float b) { return a + b; });
      row_sum[r] = row_sum[r] * correction[r] + sum;
    }
    return moved_any;
  }

  // Total row sums across the quad; returns 1/sum (0 for a row that saw no key) and writes the
  // natural-log log-sum-exp (+inf for such a row).
  CUTE_DEVICE void finish(float (&inv_sum)[kRows], float (&lse)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float const sum = quad_sum(row_sum[r]);
      bool const empty = sum == 0.f;
      inv_sum[r] = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? INFINITY : (row_max[r] + __log2f(sum)) * kLn2;
    }
  }

  // Multiplies the output accumulator's rows (rows, cols) by per-row factors.
  template <class Tensor>
  CUTE_DEVICE static void scale_rows(Tensor& o, float const (&factor)[kRows]) {
    using namespace cute;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= factor[r];
    }
  }

 private:
  // This thread's part of row r reduced with op, over kChains interleaved partial results.
  template <class Tensor, class Op>
  CUTE_DEVICE static float row_reduce(Tensor const& s, int r, Op op) {
    using namespace cute;
    constexpr int kCols = decltype(size<1>(s))::value;
    float partial[kChains];
    CUTE_UNROLL
    for (int i = 0; i < kChains; ++i) partial[i] = s(r, i);
    CUTE_UNROLL
    for (int c = kChains; c < kCols; ++c) partial[c % kChains] = op(partial[c % kChains], s(r, c));
    return join_chains<kChains>(partial, op);
  }
};

}  // namespace flashcute

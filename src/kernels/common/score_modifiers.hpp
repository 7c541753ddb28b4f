// From raw q.k products to logits the online softmax can exponentiate: scale (or tanh softcap),
// ALiBi bias, then the mask; and the slope backward needs through the softcap.
// On the plain path (no softcap, no ALiBi) the scores stay raw and the softmax folds the scale into
// its exp2 (one FFMA per score instead of a multiply and a subtract); masked scores then take the
// infinity that the scale's sign turns into -inf, so a negative scale works like any other. With a
// softcap and no ALiBi the scores stay tanh values and the softmax folds the cap's outer factor
// the same way (one multiply per score fewer beside the tanh, the softmax's busiest step); a
// kernel may leave that tanh to the softmax on blocks without hidden scores (CappedScores). Each
// modifier is an unrolled pass behind a block-uniform branch; a kernel compiled without modifiers
// (kModifiers = false, launched only when has_score_modifiers is false) drops those passes, and
// the state they keep, at compile time.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/mask.hpp"
#include "kernels/common/params.hpp"

namespace flashcute {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Softcap or ALiBi: the modifiers that change scores beyond a scale.
CUTE_HOST_DEVICE bool has_softcap_or_alibi(const AttentionParams& p) {
  return p.softcap > 0.f || p.alibi_slopes != nullptr;
}

// Whether a launch needs the modifier passes: softcap, ALiBi, or a zero scale (which cannot be
// folded into the softmax: it would turn a masked infinity into NaN).
CUTE_HOST_DEVICE bool has_score_modifiers(const AttentionParams& p) {
  return has_softcap_or_alibi(p) || p.scale_log2 == 0.f;
}

// Whether a launch may run an SM80-family plain kernel, compiled for a padded head_dim: no score
// modifier, a positive scale (a row's largest logit is then its largest raw score, so the softmax
// needs no branch on the scale's sign) and a head_dim that fills the bucket (no column predicate).
CUTE_HOST_DEVICE bool fits_plain_kernel(const AttentionParams& p, int padded_head_dim) {
  return !has_score_modifiers(p) && p.scale_log2 > 0.f && p.head_dim == padded_head_dim;
}

CUTE_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The modifiers' parameters as a kernel keeps them (AttentionParams carries the same fields).
struct ScoreModifierParams {
  float softmax_scale;
  float softcap;              // 0 = off
  const float* alibi_slopes;  // null = off; (sequence, head) at sequence * batch stride + head
  int64_t alibi_batch_stride;

  CUTE_HOST_DEVICE static ScoreModifierParams of(const AttentionParams& p) {
    return {p.softmax_scale, p.softcap, p.alibi_slopes, p.alibi_batch_stride};
  }

  // ALiBi's slope of one (sequence, head); 0 without ALiBi.
  CUTE_DEVICE float alibi_slope(int sequence, int head) const {
    return alibi_slopes ? alibi_slopes[sequence * alibi_batch_stride + head] : 0.f;
  }
};

// Softcap alone, as the online softmax reads raw scores (its LogitMap): a score x has the logit
// outer * tanh(x * inner). With inner > 0 the map is increasing, so a row's largest logit is the
// map of its largest raw score: one tanh per row ahead of the row maximum instead of one per score.
struct CappedScores {
  float inner, outer;
  CUTE_DEVICE CappedScores row(int) const { return *this; }
  CUTE_DEVICE float across_quad(float x) const { return x; }
  CUTE_DEVICE bool increasing() const { return inner > 0.f; }
  CUTE_DEVICE float logit(float x) const { return outer * tanh_approx(x * inner); }
  CUTE_DEVICE float shifted_logit(float x, float reference) const {
    return fmaf(tanh_approx(x * inner), outer, -reference);
  }
};

// Scores whose logits are scale * (x + bias), with a bias per row and thread: the row term of
// ALiBi on a block whose keys lie on one side of every row's diagonal (ScoreTransform::
// add_alibi_linear). Each thread counts a row's columns from its own first one, so the threads
// of a quad hold different biases for the same row: a row's maximum is taken over x + bias. The
// softmax adds the bias once per row, inside the FFMA that scales each score.
template <int kRows>
struct RowBiasedScores {
  float scale;
  float bias[kRows];  // raw score units

  struct Row {
    float scale, bias;
    CUTE_DEVICE float across_quad(float x) const { return x + bias; }
    CUTE_DEVICE bool increasing() const { return scale > 0.f; }
    CUTE_DEVICE float logit(float x) const { return x * scale; }
    CUTE_DEVICE float shifted_logit(float x, float reference) const {
      return fmaf(x, scale, bias * scale - reference);
    }
  };
  CUTE_DEVICE Row row(int r) const { return {scale, bias[r]}; }
};

template <bool kModifiers>
struct ScoreTransform {
  float scale_log2;        // softmax_scale * log2(e)
  float softcap_inner;     // softmax_scale / softcap
  float softcap_outer;     // softcap * log2(e); 0 = no softcap
  float alibi_slope_log2;  // slope * log2(e); 0 = no ALiBi
  // What add_alibi multiplies a distance by: slope * log2(e), over scale_log2 when the scale is
  // folded (the bias then joins the raw scores, which the softmax scales).
  float alibi_factor;
  bool fold_scale;     // the softmax applies scale_log2 itself (no softcap; with ALiBi, scale > 0)
  bool fold_softcap;   // softcap alone: scores stay tanh values, the softmax applies softcap_outer
  float masked_value;  // what a hidden score becomes

  CUTE_DEVICE ScoreTransform(const AttentionParams& p, int sequence, int head)
      : ScoreTransform(p.scale_log2, ScoreModifierParams::of(p), sequence, head) {}

  // sequence, head: whose ALiBi slope applies.
  CUTE_DEVICE ScoreTransform(float scale_log2_, const ScoreModifierParams& m, int sequence,
                             int head) {
    scale_log2 = scale_log2_;
    if constexpr (kModifiers) {
      float const alibi_slope = m.alibi_slope(sequence, head);
      softcap_outer = m.softcap > 0.f ? m.softcap * kLog2e : 0.f;
      softcap_inner = m.softcap > 0.f ? m.softmax_scale / m.softcap : 0.f;
      alibi_slope_log2 = alibi_slope * kLog2e;
      // ALiBi alone with a positive scale keeps the scale in the softmax (whose policies may take
      // a positive scale only): a score then costs ALiBi an FADD and an FFMA, not an FMUL more.
      fold_scale = softcap_outer == 0.f && scale_log2 != 0.f &&
                   (alibi_slope_log2 == 0.f || scale_log2 > 0.f);
      fold_softcap = softcap_outer != 0.f && alibi_slope_log2 == 0.f;
      alibi_factor = fold_scale ? alibi_slope_log2 / scale_log2 : alibi_slope_log2;
    } else {
      // Constants, so that the compiler removes every modifier pass.
      softcap_outer = softcap_inner = alibi_slope_log2 = alibi_factor = 0.f;
      fold_scale = true;
      fold_softcap = false;
    }
    masked_value = fold_scale && scale_log2 < 0.f ? INFINITY : -INFINITY;
  }

  // The factor the softmax multiplies scores by before exp2.
  CUTE_DEVICE float exp2_multiplier() const {
    return fold_scale ? scale_log2 : fold_softcap ? softcap_outer : 1.f;
  }

  CUTE_HOST_DEVICE bool has_softcap() const { return softcap_outer != 0.f; }

  // Whether a block without hidden scores may leave its softcap to the softmax (capped_scores):
  // softcap alone, positive scale.
  CUTE_DEVICE bool defers_softcap() const { return fold_softcap && softcap_inner > 0.f; }
  CUTE_DEVICE CappedScores capped_scores() const { return {softcap_inner, softcap_outer}; }

  // ALiBi's bias (exp2 domain) of the score at absolute (row, col).
  CUTE_DEVICE float alibi_bias(int row, int col, const AttentionMask& mask) const {
    return -alibi_slope_log2 * fabsf(float(row + mask.diag - col));
  }

  // Backward: d(capped score)/d(scaled q.k) = 1 - tanh^2, from a visible score that apply()
  // finished at absolute (row, col): the tanh itself when folded, else the capped logit, from
  // which ALiBi's bias is taken off again.
  CUTE_DEVICE float softcap_slope(float score, int row, int col, const AttentionMask& mask) const {
    float const t = fold_softcap ? score : (score - alibi_bias(row, col, mask)) / softcap_outer;
    return 1.f - t * t;
  }

  // The steps of apply. scores: (rows, cols) view of an accumulator; coords: the same view of its
  // (row, col) coordinates within the tile, offset by (row0, col0) to absolute positions.
  template <class Scores>
  CUTE_DEVICE void cap_or_scale(Scores& scores) const {
    using namespace cute;
    if (fold_scale) {
      // nothing to do before the mask
    } else if (fold_softcap) {
      CUTE_UNROLL
      for (int i = 0; i < size(scores); ++i) scores(i) = tanh_approx(scores(i) * softcap_inner);
    } else if (softcap_outer != 0.f) {
      CUTE_UNROLL
      for (int i = 0; i < size(scores); ++i) {
        scores(i) = softcap_outer * tanh_approx(scores(i) * softcap_inner);
      }
    } else {
      CUTE_UNROLL
      for (int i = 0; i < size(scores); ++i) scores(i) *= scale_log2;
    }
  }

  // Distances are taken as floats from the thread's first column: each score then costs an add
  // of a compile-time offset and an FFMA, where converting each integer distance would queue on
  // the pipe that also runs the softmax's exp2. Integers below 2^24 are exact in either form.
  template <class Scores, class Coords>
  CUTE_DEVICE void add_alibi(Scores& scores, Coords const& coords, int row0, int col0,
                             const AttentionMask& mask) const {
    using namespace cute;
    if (alibi_slope_log2 != 0.f) {
      // Coordinates derive from the unsigned thread index: make them signed before adding.
      int const first_col = int(get<1>(coords(0, 0)));
      CUTE_UNROLL
      for (int r = 0; r < size<0>(scores); ++r) {
        float const distance0 =
            float(row0 + int(get<0>(coords(r, 0))) + mask.diag - col0 - first_col);
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          float const offset = float(int(get<1>(coords(0, c))) - first_col);
          scores(r, c) -= alibi_factor * fabsf(distance0 - offset);
        }
      }
    }
  }

  // Which side of the diagonal the keys [col0, col0 + cols) lie on for every row of
  // [row0, row0 + rows): 1 at or before it, -1 at or after it, 0 across it. Also 0 unless ALiBi is
  // the only modifier and the scale is positive (folded), the case add_alibi_linear serves.
  CUTE_DEVICE int alibi_side(int row0, int rows, int col0, int cols,
                             const AttentionMask& mask) const {
    if (!fold_scale || alibi_slope_log2 == 0.f) return 0;
    if (row0 + mask.diag >= col0 + cols - 1) return 1;
    if (row0 + rows - 1 + mask.diag <= col0) return -1;
    return 0;
  }

  // ALiBi on a block on one side of the diagonal (side from alibi_side, not 0): a score's bias
  // -factor * |distance| is then -side * factor * (distance of the thread's first column - the
  // column's compile-time offset), so each score takes the column term in one FFMA with an
  // immediate, and map.bias the row term, which the softmax adds per row (add_alibi takes an FADD
  // and an FFMA per score). The row term is the same for all of a row's keys in the block, so
  // its rounding does not change the row's probabilities.
  template <class Scores, class Coords, int kRows>
  CUTE_DEVICE void add_alibi_linear(Scores& scores, Coords const& coords, int row0, int col0,
                                    const AttentionMask& mask, int side,
                                    RowBiasedScores<kRows>& map) const {
    using namespace cute;
    static_assert(decltype(size<0>(scores))::value == kRows, "row count mismatch");
    float const factor = float(side) * alibi_factor;
    int const first_col = int(get<1>(coords(0, 0)));
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      map.bias[r] =
          -factor * float(row0 + int(get<0>(coords(r, 0))) + mask.diag - col0 - first_col);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        float const offset = float(int(get<1>(coords(0, c))) - first_col);
        scores(r, c) = fmaf(factor, offset, scores(r, c));
      }
    }
  }

  template <class Scores, class Coords>
  CUTE_DEVICE void mask_hidden(Scores& scores, Coords const& coords, int row0, int col0,
                               const AttentionMask& mask) const {
    using namespace cute;
    // Per row, the visible range relative to this thread's first column, so that each score
    // compares a compile-time column offset against two registers.
    const int thread_col = col0 + int(get<1>(coords(0, 0)));
    CUTE_UNROLL
    for (int r = 0; r < size<0>(scores); ++r) {
      const KeyInterval keys = mask.row_keys(row0 + int(get<0>(coords(r, 0))));
      const int begin = keys.begin - thread_col;
      const int end = keys.end - thread_col;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        const int offset = int(get<1>(coords(0, c))) - int(get<1>(coords(0, 0)));
        if (offset < begin || offset >= end) scores(r, c) = masked_value;
      }
    }
  }

  template <bool kMasked, class Scores, class Coords>
  CUTE_DEVICE void apply(Scores& scores, Coords const& coords, int row0, int col0,
                         const AttentionMask& mask) const {
    cap_or_scale(scores);
    add_alibi(scores, coords, row0, col0, mask);
    if constexpr (kMasked) mask_hidden(scores, coords, row0, col0, mask);
  }
};

}  // namespace flashcute

// Online softmax over key blocks, in the exp2 domain, for rows spread over the four threads of an
// mma quad. The running maximum stays -inf until a row sees a key: exponents are taken against a
// safe reference (0 for an all-masked row) instead of overwriting the maximum, so a row whose first
// block is masked keeps full precision when its real, possibly very negative, scores arrive.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute {

constexpr float kLn2 = 0.6931471805599453f;

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];  // log2 domain
  float row_sum[kRows];  // this thread's partial sum; the quad is summed once, at the end

  __device__ OnlineSoftmax() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  __device__ static float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
  }
  __device__ static float quad_min(float x) {
    x = fminf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fminf(x, __shfl_xor_sync(0xffffffff, x, 2));
  }
  __device__ static float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    return x + __shfl_xor_sync(0xffffffff, x, 2);
  }

  // scores (rows, cols), multiplied by `multiplier`, are exp2-domain logits; they become
  // probabilities relative to the new row maximum, and acc_o (rows, cols) is rescaled to it.
  // The largest logit is multiplier * max(score), or multiplier * min(score) for a negative one.
  template <class Scores, class AccO>
  __device__ void update(Scores& scores, AccO& acc_o, float multiplier) {
    using namespace cute;
    static_assert(decltype(size<0>(scores))::value == kRows, "row count mismatch");
    float correction[kRows];
    bool rescale = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float extreme = scores(r, 0);
      if (multiplier > 0.f) {
        CUTE_UNROLL
        for (int c = 1; c < size<1>(scores); ++c) extreme = fmaxf(extreme, scores(r, c));
        extreme = quad_max(extreme);
      } else {
        CUTE_UNROLL
        for (int c = 1; c < size<1>(scores); ++c) extreme = fminf(extreme, scores(r, c));
        extreme = quad_min(extreme);
      }
      const float new_max = fmaxf(row_max[r], extreme * multiplier);
      const float reference = new_max == -INFINITY ? 0.f : new_max;
      correction[r] = exp2f(row_max[r] - reference);
      rescale |= correction[r] != 1.f;
      row_max[r] = new_max;
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        scores(r, c) = exp2f(fmaf(scores(r, c), multiplier, -reference));
        sum += scores(r, c);
      }
      row_sum[r] = row_sum[r] * correction[r] + sum;
    }
    // Once a row has met its largest scores the maximum stops moving: skip the rescale then.
    if (__any_sync(0xffffffff, rescale)) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_o); ++c) acc_o(r, c) *= correction[r];
      }
    }
  }

  // Normalises acc_o and returns each row's natural-log log-sum-exp (+inf for a row that saw no
  // key, whose output becomes 0).
  template <class AccO>
  __device__ void finalize(AccO& acc_o, float (&lse)[kRows]) {
    using namespace cute;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_sum(row_sum[r]);
      const bool empty = sum == 0.f;
      const float inv = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? INFINITY : (row_max[r] + __log2f(sum)) * kLn2;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(acc_o); ++c) acc_o(r, c) *= inv;
    }
  }
};

}  // namespace flashcute

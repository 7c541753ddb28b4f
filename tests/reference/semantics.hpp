// The mask and score rules of the C API, written once for the CPU and GPU references so that both
// mean the same thing (the CPU tests check this against a separate naive implementation).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FC_REF_HD __host__ __device__
#else
#define FC_REF_HD
#endif

namespace flashcute {
namespace ref {

// The keys query i of a sequence sees are lo..hi inclusive (none when lo > hi).
struct KeyRange {
  int64_t lo;
  int64_t hi;
};

// diag shifts the mask's diagonal: seqlen_k - seqlen_q when bottom-right aligned, else 0.
FC_REF_HD inline int64_t diagonal(int64_t seqlen_q, int64_t seqlen_k, bool bottom_right) {
  return bottom_right ? seqlen_k - seqlen_q : 0;
}

// Query i sees key j iff i + diag - left <= j <= i + diag + right (a negative bound is unbounded);
// causal is a right bound of 0.
FC_REF_HD inline KeyRange visible_keys(int64_t i, int64_t seqlen_k, int64_t diag, bool causal,
                                       int64_t left, int64_t right) {
  KeyRange r{0, seqlen_k - 1};
  if (causal) right = 0;
  if (left >= 0 && i + diag - left > r.lo) r.lo = i + diag - left;
  if (right >= 0 && i + diag + right < r.hi) r.hi = i + diag + right;
  return r;
}

FC_REF_HD inline float tanh_of(float x) { return tanhf(x); }
FC_REF_HD inline double tanh_of(double x) { return tanh(x); }

// The score the softmax sees: scale * q.k, then softcap * tanh(. / softcap), then the ALiBi bias
// -slope * |i + diag - j|.
template <typename T>
FC_REF_HD inline T modified_score(T dot, T scale, T softcap, T slope, int64_t i, int64_t j,
                                  int64_t diag) {
  T s = scale * dot;
  if (softcap > T(0)) s = softcap * tanh_of(s / softcap);
  const int64_t distance = i + diag - j;
  s -= slope * T(distance < 0 ? -distance : distance);
  return s;
}

}  // namespace ref
}  // namespace flashcute

#include "reference/softmax_row.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashcute {
namespace ref {

const float* row_ptr(const HostTensor& t, const Problem& p, int b, int64_t token, int h,
                     int64_t token0) {
  const int64_t batch_offset = p.varlen() ? 0 : int64_t{b} * t.layout.batch_stride;
  return t.data + batch_offset + (token0 + token) * t.layout.seq_stride + h * t.layout.head_stride;
}

double alibi_slope(const Problem& p, int b, int h) {
  return p.alibi_slopes.empty() ? 0.0 : p.alibi_slopes[b * p.alibi_batch_stride + h];
}

void softmax_row(const Problem& p, const HostTensor& q, const HostTensor& k, int b, int h,
                 int64_t i, SoftmaxRow& row) {
  const int64_t sq = p.seq_q(b), sk = p.seq_k(b);
  const int64_t diag = diagonal(sq, sk, p.bottom_right);
  row.keys = visible_keys(i, sk, diag, p.causal, p.window_left, p.window_right);
  row.dot.clear();
  row.p.clear();
  row.lse = std::numeric_limits<double>::infinity();
  if (row.keys.lo > row.keys.hi) return;
  const int hk = h / (p.heads / p.heads_k);
  const double slope = alibi_slope(p, b, h);
  const float* qi = row_ptr(q, p, b, i, h, p.q_token0(b));
  row.dot.resize(row.keys.hi - row.keys.lo + 1);
  row.p.resize(row.dot.size());
  double max_score = -std::numeric_limits<double>::infinity();
  for (int64_t j = row.keys.lo; j <= row.keys.hi; ++j) {
    const float* kj = row_ptr(k, p, b, j, hk, p.k_token0(b));
    double dot = 0;
    for (int d = 0; d < p.head_dim; ++d) dot += double(qi[d]) * kj[d];
    const double s = modified_score<double>(dot, p.softmax_scale, p.softcap, slope, i, j, diag);
    row.dot[j - row.keys.lo] = dot;
    row.p[j - row.keys.lo] = s;
    max_score = std::max(max_score, s);
  }
  double sum = 0;
  for (double& s : row.p) sum += (s = std::exp(s - max_score));
  for (double& s : row.p) s /= sum;
  row.lse = max_score + std::log(sum);
}

}  // namespace ref
}  // namespace flashcute

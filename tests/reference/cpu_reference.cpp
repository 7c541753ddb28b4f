#include "reference/cpu_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/semantics.hpp"

namespace flashcute {
namespace ref {
namespace {

const float* row_ptr(const HostTensor& t, const Problem& p, int b, int64_t token, int h,
                     int64_t token0) {
  const int64_t batch_offset = p.varlen() ? 0 : int64_t{b} * t.layout.batch_stride;
  return t.data + batch_offset + (token0 + token) * t.layout.seq_stride + h * t.layout.head_stride;
}

}  // namespace

CpuOutput cpu_reference(const Problem& p, HostTensor q, HostTensor k, HostTensor v) {
  CpuOutput out;
  out.o.assign(p.o_elements(), 0.0);
  out.lse.assign(p.lse_elements(), std::numeric_limits<double>::infinity());
  const int group = p.heads / p.heads_k;
  std::vector<double> scores;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t sq = p.seq_q(b), sk = p.seq_k(b);
    const int64_t diag = diagonal(sq, sk, p.bottom_right);
    for (int h = 0; h < p.heads; ++h) {
      const int hk = h / group;
      const double slope =
          p.alibi_slopes.empty() ? 0.0 : p.alibi_slopes[b * p.alibi_batch_stride + h];
      for (int64_t i = 0; i < sq; ++i) {
        const KeyRange keys = visible_keys(i, sk, diag, p.causal, p.window_left, p.window_right);
        if (keys.lo > keys.hi) continue;  // O stays 0 and LSE +inf
        const float* qi = row_ptr(q, p, b, i, h, p.q_token0(b));
        scores.assign(keys.hi - keys.lo + 1, 0.0);
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.lo; j <= keys.hi; ++j) {
          const float* kj = row_ptr(k, p, b, j, hk, p.k_token0(b));
          double dot = 0;
          for (int d = 0; d < p.head_dim; ++d) dot += double(qi[d]) * kj[d];
          const double s =
              modified_score<double>(dot, p.softmax_scale, p.softcap, slope, i, j, diag);
          scores[j - keys.lo] = s;
          max_score = std::max(max_score, s);
        }
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - max_score));
        double* oi = out.o.data() + p.o_index(b, i, h);
        for (int64_t j = keys.lo; j <= keys.hi; ++j) {
          const float* vj = row_ptr(v, p, b, j, hk, p.k_token0(b));
          const double weight = scores[j - keys.lo] / sum;
          for (int d = 0; d < p.head_dim; ++d) oi[d] += weight * vj[d];
        }
        out.lse[p.lse_index(b, i, h)] = max_score + std::log(sum);
      }
    }
  }
  return out;
}

}  // namespace ref
}  // namespace flashcute

#include "reference/cpu_reference.hpp"

#include <limits>

#include "reference/softmax_row.hpp"

namespace flashcute {
namespace ref {

CpuOutput cpu_reference(const Problem& p, HostTensor q, HostTensor k, HostTensor v) {
  CpuOutput out;
  out.o.assign(p.o_elements(), 0.0);
  out.lse.assign(p.lse_elements(), std::numeric_limits<double>::infinity());
  const int group = p.heads / p.heads_k;
  SoftmaxRow row;
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const int hk = h / group;
      for (int64_t i = 0; i < p.seq_q(b); ++i) {
        softmax_row(p, q, k, b, h, i, row);
        if (row.keys.lo > row.keys.hi) continue;  // O stays 0 and LSE +inf
        double* oi = out.o.data() + p.o_index(b, i, h);
        for (int64_t j = row.keys.lo; j <= row.keys.hi; ++j) {
          const float* vj = row_ptr(v, p, b, j, hk, p.k_token0(b));
          const double weight = row.p[j - row.keys.lo];
          for (int d = 0; d < p.head_dim; ++d) oi[d] += weight * vj[d];
        }
        out.lse[p.lse_index(b, i, h)] = row.lse;
      }
    }
  }
  return out;
}

}  // namespace ref
}  // namespace flashcute

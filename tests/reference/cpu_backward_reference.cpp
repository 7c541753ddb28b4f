#include "reference/cpu_backward_reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "reference/softmax_row.hpp"

namespace flashcute {
namespace ref {
namespace {

// Runs f(0) .. f(n - 1) over the machine's cores, each index once.
template <typename F>
void parallel_for(int64_t n, F f) {
  const int64_t workers = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t u = next++; u < n; u = next++) f(u);
  };
  std::vector<std::thread> threads;
  for (int64_t w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
}

// What the query rows of one head add to dK and dV (and to their term sizes), per query head:
// (kv_rows, heads, head_dim) each, reduced over every GQA group afterwards in a fixed order.
struct KeySums {
  std::vector<double> dk, dv, dk_terms, dv_terms;
};

// Query row i of head h in sequence b: its O, LSE and dQ in place, and what it adds to dK and dV of
// every key it sees.
void backward_row(const Problem& p, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                  const HostTensor& dout, const HostTensor* given_o, int b, int h, int64_t i,
                  SoftmaxRow& row, CpuBackwardOutput& out, KeySums& sums) {
  softmax_row(p, q, k, b, h, i, row);
  if (row.keys.lo > row.keys.hi) return;  // O, dQ stay 0 and LSE +inf
  const int D = p.head_dim, hk = h / (p.heads / p.heads_k);
  const int64_t q0 = p.q_token0(b), k0 = p.k_token0(b);
  const double scale = p.softmax_scale, softcap = p.softcap;
  const float* qi = row_ptr(q, p, b, i, h, q0);
  const float* doi = row_ptr(dout, p, b, i, h, q0);
  double* oi = out.o.data() + p.o_index(b, i, h);
  for (int64_t j = row.keys.lo; j <= row.keys.hi; ++j) {
    const float* vj = row_ptr(v, p, b, j, hk, k0);
    const double weight = row.p[j - row.keys.lo];
    for (int d = 0; d < D; ++d) oi[d] += weight * vj[d];
  }
  out.lse[p.lse_index(b, i, h)] = row.lse;
  double dout_dot_o = 0;  // rowsum(dO * O)
  if (given_o != nullptr) {
    const float* given = row_ptr(*given_o, p, b, i, h, q0);
    for (int d = 0; d < D; ++d) dout_dot_o += double(doi[d]) * given[d];
  } else {
    for (int d = 0; d < D; ++d) dout_dot_o += double(doi[d]) * oi[d];
  }
  double* dqi = out.dq.data() + p.o_index(b, i, h);
  double* dqi_terms = out.dq_terms.data() + p.o_index(b, i, h);
  for (int64_t j = row.keys.lo; j <= row.keys.hi; ++j) {
    const float* kj = row_ptr(k, p, b, j, hk, k0);
    const float* vj = row_ptr(v, p, b, j, hk, k0);
    const double pj = row.p[j - row.keys.lo];
    double dp = 0;
    for (int d = 0; d < D; ++d) dp += double(doi[d]) * vj[d];
    // dL/d(dot): through the softmax, the softcap's tanh and the scale; ALiBi is a constant.
    double factor = scale;
    if (softcap > 0) {
      const double t = std::tanh(scale * row.dot[j - row.keys.lo] / softcap);
      factor *= 1 - t * t;
    }
    const double ds = factor * pj * (dp - dout_dot_o);
    const double ds_terms = std::fabs(factor) * pj * (std::fabs(dp) + std::fabs(dout_dot_o));
    const int64_t at = ((p.varlen() ? k0 + j : int64_t{b} * p.seqlen_k + j) * p.heads + h) * D;
    for (int d = 0; d < D; ++d) {
      dqi[d] += ds * kj[d];
      dqi_terms[d] += ds_terms * std::fabs(kj[d]);
      sums.dk[at + d] += ds * qi[d];
      sums.dk_terms[at + d] += ds_terms * std::fabs(qi[d]);
      sums.dv[at + d] += pj * doi[d];
      sums.dv_terms[at + d] += pj * std::fabs(doi[d]);
    }
  }
}

}  // namespace

CpuBackwardOutput cpu_backward_reference(const Problem& p, HostTensor q, HostTensor k, HostTensor v,
                                         HostTensor dout, const HostTensor* given_o) {
  CpuBackwardOutput out;
  out.o.assign(p.o_elements(), 0.0);
  out.lse.assign(p.lse_elements(), std::numeric_limits<double>::infinity());
  for (auto* g : {&out.dq, &out.dq_terms}) g->assign(p.o_elements(), 0.0);
  for (auto* g : {&out.dk, &out.dv, &out.dk_terms, &out.dv_terms}) g->assign(p.kv_elements(), 0.0);
  if (p.heads == 0 || p.heads_k == 0) return out;
  const int64_t D = p.head_dim;
  KeySums sums;
  for (auto* s : {&sums.dk, &sums.dv, &sums.dk_terms, &sums.dv_terms})
    s->assign(p.kv_rows() * p.heads * D, 0.0);
  // Each (sequence, head) owns its rows of O, LSE and dQ and its slice of the per-head sums.
  parallel_for(int64_t{p.batch} * p.heads, [&](int64_t unit) {
    const int b = int(unit / p.heads), h = int(unit % p.heads);
    SoftmaxRow row;
    for (int64_t i = 0; i < p.seq_q(b); ++i)
      backward_row(p, q, k, v, dout, given_o, b, h, i, row, out, sums);
  });
  const int group = p.heads / p.heads_k;
  for (int64_t r = 0; r < p.kv_rows(); ++r)
    for (int h = 0; h < p.heads; ++h) {
      const int64_t from = (r * p.heads + h) * D, to = (r * p.heads_k + h / group) * D;
      for (int64_t d = 0; d < D; ++d) {
        out.dk[to + d] += sums.dk[from + d];
        out.dv[to + d] += sums.dv[from + d];
        out.dk_terms[to + d] += sums.dk_terms[from + d];
        out.dv_terms[to + d] += sums.dv_terms[from + d];
      }
    }
  return out;
}

}  // namespace ref
}  // namespace flashcute

// CPU fp64 attention backward: the gradients of the forward reference's output with respect to q,
// k and v for a given output gradient dO. It differentiates the same softmax rows the forward
// reference computes (reference/softmax_row.hpp), so it inherits every mask and score modifier.
#pragma once

#include <vector>

#include "reference/cpu_reference.hpp"
#include "reference/problem.hpp"

namespace flashcute {
namespace ref {

// O and LSE as cpu_reference gives them, and the gradients of sum(O * dO):
//   P = softmax(S), dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
//   times 1 - tanh^2 through a softcap, dQ = scale * dS K, dK = scale * dS^T Q.
// For GQA, dK and dV of a key/value head sum over its query heads. A query row that sees no key
// has a zero dQ and adds nothing to dK and dV; a key no query sees has zero dK and dV.
struct CpuBackwardOutput : CpuOutput {
  std::vector<double> dq;  // canonical like O, Problem::o_index
  std::vector<double> dk;  // canonical K-like, Problem::kv_index
  std::vector<double> dv;
  // The same sums with every term taken by its absolute value (|dP| + |rowsum(dO * O)| in place of
  // their difference): how large each gradient element's terms are. Where a gradient cancels far
  // below its terms (a row whose softmax is one-hot, a row that sees one key), an implementation's
  // rounding is only small next to these.
  std::vector<double> dq_terms, dk_terms, dv_terms;
};

// dout is laid out like q (one row per query token and head). rowsum(dO * O) takes O from
// `given_o` when set (laid out like q): the output the implementation under test was given,
// already rounded to its type, so that the reference differentiates from the same point;
// otherwise the reference's own fp64 O. The work is spread over threads by (sequence, head); the
// result does not depend on the number of threads.
CpuBackwardOutput cpu_backward_reference(const Problem& problem, HostTensor q, HostTensor k,
                                         HostTensor v, HostTensor dout,
                                         const HostTensor* given_o = nullptr);

}  // namespace ref
}  // namespace flashcute

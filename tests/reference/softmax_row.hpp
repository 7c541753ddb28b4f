// One query row of the attention problem in fp64, as both CPU references compute it: the keys the
// row sees, their raw dot products with the query, and the softmax over the modified scores.
// Written once so that the backward reference differentiates exactly the forward reference.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/cpu_reference.hpp"
#include "reference/problem.hpp"
#include "reference/semantics.hpp"

namespace flashcute {
namespace ref {

// Row `token` (counted from token0, the sequence's first packed token) of head h of sequence b.
const float* row_ptr(const HostTensor& t, const Problem& p, int b, int64_t token, int h,
                     int64_t token0);

// The ALiBi slope of head h in sequence b (0 without ALiBi).
double alibi_slope(const Problem& p, int b, int h);

struct SoftmaxRow {
  KeyRange keys;            // the visible keys lo..hi; empty when lo > hi
  std::vector<double> dot;  // q_i . k_j for each visible key, index j - keys.lo
  std::vector<double> p;    // softmax probability of each visible key, summing to 1
  double lse = 0;           // natural-log log-sum-exp of the modified scores; +inf if no key
};

// Fills row for query i of head h in sequence b. Reuses row's storage.
void softmax_row(const Problem& p, const HostTensor& q, const HostTensor& k, int b, int h,
                 int64_t i, SoftmaxRow& row);

}  // namespace ref
}  // namespace flashcute

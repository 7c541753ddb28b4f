// CPU fp64 attention forward: the reference every kernel and the GPU reference are checked against.
#pragma once

#include <vector>

#include "reference/problem.hpp"

namespace flashcute {
namespace ref {

// A host tensor of values already rounded from fp16/bf16, addressed with the given strides.
struct HostTensor {
  const float* data;
  Layout layout;
};

struct CpuOutput {
  std::vector<double> o;    // canonical layout, Problem::o_index
  std::vector<double> lse;  // canonical layout, Problem::lse_index; +inf where a row sees no key
};

CpuOutput cpu_reference(const Problem& problem, HostTensor q, HostTensor k, HostTensor v);

}  // namespace ref
}  // namespace flashcute

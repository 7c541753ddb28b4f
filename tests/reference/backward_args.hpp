// The fc_backward arguments that describe a reference Problem, the backward's counterpart of
// forward_args.hpp. Callers add the tensors, the LSE, the workspace, the family and determinism.
#pragma once

#include "flashcute/flashcute.h"
#include "reference/problem.hpp"

namespace flashcute {
namespace ref {

fc_backward_args backward_args_for(const Problem& p, fc_dtype dtype);

}  // namespace ref
}  // namespace flashcute

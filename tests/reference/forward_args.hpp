// The C API arguments that describe a reference Problem: sizes, scale, masks and score modifiers.
// Callers add what only they know: tensors, device pointers, the tile and the family.
#pragma once

#include "flashcute/flashcute.h"
#include "reference/problem.hpp"

namespace flashcute {
namespace ref {

fc_forward_args forward_args_for(const Problem& p, fc_dtype dtype);

}  // namespace ref
}  // namespace flashcute

// Argument validation: every check runs before anything is launched, and a failure names the
// argument. What can be checked without a GPU is checked first, so CPU-only tests cover it.
#pragma once

#include "flashcute/attention.hpp"
#include "kernels/common/backward_params.hpp"
#include "kernels/common/decode_params.hpp"
#include "kernels/common/params.hpp"

namespace flashcute {

// Shapes, dtype, strides, alignment, scale and options; fills params on success.
Status validate_arguments(const ForwardArgs& args, AttentionParams& params);

// The backward's arguments: the forward problem they describe by the forward's rules, then the
// gradient tensors and options; fills params except the workspace pointers.
Status validate_backward_arguments(const BackwardArgs& args, BackwardParams& params);

// A KV-cache call's arguments: shapes, dtype, strides, the cache layout and options; fills params
// except the split count and the workspace pointers.
Status validate_kvcache_arguments(const KvcacheArgs& args, DecodeParams& params);

// Slots one sequence's cache can hold: seqlen_cache when dense, pages_per_sequence * page_size when
// paged (for validated arguments).
int64_t kvcache_capacity(const KvcacheArgs& args);

// The device that holds all tensors (the error names a tensor that lives elsewhere or on the host).
Status find_tensor_device(const ForwardArgs& args, int& device);
Status find_tensor_device(const BackwardArgs& args, int& device);
Status find_tensor_device(const KvcacheArgs& args, int& device);

}  // namespace flashcute

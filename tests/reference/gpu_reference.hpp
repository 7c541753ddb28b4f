// GPU fp32 attention forward in plain CUDA: one warp per query row, online softmax. It reads the
// same fp16/bf16 tensors the kernels read, so it can check problems too large for the CPU
// reference.
#pragma once

#include <cuda_runtime.h>

#include "flashcute/flashcute.h"
#include "reference/problem.hpp"

namespace flashcute {
namespace ref {

// A device tensor of fp16 or bf16 with the given strides.
struct DeviceTensor {
  const void* data;
  Layout layout;
};

// Writes fp32 O (problem.o_elements()) and, when lse is not null, the LSE (problem.lse_elements()),
// both device buffers in the canonical layout. Runs on the current device and synchronizes.
cudaError_t gpu_reference(const Problem& problem, fc_dtype dtype, DeviceTensor q, DeviceTensor k,
                          DeviceTensor v, float* o, float* lse);

}  // namespace ref
}  // namespace flashcute

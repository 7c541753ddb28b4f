// Lets a kernel launch with more than 48 KB of dynamic shared memory, set once per device (the
// SM80 family's forward and backward kernels alike).
#pragma once

#include <cuda_runtime.h>

#include "kernels/device_attributes.hpp"

namespace flashcute::sm80 {

// Tag: one type per kernel (kernels of one signature share their pointer type). The caller made
// the tensors' device current.
template <class Tag, class Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return configure_once_per_device<Tag>(device, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  });
}

}  // namespace flashcute::sm80

// Lets a kernel launch with more than 48 KB of dynamic shared memory, set once per device (the
// SM80 family's forward and backward kernels alike).
#pragma once

#include <cuda_runtime.h>

#include "kernels/device_attributes.hpp"

namespace flashcute::sm80 {

// Tag: one type per kernel (kernels of one signature share their pointer type). `device` is the
// current device, which the caller made the tensors' device.
template <class Tag, class Kernel>
cudaError_t allow_dynamic_smem(int device, Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return configure_once_per_device<Tag>(device, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  });
}

// The same, for a launch that needs the current device for nothing else.
template <class Tag, class Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int device = 0;
  cudaError_t const err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return allow_dynamic_smem<Tag>(device, kernel, bytes);
}

}  // namespace flashcute::sm80

// Programmatic dependent launch (sm_90+): a dependent grid launched with programmatic stream
// serialization may start while the grid before it runs, and waits for that grid's memory before
// reading it, so its launch latency hides behind the running grid. No-ops on older devices,
// where the launch attribute is not set.
#pragma once

#include <cuda_runtime.h>
#include <cute/config.hpp>

namespace flashcute {

// The running grid lets its dependent grid launch.
CUTE_DEVICE void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// The dependent grid waits until the grid before it has completed and its writes are visible.
CUTE_DEVICE void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Host: launches kernel(args...) on `stream`; with `early` (sm_90+ only) it may start while the
// grid before it runs, and must wait_for_prior_grid before it reads that grid's writes.
template <class... Params, class... Args>
cudaError_t launch_dependent(bool early, void (*kernel)(Params...), dim3 grid, dim3 block,
                             size_t smem_bytes, cudaStream_t stream, Args const&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = early ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace flashcute

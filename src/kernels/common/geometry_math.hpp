// Integer helpers of the shared geometry, callable from host and device alike.
#pragma once

#include <cute/config.hpp>

namespace flashcute {

// CUDA's integer min/max on the device (one IMNMX each; cute::min compiles to other code), plain
// comparisons on the host.
CUTE_HOST_DEVICE int geometry_min(int a, int b) {
#if defined(__CUDA_ARCH__)
  return ::min(a, b);
#else
  return a < b ? a : b;
#endif
}
CUTE_HOST_DEVICE int geometry_max(int a, int b) {
#if defined(__CUDA_ARCH__)
  return ::max(a, b);
#else
  return a > b ? a : b;
#endif
}

// ceil(a / b) for a >= 0, b > 0.
CUTE_HOST_DEVICE constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace flashcute

// Programmatic dependent launch (sm_90+): a dependent grid launched with programmatic stream
// serialization may start while the grid before it runs, and waits for that grid's memory before
// reading it, so its launch latency hides behind the running grid. No-ops on older devices,
// where the launch attribute is not set.
#pragma once

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

}  // namespace flashcute

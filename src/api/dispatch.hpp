// Picks the kernel for a validated problem: the family (Hopper first on sm_90 when it supports
// the problem, else SM80), the head_dim bucket, and the tile (the automatic choice or the
// user's, which must be compiled in and fit the device's shared memory).
#pragma once

#include <vector>

#include "flashcute/attention.hpp"
#include "kernels/kernel_registry.hpp"

namespace flashcute {

struct DeviceLimits {
  int compute_capability;     // major * 10 + minor
  size_t max_smem_per_block;  // the opt-in limit
};

Status select_kernel(const ForwardArgs& args, const AttentionParams& params,
                     const DeviceLimits& device, const KernelEntry*& selected);

// The tile the automatic choice takes for (family, dtype, head_dim), or false when none is
// compiled.
bool default_tile_for(fc_kernel_family family, fc_dtype dtype, int head_dim, fc_tile_config& tile);

std::vector<const KernelEntry*> entries_for(fc_kernel_family family, fc_dtype dtype, int head_dim);

}  // namespace flashcute

// Picks the kernel for a validated problem: the family (Hopper first on sm_90 when it supports
// the problem, else SM80), the head_dim bucket, and the tile: the user's, which must be compiled
// in and fit the device's shared memory, or the automatic choice, which falls back to a smaller
// compiled tile on devices with less shared memory (sm_86, sm_89: 99 KB).
#pragma once

#include <vector>

#include "flashcute/attention.hpp"
#include "kernels/kernel_registry.hpp"

namespace flashcute {

struct DeviceLimits {
  int compute_capability;     // major * 10 + minor
  size_t max_smem_per_block;  // the opt-in limit
  int sm_count;
};

// Every kernel family needs compute capability 8.0 or newer: an error naming the device's
// otherwise.
Status require_sm80(const DeviceLimits& device);

// The families a call tries, in order: AUTO takes sm90 first on a compute capability 9.0 device,
// then SM80; a forced family is tried alone (sm90 refused elsewhere). Shared by the forward and
// backward entries.
Status candidate_families(int requested, const DeviceLimits& device,
                          std::vector<fc_kernel_family>& families);
const char* family_name(fc_kernel_family family);  // "sm80" or "sm90"

// The entry an automatic tile choice runs among the compiled entries of one (family, dtype,
// head_dim bucket): the automatic entry when its shared memory fits the device, else the fitting
// entry with the most work per CTA (m_block * n_block), then the most threads, then the most
// rows; null when none fits.
const KernelEntry* choose_automatic_entry(const std::vector<const KernelEntry*>& entries,
                                          const DeviceLimits& device);

Status select_kernel(const ForwardArgs& args, const AttentionParams& params,
                     const DeviceLimits& device, const KernelEntry*& selected);

// The tile the automatic choice takes for (family, dtype, head_dim), or false when none is
// compiled.
bool default_tile_for(fc_kernel_family family, fc_dtype dtype, int head_dim, fc_tile_config& tile);

std::vector<const KernelEntry*> entries_for(fc_kernel_family family, fc_dtype dtype, int head_dim);

}  // namespace flashcute

// The table of compiled kernels. Each kernel family adds its instantiations (one entry per dtype,
// padded head_dim and tile configuration); dispatch picks from the table, so there is no nest of
// boolean-switch macros and a pruned build simply has fewer rows.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "flashcute/flashcute.h"
#include "kernels/common/params.hpp"

namespace flashcute {

using LaunchFn = cudaError_t (*)(const AttentionParams& params, cudaStream_t stream);
// Features a family may lack (variable length, windows, ALiBi, ...): false sends dispatch
// elsewhere.
using SupportsFn = bool (*)(const AttentionParams& params);

struct KernelEntry {
  fc_kernel_family family;
  fc_dtype dtype;
  int head_dim;  // the padded head_dim it is built for; a problem runs on the smallest >= d
  fc_tile_config tile;
  size_t smem_bytes;           // dynamic shared memory per block
  int min_compute_capability;  // 80 for the SM80 family, 90 for Hopper
  LaunchFn launch;
  SupportsFn supports;  // null = supports everything
  // What runs when the caller left the tile to the library (null: launch). It may hand some
  // problems to another compiled tile of the same bucket (sm90 config.hpp); an explicit tile
  // request always runs exactly that tile.
  LaunchFn auto_launch = nullptr;
};

using KernelTable = std::vector<KernelEntry>;

// Each family appends its compiled entries (defined next to the family's instantiations).
void register_sm80_kernels(KernelTable& table);
void register_sm90_kernels(KernelTable& table);

// All compiled kernels, built once, thread-safe.
const KernelTable& kernel_table();

}  // namespace flashcute

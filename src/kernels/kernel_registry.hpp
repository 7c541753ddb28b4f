// The table of compiled kernels, shared by the kernel families (which add their instantiations)
// and dispatch (which picks from it): one entry per dtype, padded head_dim and tile
// configuration, so there is no nest of boolean-switch macros and a pruned build simply has
// fewer rows.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "flashcute/flashcute.h"
#include "kernels/backward/workspace.hpp"
#include "kernels/common/backward_params.hpp"
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
  size_t smem_bytes;  // dynamic shared memory per block
  LaunchFn launch;
  SupportsFn supports;  // null = supports everything
  // The entry the automatic choice takes for its (family, dtype, head_dim), set by the family.
  bool automatic = false;
  // What runs when the caller left the tile to the library (null: launch). It may hand some
  // problems to another compiled tile of the same bucket; an explicit tile request always runs
  // exactly that tile.
  LaunchFn auto_launch = nullptr;
};

using KernelTable = std::vector<KernelEntry>;

// The backward pass of one (family, dtype, head_dim bucket): its launch runs every kernel of the
// pass, in order, on one stream.
using BackwardLaunchFn = cudaError_t (*)(const BackwardParams& params, cudaStream_t stream);
using BackwardSupportsFn = bool (*)(const BackwardParams& params);

struct BackwardKernelEntry {
  fc_kernel_family family;
  fc_dtype dtype;
  int head_dim;       // the padded head_dim it is built for; a problem runs on the smallest >= d
  size_t smem_bytes;  // the most dynamic shared memory any of its kernels takes
  BackwardLaunchFn launch;
  BackwardSupportsFn supports;  // null = supports everything
};

using BackwardKernelTable = std::vector<BackwardKernelEntry>;

// A family's backward for dtype and head_dim: its smallest compiled head dim that holds head_dim
// (null if none).
inline const BackwardKernelEntry* smallest_backward_entry(const BackwardKernelTable& table,
                                                          fc_kernel_family family, fc_dtype dtype,
                                                          int head_dim) {
  const BackwardKernelEntry* match = nullptr;
  for (const BackwardKernelEntry& e : table) {
    if (e.family == family && e.dtype == dtype && e.head_dim >= head_dim &&
        (match == nullptr || e.head_dim < match->head_dim)) {
      match = &e;
    }
  }
  return match;
}

// The width of dQ's accumulator blocks in the backward's workspace: the widest of the head dims
// the families would run for this dtype and head_dim (a build may leave some out,
// FLASHCUTE_*_BACKWARD_HEAD_DIMS), so that the size query and the launch carve the same layout
// whichever family runs, and a kernel's blocks, as wide as its own head dim, fit in it. No
// compiled kernel holds head_dim: the bucket, and the launch refuses the call.
inline int backward_accum_width(const BackwardKernelTable& table, fc_dtype dtype, int head_dim) {
  int width = 0;
  for (fc_kernel_family family : {FC_FAMILY_SM80, FC_FAMILY_SM90}) {
    if (const BackwardKernelEntry* e = smallest_backward_entry(table, family, dtype, head_dim)) {
      width = std::max(width, e->head_dim);
    }
  }
  return width > 0 ? width : int(backward_bucket(head_dim));
}

template <class Element>
constexpr fc_dtype dtype_of() {
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                std::is_same_v<Element, cutlass::bfloat16_t>);
  return std::is_same_v<Element, cutlass::half_t> ? FC_FLOAT16 : FC_BFLOAT16;
}

// Each family appends its compiled entries (defined next to the family's instantiations).
void register_sm80_kernels(KernelTable& table);
void register_sm90_kernels(KernelTable& table);
void register_sm80_backward_kernels(BackwardKernelTable& table);
void register_sm90_backward_kernels(BackwardKernelTable& table);

// All compiled kernels, built once, thread-safe.
const KernelTable& kernel_table();
const BackwardKernelTable& backward_kernel_table();

}  // namespace flashcute

// The compiled decode paths, one per (family, dtype, head_dim bucket): the launch runs the append
// kernel (when there are new tokens or rotary), attention over the cache, and the split combine.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "flashcute/flashcute.h"
#include "kernels/common/decode_params.hpp"

namespace flashcute {

using DecodeLaunchFn = cudaError_t (*)(const DecodeParams& params, cudaStream_t stream);

struct DecodeKernelEntry {
  fc_kernel_family family;
  fc_dtype dtype;
  int head_dim;        // the padded head_dim it is built for; a problem runs on the smallest >= d
  size_t smem_bytes;   // dynamic shared memory of the attention kernel
  int rows_per_block;  // packed query rows of one block
  int keys_per_round;  // keys a block consumes per round (the unit of a split)
  DecodeLaunchFn launch;
};

using DecodeKernelTable = std::vector<DecodeKernelEntry>;

void register_sm80_decode_kernels(DecodeKernelTable& table);

// All compiled decode paths, built once, thread-safe.
const DecodeKernelTable& decode_kernel_table();

}  // namespace flashcute

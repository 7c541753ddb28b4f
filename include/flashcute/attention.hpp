// flashcute C++ API: the same call as the C API (flashcute.h) with C++ conveniences.
#pragma once

#include <string>
#include <vector>

#include "flashcute/flashcute.h"

namespace flashcute {

using ForwardArgs = fc_forward_args;
using TileConfig = fc_tile_config;

struct Status {
  fc_status code = FC_OK;
  std::string message;
  bool ok() const { return code == FC_OK; }
};

// Defaults: unbounded windows, automatic tile and family, bottom-right alignment, no LSE.
ForwardArgs default_forward_args();

// Validates every argument (the error names the bad one) and launches on args.stream. Works for
// tensors on any device, not only the current one, and from several host threads at once.
Status forward(const ForwardArgs& args);

using BackwardArgs = fc_backward_args;

// Defaults as fc_backward_args_init.
BackwardArgs default_backward_args();

// The workspace bytes backward(args) needs; validates args first.
Status backward_workspace_size(const BackwardArgs& args, uint64_t& bytes);

// Validates every argument (the error names the bad one), then launches on args.stream.
Status backward(const BackwardArgs& args);

using KvcacheArgs = fc_kvcache_args;

// Defaults as fc_kvcache_args_init.
KvcacheArgs default_kvcache_args();

// The workspace bytes kvcache(args) needs; validates args first.
Status kvcache_workspace_size(const KvcacheArgs& args, uint64_t& bytes);

// Validates every argument (the error names the bad one), appends the new keys and values to the
// cache, then runs attention over it on args.stream.
Status kvcache(const KvcacheArgs& args);

std::vector<TileConfig> compiled_tile_configs(fc_kernel_family family, fc_dtype dtype,
                                              int head_dim);

}  // namespace flashcute

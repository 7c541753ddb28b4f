// The public entry point: validate, find the tensors' device, pick a kernel, launch there.
#include <cuda_runtime.h>

#include "api/device.hpp"
#include "api/dispatch.hpp"
#include "api/validate.hpp"
#include "flashcute/attention.hpp"

namespace flashcute {

ForwardArgs default_forward_args() {
  ForwardArgs args;
  fc_forward_args_init(&args);
  return args;
}

Status forward(const ForwardArgs& args) {
  AttentionParams params;
  if (Status s = validate_arguments(args, params); !s.ok()) return s;
  if (args.batch == 0 || args.seqlen_q == 0 || args.heads == 0) return {};  // nothing to write

  int device = -1;
  if (Status s = find_tensor_device(args, device); !s.ok()) return s;
  DeviceLimits limits{};
  if (Status s = device_limits(device, limits); !s.ok()) return s;
  const KernelEntry* kernel = nullptr;
  if (Status s = select_kernel(args, params, limits, kernel); !s.ok()) return s;

  DeviceGuard guard(device);
  const bool auto_tile = args.tile.m_block == 0;
  const LaunchFn launch = auto_tile && kernel->auto_launch ? kernel->auto_launch : kernel->launch;
  const cudaError_t err = launch(params, static_cast<cudaStream_t>(args.stream));
  if (err != cudaSuccess) return cuda_error("launching the kernel", err);
  return {};
}

std::vector<TileConfig> compiled_tile_configs(fc_kernel_family family, fc_dtype dtype,
                                              int head_dim) {
  std::vector<TileConfig> out;
  for (const KernelEntry* e : entries_for(family, dtype, head_dim)) out.push_back(e->tile);
  return out;
}

}  // namespace flashcute

// The public entry point: validate, find the tensors' device, pick a kernel, launch there.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "api/dispatch.hpp"
#include "api/validate.hpp"
#include "flashcute/attention.hpp"
#include "kernels/device_attributes.hpp"

namespace flashcute {
namespace {

Status cuda_error(const char* what, cudaError_t err) {
  return {FC_ERROR_CUDA, std::string(what) + ": " + cudaGetErrorString(err)};
}

// Makes the tensors' device current for the launch and restores the caller's device after, so
// tensors on any device work without the caller switching devices.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int current = -1;
    cudaGetDevice(&current);
    if (current != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A device's compute capability and shared-memory limit, queried once per device.
Status device_limits(int device, DeviceLimits& limits) {
  static std::atomic<uint64_t> cached[kMaxCachedDevices] = {};  // cc << 32 | smem; 0: not yet
  bool const cacheable = device >= 0 && device < kMaxCachedDevices;
  if (cacheable) {
    uint64_t const packed = cached[device].load(std::memory_order_relaxed);
    if (packed != 0) {
      limits = {int(packed >> 32), size_t(uint32_t(packed))};
      return {};
    }
  }
  int major = 0, minor = 0, smem = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (err != cudaSuccess) return cuda_error("querying the device", err);
  limits = {major * 10 + minor, size_t(smem)};
  if (cacheable) {
    cached[device].store(uint64_t(limits.compute_capability) << 32 | uint32_t(smem),
                         std::memory_order_relaxed);
  }
  return {};
}

}  // namespace

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

#include "api/device.hpp"

#include <atomic>
#include <cstdint>
#include <string>

#include "kernels/device_attributes.hpp"

namespace flashcute {

Status cuda_error(const char* what, cudaError_t err) {
  return {FC_ERROR_CUDA, std::string(what) + ": " + cudaGetErrorString(err)};
}

DeviceGuard::DeviceGuard(int device) {
  cudaGetDevice(&previous_);
  if (previous_ != device) cudaSetDevice(device);
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  cudaGetDevice(&current);
  if (current != previous_) cudaSetDevice(previous_);
}

Status device_limits(int device, DeviceLimits& limits) {
  // cc << 48 | SMs << 32 | smem; 0: not yet
  static std::atomic<uint64_t> cached[kMaxCachedDevices] = {};
  bool const cacheable = device >= 0 && device < kMaxCachedDevices;
  if (cacheable) {
    uint64_t const packed = cached[device].load(std::memory_order_relaxed);
    if (packed != 0) {
      limits = {int(packed >> 48), size_t(uint32_t(packed)), int(packed >> 32 & 0xffff)};
      return {};
    }
  }
  int major = 0, minor = 0, smem = 0, sms = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return cuda_error("querying the device", err);
  limits = {major * 10 + minor, size_t(smem), sms};
  if (cacheable) {
    cached[device].store(
        uint64_t(limits.compute_capability) << 48 | uint64_t(uint16_t(sms)) << 32 | uint32_t(smem),
        std::memory_order_relaxed);
  }
  return {};
}

}  // namespace flashcute

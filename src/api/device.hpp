// What every entry point does around a launch: report CUDA errors, make the tensors' device
// current, and know the device's limits (queried once per device).
#pragma once

#include <cuda_runtime.h>

#include "api/dispatch.hpp"
#include "flashcute/attention.hpp"

namespace flashcute {

Status cuda_error(const char* what, cudaError_t err);

// Makes the tensors' device current for the launch and restores the caller's device after, so
// tensors on any device work without the caller switching devices.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A device's compute capability and shared-memory limit, queried once per device.
Status device_limits(int device, DeviceLimits& limits);

}  // namespace flashcute

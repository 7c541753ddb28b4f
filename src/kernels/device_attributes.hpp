// What launches need to know about a device or to tell the driver about a kernel, computed once:
// both are fixed for the life of the process, and each query costs a call into the CUDA runtime
// that a tiny problem's launch would otherwise pay every time.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace flashcute {

constexpr int kMaxCachedDevices = 64;

// A value fixed per (Tag, device), such as a device attribute or a kernel's occupancy:
// query(int&) runs once per device (again after a failure or a value <= 0).
template <class Tag, class Query>
cudaError_t cached_per_device(int device, int& value, Query query) {
  static std::atomic<int> cached[kMaxCachedDevices] = {};
  bool const cacheable = device >= 0 && device < kMaxCachedDevices;
  if (cacheable && (value = cached[device].load(std::memory_order_relaxed)) > 0) {
    return cudaSuccess;
  }
  cudaError_t const err = query(value);
  if (err == cudaSuccess && cacheable) cached[device].store(value, std::memory_order_relaxed);
  return err;
}

// A device attribute, queried once per device.
template <cudaDeviceAttr kAttribute>
cudaError_t cached_device_attribute(int device, int& value) {
  return cached_per_device<std::integral_constant<cudaDeviceAttr, kAttribute>>(
      device, value, [device](int& v) { return cudaDeviceGetAttribute(&v, kAttribute, device); });
}

inline cudaError_t multiprocessor_count(int device, int& count) {
  return cached_device_attribute<cudaDevAttrMultiProcessorCount>(device, count);
}

inline cudaError_t l2_cache_bytes(int device, int& bytes) {
  return cached_device_attribute<cudaDevAttrL2CacheSize>(device, bytes);
}

// Runs configure() (cudaFuncSetAttribute calls for one kernel) once per device; each Tag (the
// kernel's own type) has its own record. Two threads may both configure: the calls are idempotent.
template <class Tag, class Configure>
cudaError_t configure_once_per_device(int device, Configure configure) {
  static std::atomic<uint64_t> configured{0};
  bool const cacheable = device >= 0 && device < kMaxCachedDevices;
  uint64_t const bit = cacheable ? uint64_t(1) << device : 0;
  if (cacheable && (configured.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  cudaError_t const err = configure();
  if (err == cudaSuccess && cacheable) configured.fetch_or(bit, std::memory_order_release);
  return err;
}

}  // namespace flashcute

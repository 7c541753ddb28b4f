#include "kernels/sm90/tile_counters.hpp"

#include <cstdint>
#include <mutex>
#include <vector>

namespace flashcute::sm90 {
namespace {

// Pairs per device, allocated together the first time a device needs one; a process with more
// streams than this runs the static schedule on the rest.
constexpr int kPairsPerDevice = 4096;

struct StreamCounters {
  int device;
  unsigned long long stream_id;
  int* counters;
};

struct DeviceSlab {
  int device;
  int* pairs;
  int used;
};

std::mutex registry_mutex;
std::vector<StreamCounters> registry;  // guarded by registry_mutex
std::vector<DeviceSlab> slabs;         // guarded by registry_mutex

// A zeroed slab for `device`, or null. Runs once per device, under registry_mutex. The stream's
// capture mode is relaxed meanwhile, so that the allocation cannot disturb another thread's
// capture.
int* allocate_slab(cudaStream_t stream) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) return nullptr;
  size_t const bytes = size_t(kPairsPerDevice) * 2 * sizeof(int);
  void* pairs = nullptr;
  bool ok = cudaMalloc(&pairs, bytes) == cudaSuccess;
  // Zeroed before any stream of the device can see it: other streams are not ordered after this
  // one, so wait here.
  ok = ok && cudaMemsetAsync(pairs, 0, bytes, stream) == cudaSuccess &&
       cudaStreamSynchronize(stream) == cudaSuccess;
  if (!ok) {
    if (pairs != nullptr) cudaFree(pairs);
    cudaGetLastError();  // the kernel then runs its static schedule: not the launch's error
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  return ok ? static_cast<int*>(pairs) : nullptr;
}

int* find_or_add(int device, unsigned long long stream_id, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (StreamCounters const& entry : registry) {
    if (entry.device == device && entry.stream_id == stream_id) return entry.counters;
  }
  DeviceSlab* slab = nullptr;
  for (DeviceSlab& s : slabs) {
    if (s.device == device) slab = &s;
  }
  if (slab == nullptr) {
    int* pairs = allocate_slab(stream);
    if (pairs == nullptr) return nullptr;
    slabs.push_back(DeviceSlab{device, pairs, 0});
    slab = &slabs.back();
  }
  if (slab->used == kPairsPerDevice) return nullptr;
  int* counters = slab->pairs + 2 * slab->used++;
  registry.push_back(StreamCounters{device, stream_id, counters});
  return counters;
}

}  // namespace

int* stream_tile_counters(int device, cudaStream_t stream) {
  // Nothing but this query while the stream is captured: in the global capture mode another
  // call (even the stream's id) invalidates the capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();  // a failed query is not the launch's error
    return nullptr;
  }
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  unsigned long long stream_id = 0;
  if (cudaStreamGetId(stream, &stream_id) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  // The last stream this thread used: a repeated call skips the lock.
  thread_local StreamCounters last{-1, 0, nullptr};
  if (last.device == device && last.stream_id == stream_id && last.counters != nullptr) {
    return last.counters;
  }
  int* counters = find_or_add(device, stream_id, stream);
  if (counters != nullptr) last = StreamCounters{device, stream_id, counters};
  return counters;
}

}  // namespace flashcute::sm90

#include "kernels/sm90/tile_counters.hpp"

#include <cuda.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace flashcute::sm90 {
namespace {

// Pairs per context, allocated together the first time a context needs one; a process with more
// streams than this runs the static schedule on the rest.
constexpr int kPairsPerContext = 4096;

struct StreamCounters {
  unsigned long long context_id, stream_id;
  int* counters;
};

struct ContextSlab {
  unsigned long long context_id;
  int* pairs;
  int used;
};

std::mutex registry_mutex;
std::vector<StreamCounters> registry;  // guarded by registry_mutex
std::vector<ContextSlab> slabs;        // guarded by registry_mutex

// The current context's unique id, or 0. Counters are kept per context, not per device: after
// cudaDeviceReset the device's new primary context has a new id, where the device number would
// hand out memory freed with the old one.
unsigned long long current_context_id() {
  using GetCurrent = CUresult (*)(CUcontext*);
  using GetId = CUresult (*)(CUcontext, unsigned long long*);
  struct EntryPoints {
    GetCurrent get_current = nullptr;
    GetId get_id = nullptr;
  };
  // The driver's functions through the runtime (the library links no libcuda), resolved once.
  static EntryPoints const driver = [] {
    EntryPoints e;
    void* current = nullptr;
    void* id = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &current, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxGetId", &id, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      e.get_current = reinterpret_cast<GetCurrent>(current);
      e.get_id = reinterpret_cast<GetId>(id);
    } else {
      cudaGetLastError();  // the kernels then run their static schedule
    }
    return e;
  }();
  CUcontext context = nullptr;
  unsigned long long id = 0;
  if (driver.get_current == nullptr || driver.get_current(&context) != CUDA_SUCCESS ||
      context == nullptr || driver.get_id(context, &id) != CUDA_SUCCESS) {
    return 0;
  }
  return id;
}

// A zeroed slab in the current context, or null. Runs once per context, under registry_mutex.
// The thread's capture mode is relaxed meanwhile, so that the allocation cannot disturb another
// thread's capture.
int* allocate_slab(cudaStream_t stream) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) return nullptr;
  size_t const bytes = size_t(kPairsPerContext) * 2 * sizeof(int);
  void* pairs = nullptr;
  bool ok = cudaMalloc(&pairs, bytes) == cudaSuccess;
  // Zeroed before any stream can see it: other streams are not ordered after this one, so wait.
  ok = ok && cudaMemsetAsync(pairs, 0, bytes, stream) == cudaSuccess &&
       cudaStreamSynchronize(stream) == cudaSuccess;
  if (!ok) {
    if (pairs != nullptr) cudaFree(pairs);
    cudaGetLastError();  // the kernel then runs its static schedule: not the launch's error
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  return ok ? static_cast<int*>(pairs) : nullptr;
}

int* find_or_add(unsigned long long context_id, unsigned long long stream_id, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (StreamCounters const& entry : registry) {
    if (entry.context_id == context_id && entry.stream_id == stream_id) return entry.counters;
  }
  ContextSlab* slab = nullptr;
  for (ContextSlab& s : slabs) {
    if (s.context_id == context_id) slab = &s;
  }
  if (slab == nullptr) {
    int* pairs = allocate_slab(stream);
    if (pairs == nullptr) return nullptr;
    slabs.push_back(ContextSlab{context_id, pairs, 0});
    slab = &slabs.back();
  }
  if (slab->used == kPairsPerContext) return nullptr;
  int* counters = slab->pairs + 2 * slab->used++;
  registry.push_back(StreamCounters{context_id, stream_id, counters});
  return counters;
}

}  // namespace

int* stream_tile_counters(cudaStream_t stream) {
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
  unsigned long long const context_id = current_context_id();
  if (context_id == 0) return nullptr;
  // The last stream this thread used: a repeated call skips the lock.
  thread_local StreamCounters last{0, 0, nullptr};
  if (last.context_id == context_id && last.stream_id == stream_id && last.counters != nullptr) {
    return last.counters;
  }
  int* counters = find_or_add(context_id, stream_id, stream);
  if (counters != nullptr) last = StreamCounters{context_id, stream_id, counters};
  return counters;
}

}  // namespace flashcute::sm90

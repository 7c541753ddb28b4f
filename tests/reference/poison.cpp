#include "reference/poison.hpp"

namespace flashcute {
namespace ref {

cudaError_t poison_device(void* data, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  cudaError_t e = cudaMemset(data, 0xFF, bytes);
  return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

}  // namespace ref
}  // namespace flashcute

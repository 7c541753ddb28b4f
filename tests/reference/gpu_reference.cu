#include "reference/gpu_reference.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/semantics.hpp"

namespace flashcute {
namespace ref {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256 split over 32 lanes

struct KernelArgs {
  const void* q;
  const void* k;
  const void* v;
  Layout q_layout, k_layout, v_layout;
  float* o;
  float* lse;
  int batch, seqlen_q, seqlen_k, heads, heads_k, head_dim;
  const int32_t* cu_seqlens_q;  // device, or null when dense
  const int32_t* cu_seqlens_k;
  float scale, softcap;
  bool causal, bottom_right;
  int64_t window_left, window_right;
  const float* alibi_slopes;  // device, or null
  int64_t alibi_batch_stride;
};

__device__ float to_float(__half x) { return __half2float(x); }
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Row `token` of head h: packed tokens when variable length, else batch b's row.
template <typename T>
__device__ const T* row_of(const void* base, const Layout& layout, bool varlen, int b,
                           int64_t token, int h) {
  const int64_t batch_offset = varlen ? 0 : int64_t{b} * layout.batch_stride;
  return static_cast<const T*>(base) + batch_offset + token * layout.seq_stride +
         int64_t{h} * layout.head_stride;
}

__device__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Lane l owns dimensions l, l + 32, ...: loads of a row are coalesced across the warp, and the
// dot product is the warp-wide sum of each lane's partial.
template <typename T>
__global__ void reference_kernel(KernelArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t i = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int h = blockIdx.y, b = blockIdx.z;
  const bool varlen = a.cu_seqlens_q != nullptr;
  const int64_t q0 = varlen ? a.cu_seqlens_q[b] : 0;
  const int64_t k0 = varlen ? a.cu_seqlens_k[b] : 0;
  const int64_t sq = varlen ? a.cu_seqlens_q[b + 1] - q0 : a.seqlen_q;
  const int64_t sk = varlen ? a.cu_seqlens_k[b + 1] - k0 : a.seqlen_k;
  if (i >= sq) return;
  const int hk = h / (a.heads / a.heads_k);
  const int64_t diag = diagonal(sq, sk, a.bottom_right);
  const float slope = a.alibi_slopes ? a.alibi_slopes[b * a.alibi_batch_stride + h] : 0.0f;

  const T* q_row = row_of<T>(a.q, a.q_layout, varlen, b, q0 + i, h);
  float q[kMaxDimsPerLane], acc[kMaxDimsPerLane];
  for (int t = 0; t < kMaxDimsPerLane; ++t) {
    const int d = lane + 32 * t;
    q[t] = d < a.head_dim ? to_float(q_row[d]) : 0.0f;
    acc[t] = 0.0f;
  }

  const KeyRange keys = visible_keys(i, sk, diag, a.causal, a.window_left, a.window_right);
  float row_max = -INFINITY, row_sum = 0.0f;
  for (int64_t j = keys.lo; j <= keys.hi; ++j) {
    const T* k_row = row_of<T>(a.k, a.k_layout, varlen, b, k0 + j, hk);
    float partial = 0.0f;
    for (int t = 0; t < kMaxDimsPerLane; ++t) {
      const int d = lane + 32 * t;
      if (d < a.head_dim) partial += q[t] * to_float(k_row[d]);
    }
    const float s = modified_score<float>(warp_sum(partial), a.scale, a.softcap, slope, i, j, diag);
    const float new_max = fmaxf(row_max, s);
    const float rescale = expf(row_max - new_max);  // 0 on the first key (row_max = -inf)
    const float p = expf(s - new_max);
    row_sum = row_sum * rescale + p;
    const T* v_row = row_of<T>(a.v, a.v_layout, varlen, b, k0 + j, hk);
    for (int t = 0; t < kMaxDimsPerLane; ++t) {
      const int d = lane + 32 * t;
      if (d < a.head_dim) acc[t] = acc[t] * rescale + p * to_float(v_row[d]);
    }
    row_max = new_max;
  }

  // A row that sees no key: O = 0 and LSE = +inf.
  const bool empty = keys.lo > keys.hi;
  const int64_t row = varlen ? q0 + i : int64_t{b} * a.seqlen_q + i;
  float* o_row = a.o + (row * a.heads + h) * a.head_dim;
  for (int t = 0; t < kMaxDimsPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < a.head_dim) o_row[d] = empty ? 0.0f : acc[t] / row_sum;
  }
  if (a.lse != nullptr && lane == 0) {
    const int64_t index = varlen ? int64_t{h} * a.cu_seqlens_q[a.batch] + q0 + i
                                 : (int64_t{b} * a.heads + h) * a.seqlen_q + i;
    a.lse[index] = empty ? INFINITY : row_max + logf(row_sum);
  }
}

// A device copy of a small host array, freed on scope exit.
template <typename T>
class DeviceCopy {
 public:
  DeviceCopy(const std::vector<T>& host) {
    if (host.empty()) return;
    status_ = cudaMalloc(&ptr_, host.size() * sizeof(T));
    if (status_ == cudaSuccess)
      status_ = cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceCopy() { cudaFree(ptr_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  const T* get() const { return ptr_; }
  cudaError_t status() const { return status_; }

 private:
  T* ptr_ = nullptr;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace

cudaError_t gpu_reference(const Problem& p, fc_dtype dtype, DeviceTensor q, DeviceTensor k,
                          DeviceTensor v, float* o, float* lse) {
  if (p.head_dim > 32 * kMaxDimsPerLane || p.heads_k <= 0 || p.heads % p.heads_k != 0)
    return cudaErrorInvalidValue;
  DeviceCopy<int32_t> cu_q(p.cu_seqlens_q), cu_k(p.cu_seqlens_k);
  DeviceCopy<float> slopes(p.alibi_slopes);
  for (cudaError_t e : {cu_q.status(), cu_k.status(), slopes.status()})
    if (e != cudaSuccess) return e;

  int max_sq = 0;
  for (int b = 0; b < p.batch; ++b) max_sq = std::max(max_sq, p.seq_q(b));
  if (max_sq == 0 || p.heads == 0) return cudaSuccess;

  KernelArgs a{q.data,
               k.data,
               v.data,
               q.layout,
               k.layout,
               v.layout,
               o,
               lse,
               p.batch,
               p.seqlen_q,
               p.seqlen_k,
               p.heads,
               p.heads_k,
               p.head_dim,
               cu_q.get(),
               cu_k.get(),
               p.softmax_scale,
               p.softcap,
               p.causal,
               p.bottom_right,
               p.window_left,
               p.window_right,
               slopes.get(),
               p.alibi_batch_stride};
  const dim3 grid((max_sq + kWarpsPerBlock - 1) / kWarpsPerBlock, p.heads, p.batch);
  const dim3 block(32 * kWarpsPerBlock);
  if (dtype == FC_FLOAT16)
    reference_kernel<__half><<<grid, block>>>(a);
  else
    reference_kernel<__nv_bfloat16><<<grid, block>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e;
}

}  // namespace ref
}  // namespace flashcute

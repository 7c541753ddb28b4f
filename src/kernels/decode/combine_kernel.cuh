// Merges the key splits of a decode call: each output row is the splits' outputs weighted by
// exp2(lse_split - lse_max), over their sum. One block per (query token, head) row: the weights go
// through shared memory, and the warps take the splits in turn so that every split's loads are in
// flight at once (a per-row loop over the splits would wait on each load in turn). On sm_90 the
// kernel launches while attention still runs and waits for it (dependent_launch.hpp).
#pragma once

#include <cuda_runtime.h>
#include <cutlass/array.h>
#include <cute/config.hpp>

#include "kernels/common/decode_params.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/common/online_softmax.hpp"

namespace flashcute::decode {

constexpr int kCombineWarps = 4;
constexpr int kCombineMaxSplits = 128;           // FC_KVCACHE_MAX_SPLITS
constexpr int kCombineMaxChunks = 256 / 4 / 32;  // float4 chunks per lane at head_dim 256

template <class Element>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const DecodeParams p) {
  __shared__ float weights[kCombineMaxSplits];
  __shared__ float4 partial[kCombineWarps][32 * kCombineMaxChunks];
  __shared__ float reduce[kCombineWarps];
  wait_for_prior_grid();
  const int64_t total_rows = p.total_q * p.heads;
  const int64_t row = blockIdx.x;
  // Packed rows past the last sequence belong to none: no split wrote them.
  if (p.cu_seqlens_q != nullptr && row / p.heads >= p.cu_seqlens_q[p.batch]) return;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int tid = int(threadIdx.x);
  const float* const lse = p.lse_partial + row;

  // The row's largest split log-sum-exp, then each split's weight; a split whose keys the row
  // never saw has -inf and weighs 0. A row that saw no key at all ends with output 0 and
  // log-sum-exp +inf.
  const float own = tid < p.num_splits ? lse[tid * total_rows] : -INFINITY;
  float m = own;
  for (int offset = 16; offset > 0; offset /= 2) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, offset));
  }
  if (lane == 0) reduce[warp] = m;
  __syncthreads();
  float lse_max = reduce[0];
  for (int w = 1; w < kCombineWarps; ++w) lse_max = fmaxf(lse_max, reduce[w]);
  const float weight = own == -INFINITY ? 0.f : fast_exp2(own - lse_max);
  if (tid < p.num_splits) weights[tid] = weight;
  float sum = weight;
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  __syncthreads();  // every warp has read reduce[] for the maximum
  if (lane == 0) reduce[warp] = sum;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kCombineWarps; ++w) total += reduce[w];
  const float inv_total = total > 0.f ? 1.f / total : 0.f;

  // Warp w sums splits w, w + kCombineWarps, ...; lane l holds float4 chunks l, l + 32, ...
  const int chunks = p.head_dim / 4;
  float4 acc[kCombineMaxChunks];
  for (int c = 0; c < kCombineMaxChunks; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int s = warp; s < p.num_splits; s += kCombineWarps) {
    const float w = weights[s];
    const float4* o =
        reinterpret_cast<const float4*>(p.o_partial + (s * total_rows + row) * p.head_dim);
#pragma unroll
    for (int c = 0; c < kCombineMaxChunks; ++c) {
      if (lane + 32 * c < chunks) {
        const float4 v = o[lane + 32 * c];
        acc[c].x += w * v.x;
        acc[c].y += w * v.y;
        acc[c].z += w * v.z;
        acc[c].w += w * v.w;
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kCombineMaxChunks; ++c) partial[warp][lane + 32 * c] = acc[c];
  __syncthreads();

  const int64_t token = row / p.heads;
  const int head = int(row % p.heads);
  int64_t batch = 0, token_in_batch = token;
  if (p.cu_seqlens_q == nullptr) {
    batch = token / p.seqlen_q;
    token_in_batch = token % p.seqlen_q;
  }
  Element* const out = static_cast<Element*>(p.o) + batch * p.o_batch_stride +
                       token_in_batch * p.o_row_stride + head * p.o_head_stride;
  for (int c = tid; c < chunks; c += kCombineWarps * 32) {
    float4 v = partial[0][c];
    for (int w = 1; w < kCombineWarps; ++w) {
      v.x += partial[w][c].x;
      v.y += partial[w][c].y;
      v.z += partial[w][c].z;
      v.w += partial[w][c].w;
    }
    cutlass::Array<Element, 4> chunk;
    chunk[0] = Element(v.x * inv_total);
    chunk[1] = Element(v.y * inv_total);
    chunk[2] = Element(v.z * inv_total);
    chunk[3] = Element(v.w * inv_total);
    *reinterpret_cast<cutlass::Array<Element, 4>*>(out + 4 * c) = chunk;
  }
  if (p.lse != nullptr && tid == 0) {
    p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + token_in_batch] =
        total > 0.f ? (lse_max + __log2f(total)) * kLn2 : INFINITY;
  }
}

// Launches the combine on `stream` after the attention grid; with p.dependent_launch (sm_90+)
// it may start early and wait for that grid.
template <class Element>
cudaError_t launch_combine(const DecodeParams& p, cudaStream_t stream) {
  return launch_dependent(p.dependent_launch, combine_kernel<Element>,
                          dim3(unsigned(p.total_q * p.heads)), dim3(kCombineWarps * 32), 0, stream,
                          p);
}

}  // namespace flashcute::decode

// Merges the key splits of a decode call: each output row is the splits' outputs weighted by
// exp2(lse_split - lse_max), over their sum; one warp per (query token, head) row.
#pragma once

#include <cutlass/array.h>
#include <cute/config.hpp>

#include "kernels/common/decode_params.hpp"
#include "kernels/common/online_softmax.hpp"

namespace flashcute::decode {

constexpr int kCombineWarps = 4;

inline dim3 combine_grid(const DecodeParams& p) {
  const int64_t rows = p.total_q * p.heads;
  return dim3(unsigned((rows + kCombineWarps - 1) / kCombineWarps));
}

CUTE_DEVICE float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
  }
  return x;
}

CUTE_DEVICE float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  return x;
}

template <class Element>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const DecodeParams p) {
  const int64_t total_rows = p.total_q * p.heads;
  const int64_t row = int64_t(blockIdx.x) * kCombineWarps + threadIdx.x / 32;
  if (row >= total_rows) return;
  // Packed rows past the last sequence belong to none: no split wrote them.
  if (p.cu_seqlens_q != nullptr && row / p.heads >= p.cu_seqlens_q[p.batch]) return;
  const int lane = int(threadIdx.x) % 32;
  const float* const lse = p.lse_partial + row;

  float lse_max = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) lse_max = fmaxf(lse_max, lse[s * total_rows]);
  lse_max = warp_max(lse_max);
  // A split whose keys the row never saw has -inf: weight 0. A row that saw no key at all
  // ends with output 0 and log-sum-exp +inf.
  const auto weight_of = [&](int s) {
    const float l = lse[s * total_rows];
    return l == -INFINITY ? 0.f : fast_exp2(l - lse_max);
  };
  float total = 0.f;
  for (int s = lane; s < p.num_splits; s += 32) total += weight_of(s);
  total = warp_sum(total);
  const float inv_total = total > 0.f ? 1.f / total : 0.f;

  const int64_t token = row / p.heads;
  const int head = int(row % p.heads);
  int64_t batch = 0, token_in_batch = token;
  if (p.cu_seqlens_q == nullptr) {
    batch = token / p.seqlen_q;
    token_in_batch = token % p.seqlen_q;
  }
  Element* const out = static_cast<Element*>(p.o) + batch * p.o_batch_stride +
                       token_in_batch * p.o_row_stride + head * p.o_head_stride;
  for (int col = lane * 4; col < p.head_dim; col += 32 * 4) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = weight_of(s);
      const float4 o =
          *reinterpret_cast<const float4*>(p.o_partial + (s * total_rows + row) * p.head_dim + col);
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
    cutlass::Array<Element, 4> chunk;
    chunk[0] = Element(acc.x * inv_total);
    chunk[1] = Element(acc.y * inv_total);
    chunk[2] = Element(acc.z * inv_total);
    chunk[3] = Element(acc.w * inv_total);
    *reinterpret_cast<cutlass::Array<Element, 4>*>(out + col) = chunk;
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + token_in_batch] =
        total > 0.f ? (lse_max + __log2f(total)) * kLn2 : INFINITY;
  }
}

}  // namespace flashcute::decode

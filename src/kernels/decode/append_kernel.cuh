// Before attention over a KV cache: the new keys (rotated) and values are written into their
// cache slots, and q is rotated into q_rotated. One warp per row of head_dim elements; rotary
// math in fp32, rounded once to the storage type.
#pragma once

#include <cute/config.hpp>

#include "kernels/common/decode_params.hpp"
#include "kernels/common/kv_cache.hpp"

namespace flashcute::decode {

constexpr int kAppendWarps = 4;

// Rows: new keys, then new values (batch * seqlen_new * heads_k each), then, with rotary, the
// query rows (batch * seqlen_q * heads).
inline int64_t append_rows(const DecodeParams& p) {
  const int64_t kv = p.k_new != nullptr ? int64_t(p.batch) * p.seqlen_new * p.heads_k : 0;
  const int64_t q = p.rotary_dim > 0 ? int64_t(p.batch) * p.seqlen_q * p.heads : 0;
  return 2 * kv + q;
}

// Rotary embedding of one row: columns below rotary_dim rotate in pairs, (2j, 2j + 1) when
// interleaved, else (j, j + rotary_dim / 2), by the angle whose cosine and sine are cos[j], sin[j];
// the rest are copied.
template <class Element>
CUTE_DEVICE void rotate_row(const Element* src, Element* dst, const Element* cos,
                            const Element* sin, int head_dim, int rotary_dim, bool interleaved,
                            int lane) {
  const int half = rotary_dim / 2;
  for (int col = lane; col < head_dim; col += 32) {
    const float x = float(src[col]);
    float y = x;
    if (col < rotary_dim) {
      const int j = interleaved ? col / 2 : col % half;
      const bool first = interleaved ? col % 2 == 0 : col < half;
      const int partner =
          interleaved ? (first ? col + 1 : col - 1) : (first ? col + half : col - half);
      const float c = float(cos[j]), s = float(sin[j]);
      const float other = float(src[partner]);
      y = first ? x * c - other * s : x * c + other * s;
    }
    dst[col] = Element(y);
  }
}

template <class Element>
CUTE_DEVICE void copy_row(const Element* src, Element* dst, int head_dim, int lane) {
  for (int col = lane * 8; col < head_dim; col += 32 * 8) {
    *reinterpret_cast<uint4*>(dst + col) = *reinterpret_cast<const uint4*>(src + col);
  }
}

template <class Element>
__global__ void __launch_bounds__(kAppendWarps * 32) append_kernel(const DecodeParams p) {
  int64_t row = int64_t(blockIdx.x) * kAppendWarps + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  const int64_t kv_rows = p.k_new != nullptr ? int64_t(p.batch) * p.seqlen_new * p.heads_k : 0;
  const Element* const cos = static_cast<const Element*>(p.rotary_cos);
  const Element* const sin = static_cast<const Element*>(p.rotary_sin);
  const int half = p.rotary_dim / 2;

  if (row < 2 * kv_rows) {
    const bool is_value = row >= kv_rows;
    if (is_value) row -= kv_rows;
    const int head = int(row % p.heads_k);
    const int token = int(row / p.heads_k % p.seqlen_new);
    const int batch = int(row / (int64_t(p.heads_k) * p.seqlen_new));
    const CacheSequence cache(p, batch);
    const SlotLocation loc = locate_slot(p, cache, cache.seqlen + token);
    if (is_value) {
      const Element* src = static_cast<const Element*>(p.v_new) + batch * p.v_new_batch_stride +
                           int64_t(token) * p.v_new_row_stride + head * p.v_new_head_stride;
      Element* dst = static_cast<Element*>(const_cast<void*>(p.v)) +
                     slot_offset(loc, p.v_batch_stride, p.v_row_stride, p.v_head_stride, head);
      copy_row(src, dst, p.head_dim, lane);
      return;
    }
    const Element* src = static_cast<const Element*>(p.k_new) + batch * p.k_new_batch_stride +
                         int64_t(token) * p.k_new_row_stride + head * p.k_new_head_stride;
    Element* dst = static_cast<Element*>(const_cast<void*>(p.k)) +
                   slot_offset(loc, p.k_batch_stride, p.k_row_stride, p.k_head_stride, head);
    if (p.rotary_dim > 0) {
      const int64_t position = cache.rotary_offset() + token;
      rotate_row(src, dst, cos + position * half, sin + position * half, p.head_dim, p.rotary_dim,
                 p.rotary_interleaved, lane);
    } else {
      copy_row(src, dst, p.head_dim, lane);
    }
    return;
  }
  row -= 2 * kv_rows;
  if (p.rotary_dim == 0 || row >= int64_t(p.batch) * p.seqlen_q * p.heads) return;
  const int head = int(row % p.heads);
  const int token = int(row / p.heads % p.seqlen_q);
  const int batch = int(row / (int64_t(p.heads) * p.seqlen_q));
  const CacheSequence cache(p, batch);
  const int64_t position = cache.rotary_offset() + (p.rotary_per_token ? token : 0);
  const Element* src = static_cast<const Element*>(p.q) + batch * p.q_batch_stride +
                       int64_t(token) * p.q_row_stride + head * p.q_head_stride;
  Element* dst = static_cast<Element*>(p.q_rotated) + row * p.head_dim;
  rotate_row(src, dst, cos + position * half, sin + position * half, p.head_dim, p.rotary_dim,
             p.rotary_interleaved, lane);
}

}  // namespace flashcute::decode

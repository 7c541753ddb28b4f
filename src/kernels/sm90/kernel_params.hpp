// What the device code receives: TMA descriptors for the loads (passed by value, __grid_constant__),
// plain pointers for the stores, and the mask geometry.
#pragma once

#include <cstdint>

namespace flashcute::sm90 {

template <class Traits>
struct KernelParams {
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::GmemShape shape_q;
  typename Traits::GmemShape shape_k;

  typename Traits::Element* o;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  float* lse;  // null = not requested
  int64_t lse_batch_stride, lse_head_stride;

  int seqlen_q, seqlen_k, head_dim;
  int heads_per_kv_head;
  int num_m_blocks;
  int heads, batch;
  int num_units;  // work units of the persistent grid (scheduler.hpp)
  float scale_log2;
  bool causal;
  int causal_offset;  // key j is visible to query i iff j <= i + causal_offset (when causal)
};

}  // namespace flashcute::sm90

// What the device code receives: TMA descriptors for the loads and for O's store (passed by
// value, __grid_constant__), plain pointers for the stores of a packed batch and the LSE, the
// sequence offsets of a packed batch, and the mask geometry.
#pragma once

#include <cutlass/fast_math.h>

#include <cstdint>

namespace flashcute::sm90 {

template <class Traits>
struct KernelParams {
  static constexpr int kBlockM = Traits::kBlockM;

  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaO tma_o;  // dense problems only; O has Q's shape
  typename Traits::GmemShape shape_q;
  typename Traits::GmemShape shape_k;

  typename Traits::Element* o;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  float* lse;  // null = not requested
  int64_t lse_batch_stride, lse_head_stride;

  int seqlen_q, seqlen_k;  // the maxima when packed
  int head_dim;
  int heads_per_kv_head;
  int num_m_blocks;  // of the longest sequence when packed
  int heads, batch;  // batch = number of sequences when packed
  int num_units;     // work units of the persistent grid (scheduler.hpp); a bound when packed
  // Packed variable-length batch: token offsets of each sequence (batch + 1 entries); null when
  // dense. The TMA descriptors then span all tokens with a batch extent of 1 (tile_info.hpp).
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  float scale_log2;
  // Query i sees key j iff i + diag - window_left <= j <= i + diag + window_right (a negative
  // bound is unbounded; causal is window_right 0), with diag = seqlen_k - seqlen_q of the sequence
  // when bottom_right, else 0.
  int window_left, window_right;
  bool bottom_right;
  bool causal;  // causal without a left window: a tile's cost grows with its row (scheduler.hpp)
  // Dense schedule, set by TileScheduler::prepare: divide by heads, and by the paired units of
  // one (batch, head).
  cutlass::FastDivmod heads_divmod, paired_per_bh_divmod;
};

}  // namespace flashcute::sm90

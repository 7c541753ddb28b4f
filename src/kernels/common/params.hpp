// The validated problem as every kernel family sees it: pointers, 64-bit strides in elements, and
// the mask and score modifiers in the form the kernels use them.
#pragma once

#include <cute/config.hpp>

#include <cstdint>

#include "kernels/common/sequence_info.hpp"

namespace flashcute {

struct AttentionParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // optional

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;  // lse row stride is 1

  int batch, heads, heads_k, head_dim;
  int heads_per_kv_head;   // heads / heads_k (GQA group size)
  int seqlen_q, seqlen_k;  // maxima when variable length
  // Query tokens of all sequences together: batch * seqlen_q when dense; when packed, the rows of
  // q and o (cu_seqlens_q[batch] at most).
  int64_t total_q;

  // Variable length: token offsets of each sequence (batch + 1 entries), or null for dense.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;

  // Scores are computed in the exp2 domain: s = q.k * scale_log2, or with softcap c:
  // s = c * log2(e) * tanh(q.k * softmax_scale / c).
  float softmax_scale;
  float scale_log2;
  float softcap;  // 0 = off

  // Mask: query i sees key j iff i + diag - left <= j <= i + diag + right, where diag is
  // seqlen_k - seqlen_q (bottom-right) or 0 (top-left); a negative bound is unbounded.
  bool bottom_right;
  int window_left, window_right;

  const float* alibi_slopes;  // optional; adds -slope * |i + diag - j| to the scaled score
  int64_t alibi_batch_stride;

  // Where each sequence's tokens lie (sequence_info.hpp).
  CUTE_HOST_DEVICE SequenceLayout sequences() const {
    return SequenceLayout{seqlen_q, seqlen_k, cu_seqlens_q, cu_seqlens_k, nullptr, nullptr};
  }
};

}  // namespace flashcute

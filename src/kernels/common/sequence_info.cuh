// Where one (batch, head) problem lives: its sequence lengths and the element offsets of its first
// row in Q/O and K/V, for dense and variable-length (packed token) batches alike.
#pragma once

#include <cstdint>

#include "kernels/common/params.hpp"

namespace flashcute {

struct SequenceInfo {
  int seqlen_q, seqlen_k;
  int64_t q_token_start;  // index of the first query token among all tokens (0 when dense)
  int64_t q_offset, k_offset, v_offset, o_offset;  // elements to this (batch, head)'s row 0
  int64_t lse_offset;                              // floats to this (batch, head)'s row 0

  __device__ SequenceInfo(const AttentionParams& p, int batch, int head) {
    const int head_kv = head / p.heads_per_kv_head;
    int64_t q_rows_before, k_rows_before;  // rows reached through the row stride
    if (p.cu_seqlens_q != nullptr) {
      const int q_start = p.cu_seqlens_q[batch];
      const int k_start = p.cu_seqlens_k[batch];
      seqlen_q = p.cu_seqlens_q[batch + 1] - q_start;
      seqlen_k = p.cu_seqlens_k[batch + 1] - k_start;
      q_token_start = q_start;
      q_rows_before = q_start;
      k_rows_before = k_start;
      batch = 0;  // packed tokens: the batch stride does not apply
    } else {
      seqlen_q = p.seqlen_q;
      seqlen_k = p.seqlen_k;
      q_token_start = 0;
      q_rows_before = 0;
      k_rows_before = 0;
    }
    q_offset = batch * p.q_batch_stride + q_rows_before * p.q_row_stride + head * p.q_head_stride;
    o_offset = batch * p.o_batch_stride + q_rows_before * p.o_row_stride + head * p.o_head_stride;
    k_offset = batch * p.k_batch_stride + k_rows_before * p.k_row_stride + head_kv * p.k_head_stride;
    v_offset = batch * p.v_batch_stride + k_rows_before * p.v_row_stride + head_kv * p.v_head_stride;
    lse_offset = batch * p.lse_batch_stride + head * p.lse_head_stride + q_token_start;
  }
};

}  // namespace flashcute

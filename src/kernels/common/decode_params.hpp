// The validated KV-cache problem: the attention problem (q, o, the caches as k and v with their
// strides, mask and score modifiers) plus where each sequence's keys live in the cache, the new
// tokens to append, rotary embedding, and the split of the keys with its fp32 partial results.
#pragma once

#include <cstdint>

#include "kernels/common/params.hpp"

namespace flashcute {

struct DecodeParams : AttentionParams {
  // Cache geometry (kv_cache.hpp). k/v and their strides (AttentionParams) address the caches;
  // k_batch_stride is the cache-row stride when dense, the page stride when paged.
  const int32_t* cache_seqlens;  // (batch), or null: cache_seqlen for every sequence
  int cache_seqlen;
  const int32_t* cache_batch_idx;  // dense only; null: sequence b uses cache row b
  const int32_t* cache_leftpad;    // null: 0
  const int32_t* block_table;      // null: dense
  int64_t block_table_stride;
  int page_size;  // paged: slots per page; dense: slots per cache row
  int pages_per_sequence;
  int batch_cache;  // dense: cache rows; paged: pages

  // New tokens written to the cache before attention; null when none.
  const void* k_new;
  const void* v_new;
  int64_t k_new_batch_stride, k_new_row_stride, k_new_head_stride;
  int64_t v_new_batch_stride, v_new_row_stride, v_new_head_stride;
  int seqlen_new;

  // Rotary embedding of q and the new keys (rotary_dim 0: none). The rotated q is written to
  // q_rotated (contiguous (batch, seqlen_q, heads, head_dim)), which attention then reads as q.
  const void* rotary_cos;
  const void* rotary_sin;
  int rotary_dim, rotary_seqlen;
  bool rotary_interleaved;
  bool rotary_per_token;  // q token t at position offset + t (causal or windowed); else offset
  void* q_rotated;

  // Query heads of one KV head share a tile (each cache element is read once per KV head) unless
  // ALiBi gives each head its own bias.
  bool pack_gqa;
  // The keys of a sequence are cut into num_splits ranges; with more than one, each range writes
  // its normalised output and log2-domain log-sum-exp to o_partial / lse_partial (split-major,
  // then row = query token * heads + head), and a combine kernel merges them.
  int num_splits;
  float* o_partial;
  float* lse_partial;
  // sm_90+: the combine launches while attention runs and waits for it (dependent_launch.hpp).
  bool dependent_launch;
  // Debug: where the device-memory check writes its verdict (decode/contract_check.cuh).
  int* contract_status;
};

}  // namespace flashcute

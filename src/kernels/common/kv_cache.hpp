// Where a sequence's keys live in a KV cache, dense or paged, and how many it attends to: the one
// rule the append, attention and contract-check kernels share. Sequence b sees the cache slots
// [leftpad, seqlen + seqlen_new) of its cache row; visible key j is slot leftpad + j.
// Host-callable too, so that CPU tests run the same code.
#pragma once

#include <cute/config.hpp>

#include <cstdint>

#include "kernels/common/decode_params.hpp"

namespace flashcute {

struct CacheSequence {
  int seqlen;    // slots filled before this call's new tokens
  int leftpad;   // leading slots skipped
  int row;       // cache row (dense) or the row of block_table (paged)
  int num_keys;  // keys attended: seqlen + seqlen_new - leftpad

  CUTE_HOST_DEVICE CacheSequence(const DecodeParams& p, int batch) {
    seqlen = p.cache_seqlens != nullptr ? p.cache_seqlens[batch] : p.cache_seqlen;
    leftpad = p.cache_leftpad != nullptr ? p.cache_leftpad[batch] : 0;
    row = p.cache_batch_idx != nullptr ? p.cache_batch_idx[batch] : batch;
    num_keys = seqlen + p.seqlen_new - leftpad;
  }

  // Rotary position of the first new token: its slot (positions count from the cache row's
  // start, left padding included, as FlashAttention's kernels do).
  CUTE_HOST_DEVICE int rotary_offset() const { return seqlen; }
};

// (page or cache row, row within it) of one slot.
struct SlotLocation {
  int page, offset;
};

CUTE_HOST_DEVICE SlotLocation locate_slot(const DecodeParams& p, const CacheSequence& s, int slot) {
  if (p.block_table == nullptr) return {s.row, slot};
  return {p.block_table[s.row * p.block_table_stride + slot / p.page_size], slot % p.page_size};
}

// Element offset of a slot's row for one KV head in a cache with these strides.
CUTE_HOST_DEVICE int64_t slot_offset(SlotLocation loc, int64_t page_stride, int64_t row_stride,
                                     int64_t head_stride, int head) {
  return loc.page * page_stride + loc.offset * row_stride + head * head_stride;
}

}  // namespace flashcute

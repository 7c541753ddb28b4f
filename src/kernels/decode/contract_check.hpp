// The device-memory contract of a KV-cache call (flashcute.h), checked on the device when the
// caller asks for it: the values host validation cannot see.
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/decode_params.hpp"

namespace flashcute::decode {

enum class ContractViolation : int {
  kNone = 0,
  kCacheSeqlens,   // cache_seqlens[b] < 0, or cache_seqlens[b] + seqlen_new past the capacity
  kCacheLeftpad,   // cache_leftpad[b] outside [0, cache_seqlens[b]]
  kCacheBatchIdx,  // cache_batch_idx[b] outside [0, batch_cache)
  kBlockTable,     // a block-table entry the sequence uses outside [0, num_pages)
  kRotaryLength,   // a rotary position past rotary_seqlen
  kCuSeqlensQ,     // cu_seqlens_q not rising from 0 to at most total_q by at most seqlen_q
};

struct ContractReport {
  ContractViolation violation;
  int sequence;  // the first sequence found in violation
};

// Runs the check on `stream` (p.contract_status: two ints of device memory) and waits for it.
cudaError_t check_decode_contract(const DecodeParams& p, int capacity, cudaStream_t stream,
                                  ContractReport& report);

}  // namespace flashcute::decode

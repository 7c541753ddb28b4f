#include "kernels/common/kv_cache.hpp"
#include "kernels/decode/contract_check.hpp"

namespace flashcute::decode {
namespace {

__device__ void report(int* status, ContractViolation v, int sequence) {
  if (atomicCAS(status, 0, int(v)) == 0) status[1] = sequence;
}

// One thread per sequence.
__global__ void contract_check_kernel(const DecodeParams p, int capacity) {
  const int b = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (b >= p.batch) return;
  int* const status = p.contract_status;
  if (p.cu_seqlens_q != nullptr) {
    const int begin = p.cu_seqlens_q[b], end = p.cu_seqlens_q[b + 1];
    if ((b == 0 && begin != 0) || end < begin || end - begin > p.seqlen_q || end > p.total_q) {
      report(status, ContractViolation::kCuSeqlensQ, b);
    }
  }
  if (p.cache_batch_idx != nullptr &&
      (p.cache_batch_idx[b] < 0 || p.cache_batch_idx[b] >= p.batch_cache)) {
    report(status, ContractViolation::kCacheBatchIdx, b);
    return;
  }
  const CacheSequence s(p, b);
  if (s.seqlen < 0 || int64_t(s.seqlen) + p.seqlen_new > capacity) {
    report(status, ContractViolation::kCacheSeqlens, b);
    return;
  }
  if (s.leftpad < 0 || s.leftpad > s.seqlen) {
    report(status, ContractViolation::kCacheLeftpad, b);
    return;
  }
  if (p.block_table != nullptr) {
    const int end_slot = s.seqlen + p.seqlen_new;
    for (int page = s.leftpad / p.page_size; page * p.page_size < end_slot; ++page) {
      const int entry = p.block_table[b * p.block_table_stride + page];
      if (entry < 0 || entry >= p.batch_cache) {
        report(status, ContractViolation::kBlockTable, b);
        return;
      }
    }
  }
  if (p.rotary_dim > 0) {
    const int q_tokens = p.rotary_per_token ? p.seqlen_q : 1;
    const int tokens = p.seqlen_new > q_tokens ? p.seqlen_new : q_tokens;
    if (s.rotary_offset() + tokens > p.rotary_seqlen) {
      report(status, ContractViolation::kRotaryLength, b);
    }
  }
}

}  // namespace

cudaError_t check_decode_contract(const DecodeParams& p, int capacity, cudaStream_t stream,
                                  ContractReport& result) {
  int host[2] = {0, 0};
  cudaError_t err = cudaMemsetAsync(p.contract_status, 0, sizeof(host), stream);
  if (err != cudaSuccess) return err;
  if (p.batch > 0) {
    constexpr int kThreads = 128;
    contract_check_kernel<<<(p.batch + kThreads - 1) / kThreads, kThreads, 0, stream>>>(p,
                                                                                        capacity);
  }
  err = cudaMemcpyAsync(host, p.contract_status, sizeof(host), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return err;
  result = {ContractViolation(host[0]), host[1]};
  return cudaSuccess;
}

}  // namespace flashcute::decode

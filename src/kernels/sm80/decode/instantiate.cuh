// Registers the SM80-family decode path of one (dtype, head_dim bucket). The build generates one
// translation unit per (dtype, head_dim) that expands FLASHCUTE_SM80_DECODE_INSTANTIATE
// (cmake/instantiate.cmake).
#pragma once

#include "kernels/decode/append_kernel.cuh"
#include "kernels/decode/combine_kernel.cuh"
#include "kernels/decode/decode_registry.hpp"
#include "kernels/kernel_registry.hpp"
#include "kernels/sm80/decode/decode_kernel.cuh"
#include "kernels/sm80/decode/traits.cuh"
#include "kernels/sm80/dynamic_smem.hpp"

namespace flashcute::sm80::decode {

// Two warps with three stages each (100 KB of shared memory at head_dim 128): two blocks per SM
// keep eight K and V tiles (128 KB) in flight, and one block's start (Q, the first tiles) and end
// (the merge) overlap the other's streaming.
template <class Element, int kHeadDim>
using DefaultDecodeTraits = DecodeTraits<Element, kHeadDim, 2, 3>;

// The query heads of one block set: KV heads when packed, else query heads.
inline int head_sets(const DecodeParams& p) { return p.pack_gqa ? p.heads_k : p.heads; }

template <class Traits>
cudaError_t launch(const DecodeParams& params, cudaStream_t stream) {
  using Element = typename Traits::Element;
  DecodeParams p = params;
  const int64_t append_rows = flashcute::decode::append_rows(p);
  if (append_rows > 0) {
    constexpr int kWarps = flashcute::decode::kAppendWarps;
    flashcute::decode::append_kernel<Element>
        <<<unsigned((append_rows + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(p);
  }
  if (p.rotary_dim > 0) {
    p.q = p.q_rotated;
    p.q_head_stride = p.head_dim;
    p.q_row_stride = int64_t(p.heads) * p.head_dim;
    p.q_batch_stride = int64_t(p.seqlen_q) * p.q_row_stride;
  }
  if (p.seqlen_q > 0) {
    const auto kernel = decode_kernel<Traits>;
    const cudaError_t err = allow_dynamic_smem<Traits>(kernel, Traits::kSmemBytes);
    if (err != cudaSuccess) return err;
    const int group = p.pack_gqa ? p.heads_per_kv_head : 1;
    const int m_blocks = (p.seqlen_q * group + Traits::kBlockM - 1) / Traits::kBlockM;
    const dim3 grid(unsigned(m_blocks * head_sets(p)), unsigned(p.num_splits), unsigned(p.batch));
    kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
    if (p.num_splits > 1) {
      if (const cudaError_t launched = cudaGetLastError(); launched != cudaSuccess) return launched;
      return flashcute::decode::launch_combine<Element>(p, stream);
    }
  }
  return cudaGetLastError();
}

template <class Element, int kHeadDim>
void add_decode_kernels(DecodeKernelTable& table) {
  using Traits = DefaultDecodeTraits<Element, kHeadDim>;
  DecodeKernelEntry entry{};
  entry.family = FC_FAMILY_SM80;
  entry.dtype = dtype_of<Element>();
  entry.head_dim = kHeadDim;
  entry.smem_bytes = size_t(Traits::kSmemBytes);
  entry.rows_per_block = Traits::kBlockM;
  entry.keys_per_round = Traits::kBlockKeys;
  entry.launch = &launch<Traits>;
  table.push_back(entry);
}

}  // namespace flashcute::sm80::decode

#define FLASHCUTE_SM80_DECODE_INSTANTIATE(Element, dtype, head_dim)          \
  namespace flashcute::sm80_decode {                                         \
  void register_##dtype##_hd##head_dim(DecodeKernelTable& table) {           \
    ::flashcute::sm80::decode::add_decode_kernels<Element, head_dim>(table); \
  }                                                                          \
  }

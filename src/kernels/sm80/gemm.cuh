// Warp-level GEMMs over a tile's k extent with the shared-to-register loads one k-slice ahead of
// the mma.sync that consumes them (register double buffering). `thread` is the caller's index in
// the tiled MMA: threadIdx.x for a block-wide MMA, the lane for a one-warp MMA.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute::sm80 {

// acc += A * B with both operands in shared memory.
template <class Acc, class FragA, class FragB, class SmemA, class SmemB, class TiledMma,
          class CopyA, class CopyB>
__device__ void gemm_smem_smem(Acc& acc, FragA& frag_a, FragB& frag_b, SmemA const& smem_a,
                               SmemB const& smem_b, TiledMma const& mma, CopyA const& copy_a,
                               CopyB const& copy_b, int thread = int(threadIdx.x)) {
  using namespace cute;
  auto thr_copy_a = copy_a.get_thread_slice(thread);
  auto thr_copy_b = copy_b.get_thread_slice(thread);
  Tensor frag_a_view = thr_copy_a.retile_D(frag_a);
  Tensor frag_b_view = thr_copy_b.retile_D(frag_b);
  copy(copy_a, smem_a(_, _, 0), frag_a_view(_, _, 0));
  copy(copy_b, smem_b(_, _, 0), frag_b_view(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(frag_a); ++k) {
    if (k + 1 < size<2>(frag_a)) {
      copy(copy_a, smem_a(_, _, k + 1), frag_a_view(_, _, k + 1));
      copy(copy_b, smem_b(_, _, k + 1), frag_b_view(_, _, k + 1));
    }
    cute::gemm(mma, frag_a(_, _, k), frag_b(_, _, k), acc);
  }
}

// acc += A * B with A already in registers (the softmax probabilities) and B in shared memory.
template <class Acc, class FragA, class FragB, class SmemB, class TiledMma, class CopyB>
__device__ void gemm_regs_smem(Acc& acc, FragA const& frag_a, FragB& frag_b, SmemB const& smem_b,
                               TiledMma const& mma, CopyB const& copy_b,
                               int thread = int(threadIdx.x)) {
  using namespace cute;
  auto thr_copy_b = copy_b.get_thread_slice(thread);
  Tensor frag_b_view = thr_copy_b.retile_D(frag_b);
  copy(copy_b, smem_b(_, _, 0), frag_b_view(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(frag_a); ++k) {
    if (k + 1 < size<2>(frag_a)) copy(copy_b, smem_b(_, _, k + 1), frag_b_view(_, _, k + 1));
    cute::gemm(mma, frag_a(_, _, k), frag_b(_, _, k), acc);
  }
}

}  // namespace flashcute::sm80

// dQ's post-pass in the Hopper backward: each CTA scales and converts one block of dQ's fp32
// accumulator into dq. It is launched to start while the main kernel runs (programmatic
// dependent launch), so it runs on the SMs the main kernel's last, partly empty wave leaves
// idle. kCounted: a CTA starts its block once the block's count (the writer warp's, complete
// reductions only) reaches the key tiles that add to it; otherwise it waits for the whole main
// kernel (head dim 256, whose dQ atomics are not counted). Either way the grid ends after the
// main kernel, so that what the stream runs next sees dK and dV too.
#pragma once

#include <cuda_runtime.h>

#include "kernels/backward/dq_fragments.cuh"
#include "kernels/backward/workspace.hpp"
#include "kernels/common/backward_params.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/device_attributes.hpp"

namespace flashcute::sm90 {

// Grid: (query blocks, heads, batch), one thread per thread of the dQ MMA. kBlockN: the main
// kernel's key tile.
template <class Fragments, int kBlockN, bool kCounted>
__global__ void __launch_bounds__(Fragments::kThreads) dq_post_pass_kernel(const BackwardParams p) {
  constexpr int kBlockM = Fragments::kBlockM;
  int const m_block = blockIdx.x, head = blockIdx.y, sequence = blockIdx.z;
  SequenceInfo<> const seq(p.sequences(), sequence);
  bool const in_sequence = m_block * kBlockM < seq.seqlen_q;
  if constexpr (kCounted) {
    if (in_sequence) {
      if (threadIdx.x == 0) {
        AttentionMask const mask(seq.seqlen_q, seq.seqlen_k, p.bottom_right, p.window_left,
                                 p.window_right);
        BlockRange const tiles = mask.key_tiles_of<kBlockM, kBlockN>(m_block);
        float const* const block = Fragments::block(p, seq, sequence, head, m_block);
        backward::wait_for_count<true>(Fragments::count(p, block), tiles.end - tiles.begin);
      }
      __syncthreads();
      backward::convert_dq_block<Fragments>(p, seq, sequence, head, m_block);
    }
    // One CTA waiting suffices for the grid's end to follow the main kernel's; were every CTA to
    // wait, each would hold its slot until the main kernel ends, and the rest of the grid could
    // not start before then.
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) wait_for_prior_grid();
  } else {
    wait_for_prior_grid();
    if (in_sequence) backward::convert_dq_block<Fragments>(p, seq, sequence, head, m_block);
  }
}

template <class Fragments, int kBlockN, bool kCounted>
struct DqPostPass {
  // Launched after the main kernel on `stream`; `device`: the current device, which the caller
  // made the tensors' device.
  static cudaError_t launch(BackwardParams const& p, int device, cudaStream_t stream) {
    auto const kernel = dq_post_pass_kernel<Fragments, kBlockN, kCounted>;
    cudaError_t const err = configure_once_per_device<DqPostPass>(device, [&] {
      return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Fragments::kSmemBytes);
    });
    if (err != cudaSuccess) return err;
    dim3 const grid((p.seqlen_q + Fragments::kBlockM - 1) / Fragments::kBlockM, p.heads, p.batch);
    return launch_dependent(true, kernel, grid, dim3(Fragments::kThreads), Fragments::kSmemBytes,
                            stream, p);
  }
};

}  // namespace flashcute::sm90

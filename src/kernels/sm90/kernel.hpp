// The kernel: warpgroup 0 produces (TMA loads), warpgroups 1.. consume (wgmma + softmax). The
// producer gives up registers it does not need so the consumers can hold S, P and O at once.
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include "kernels/sm90/consumer.hpp"
#include "kernels/sm90/epilogue.hpp"
#include "kernels/sm90/kernel_params.hpp"
#include "kernels/sm90/producer.hpp"
#include "kernels/sm90/softmax.hpp"
#include "kernels/sm90/tile_info.hpp"

namespace flashcute::sm90 {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    forward_kernel(CUTE_GRID_CONSTANT KernelParams<Traits> const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Params = KernelParams<Traits>;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);

  int const warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    smem.bar_q.init(1);
  }

  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = Traits::kBytesKV;
  pipe_params.role = warpgroup == 0 ? Pipeline::ThreadCategory::Producer
                                    : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = threadIdx.x == 0;
  pipe_params.num_consumers = Traits::kConsumerThreads;
  Pipeline pipe_k(smem.pipe_k, pipe_params, Shape<_1, _1, _1>{});
  Pipeline pipe_v(smem.pipe_v, pipe_params, Shape<_1, _1, _1>{});
  __syncthreads();  // barrier initialisation visible to every thread

  // Causal tiles get heavier with m: launch them in reverse so the long ones start first.
  int const m_block = p.causal ? p.num_m_blocks - 1 - int(blockIdx.x) : int(blockIdx.x);
  int const head = blockIdx.y;
  int const batch = blockIdx.z;
  TileInfo const tile = TileInfo::make<Traits>(p, m_block);

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x == 0) {
      PipelineState state = cutlass::make_producer_start_state<Pipeline>();
      Producer<Traits, Params>::run(p, smem, pipe_k, pipe_v, state, tile, head, batch);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    int const thread = threadIdx.x - 128;
    PipelineState state_k, state_v;
    typename Traits::TiledMmaPV mma_pv;
    Tensor o = partition_fragment_C(mma_pv, Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{});
    constexpr int kRows = decltype(size<0>(rowcol_view(o)))::value;
    OnlineSoftmax<kRows> softmax;
    Consumer<Traits, Params>::run(p, smem, pipe_k, pipe_v, state_k, state_v, tile, thread, o,
                                  softmax);
    Epilogue<Traits, Params>::run(p, smem, m_block, head, batch, thread, o, softmax);
  }
#endif
}

}  // namespace flashcute::sm90

// The kernel: warpgroup 0 produces (TMA loads), warpgroups 1.. consume (wgmma + softmax). The
// producer gives up registers it does not need so the consumers can hold S, P and O at once.
// The grid is persistent: each CTA walks the tiles the scheduler gives it, so launch and set-up
// are paid once per SM and one tile's loads overlap the previous tile's tail.
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include "kernels/sm90/consumer.hpp"
#include "kernels/sm90/epilogue.hpp"
#include "kernels/sm90/kernel_params.hpp"
#include "kernels/sm90/producer.hpp"
#include "kernels/sm90/scheduler.hpp"
#include "kernels/sm90/softmax.hpp"
#include "kernels/sm90/tile_info.hpp"

namespace flashcute::sm90 {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kCtasPerSm)
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
    cute::prefetch_tma_descriptor(p.tma_o.get_tma_descriptor());
    smem.bar_q.init(1);
    smem.bar_q_free.init(Traits::kConsumerThreads);
  }

  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = Traits::kBytesKV;
  pipe_params.role =
      warpgroup == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = threadIdx.x == 0;
  pipe_params.num_consumers = Traits::kConsumerThreads;
  Pipeline pipe_k(smem.pipe_k, pipe_params, Shape<_1, _1, _1>{});
  Pipeline pipe_v(smem.pipe_v, pipe_params, Shape<_1, _1, _1>{});
  __syncthreads();  // barrier initialisation visible to every thread

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x == 0) {
      PipelineState state = cutlass::make_producer_start_state<Pipeline>();
      int iteration = 0;  // tiles this CTA has run (the scheduler hands out no empty tile)
      for (TileScheduler sched(p, int(blockIdx.x)); sched.valid(p);
           sched.advance(p, int(gridDim.x))) {
        WorkTile const w = sched.get(p);
        TileInfo const tile = TileInfo::make<Traits>(p, w);
        Producer<Traits, Params>::run(p, smem, pipe_k, pipe_v, state, tile, w.head, iteration);
        ++iteration;
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    int const thread = threadIdx.x - 128;
    PipelineState state_k, state_v;
    typename Traits::TiledMmaPV mma_pv;
    TurnTaking<Traits::kPingPong> const turns{thread / 128};
    turns.start();
    int iteration = 0;  // tiles this CTA has run (the scheduler hands out no empty tile)
    for (TileScheduler sched(p, int(blockIdx.x)); sched.valid(p);
         sched.advance(p, int(gridDim.x))) {
      WorkTile const w = sched.get(p);
      TileInfo const tile = TileInfo::make<Traits>(p, w);
      // Hide that the thread index is the same every tile: otherwise the compiler hoists the
      // per-thread coordinates of masks and epilogue out of the tile loop and spills them.
      int thread_here;
      asm volatile("mov.b32 %0, %1;" : "=r"(thread_here) : "r"(thread));
      Tensor o = partition_fragment_C(mma_pv, Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{});
      constexpr int kRows = decltype(size<0>(rowcol_view(o)))::value;
      OnlineSoftmax<kRows> softmax;
      Consumer<Traits, Params>::run(p, smem, pipe_k, pipe_v, state_k, state_v, w, tile, thread_here,
                                    o, softmax, iteration);
      // The tile's sequence is looked up again rather than kept across the main loop, where
      // the consumers have no register to spare.
      Epilogue<Traits, Params>::run(p, smem, TileInfo::make<Traits>(p, w), w.head, thread_here, o,
                                    softmax);
      ++iteration;
    }
    Epilogue<Traits, Params>::drain(thread);
    turns.finish();
  }
#endif
}

}  // namespace flashcute::sm90

// The Hopper forward kernel: warpgroup 0 produces (TMA loads), warpgroups 1.. consume (wgmma and
// softmax), each CTA walking the tiles the scheduler gives it (a persistent grid: launch and
// set-up are paid once per CTA, and one tile's loads overlap the previous tile's tail). The
// producer runs the scheduler and hands each tile to the consumers with its Q. The kernel
// type owns what its collectives share: the shared storage, the register budgets, and the choice
// of where O is staged.
#pragma once

#include <cutlass/arch/reg_reconfig.h>
#include <cute/arch/cluster_sm90.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common/params.hpp"
#include "kernels/sm90/collective/epilogue_fwd.hpp"
#include "kernels/sm90/collective/mainloop_fwd.hpp"
#include "kernels/sm90/register_budget.hpp"
#include "kernels/sm90/softmax.hpp"
#include "kernels/sm90/tile_info.hpp"
#include "kernels/sm90/tile_scheduler.hpp"
#include "kernels/sm90/traits.hpp"
#include "kernels/sm90/turn_taking.hpp"

namespace flashcute::sm90 {

// kModifiers: the kernel of calls with softcap or ALiBi (it runs only those).
template <class Traits_, bool kModifiers = false>
struct ForwardKernel {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kCtasPerSm = Traits::kCtasPerSm;
  static constexpr int kClusterM = Traits::kClusterM;

  using Registers = RegisterBudget<kThreads, Traits::kConsumerThreads, kCtasPerSm>;
  static constexpr int kProducerRegs = Registers::kProducer;
  static constexpr int kConsumerRegs = Registers::kConsumer;

  // Shared memory per SM, of which the driver keeps kSmemReservedPerCta for every CTA.
  static constexpr int kSmemPerSm = 228 * 1024;
  static constexpr int kSmemReservedPerCta = 1024;
  // O has a buffer of its own if it fits beside every CTA on the SM (plus 1 KB for the barriers).
  // Otherwise it borrows V's, which the next tile's first V load then waits for; Q's buffer is
  // never borrowed, so the producer loads the next tile's Q (and first K) as soon as the last
  // QK^T has read the current Q, under this tile's tail.
  static constexpr int kBytesQKV = int(Traits::kBytesQ + 2 * Traits::kStages * Traits::kBytesKV);
  static constexpr bool kSeparateO =
      kCtasPerSm * (kBytesQKV + int(Traits::kBytesQ) + 1024 + kSmemReservedPerCta) <= kSmemPerSm;

  using Mainloop = CollectiveMainloopFwd<Traits, !kSeparateO, kModifiers>;
  using Epilogue = CollectiveEpilogueFwd<Traits, kSeparateO>;
  static_assert(kSeparateO || cosize_v<typename Traits::SmemLayoutO> <=
                                  cosize_v<typename Traits::SmemLayoutKV>,
                "O staged in V's buffer must fit in it");
  // A cluster's CTAs take each unit of the scheduler together (tile_of_cluster_member).
  using Scheduler = TileScheduler<Traits::kBlockM * kClusterM>;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;

  struct SharedStorage {
    typename Mainloop::SharedStorage mainloop;
    typename Epilogue::SharedStorage epilogue;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kCtasPerSm * (kSmemBytes + kSmemReservedPerCta) <= kSmemPerSm);

  struct Params {
    typename Mainloop::Params mainloop;
    typename Epilogue::Params epilogue;
    typename Scheduler::Params scheduler;
  };

  // Host, once per launch. counters: the stream's zeroed pair of ints for the dynamic schedule,
  // or null; l2_bytes: the device's L2, which sizes the dynamic schedule's sections; max_ctas:
  // the grid's largest size (in clusters for a cluster kernel).
  static Params to_params(AttentionParams const& a, int* counters = nullptr, int l2_bytes = 0,
                          int max_ctas = 0) {
    typename Scheduler::Arguments s = scheduler_arguments(a);
    s.counters = counters;
    // Half of L2 for the section's K and V (each query head's share of its KV head's).
    int64_t const kv_bytes_per_head =
        std::max<int64_t>(1, 2 * int64_t(a.seqlen_k) * Traits::kHeadDim * int64_t(sizeof(Element)) *
                                 a.heads_k / a.heads);
    s.l2_section_heads = int(std::min<int64_t>(l2_bytes / 2 / kv_bytes_per_head, INT_MAX));
    s.max_ctas = max_ctas;
    return Params{Mainloop::to_params(Mainloop::to_arguments(a)),
                  Epilogue::to_params(Epilogue::to_arguments(a)), Scheduler::to_params(s)};
  }

  // Whether this call would use the dynamic schedule's counters if given them. A cluster kernel
  // runs only problems without a mask, whose units are equal: it keeps the static schedule.
  static bool schedules_dynamically(AttentionParams const& a) {
    return kClusterM == 1 && Scheduler::schedules_dynamically(scheduler_arguments(a));
  }

  static typename Scheduler::Arguments scheduler_arguments(AttentionParams const& a) {
    // Causal without a left window edge: a tile's cost grows with its row, so pair tiles.
    bool const pair_tiles = a.window_right == 0 && a.window_left < 0;
    return {a.batch, a.heads, a.seqlen_q, pair_tiles, a.cu_seqlens_q, nullptr, 0, 0};
  }

  CUTE_DEVICE static void run(Params const& p, char* smem_raw) {
    auto& smem = *reinterpret_cast<SharedStorage*>(smem_raw);
    int const warpgroup = threadIdx.x / 128;
    if (threadIdx.x == 0) {
      Mainloop::prefetch_descriptors(p.mainloop);
      Epilogue::prefetch_descriptors(p.epilogue);
      smem.mainloop.bar_q.init(1);
      smem.mainloop.bar_q_free.init(Traits::kConsumerThreads);
      smem.mainloop.bar_o_free.init(Traits::kConsumerThreads * kClusterM);
    }

    typename Pipeline::Params pipe_params;
    pipe_params.transaction_bytes = Traits::kBytesKV;
    pipe_params.role =
        warpgroup == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pipe_params.is_leader = threadIdx.x == 0;
    pipe_params.num_consumers = Traits::kConsumerThreads;
    typename Mainloop::Pipelines pipes{
        Pipeline(smem.mainloop.pipe_k, pipe_params, typename Traits::ClusterShape{}),
        Pipeline(smem.mainloop.pipe_v, pipe_params, typename Traits::ClusterShape{})};
    // Barrier initialisation visible to every thread (of the cluster: the other CTAs' consumers
    // arrive on this CTA's K/V barriers).
    if constexpr (kClusterM > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    if (warpgroup == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if (threadIdx.x == 0) produce(p, smem, pipes);
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(p, smem, pipes, int(threadIdx.x) - 128);
    }
  }

 private:
  CUTE_DEVICE static void produce(Params const& p, SharedStorage& smem,
                                  typename Mainloop::Pipelines& pipes) {
    PipelineState state = cutlass::make_producer_start_state<Pipeline>();
    int tiles = 0;  // tiles this CTA has run (the scheduler hands out no empty tile)
    int const clusters = int(gridDim.x) / kClusterM;
    int const block = int(blockIdx.x);
    int const rank = block % kClusterM;  // the CTA's rank in its cluster (a 1-D grid)
    Scheduler sched(p.scheduler, block / kClusterM);
    for (; sched.valid(p.scheduler); sched.advance(p.scheduler, clusters)) {
      WorkTile const w = tile_of_cluster_member<kClusterM>(sched.get(p.scheduler), rank);
      TileInfo const tile = TileInfo::make<Traits>(p.mainloop, w);
      Mainloop::load(p.mainloop, smem.mainloop, pipes, state, tile, w, tiles, rank);
      ++tiles;
    }
    Scheduler::retire(p.scheduler, clusters);
    Mainloop::end_of_work(smem.mainloop, tiles);
  }

  // thread: the index among the consumer threads.
  CUTE_DEVICE static void consume(Params const& p, SharedStorage& smem,
                                  typename Mainloop::Pipelines& pipes, int thread) {
    typename Mainloop::ConsumerState state{};
    state.tiles = 0;
    typename Traits::TiledMmaPV mma_pv;
    TurnTaking<Traits::kPingPong> const turns{thread / 128};
    turns.start();
    Element* o_smem;
    if constexpr (kSeparateO) {
      o_smem = smem.epilogue.o.data();
    } else {
      o_smem = smem.mainloop.v.data();
    }
    for (;;) {
      WorkTile const w = Mainloop::wait_work(smem.mainloop, state.tiles);
      if (w.m_block < 0) break;
      TileInfo const tile = TileInfo::make<Traits>(p.mainloop, w);
      // Hide that the thread index is the same every tile: otherwise the compiler hoists the
      // per-thread coordinates of masks and epilogue out of the tile loop and spills them.
      int thread_here;
      asm volatile("mov.b32 %0, %1;" : "=r"(thread_here) : "r"(thread));
      Tensor o = partition_fragment_C(mma_pv, Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{});
      constexpr int kRows = decltype(size<0>(rowcol_view(o)))::value;
      Softmax<kRows> softmax;
      Mainloop::mma(p.mainloop, smem.mainloop, pipes, state, w, tile, thread_here, o, softmax);
      // The tile's sequence is looked up again rather than kept across the main loop, where the
      // consumers have no register to spare.
      Epilogue::store(p.epilogue, o_smem, TileInfo::make<Traits>(p.mainloop, w), w.head,
                      thread_here, o, softmax);
      if constexpr (!kSeparateO) Mainloop::release_o(smem.mainloop);
      ++state.tiles;
    }
    Epilogue::drain(thread);
    turns.finish();
    // In a cluster, the other CTAs' consumers release their K/V stages on this CTA's barriers too,
    // up to their last block: no CTA leaves (and frees its shared memory) before they all have.
    // The producer and the idle threads have left: a cluster barrier waits for those that have
    // not exited. (The producer waiting on its stages' releases instead pushed its tile and TMA
    // arithmetic out of uniform registers: it spilled.)
    if constexpr (kClusterM > 1) {
      cute::cluster_arrive();
      cute::cluster_wait();
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, Kernel::kCtasPerSm)
    forward_kernel(CUTE_GRID_CONSTANT typename Kernel::Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) char smem_raw[];
  Kernel::run(p, smem_raw);
#endif
}

}  // namespace flashcute::sm90

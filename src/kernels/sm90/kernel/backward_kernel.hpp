// The Hopper backward kernel. One CTA owns one key block of one KV head and accumulates its dK and
// dV in registers over every query block that sees it, for every query head of the KV head's
// group (GQA sums need no atomics). Warpgroup 0 produces: one thread streams Q, dO and the
// blocks' row statistics (LSE, rowsum(dO * O)) through a TMA pipeline. Per step (query head,
// query block) the two consumer warpgroups compute S^T = K Q^T and dP^T = V dO^T (wgmma,
// shared-memory operands), P^T = exp2(S^T scale - lse) and dS^T = P^T (dP^T - rowsum(dO * O)),
// then dV += P^T dO, dK += dS^T Q and this step's dQ = dS K, split between them as the traits'
// BackwardSplit says:
// - kKeys: each warpgroup owns 64 keys; dV's GEMM takes P^T from registers while dP^T finishes,
//   dS^T goes to shared memory (dQ reads every key), and dK's GEMM runs on under dQ's staging and
//   the next step's first GEMMs. The warpgroups stage the step's dQ in shared memory (at 64 rows
//   per step each its own half, meeting a second producer warp on barriers of its own, so that
//   neither waits for the other's staging); that warp adds each staged part to the fp32
//   accumulator in global memory with one bulk reduction (cp.reduce.async.bulk), and counts the
//   blocks it has finished, so that dQ's post-pass (sm90/backward/dq_post_pass.hpp) converts each
//   as soon as its count is complete, under the main kernel's last CTAs.
// - kHeadDim: the warpgroups share 64 keys, each takes half of the step's queries for S^T and
//   dP^T and half of the head dim for dK, dV and dQ; P^T and dS^T meet in shared memory, and each
//   warpgroup adds its dQ half to the accumulator with 16-byte atomics while dV's and dK's GEMMs
//   run (a staged 64 x 256 fp32 block would leave no room for a second Q/dO stage).
// Either way a dQ block is kept in the dQ MMA's register order (backward::DqFragments), so a
// thread's values are whole 16-byte vectors of one contiguous block.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <type_traits>

#include "kernels/backward/dq_fragments.cuh"
#include "kernels/backward/workspace.hpp"
#include "kernels/common/backward_params.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/sm80/predicated_copy.cuh"
#include "kernels/sm90/backward/launch_order.hpp"
#include "kernels/sm90/backward/traits.hpp"
#include "kernels/sm90/fragment.hpp"
#include "kernels/sm90/named_barriers.hpp"
#include "kernels/sm90/register_budget.hpp"
#include "kernels/sm90/softmax.hpp"

namespace flashcute::sm90 {

template <class Traits_>
struct BackwardKernel {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kStages = Traits::kStages;
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kConsumerThreads = Traits::kConsumerThreads;

  using Registers = RegisterBudget<kThreads, kConsumerThreads>;
  static constexpr int kProducerRegs = Registers::kProducer;
  static constexpr int kConsumerRegs = Registers::kConsumer;

  // kKeys: one step's dQ, in register order, for the bulk reduction.
  struct StagedDq {
    alignas(128) float dq[kBlockM * kHeadDim];
  };
  // kHeadDim: one step's P^T, which both warpgroups read.
  struct SharedPt {
    cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutPt>, 1024> pt;
  };

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutQ>, 1024> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutQ>, 1024> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutK>, 1024> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutV>, 1024> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutDs>, 1024> ds;
    alignas(1024) std::conditional_t<Traits::kSplitHeadDim, SharedPt, StagedDq> step;
    alignas(16) float lse_log2[kStages][kBlockM];
    alignas(16) float dout_dot_out[kStages][kBlockM];
    typename Pipeline::SharedStorage pipe;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an SM90 CTA may have");

  struct Params {
    typename Traits::TmaQ tma_q;
    typename Traits::TmaQ tma_dout;
    typename Traits::GmemShape shape_q;  // (rows, head_dim, heads, batches)
    BackwardLaunchOrder order;
    BackwardParams p;
  };

  // Host, once per launch. Packed sequences are one batch of total_q tokens, whose batch stride
  // is never applied (the row stride stands in, a valid TMA stride).
  static Params to_params(BackwardParams const& p, int multiprocessors, int l2_bytes) {
    bool const packed = p.cu_seqlens_q != nullptr;
    auto const shape =
        make_shape(packed ? int(p.total_q) : p.seqlen_q, p.head_dim, p.heads, packed ? 1 : p.batch);
    auto const tma = [&](const void* ptr, int64_t row, int64_t head, int64_t batch) {
      Tensor t =
          make_tensor(make_gmem_ptr(static_cast<const Element*>(ptr)),
                      make_layout(shape, make_stride(row, _1{}, head, packed ? row : batch)));
      return make_tma_copy(SM90_TMA_LOAD{}, t, take<0, 2>(typename Traits::SmemLayoutQ{}),
                           Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{});
    };
    return Params{tma(p.q, p.q_row_stride, p.q_head_stride, p.q_batch_stride),
                  tma(p.dout, p.dout_row_stride, p.dout_head_stride, p.dout_batch_stride), shape,
                  launch_order(p, multiprocessors, l2_bytes), p};
  }

  // The query blocks of this CTA's key block, and its steps: every block for each query head of
  // the group, the head changing slowest.
  struct Work {
    int n_block, head_kv, sequence;
    SequenceInfo<> seq;
    AttentionMask mask;
    BlockRange blocks;
    int steps;

    CUTE_DEVICE Work(Params const& params)
        : Work(params.p, params.order.template place<kLaunchSections>(int(blockIdx.x),
                                                                      turns_descend(params.p))) {}
    CUTE_DEVICE Work(BackwardParams const& p, BackwardPlace const& at)
        : n_block(at.n_block),
          head_kv(at.head_kv),
          sequence(at.sequence),
          seq(p.sequences(), sequence),
          mask(seq.seqlen_q, seq.seqlen_k, p.bottom_right, p.window_left, p.window_right),
          blocks(mask.query_blocks<kBlockM, kBlockN>(n_block)) {
      steps = cute::max(blocks.end - blocks.begin, 0) * p.heads_per_kv_head;
    }
    CUTE_DEVICE int head(BackwardParams const& p, int step) const {
      return head_kv * p.heads_per_kv_head + step / (blocks.end - blocks.begin);
    }
    CUTE_DEVICE int m_block(int step) const {
      return blocks.begin + step % (blocks.end - blocks.begin);
    }
  };

  // Sections in the launch order at 64-row steps only: at 128 (d 64) the consumers have no
  // registers to spare, and the sections' arithmetic spills their step loop (3-6% on every d 64
  // row, bench/NOTES.md); there the whole grid is the tail.
  static constexpr bool kLaunchSections = kBlockM == 64;

  // Which (key block, KV head, sequence) each CTA of the one-dimensional grid takes. With a right
  // mask edge: a section's Q, dO and dQ accumulator rows fill at most half of L2 (at least one
  // group), and the tail spreads its costliest CTAs over the SMs.
  static BackwardLaunchOrder launch_order(BackwardParams const& p, int multiprocessors,
                                          int l2_bytes) {
    int const n_blocks = cute::max((p.seqlen_k + kBlockN - 1) / kBlockN, 1);
    int const groups = p.heads_k * p.batch;
    if (p.window_right < 0) return {n_blocks, p.heads_k, p.batch, n_blocks, 1, 0};
    int const chunk = cute::min(BackwardLaunchOrder::kCostOrderChunk, n_blocks);
    if (!kLaunchSections) return {n_blocks, p.heads_k, p.batch, chunk, 1, groups};
    int64_t const group_bytes = int64_t(p.heads_per_kv_head) * p.seqlen_q * p.head_dim *
                                (2 * sizeof(Element) + sizeof(float));
    int64_t const section_groups = cute::max(int64_t(l2_bytes / 2) / group_bytes, int64_t(1));
    return {n_blocks,
            p.heads_k,
            p.batch,
            chunk,
            int(cute::min(section_groups, int64_t(groups))),
            BackwardLaunchOrder::cost_order_tail(n_blocks, multiprocessors)};
  }

  // kKeys: each consumer warpgroup stages its own part of a step's dQ at 64 rows per step, so
  // that neither waits for the other's staging (5% of the main kernel at d 128). At 128 rows
  // (d 64) the warpgroups stage one part together: two parts raise its spills and slow it.
  static constexpr int kDqParts = kBlockM == 64 ? kConsumerThreads / 128 : 1;
  static constexpr int kDqPartThreads = kConsumerThreads / kDqParts;

  // dQ's accumulator blocks, in the dQ MMA's register order, one contiguous part per staging
  // part.
  using DqBlocks = backward::DqFragments<Element, typename Traits::TiledMmaDq, kBlockM, kHeadDim,
                                         kConsumerThreads, kDqPartThreads>;

  CUTE_DEVICE static void run(Params const& params, char* smem_raw) {
    auto& smem = *reinterpret_cast<SharedStorage*>(smem_raw);
    BackwardParams const& p = params.p;
    // The pre-pass's row statistics, dQ's zeroed accumulator and counts are needed from here on.
    // dQ's post-pass may launch now: it waits for its blocks' counts (or for this grid).
    wait_for_prior_grid();
    allow_dependent_launch();
    Work const work(params);
    if (work.n_block * kBlockN >= work.seq.seqlen_k) return;  // a shorter packed sequence

    int const warpgroup = threadIdx.x / 128;
    if (threadIdx.x == 0) {
      cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_dout.get_tma_descriptor());
    }
    typename Pipeline::Params pipe_params;
    pipe_params.transaction_bytes = Traits::kBytesStage;
    pipe_params.role =
        warpgroup == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pipe_params.is_leader = threadIdx.x == 0;
    pipe_params.num_consumers = kConsumerThreads;
    Pipeline pipe(smem.pipe, pipe_params, Shape<_1, _1, _1>{});
    __syncthreads();  // barrier initialisation visible to every thread

    if (warpgroup == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if (threadIdx.x == 0) produce(params, smem, pipe, work);
      if constexpr (!Traits::kSplitHeadDim) {
        if (threadIdx.x / 32 == 1) write_dq(p, smem, work);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(p, smem, pipe, work, int(threadIdx.x) - 128);
    }
  }

 private:
  CUTE_DEVICE static void produce(Params const& params, SharedStorage& smem, Pipeline& pipe,
                                  Work const& work) {
    BackwardParams const& p = params.p;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQ{});
    int64_t const stats_start = PaddedRows::sequence_start(work.seq, work.sequence, p.seqlen_q);
    PipelineState state = cutlass::make_producer_start_state<Pipeline>();
    for (int step = 0; step < work.steps; ++step) {
      int const head = work.head(p, step), m_block = work.m_block(step);
      // (global block, shared stage) partitions of Q and dO for this head.
      auto blocks_of = [&](auto const& tma, auto const& sX) {
        Tensor mX = domain_offset(make_coord(work.seq.q_start, _0{}),
                                  tma.get_tma_tensor(params.shape_q)(_, _, head, work.seq.batch));
        Tensor gX = local_tile(mX, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(_, _0{}));
        return tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(sX), group_modes<0, 2>(gX));
      };
      auto [tQg, tQs] = blocks_of(params.tma_q, sQ);
      auto [tdOg, tdOs] = blocks_of(params.tma_dout, sdO);
      pipe.producer_acquire(state);
      auto* const bar = pipe.producer_get_barrier(state);
      int const stage = state.index();
      copy(params.tma_q.with(*bar, 0), tQg(_, m_block), tQs(_, stage));
      copy(params.tma_dout.with(*bar, 0), tdOg(_, m_block), tdOs(_, stage));
      int64_t const row = head * p.padded_rows + stats_start + int64_t(m_block) * kBlockM;
      SM90_BULK_COPY_G2S::copy(p.lse_log2_padded + row, bar, smem.lse_log2[stage],
                               Traits::kBytesStats);
      SM90_BULK_COPY_G2S::copy(p.dout_dot_out_padded + row, bar, smem.dout_dot_out[stage],
                               Traits::kBytesStats);
      ++state;
    }
  }

  // thread: the index among the consumer threads.
  CUTE_DEVICE static void consume(BackwardParams const& p, SharedStorage& smem, Pipeline& pipe,
                                  Work const& work, int thread) {
    load_kv(p, smem, work, thread);
    typename Traits::TiledMmaDkv mma_dkv;
    Tensor dk = partition_fragment_C(mma_dkv, TileKV{});
    Tensor dv = partition_fragment_C(mma_dkv, TileKV{});
    clear(dk);
    clear(dv);
    if constexpr (Traits::kSplitHeadDim) {
      steps_split_head_dim(p, smem, pipe, work, thread, dk, dv);
    } else {
      steps_split_keys(p, smem, pipe, work, thread, dk, dv);
    }
    store_gradients(p, smem, work, thread, dk, dv);
  }

  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileS = Shape<Int<kBlockN>, Int<kBlockM>>;
  using TileDq = Shape<Int<kBlockM>, Int<kHeadDim>>;

  // K and V of the block, through the consumers' own cp.async loads, visible to wgmma after.
  CUTE_DEVICE static void load_kv(BackwardParams const& p, SharedStorage& smem, Work const& work,
                                  int thread) {
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});
    typename Traits::GmemTiledCopyKV gmem_copy;
    auto thr = gmem_copy.get_thread_slice(thread);
    Tensor coords = thr.partition_S(make_identity_tensor(TileKV{}));
    Tensor col_ok = make_tensor<bool>(make_shape(size<2>(coords)));
    CUTE_UNROLL
    for (int k = 0; k < size(col_ok); ++k) col_ok(k) = int(get<1>(coords(0, 0, k))) < p.head_dim;
    auto block_of = [&](const void* ptr, int64_t batch_stride, int64_t row_stride,
                        int64_t head_stride) {
      auto base =
          make_gmem_ptr(static_cast<const Element*>(ptr) +
                        work.seq.k_offset(batch_stride, row_stride, head_stride, work.head_kv));
      return local_tile(make_tensor(base, make_shape(work.seq.seqlen_k, Int<kHeadDim>{}),
                                    make_stride(row_stride, _1{})),
                        TileKV{}, make_coord(work.n_block, 0));
    };
    int const key_rows = work.seq.seqlen_k - work.n_block * kBlockN;
    sm80::copy_tile_in<true>(
        gmem_copy,
        thr.partition_S(block_of(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride)),
        thr.partition_D(sK), coords, col_ok, key_rows);
    sm80::copy_tile_in<true>(
        gmem_copy,
        thr.partition_S(block_of(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride)),
        thr.partition_D(sV), coords, col_ok, key_rows);
    cp_async_fence();
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();  // visible to wgmma (the async proxy)
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, int(BarrierId::kConsumers));
  }

  // The step's LSE (log2 units) of each query column this thread holds.
  template <class Coords>
  CUTE_DEVICE static auto column_lse(SharedStorage const& smem, int stage, Coords const& coords) {
    constexpr int kCols = decltype(size<1>(coords))::value;
    cute::array<float, kCols> lse;
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) lse[c] = smem.lse_log2[stage][get<1>(coords(0, c))];
    return lse;
  }

  // P^T = exp2(S^T scale - lse) in place: column c of s_rc is query row m_block * kBlockM +
  // (its coordinate). The mask acts on the exponent, so a zero or negative scale needs no
  // special case.
  template <class Tensor, class Coords, class Lse>
  CUTE_DEVICE static void probabilities(BackwardParams const& p, Work const& work,
                                        MaskedBlocks const& masked, int m_block, Tensor& s_rc,
                                        Coords const& coords, Lse const& lse) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s_rc); ++c) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(s_rc); ++r) s_rc(r, c) = s_rc(r, c) * p.scale_log2 - lse[c];
    }
    if (masked.contains(m_block)) {
      mask_outside(s_rc, coords, work.n_block * kBlockN, m_block * kBlockM, 0, work.mask.right >= 0,
                   [&](int key) { return work.mask.key_queries(key); });
    }
    CUTE_UNROLL
    for (int i = 0; i < size(s_rc); ++i) s_rc(i) = fast_exp2(s_rc(i));
  }

  // dS^T = P^T (dP^T - rowsum(dO * O)) in place of dP^T.
  template <class Tensor, class Coords>
  CUTE_DEVICE static void score_gradients(SharedStorage const& smem, int stage, Tensor const& pt_rc,
                                          Tensor& dp_rc, Coords const& coords) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(dp_rc); ++c) {
      float const dot = smem.dout_dot_out[stage][get<1>(coords(0, c))];
      CUTE_UNROLL
      for (int r = 0; r < size<0>(dp_rc); ++r) dp_rc(r, c) = pt_rc(r, c) * (dp_rc(r, c) - dot);
    }
  }

  // The wgmma operands in shared memory that both step loops read: K and V for S^T and dP^T,
  // Q and dO (one per stage) for S^T, dP^T, dV and dK, dS and K^T for dQ.
  CUTE_DEVICE static auto step_operands(SharedStorage& smem, int thread) {
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQt{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});
    Tensor sdS = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutDs{});
    auto thr_sdp = typename Traits::TiledMmaSdP{}.get_thread_slice(thread);
    auto thr_dkv = typename Traits::TiledMmaDkv{}.get_thread_slice(thread);
    auto thr_dq = typename Traits::TiledMmaDq{}.get_thread_slice(thread);
    return cute::make_tuple(thr_sdp.partition_fragment_A(sK),
                            thr_sdp.partition_fragment_B(sQ),  // (MMA, MMA_N, MMA_K, stages)
                            thr_sdp.partition_fragment_A(sV), thr_sdp.partition_fragment_B(sdO),
                            thr_dkv.partition_fragment_B(sdOt), thr_dkv.partition_fragment_B(sQt),
                            thr_dq.partition_fragment_A(sdS),  // (MMA, MMA_M, MMA_K, buffers)
                            thr_dq.partition_fragment_B(sKt));
  }

  // BackwardSplit::kKeys: this warpgroup's 64 keys, every query of the step.
  template <class Dk, class Dv>
  CUTE_DEVICE static void steps_split_keys(BackwardParams const& p, SharedStorage& smem,
                                           Pipeline& pipe, Work const& work, int thread, Dk& dk,
                                           Dv& dv) {
    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmaDkv mma_dkv;
    typename Traits::TiledMmaDq mma_dq;
    auto [tSrK, tSrQ, tPrV, tPrdO, tdVrdO, tdKrQ, tdQrdS, tdQrK] = step_operands(smem, thread);
    Tensor coords =
        rowcol_view(mma_sdp.get_thread_slice(thread).partition_C(make_identity_tensor(TileS{})));
    MaskedBlocks const masked =
        work.mask.template masked_query_blocks<kBlockM, kBlockN>(work.n_block);
    Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutDst{});

    // dS^T leaves registers by stmatrix: 16 bytes of 8 consecutive queries of one key per row.
    auto stage_ds = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto thr_stage_ds = stage_ds.get_thread_slice(thread);
    Tensor tdSsdS = thr_stage_ds.partition_D(sdSt);  // (CPY, CPY_M, CPY_N, buffers)

    // A step of 64 rows ends with dK's GEMM still running, under dQ's staging and the next
    // step's first GEMMs; its Q/dO stage is released once the next step's wait shows dK done. A
    // longer step waits for dK at its end, after dQ's staging, which dK's GEMM runs under.
    PipelineState state, previous;
    int m_block = work.blocks.begin;
    for (int step = 0; step < work.steps; ++step) {
      int const stage = state.index(), buffer = step & 1;
      pipe.consumer_wait(state);
      auto const lse = column_lse(smem, stage, coords);
      Tensor s = partition_fragment_C(mma_sdp, TileS{});
      Tensor dp = partition_fragment_C(mma_sdp, TileS{});
      warpgroup_gemm<true, -1>(mma_sdp, tSrK, tSrQ(_, _, _, stage), s);
      warpgroup_gemm<true, -1>(mma_sdp, tPrV, tPrdO(_, _, _, stage), dp);
      warpgroup_wait<1>();  // S, and the last step's dK
      warpgroup_fence_operand(s);
      warpgroup_fence_operand(dk);
      if (step > 0) pipe.consumer_release(previous);

      Tensor s_rc = rowcol_view(s);
      probabilities(p, work, masked, m_block, s_rc, coords, lse);
      Tensor pt = convert_fragment<Element>(s);
      Tensor pt_a = make_tensor(pt.data(), acc_as_a_operand(pt.layout()));
      warpgroup_gemm<false, -1>(mma_dkv, pt_a, tdVrdO(_, _, _, stage), dv);

      // dS^T while dV's GEMM runs.
      warpgroup_wait<1>();
      warpgroup_fence_operand(dp);
      Tensor dp_rc = rowcol_view(dp);
      score_gradients(smem, stage, s_rc, dp_rc, coords);
      Tensor dst = convert_fragment<Element>(dp);
      copy(stage_ds, thr_stage_ds.retile_S(dst), tdSsdS(_, _, _, buffer));

      // dQ = dS K once every warpgroup's keys are in dS, then dK += dS^T Q.
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, int(BarrierId::kConsumers));
      Tensor dq = partition_fragment_C(mma_dq, TileDq{});
      // At 64 rows dK is issued once dV is done, so that both warpgroups' dQ GEMMs queue before
      // either dK.
      warpgroup_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, buffer), tdQrK, dq);
      if constexpr (kBlockM == 64) warpgroup_wait<1>();  // dV
      Tensor dst_a = make_tensor(dst.data(), acc_as_a_operand(dst.layout()));
      warpgroup_gemm<false, -1>(mma_dkv, dst_a, tdKrQ(_, _, _, stage), dk);
      warpgroup_wait<1>();  // dV and dQ
      warpgroup_fence_operand(dq);
      warpgroup_fence_operand(dv);
      stage_dq(smem, dq, thread);
      if constexpr (kBlockM > 64) {
        // dK runs under dQ's staging but not into the next step: there its operands would stay
        // live beside the next S^T and dP^T, and ptxas would serialise every wgmma.
        warpgroup_wait<0>();
        warpgroup_fence_operand(dk);
      }
      previous = state;
      ++state;
      if (++m_block == work.blocks.end) m_block = work.blocks.begin;  // the next query head
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(dk);
    if (work.steps > 0) pipe.consumer_release(previous);
  }

  // BackwardSplit::kHeadDim: the block's 64 keys, half of the step's queries for S^T and dP^T,
  // half of the head dim for dV, dK and dQ.
  template <class Dk, class Dv>
  CUTE_DEVICE static void steps_split_head_dim(BackwardParams const& p, SharedStorage& smem,
                                               Pipeline& pipe, Work const& work, int thread, Dk& dk,
                                               Dv& dv) {
    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmaDkv mma_dkv;
    typename Traits::TiledMmaDq mma_dq;
    auto [tSrK, tSrQ, tPrV, tPrdO, tdVrdO, tdKrQ, tdQrdS, tdQrK] = step_operands(smem, thread);
    Tensor coords =
        rowcol_view(mma_sdp.get_thread_slice(thread).partition_C(make_identity_tensor(TileS{})));
    MaskedBlocks const masked =
        work.mask.template masked_query_blocks<kBlockM, kBlockN>(work.n_block);
    Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutDst{});
    Tensor sPt = make_tensor(make_smem_ptr(smem.step.pt.data()), typename Traits::SmemLayoutPt{});
    auto thr_dkv = mma_dkv.get_thread_slice(thread);
    Tensor tdVrPt = thr_dkv.partition_fragment_A(sPt);  // (MMA, MMA_M, MMA_K, buffers)
    Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdSt);

    // P^T and dS^T leave registers by stmatrix: 16 bytes of 8 consecutive queries of one key.
    auto stage_st = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto thr_stage_st = stage_st.get_thread_slice(thread);
    Tensor tPsPt = thr_stage_st.partition_D(sPt);  // (CPY, CPY_M, CPY_N, buffers)
    Tensor tdSsdS = thr_stage_st.partition_D(sdSt);

    // A step ends with dV's and dK's GEMMs running under dQ's atomics and the next step's first
    // GEMMs; its Q/dO stage is released once the next step's wait shows them done. P^T and dS^T
    // alternate between two buffers: a step writes one after its first wait, which shows this
    // warpgroup's last reads of the other done, and the barrier before the reads shows the other
    // warpgroup's.
    PipelineState state, previous;
    int m_block = work.blocks.begin;
    for (int step = 0; step < work.steps; ++step) {
      int const stage = state.index(), buffer = step & 1;
      pipe.consumer_wait(state);
      auto const lse = column_lse(smem, stage, coords);
      Tensor s = partition_fragment_C(mma_sdp, TileS{});
      Tensor dp = partition_fragment_C(mma_sdp, TileS{});
      warpgroup_gemm<true, -1>(mma_sdp, tSrK, tSrQ(_, _, _, stage), s);
      warpgroup_gemm<true, -1>(mma_sdp, tPrV, tPrdO(_, _, _, stage), dp);
      warpgroup_wait<1>();  // S, and the last step's dV and dK
      warpgroup_fence_operand(s);
      warpgroup_fence_operand(dk);
      warpgroup_fence_operand(dv);
      if (step > 0) pipe.consumer_release(previous);

      Tensor s_rc = rowcol_view(s);
      probabilities(p, work, masked, m_block, s_rc, coords, lse);
      Tensor pt = convert_fragment<Element>(s);
      copy(stage_st, thr_stage_st.retile_S(pt), tPsPt(_, _, _, buffer));
      warpgroup_wait<0>();
      warpgroup_fence_operand(dp);
      Tensor dp_rc = rowcol_view(dp);
      score_gradients(smem, stage, s_rc, dp_rc, coords);
      Tensor dst = convert_fragment<Element>(dp);
      copy(stage_st, thr_stage_st.retile_S(dst), tdSsdS(_, _, _, buffer));

      // Every query of P^T and dS^T in shared memory: dQ first, so that its atomics overlap dV's
      // and dK's GEMMs.
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, int(BarrierId::kConsumers));
      Tensor dq = partition_fragment_C(mma_dq, TileDq{});
      warpgroup_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, buffer), tdQrK, dq);
      warpgroup_gemm<false, -1>(mma_dkv, tdVrPt(_, _, _, buffer), tdVrdO(_, _, _, stage), dv);
      warpgroup_gemm<false, -1>(mma_dkv, tdKrdSt(_, _, _, buffer), tdKrQ(_, _, _, stage), dk);
      warpgroup_wait<2>();  // dQ
      warpgroup_fence_operand(dq);
      add_dq(p, work, step, dq, thread);
      previous = state;
      ++state;
      if (++m_block == work.blocks.end) m_block = work.blocks.begin;  // the next query head
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(dk);
    warpgroup_fence_operand(dv);
    if (work.steps > 0) pipe.consumer_release(previous);
  }

  // dK (scaled: it is the gradient of the scaled scores' keys) and dV leave through the K and V
  // buffers, free once every warpgroup's last GEMM is done: stmatrix in, 16-byte rows out.
  template <class Dk, class Dv>
  CUTE_DEVICE static void store_gradients(BackwardParams const& p, SharedStorage& smem,
                                          Work const& work, int thread, Dk& dk, Dv const& dv) {
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});
    typename Traits::TiledMmaDkv mma_dkv;
    CUTE_UNROLL
    for (int i = 0; i < size(dk); ++i) dk(i) *= p.softmax_scale;
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, int(BarrierId::kConsumers));
    // A thread index the compiler cannot see is the prologue's: otherwise it keeps the K/V
    // loads' addresses for these stores across the main loop, and spills them.
    int thread_here;
    asm volatile("mov.b32 %0, %1;" : "=r"(thread_here) : "r"(thread));
    auto stage_kv = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dkv);
    auto thr_stage_kv = stage_kv.get_thread_slice(thread_here);
    {
      Tensor out = convert_fragment<Element>(dk);
      copy(stage_kv, thr_stage_kv.retile_S(out), thr_stage_kv.partition_D(sK));
    }
    {
      Tensor out = convert_fragment<Element>(dv);
      copy(stage_kv, thr_stage_kv.retile_S(out), thr_stage_kv.partition_D(sV));
    }
    cutlass::arch::NamedBarrier::sync(kConsumerThreads, int(BarrierId::kConsumers));
    typename Traits::GmemTiledCopyOut gmem_out;
    auto thr_out = gmem_out.get_thread_slice(thread_here);
    Tensor coords_out = thr_out.partition_S(make_identity_tensor(TileKV{}));
    Tensor col_ok = make_tensor<bool>(make_shape(size<2>(coords_out)));
    CUTE_UNROLL
    for (int k = 0; k < size(col_ok); ++k) {
      col_ok(k) = int(get<1>(coords_out(0, 0, k))) < p.head_dim;
    }
    auto gradient_block = [&](void* ptr, int64_t batch_stride, int64_t row_stride,
                              int64_t head_stride) {
      auto base =
          make_gmem_ptr(static_cast<Element*>(ptr) +
                        work.seq.k_offset(batch_stride, row_stride, head_stride, work.head_kv));
      return local_tile(make_tensor(base, make_shape(work.seq.seqlen_k, Int<kHeadDim>{}),
                                    make_stride(row_stride, _1{})),
                        TileKV{}, make_coord(work.n_block, 0));
    };
    int const key_rows = work.seq.seqlen_k - work.n_block * kBlockN;
    sm80::copy_tile_out(gmem_out, thr_out.partition_S(sK),
                        thr_out.partition_D(gradient_block(p.dk, p.dk_batch_stride, p.dk_row_stride,
                                                           p.dk_head_stride)),
                        coords_out, col_ok, key_rows);
    sm80::copy_tile_out(gmem_out, thr_out.partition_S(sV),
                        thr_out.partition_D(gradient_block(p.dv, p.dv_batch_stride, p.dv_row_stride,
                                                           p.dv_head_stride)),
                        coords_out, col_ok, key_rows);
  }

  // kHeadDim: this thread's dQ values added to the step's accumulator block.
  template <class Dq>
  CUTE_DEVICE static void add_dq(BackwardParams const& p, Work const& work, int step, Dq const& dq,
                                 int thread) {
    DqBlocks::add(dq_block(p, work, step), dq, thread);
  }

  // A part's threads and the writer warp meet on the part's barriers.
  static constexpr int kDqBarrierThreads = kDqPartThreads + 32;
  static constexpr int kDqPartBytes = kBlockM * kHeadDim * int(sizeof(float)) / kDqParts;

  // This thread's part of the step's dQ, in the accumulator's order (DqBlocks::vector_index),
  // once the writer has read the part's last one.
  template <class Dq>
  CUTE_DEVICE static void stage_dq(SharedStorage& smem, Dq const& dq, int thread) {
    static_assert(decltype(size(dq))::value == DqBlocks::kVectors * 4);
    int const part = kDqParts == 1 ? 0 : thread / kDqPartThreads;
    cutlass::arch::NamedBarrier::sync(kDqBarrierThreads,
                                      barrier_id(BarrierId::kBackwardDqEmptyPart0, part));
    float4* const dst = reinterpret_cast<float4*>(smem.step.dq);
    CUTE_UNROLL
    for (int j = 0; j < size(dq) / 4; ++j) {
      dst[DqBlocks::vector_index(j, thread)] =
          make_float4(dq(4 * j), dq(4 * j + 1), dq(4 * j + 2), dq(4 * j + 3));
    }
    cutlass::arch::fence_view_async_shared();  // visible to the bulk reduction
    cutlass::arch::NamedBarrier::arrive(kDqBarrierThreads,
                                        barrier_id(BarrierId::kBackwardDqFullPart0, part));
  }

  // Deterministic: the key blocks that add to a dQ block take turns in key-block order. Both ends
  // of a key block's query range grow with the block, so those of query block m_block are a
  // contiguous range. With a right edge a higher key block starts at a later query block and
  // reaches each block first: the turns go from the highest key block down, and CTAs launch in
  // that order (BackwardLaunchOrder, descending). Otherwise every key block starts at
  // block 0 and the turns go up. Either way a CTA waits only for CTAs launched before it.
  CUTE_HOST_DEVICE static bool turns_descend(BackwardParams const& p) {
    return p.deterministic && p.window_right >= 0;
  }

  // This CTA's turn at m_block: its distance from the first key tile in turn order among those
  // that add to the block (the ends of AttentionMask::key_tiles_of), by bisection over the rule
  // the adding CTAs themselves use (query_blocks), so that no turn is waited for that no CTA
  // takes. The bisection covers only the tiles on the turn order's near side of this one: the
  // writer computes it at every step, and a bisection over every tile slowed the deterministic
  // main kernel 15%.
  CUTE_DEVICE static int dq_turn(BackwardParams const& p, Work const& work, int m_block) {
    if (turns_descend(p)) {
      // The last key tile whose range begins at or before m_block (its range ends past it: the
      // ends grow too).
      int lo = work.n_block, hi = (work.seq.seqlen_k + kBlockN - 1) / kBlockN - 1;
      while (lo < hi) {
        int const mid = (lo + hi + 1) / 2;
        if (work.mask.template query_blocks<kBlockM, kBlockN>(mid).begin <= m_block) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      return lo - work.n_block;
    }
    // The first key tile whose range ends past m_block (its range begins at or before it).
    int lo = 0, hi = work.n_block;
    while (lo < hi) {
      int const mid = (lo + hi) / 2;
      if (work.mask.template query_blocks<kBlockM, kBlockN>(mid).end > m_block) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return work.n_block - lo;
  }

  // The writer warp: each part of each step's dQ added to its block of the accumulator by one
  // bulk reduction, in part order, and the blocks' counts raised once the reductions are
  // complete (for dQ's post-pass): deterministic, each block's in its turn (dq_turn), once the
  // count shows the turns before it done; otherwise all of them at the CTA's end (count_blocks).
  // Only the leader lane holds the step's values: the warp runs on the producer's registers.
  CUTE_DEVICE static void write_dq(BackwardParams const& p, SharedStorage& smem, Work const& work) {
    bool const leader = threadIdx.x % 32 == 0;
    auto release_parts = [] {
      CUTE_UNROLL
      for (int part = 0; part < kDqParts; ++part) {
        cutlass::arch::NamedBarrier::arrive(kDqBarrierThreads,
                                            barrier_id(BarrierId::kBackwardDqEmptyPart0, part));
      }
    };
    if (work.steps > 0) release_parts();
    DqWalk walk(p, work);
    for (int step = 0; step < work.steps; ++step) {
      CUTE_UNROLL
      for (int part = 0; part < kDqParts; ++part) {
        cutlass::arch::NamedBarrier::sync(kDqBarrierThreads,
                                          barrier_id(BarrierId::kBackwardDqFullPart0, part));
        if (leader) reduce_dq_part(p, smem, work, walk, part);
      }
      __syncwarp();
      if (step + 1 < work.steps) release_parts();
      walk.advance(p, work);
    }
    if (leader && work.steps > 0 && !p.deterministic) count_blocks(p, work);
  }

  // The writer's leader, once every reduction of the CTA has been issued: their completion, then
  // one more key tile done with each block they added to (every query block of the CTA's range,
  // for each query head of its group). Counting at each step instead, once the step before's
  // reductions were complete, slowed the main kernel 11-20%; the post-pass gains little from
  // early counts, as it starts when the main kernel's last CTAs do.
  CUTE_DEVICE static void count_blocks(BackwardParams const& p, Work const& work) {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
    asm volatile("fence.acq_rel.gpu;" ::: "memory");  // releases the counts below
    constexpr int kCountsPerBlock = kBlockM / kDqCountRows;
    int* count =
        DqBlocks::count(p, DqBlocks::block(p, work.seq, work.sequence,
                                           work.head_kv * p.heads_per_kv_head, work.blocks.begin));
    int64_t const next_head = p.padded_rows / kDqCountRows -
                              int64_t(work.blocks.end - work.blocks.begin) * kCountsPerBlock;
    for (int h = 0; h < p.heads_per_kv_head; ++h, count += next_head) {
      for (int m = work.blocks.begin; m < work.blocks.end; ++m, count += kCountsPerBlock) {
        asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;" ::"l"(count) : "memory");
      }
    }
  }

  // Where a step's dQ sums: block m_block of its query head.
  CUTE_DEVICE static float* dq_block(BackwardParams const& p, Work const& work, int step) {
    return DqBlocks::block(p, work.seq, work.sequence, work.head(p, step), work.m_block(step));
  }

  // The writer's steps' dQ blocks in order (dq_block's), each address advanced from the last
  // one's: no division lies on the writer's path from the consumers' arrival to the reduction
  // they wait for.
  struct DqWalk {
    float* block;
    int m_block;

    CUTE_DEVICE DqWalk(BackwardParams const& p, Work const& work)
        : block(DqBlocks::block(p, work.seq, work.sequence, work.head_kv * p.heads_per_kv_head,
                                work.blocks.begin)),
          m_block(work.blocks.begin) {}

    CUTE_DEVICE void advance(BackwardParams const& p, Work const& work) {
      block += DqBlocks::kBlockM * DqBlocks::kWidth;
      if (++m_block == work.blocks.end) {  // the next query head's first block
        m_block = work.blocks.begin;
        block +=
            (p.padded_rows - int64_t(work.blocks.end - work.blocks.begin) * DqBlocks::kBlockM) *
            DqBlocks::kWidth;
      }
    }
  };

  // The writer's leader: one staged part of the step's dQ added to the accumulator; after the
  // last part, the buffer read (deterministic: the reductions complete, their writes done, and
  // the block's count raised: the next turn).
  CUTE_DEVICE static void reduce_dq_part(BackwardParams const& p, SharedStorage& smem,
                                         Work const& work, DqWalk const& walk, int part) {
    float* const dst = walk.block;
    if (p.deterministic && part == 0) {
      // The count reaches this CTA's turn and stays there until this CTA raises it.
      backward::wait_for_count<false>(DqBlocks::count(p, dst), dq_turn(p, work, walk.m_block));
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the reductions come after
    }
    // The accumulator stays in L2 for the key blocks still to add to it and for the post-pass
    // (which then runs 5% faster).
    constexpr uint64_t kEvictLast = uint64_t(cute::TMA::CacheHintSm90::EVICT_LAST);
    uint32_t const src = cute::cast_smem_ptr_to_uint(smem.step.dq) + part * kDqPartBytes;
    asm volatile(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 [%0], [%1], "
        "%2, %3;\n" ::"l"(dst + part * kDqPartBytes / int(sizeof(float))),
        "r"(src), "n"(kDqPartBytes), "l"(kEvictLast)
        : "memory");
    cute::tma_store_arrive();
    if (part + 1 < kDqParts) return;
    if (p.deterministic) {
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      asm volatile("fence.proxy.async.global;" ::: "memory");
      asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(DqBlocks::count(p, dst))
                   : "memory");
    } else {
      cute::tma_store_wait<0>();  // the buffer has been read
    }
  }
};

// Grid: BackwardLaunchOrder's CTAs, one per (key block, KV head, sequence).
template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    backward_kernel(CUTE_GRID_CONSTANT typename Kernel::Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) char smem_raw[];
  Kernel::run(p, smem_raw);
#endif
}

}  // namespace flashcute::sm90

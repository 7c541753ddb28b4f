// The consumer main loop of one warpgroup (64 query rows). Within an iteration the warpgroup
// issues S = Q K_n^T and O += P_{n+1} V_{n+1} back to back, then runs the softmax of S_n while
// the PV wgmma is still in the tensor cores: the exp2 work hides under the GEMM. Once the last
// QK^T has read Q, the thread tells the producer (when O has its own buffer) so the next tile's
// Q can load under this tile's tail.
#pragma once

#include "kernels/sm90/fragment.hpp"
#include "kernels/sm90/softmax.hpp"
#include "kernels/sm90/tile_info.hpp"
#include "kernels/sm90/traits.hpp"
#include "kernels/sm90/turn_taking.hpp"

namespace flashcute::sm90 {

template <class Traits, class Params>
struct Consumer {
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  // Registers a consumer thread needs for S, P and O (64 rows per warpgroup over 128 threads).
  // Where fewer than 64 of its budget remain (d 64 at 160 registers, d 128 with 176 keys, d 256
  // with 80), ptxas spilled Q's shared-memory descriptors, which it otherwise keeps across the
  // main loop; those kernels rebuild them per block instead.
  static constexpr int kAccumulatorRegs = kBlockN / 2 + kBlockN / 4 + kHeadDim / 2;
  static constexpr bool kTightRegisters = Traits::kConsumerRegs - kAccumulatorRegs < 64;

  // Returns with o holding the unnormalised output and softmax the row statistics. thread is
  // the index among all consumer threads.
  template <class FragO, class Softmax>
  CUTE_DEVICE static void run(Params const& p, typename Traits::SharedStorage& smem,
                              Pipeline& pipe_k, Pipeline& pipe_v, PipelineState& state_k,
                              PipelineState& state_v, WorkTile const& work, TileInfo const& tile,
                              int thread, FragO& o, Softmax& softmax, int iteration) {
    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(thread);
    auto thr_pv = mma_pv.get_thread_slice(thread);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // smem descriptors
    Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stages)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)
    Tensor s = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor s_rc = rowcol_view(s);
    Tensor coords =
        rowcol_view(thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{})));
    Tensor o_rc = rowcol_view(o);
    constexpr int kRows = decltype(size<0>(s_rc))::value;

    auto q_done = [&] {
      if constexpr (Traits::kSeparateO) smem.bar_q_free.arrive();
    };
    softmax.init();
    clear(o);
    smem.bar_q.wait(iteration & 1);
    if (tile.n_block_max <= tile.n_block_min) {
      q_done();
      return;
    }

    int const row0 = tile.m_block * kBlockM;
    // A positive scale is applied inside the softmax (its row maximum is then the raw scores'
    // maximum times the scale); any other scale multiplies the scores first.
    bool const scale_first = !(p.scale_log2 > 0.f);
    // Scores of a block become probabilities in place; blocks with hidden pairs are masked with
    // -inf first. Returns whether O needs rescaling.
    auto softmax_step = [&](int n, float(&correction)[kRows]) -> bool {
      bool const masked = n >= tile.n_block_mask || n < tile.n_block_left_mask;
      if (scale_first || masked) {
        float scale = p.scale_log2;
        if (scale_first) {
          scale_scores(s_rc, scale);
          scale = 1.f;
        }
        if (masked) {
          // The sequence is looked up again (cu_seqlens, in L1) rather than kept in registers
          // across the loop; dense problems take it from the parameters.
          TileInfo const seq = TileInfo::make<Traits>(p, work);
          mask_scores(s_rc, coords, row0, seq.key0<Traits>(p, n), n * kBlockN, seq.seqlen_k,
                      p.window_left, p.window_right, seq.diagonal(p));
        }
        return softmax.update(s_rc, scale, correction);
      }
      // The steady state has a copy of its own: one path for both made ptxas wait for the PV
      // GEMM before the softmax (d 64 192x128, 160 registers: -10%).
      return softmax.update(s_rc, p.scale_log2, correction);
    };

    // The turns started once per kernel (kernel.hpp) and run on across tiles.
    TurnTaking<Traits::kPingPong> const turns{thread / 128};
    int n = tile.n_block_max - 1;
    float correction[kRows];
    pipe_k.consumer_wait(state_k);
    turns.wait();
    warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), s);
    turns.pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(s);
    pipe_k.consumer_release(state_k);
    ++state_k;
    if (n == tile.n_block_min) q_done();
    softmax_step(n, correction);
    Tensor p_frag = convert_fragment<Element>(s);
    Tensor p_a = make_tensor(p_frag.data(), acc_as_a_operand(p_frag.layout()));
    bool first_pv = true;

    for (--n; n >= tile.n_block_min; --n) {
      pipe_k.consumer_wait(state_k);
      turns.wait();
      if constexpr (kTightRegisters) {
        // Rebuild Q's descriptors from an index the compiler cannot hoist (a few integer ops)
        // rather than keep them across the loop.
        int t;
        asm volatile("mov.b32 %0, %1;" : "=r"(t) : "r"(thread));
        Tensor q_desc = mma_qk.get_thread_slice(t).partition_fragment_A(sQ);
        warpgroup_gemm<true, -1>(mma_qk, q_desc, tSrK(_, _, _, state_k.index()), s);
      } else {
        warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), s);
      }
      pipe_v.consumer_wait(state_v);
      if (first_pv) {
        warpgroup_gemm<true, -1>(mma_pv, p_a, tOrV(_, _, _, state_v.index()), o);
      } else {
        warpgroup_gemm<false, -1>(mma_pv, p_a, tOrV(_, _, _, state_v.index()), o);
      }
      first_pv = false;
      turns.pass();
      warpgroup_wait<1>();  // S is ready; PV may still run
      warpgroup_fence_operand(s);
      pipe_k.consumer_release(state_k);
      ++state_k;
      if (n == tile.n_block_min) q_done();
      // Rows keep their reference maximum most of the time (softmax.hpp): the warp skips O's
      // rescale unless one of its rows moved.
      bool const rescale = __any_sync(0xffffffff, softmax_step(n, correction));
      warpgroup_wait<0>();
      warpgroup_fence_operand(o);
      pipe_v.consumer_release(state_v);
      ++state_v;
      if (rescale) {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          CUTE_UNROLL
          for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= correction[r];
        }
      }
      p_frag = convert_fragment<Element>(s);
    }

    pipe_v.consumer_wait(state_v);
    turns.wait();
    if (first_pv) {
      warpgroup_gemm<true, -1>(mma_pv, p_a, tOrV(_, _, _, state_v.index()), o);
    } else {
      warpgroup_gemm<false, -1>(mma_pv, p_a, tOrV(_, _, _, state_v.index()), o);
    }
    turns.pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(o);
    pipe_v.consumer_release(state_v);
    ++state_v;
  }
};

}  // namespace flashcute::sm90

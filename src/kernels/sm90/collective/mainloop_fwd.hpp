// The forward mainloop of the Hopper family: the producer's TMA loads and the consumers' GEMMs and
// online softmax over one tile's key blocks, with the shared memory and pipelines they share.
//
// Producer (one thread of the producer warpgroup): Q arrives once per tile on its own barrier; K
// and V stream through their pipelines in the order the consumers use them (last key block
// first; on ping-pong tiles K one block ahead of V). The pipelines run on across tiles, so the
// next tile's first K/V blocks load while the consumers finish the current one. In a cluster
// (Traits::kClusterM), each CTA loads its slice of every K/V block into all of the cluster's
// CTAs, whose consumers all release each stage.
// Consumer (one warpgroup per 64 query rows): within an iteration the warpgroup issues
// S = Q K_n^T and O += P_{n+1} V_{n+1} back to back, then runs the softmax of S_n while the PV
// wgmma is still in the tensor cores: the exp2 work hides under the GEMM (under ping-pong, ptxas
// may end that wait amid the exponentials and convert P among them). Once the last QK^T has
// read Q, the consumers tell the producer, so that the next tile's Q loads under this tile's tail
// (the epilogue leaves Q's buffer alone). Where O has no buffer of its own it is staged in V's
// (kOInV): the producer then holds the next tile's first V load until the epilogue is done with
// it (bar_o_free); Q and K go out before that wait.
// Softcap and ALiBi (kModifiers) go through the shared score transform (kernels/common/
// score_modifiers.hpp) before the mask: scores then reach the softmax as finished logits, except
// on blocks without hidden scores under softcap alone, where the softmax takes the tanh itself
// and a row's maximum from its raw maximum (the tanh then stays off the path to the maximum).
#pragma once

#include <climits>

#include "kernels/common/params.hpp"
#include "kernels/common/score_modifiers.hpp"
#include "kernels/sm90/fragment.hpp"
#include "kernels/sm90/softmax.hpp"
#include "kernels/sm90/tile_info.hpp"
#include "kernels/sm90/traits.hpp"
#include "kernels/sm90/turn_taking.hpp"

namespace flashcute::sm90 {

// kOInV: the epilogue stages O in V's buffer. kModifiers: the kernel of calls with softcap or
// ALiBi.
template <class Traits, bool kOInV, bool kModifiers>
struct CollectiveMainloopFwd {
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kClusterM = Traits::kClusterM;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutQ>, 1024> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutKV>, 1024> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutKV>, 1024> v;
    typename Pipeline::SharedStorage pipe_k;
    typename Pipeline::SharedStorage pipe_v;
    cutlass::arch::ClusterTransactionBarrier bar_q;  // Q landed
    cutlass::arch::ClusterBarrier bar_q_free;        // every consumer thread is done with Q
    // kOInV: every consumer thread of every CTA of the cluster (whose V loads land here too) is
    // done with O staged in V's buffer.
    cutlass::arch::ClusterBarrier bar_o_free;
    // The tile whose Q bar_q announces (m_block, head, batch; m_block < 0: no more tiles), tile
    // t in slot t % 2. The producer writes it as it starts tile t's loads; the consumers read it
    // after their wait for tile t's Q. The slot's previous tile, t - 2, was read before the
    // consumers released its Q, which the producer waited for while loading tile t - 1.
    alignas(16) int work[2][4];
  };

  struct Arguments {
    const Element* q;
    const Element* k;
    const Element* v;
    typename Traits::GmemShape shape_q, shape_k;  // (rows, head_dim, heads, batches)
    typename Traits::GmemStride stride_q, stride_k, stride_v;
    SequenceLayout sequences;
    int heads_per_kv_head;
    float scale_log2;
    bool bottom_right;
    int window_left, window_right;
    ScoreModifierParams modifiers;
  };

  struct Params {
    typename Traits::TmaQ tma_q;
    typename Traits::TmaKV tma_k;
    typename Traits::TmaKV tma_v;
    typename Traits::GmemShape shape_q, shape_k;
    SequenceLayout sequences;
    int heads_per_kv_head;
    float scale_log2;
    // Query i sees key j iff i + diag - window_left <= j <= i + diag + window_right (a negative
    // bound is unbounded), with diag = seqlen_k - seqlen_q of the sequence when bottom_right.
    bool bottom_right;
    int window_left, window_right;
    ScoreModifierParams modifiers;
  };

  // Packed sequences are one batch of all tokens: Q spans total_q rows; for K/V only an upper
  // bound of the total is known, which is enough because no load reads past a sequence's last key
  // (TileInfo::key0). The batch stride of an extent of 1 is never applied: the row stride stands
  // in (a valid TMA stride). With no key every tile is empty and K/V are never read, but a TMA
  // descriptor needs a non-empty tensor: Q's describes them instead.
  static Arguments to_arguments(AttentionParams const& a) {
    bool const packed = a.cu_seqlens_q != nullptr;
    int const rows_q = packed ? int(a.total_q) : a.seqlen_q;
    int const rows_k =
        packed ? int(std::min<int64_t>(int64_t(a.batch) * a.seqlen_k, INT_MAX)) : a.seqlen_k;
    int const batches = packed ? 1 : a.batch;
    auto stride = [packed](int64_t row, int64_t head, int64_t batch) {
      return make_stride(row, _1{}, head, packed ? row : batch);
    };
    Arguments args{};
    args.q = static_cast<const Element*>(a.q);
    args.shape_q = make_shape(rows_q, a.head_dim, a.heads, batches);
    args.stride_q = stride(a.q_row_stride, a.q_head_stride, a.q_batch_stride);
    if (a.seqlen_k == 0) {
      args.k = args.v = args.q;
      args.shape_k = args.shape_q;
      args.stride_k = args.stride_v = args.stride_q;
    } else {
      args.k = static_cast<const Element*>(a.k);
      args.v = static_cast<const Element*>(a.v);
      args.shape_k = make_shape(rows_k, a.head_dim, a.heads_k, batches);
      args.stride_k = stride(a.k_row_stride, a.k_head_stride, a.k_batch_stride);
      args.stride_v = stride(a.v_row_stride, a.v_head_stride, a.v_batch_stride);
    }
    args.sequences = a.sequences();
    args.heads_per_kv_head = a.heads_per_kv_head;
    args.scale_log2 = a.scale_log2;
    args.bottom_right = a.bottom_right;
    args.window_left = a.window_left;
    args.window_right = a.window_right;
    args.modifiers = ScoreModifierParams::of(a);
    return args;
  }

  static Params to_params(Arguments const& a) {
    auto gmem = [](const Element* ptr, auto shape, auto stride) {
      return make_tensor(make_gmem_ptr(ptr), make_layout(shape, stride));
    };
    Params p{};
    p.tma_q =
        make_tma_copy(SM90_TMA_LOAD{}, gmem(a.q, a.shape_q, a.stride_q),
                      typename Traits::SmemLayoutQ{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{});
    using CopyOpKV = typename Traits::CopyOpKV;
    p.tma_k = make_tma_copy(CopyOpKV{}, gmem(a.k, a.shape_k, a.stride_k),
                            take<0, 2>(typename Traits::SmemLayoutKV{}),
                            Shape<Int<kBlockN>, Int<kHeadDim>>{}, Int<kClusterM>{});
    p.tma_v = make_tma_copy(CopyOpKV{}, gmem(a.v, a.shape_k, a.stride_v),
                            take<0, 2>(typename Traits::SmemLayoutKV{}),
                            Shape<Int<kBlockN>, Int<kHeadDim>>{}, Int<kClusterM>{});
    p.shape_q = a.shape_q;
    p.shape_k = a.shape_k;
    p.sequences = a.sequences;
    p.heads_per_kv_head = a.heads_per_kv_head;
    p.scale_log2 = a.scale_log2;
    p.bottom_right = a.bottom_right;
    p.window_left = a.window_left;
    p.window_right = a.window_right;
    p.modifiers = a.modifiers;
    return p;
  }

  CUTE_DEVICE static void prefetch_descriptors(Params const& p) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
  }

  // The K and V pipelines of one CTA.
  struct Pipelines {
    Pipeline k, v;
  };

  // Where a consumer warpgroup stands in the pipelines and in the tiles it has run (each tile
  // loads Q once, so the tile count is the phase of Q's barriers).
  struct ConsumerState {
    PipelineState k, v;
    int tiles;
  };

  // Producer: every load of one tile. `tiles`: tiles this CTA has loaded before; rank: this
  // CTA's in its cluster.
  CUTE_DEVICE static void load(Params const& p, SharedStorage& smem, Pipelines& pipes,
                               PipelineState& state, TileInfo const& tile, WorkTile const& work,
                               int tiles, int rank) {
    using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
    using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
    int const head = work.head;
    int kv_head = head / p.heads_per_kv_head;

    // Row 0 of these views is the sequence's first token (packed) or row (dense).
    Tensor mQ = domain_offset(make_coord(tile.q_start, _0{}),
                              p.tma_q.get_tma_tensor(p.shape_q)(_, _, head, tile.batch));
    Tensor mK = domain_offset(make_coord(tile.k_start, _0{}),
                              p.tma_k.get_tma_tensor(p.shape_k)(_, _, kv_head, tile.batch));
    Tensor mV = domain_offset(make_coord(tile.k_start, _0{}),
                              p.tma_v.get_tma_tensor(p.shape_k)(_, _, kv_head, tile.batch));
    Tensor gQ = local_tile(mQ, TileQ{}, make_coord(tile.m_block, _0{}));
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutKV{});

    auto tQ = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                            group_modes<0, 2>(gQ));  // (global, shared); a lambda uses it below
    // Q is read once, from DRAM: an L2 prefetch now, while the previous tile still runs, leaves
    // only L2's latency to the load that waits for Q's buffer.
    cute::prefetch(p.tma_q, get<0>(tQ));
    // (global, shared) partitions of K and V blocks: block n starts at key n * kBlockN, except a
    // packed sequence's partial last block (tile.key0), which a second view shifted back by
    // less than a block provides. In a cluster, this CTA's slice of each block, which it
    // multicasts to every CTA of the cluster (kv_mask).
    int const n_last = (tile.seqlen_k - 1) / kBlockN;
    int const shift = tile.key0<Traits>(p, n_last) - n_last * kBlockN;
    uint16_t const kv_mask = (1u << kClusterM) - 1;
    auto kv_blocks = [&](auto const& tma, auto const& mX, auto const& sX, int offset) {
      Tensor gX = local_tile(domain_offset(make_coord(offset, _0{}), mX), TileKV{},
                             make_coord(_, _0{}));  // (N, D, n_blocks)
      return tma_partition(tma, rank, Layout<Int<kClusterM>>{}, group_modes<0, 2>(sX),
                           group_modes<0, 2>(gX));
    };
    // Named, not structured bindings, so that the lambdas below may capture them (C++17).
    auto const k_parts = kv_blocks(p.tma_k, mK, sK, 0);
    auto const v_parts = kv_blocks(p.tma_v, mV, sV, 0);
    auto const& tKg = get<0>(k_parts);
    auto const& tKs = get<1>(k_parts);
    auto const& tVg = get<0>(v_parts);
    auto const& tVs = get<1>(v_parts);
    Tensor tKg_last = get<0>(kv_blocks(p.tma_k, mK, sK, shift));
    Tensor tVg_last = get<0>(kv_blocks(p.tma_v, mV, sV, shift));

    // Q is loaded for every tile, even one with no visible key, so that both sides count the
    // Q buffer's phases the same way. Its first K block goes out before the wait for Q's buffer.
    auto load_q = [&] {
      if (tiles > 0) smem.bar_q_free.wait((tiles - 1) & 1);
      smem.bar_q.arrive_and_expect_tx(Traits::kBytesQ);
      copy(p.tma_q.with(reinterpret_cast<uint64_t&>(smem.bar_q), 0), get<0>(tQ), get<1>(tQ));
    };
    // Block n of K or V into the stage of `at`. A cluster kernel runs dense problems only: no
    // shifted block, and no view of one kept in the producer's few registers.
    auto load_block = [&](auto& pipe, auto const& tma, auto const& tXg, auto const& tXg_last,
                          auto const& tXs, int n, PipelineState const& at) {
      bool const last = kClusterM == 1 && n == n_last;
      pipe.producer_acquire(at);
      copy(tma.with(*pipe.producer_get_barrier(at), kv_mask), last ? tXg_last(_, n) : tXg(_, n),
           tXs(_, at.index()));
    };
    auto load_k = [&](int n, PipelineState const& at) {
      load_block(pipes.k, p.tma_k, tKg, tKg_last, tKs, n, at);
    };
    auto load_v = [&](int n, PipelineState const& at) {
      load_block(pipes.v, p.tma_v, tVg, tVg_last, tVs, n, at);
    };
    // kOInV: once per tile, before its first V load, for the previous tile's epilogue. The
    // consumers cannot end this tile's epilogue before that wait (they wait for V first; a tile
    // without V loads waits before its Q), so they never complete two phases the wait has not
    // seen, which a parity wait could not tell apart.
    auto wait_o_free = [&] {
      if constexpr (kOInV) {
        if (tiles > 0) smem.bar_o_free.wait((tiles - 1) & 1);
      }
    };
    publish_work(smem, tiles, work.m_block, work.head, work.batch);
    if (tile.n_block_max <= tile.n_block_min) {
      wait_o_free();
      load_q();
      return;
    }
    if constexpr (Traits::kPingPong) {
      // K runs one block ahead of V: the consumers free a K stage when S is ready, mid-step, but
      // a V stage only when the step's PV GEMM is done, so K(n - 1) goes out before the wait for
      // V(n)'s stage rather than behind it. Tiles without ping-pong (d 64) ran slower with this
      // order (bench/NOTES.md), so they keep each block's K and V together.
      load_k(tile.n_block_max - 1, state);
      load_q();
      for (int n = tile.n_block_max - 1; n >= tile.n_block_min; --n) {
        if (n > tile.n_block_min) {
          PipelineState next = state;
          ++next;
          load_k(n - 1, next);
        }
        if (n == tile.n_block_max - 1) wait_o_free();
        load_v(n, state);
        ++state;
      }
    } else {
      for (int n = tile.n_block_max - 1; n >= tile.n_block_min; --n) {
        load_k(n, state);
        if (n == tile.n_block_max - 1) {
          load_q();
          wait_o_free();
        }
        load_v(n, state);
        ++state;
      }
    }
  }

  // Producer, after its last tile: tells the consumers that no tile follows (bar_q completes
  // without a load).
  CUTE_DEVICE static void end_of_work(SharedStorage& smem, int tiles) {
    publish_work(smem, tiles, -1, 0, 0);
    if (tiles > 0) smem.bar_q_free.wait((tiles - 1) & 1);
    smem.bar_q.arrive();
  }

  // Consumer: waits for the next tile's Q and returns that tile (m_block < 0: no more tiles).
  // `tiles`: tiles this consumer has run before.
  CUTE_DEVICE static WorkTile wait_work(SharedStorage& smem, int tiles) {
    smem.bar_q.wait(tiles & 1);
    WorkTile w;
    int padding;
    // Volatile, as is the barrier's wait: the read stays after it.
    asm volatile("ld.volatile.shared.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w.m_block), "=r"(w.head), "=r"(w.batch), "=r"(padding)
                 : "r"(cute::cast_smem_ptr_to_uint(smem.work[tiles & 1])));
    return w;
  }

  // Consumer: one tile's main loop, once wait_work returned the tile. Returns with o holding the
  // unnormalised output and softmax the row statistics. thread: the index among all consumer
  // threads.
  template <class FragO, class Softmax>
  CUTE_DEVICE static void mma(Params const& p, SharedStorage& smem, Pipelines& pipes,
                              ConsumerState& state, WorkTile const& work, TileInfo const& tile,
                              int thread, FragO& o, Softmax& softmax) {
    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(thread);
    auto thr_pv = mma_pv.get_thread_slice(thread);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});
    // Q's descriptors depend only on the warpgroup: taken from an index the compiler knows is the
    // same across the warp, they live in uniform registers (else each QK^T wgmma waits for two
    // R2UR moves of its descriptor).
    int const warpgroup_thread = __shfl_sync(0xffffffff, thread / 128, 0) * 128;
    Tensor tSrQ = mma_qk.get_thread_slice(warpgroup_thread).partition_fragment_A(sQ);
    Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stages)
    typename Traits::TiledMmaQKLower mma_qk_lower;
    Tensor tSrK_lower = mma_qk_lower.get_thread_slice(thread).partition_fragment_B(
        make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKLower{}));
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)
    Tensor s = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
    constexpr int kLower = Traits::kBlockNLower;
    Tensor s_rc = rowcol_view(s);
    Tensor coords =
        rowcol_view(thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{})));
    Tensor o_rc = rowcol_view(o);
    constexpr int kRows = decltype(size<0>(s_rc))::value;

    auto q_done = [&] { smem.bar_q_free.arrive(); };
    softmax.init();
    clear(o);
    if (tile.n_block_max <= tile.n_block_min) {
      q_done();
      return;
    }

    // The turns started once per kernel and run on across tiles.
    TurnTaking<Traits::kPingPong> const turns{thread / 128};
    int const row0 = tile.m_block * kBlockM;
    int const warpgroup_row0 = row0 + warpgroup_thread / 2;  // this warpgroup's first row
    if constexpr (Traits::kConsumerWarpgroups > 1) {
      // A warpgroup whose rows all lie past the sequence's end (in a tile that holds its last 64
      // rows or fewer) has nothing to compute; it keeps step with the others. Taken from lane 0,
      // the condition is uniform to ptxas (computed per thread, a branch around wgmma code made
      // it serialise them, warning C7520).
      bool const idle = __shfl_sync(0xffffffff, int(warpgroup_row0 >= tile.seqlen_q), 0) != 0;
      if (idle) {
        keep_step(pipes, state, tile, turns, q_done);
        return;
      }
    }
    // A positive scale is applied inside the softmax (its row maximum is then the raw scores'
    // maximum times the scale); any other scale multiplies the scores first.
    bool const scale_first = !(p.scale_log2 > 0.f);
    // Scores of a block become probabilities in place; a masked block has its hidden pairs set to
    // -inf first, and takes the scale first when it is not positive (such calls mask every block:
    // is_masked). Returns whether O needs rescaling.
    // kModifiers: softcap or ALiBi (the slope of this sequence and query head) first.
    ScoreTransform<kModifiers> const transform(p.scale_log2, p.modifiers, work.batch, work.head);
    auto softmax_step = [&](int n, bool masked, float(&correction)[kRows]) -> bool {
      if constexpr (kModifiers) {
        if (!masked && transform.defers_softcap()) {
          return softmax.update(s_rc, transform.capped_scores(), correction);
        }
        int const key0 = tile.key0<Traits>(p, n);
        AttentionMask const mask = TileInfo::make_mask(p, tile);
        // ALiBi alone on a block wholly on one side of the diagonal for the warpgroup's 64 rows:
        // the bias as a column term per score and a row term the softmax adds (elsewhere the row
        // term stays 0). One update call for both keeps P's conversion amid the exponentials.
        RowBiasedScores<kRows> map{transform.exp2_multiplier()};
        int const alibi_side = transform.alibi_side(warpgroup_row0, 64, key0, kBlockN, mask);
        if (alibi_side != 0) {
          transform.add_alibi_linear(s_rc, coords, row0, key0, mask, alibi_side, map);
        } else {
          transform.cap_or_scale(s_rc);
          transform.add_alibi(s_rc, coords, row0, key0, mask);
        }
        if (masked) mask_scores(s_rc, coords, row0, key0, n * kBlockN, mask);
        return softmax.update(s_rc, map, correction);
      } else if (masked) {
        float scale = p.scale_log2;
        if (scale_first) {
          scale_scores(s_rc, scale);
          scale = 1.f;
        }
        // The sequence is looked up again (cu_seqlens, in L1) rather than kept in registers
        // across the loop; dense problems take it from the parameters.
        TileInfo const seq = TileInfo::make<Traits>(p, work);
        mask_scores(s_rc, coords, row0, seq.key0<Traits>(p, n), n * kBlockN,
                    TileInfo::make_mask(p, seq));
        return softmax.update(s_rc, scale, correction);
      } else {
        return softmax.update(s_rc, p.scale_log2, correction);
      }
    };
    auto is_masked = [&](int n) {
      return scale_first || n >= tile.n_block_mask || n < tile.n_block_left_mask;
    };

    int n = tile.n_block_max - 1;
    float correction[kRows];
    // The first block visited, the top one, holds the right mask edge and the key residue. Where
    // they hide its upper columns from all of this warpgroup's rows (the diagonal block of a
    // causal tile, for its first warpgroup), both GEMMs of the block take only its lower kLower
    // keys, and the PV GEMM none when no column is visible (a QK^T skipped outright made ptxas
    // serialise the kernel's wgmmas, warning C7515). The scores left out keep whatever the
    // registers held: the block is then masked (some of the tile's rows do not see it whole), and
    // mask_scores selects -inf for each of them, so their probabilities are 0 and the PV GEMM may
    // skip them. The warpgroup's rows start at warpgroup_row0 (row0 + 64 w). A tile of one
    // warpgroup (64 rows on 64-key blocks) sees its diagonal block whole: the check is left out
    // there (it cost that tile 2-3% at s <= 1k, bench/NOTES.md).
    int const top_columns = Traits::kConsumerWarpgroups > 1
                                ? tile.visible_columns<Traits>(p, warpgroup_row0, n)
                                : INT_MAX;
    pipes.k.consumer_wait(state.k);
    turns.wait();
    Tensor s_lower = partition_fragment_C(mma_qk_lower, Shape<Int<kBlockM>, Int<kLower>>{});
    if (top_columns > kLower) {
      warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, state.k.index()), s);
    } else {
      warpgroup_gemm<true, -1>(mma_qk_lower, tSrQ, tSrK_lower(_, _, _, state.k.index()), s_lower);
    }
    turns.pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(s);
    warpgroup_fence_operand(s_lower);
    if (top_columns <= kLower) {
      // The lower part's accumulator is the first columns of S's, column group for column group:
      // copied after the wait (a wgmma writing into part of S's registers drew C7515 too).
      CUTE_UNROLL
      for (int i = 0; i < size(s_lower); ++i) s(i) = s_lower(i);
    }
    pipes.k.consumer_release(state.k);
    ++state.k;
    if (n == tile.n_block_min) q_done();
    softmax_step(n, is_masked(n), correction);
    Tensor p_frag = convert_fragment<Element>(s);
    Tensor p_a = make_tensor(p_frag.data(), acc_as_a_operand(p_frag.layout()));
    bool first_pv = true;
    // O = P V of the top block (O's first product, so it overwrites O).
    auto top_block_pv = [&](int stage) {
      if (top_columns > kLower) {
        warpgroup_gemm<true, -1>(mma_pv, p_a, tOrV(_, _, _, stage), o);
      } else if (top_columns > 0) {
        warpgroup_gemm<true, -1, kLower / 16>(mma_pv, p_a, tOrV(_, _, _, stage), o);
      } else {
        warpgroup_commit_batch();  // P is 0 and O already clear; the batch keeps the wait counts
      }
    };

    // One key block after the first. Under ping-pong, masked and unmasked blocks each have a copy
    // of the whole step (masked is a constant in each, always inlined), which runs from the GEMMs'
    // issue to P's conversion without a branch: ptxas then waits for the PV GEMM amid the
    // exponentials and converts each pair of probabilities as it is ready, while the other
    // warpgroup's GEMMs keep the tensor cores busy. Without ping-pong nothing else covers the
    // softmax, so one copy keeps the softmax paths' join between it and the wait for the PV GEMM,
    // which ptxas would otherwise move above the exponentials (bench/NOTES.md has the A/B). With
    // the wait and the conversion in each path ptxas serialised the wgmmas (C7515); a step not
    // inlined, too (C7520, and spills).
    auto step = [&](int n, bool masked) __attribute__((always_inline)) {
      pipes.k.consumer_wait(state.k);
      turns.wait();
      warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, state.k.index()), s);
      pipes.v.consumer_wait(state.v);
      if (first_pv) {
        top_block_pv(state.v.index());
      } else {
        warpgroup_gemm<false, -1>(mma_pv, p_a, tOrV(_, _, _, state.v.index()), o);
      }
      first_pv = false;
      turns.pass();
      warpgroup_wait<1>();  // S is ready; PV may still run
      warpgroup_fence_operand(s);
      pipes.k.consumer_release(state.k);
      ++state.k;
      if (n == tile.n_block_min) q_done();
      bool const moved = softmax_step(n, masked, correction);
      warpgroup_wait<0>();
      warpgroup_fence_operand(o);
      p_frag = convert_fragment<Element>(s);  // the PV GEMM has read the previous P
      // Rows keep their reference maximum most of the time: the warp skips O's rescale unless one
      // of its rows moved.
      bool const rescale = __any_sync(0xffffffff, moved);
      pipes.v.consumer_release(state.v);
      ++state.v;
      if (rescale) Softmax::scale_rows(o_rc, correction);
    };
    for (--n; n >= tile.n_block_min; --n) {
      if constexpr (Traits::kPingPong) {
        if (is_masked(n)) {
          step(n, true);
        } else {
          step(n, false);
        }
      } else {
        step(n, is_masked(n));
      }
    }

    pipes.v.consumer_wait(state.v);
    turns.wait();
    if (first_pv) {
      top_block_pv(state.v.index());
    } else {
      warpgroup_gemm<false, -1>(mma_pv, p_a, tOrV(_, _, _, state.v.index()), o);
    }
    turns.pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(o);
    pipes.v.consumer_release(state.v);
    ++state.v;
  }

  // What a warpgroup without rows does for one tile: as many turns as mma() takes (one per key
  // block and one for the last PV GEMM) and every K/V stage waited for and released in mma()'s
  // order, since the pipelines count on each consumer thread's release of each stage.
  template <class QDone>
  CUTE_DEVICE static void keep_step(Pipelines& pipes, ConsumerState& state, TileInfo const& tile,
                                    TurnTaking<Traits::kPingPong> const& turns,
                                    QDone const& q_done) {
    for (int n = tile.n_block_max - 1; n >= tile.n_block_min; --n) {
      turns.wait();
      turns.pass();
      pipes.k.consumer_wait(state.k);
      pipes.k.consumer_release(state.k);
      ++state.k;
      if (n == tile.n_block_min) q_done();
      if (n < tile.n_block_max - 1) {
        pipes.v.consumer_wait(state.v);
        pipes.v.consumer_release(state.v);
        ++state.v;
      }
    }
    turns.wait();
    turns.pass();
    pipes.v.consumer_wait(state.v);
    pipes.v.consumer_release(state.v);
    ++state.v;
  }

  // kOInV: after the epilogue, once its stores have read O from V's buffer; the next tile's V
  // may then be loaded into it, in this CTA and (through multicast) in the cluster's others.
  CUTE_DEVICE static void release_o(SharedStorage& smem) {
    if constexpr (kClusterM == 1) {
      smem.bar_o_free.arrive();
    } else {
      CUTE_UNROLL
      for (int cta = 0; cta < kClusterM; ++cta) smem.bar_o_free.arrive(cta, true);
    }
  }

 private:
  // Volatile, as is the barrier's arrive that follows: the write stays before it.
  CUTE_DEVICE static void publish_work(SharedStorage& smem, int tiles, int m_block, int head,
                                       int batch) {
    asm volatile("st.volatile.shared.v4.s32 [%0], {%1, %2, %3, %4};"
                 :
                 : "r"(cute::cast_smem_ptr_to_uint(smem.work[tiles & 1])), "r"(m_block), "r"(head),
                   "r"(batch), "r"(0));
  }
};

}  // namespace flashcute::sm90

// The SM80-family backward's main kernel: one thread block owns one key block of one KV head and
// accumulates its dK and dV in registers over every query block that sees it, for every query
// head of the KV head's group (so GQA sums need no atomics and no per-query-head copies). Per
// (query head, query block):
//   wait for Q and dO (and start loading the next pair's); S, dP, P and dS (score_gradients);
//   dV += P^T dO; with kAccumulateDq, dQ = dS K added to its fp32 accumulator block with
//   atomics (the deterministic path computes dQ in dq_kernel instead); dK += dS^T Q.
// The atomic kernel is compiled twice: the plain one (kPlain) serves launches without score
// modifiers whose head_dim fills the padded bucket, with no modifier pass and no column
// predicate in its main loop; the other serves everything.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/backward_params.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/score_modifiers.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/sm80/backward/gradient_store.cuh"
#include "kernels/sm80/backward/score_gradients.cuh"
#include "kernels/sm80/fragment_layouts.cuh"
#include "kernels/sm80/gemm.cuh"
#include "kernels/sm80/predicated_copy.cuh"

namespace flashcute::sm80::backward {

template <class Traits, bool kAccumulateDq, bool kPlain>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    dkdv_kernel(const __grid_constant__ BackwardParams params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStagesQ;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  int const tid = int(threadIdx.x);

  int const n_block = blockIdx.x;
  int const head_kv = blockIdx.y;
  SequenceInfo<> const seq(params.sequences(), blockIdx.z);
  int const key_begin = n_block * kBlockN;
  if (key_begin >= seq.seqlen_k) return;  // variable length: this sequence is shorter
  AttentionMask const mask(seq.seqlen_q, seq.seqlen_k, params.bottom_right, params.window_left,
                           params.window_right);
  BlockRange const blocks = mask.query_blocks<kBlockM, kBlockN>(n_block);
  MaskedBlocks const masked = mask.masked_query_blocks<kBlockM, kBlockN>(n_block);
  int const group = params.heads_per_kv_head;
  int const steps = max(blocks.end - blocks.begin, 0) * group;

  extern __shared__ char smem[];
  Element* const base = reinterpret_cast<Element*>(smem);
  constexpr int kQElems = kBlockM * kHeadDim;
  // Stage s of Q and of dO.
  const auto sQ = [&](int stage) {
    return make_tensor(make_smem_ptr(base + stage * kQElems), typename Traits::SmemLayoutQ{});
  };
  const auto sdO = [&](int stage) {
    return make_tensor(make_smem_ptr(base + (kStages + stage) * kQElems),
                       typename Traits::SmemLayoutQ{});
  };
  Tensor sK =
      make_tensor(make_smem_ptr(base + 2 * kStages * kQElems), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});
  Tensor sP = make_tensor(sV.data() + size(sV), typename Traits::SmemLayoutP{});
  Tensor sdS = make_tensor(sP.data() + size(sP), typename Traits::SmemLayoutP{});

  // Global views of the key block and of the whole query sequence (query head chosen per step).
  auto k_ptr = make_gmem_ptr(
      static_cast<const Element*>(params.k) +
      seq.k_offset(params.k_batch_stride, params.k_row_stride, params.k_head_stride, head_kv));
  auto v_ptr = make_gmem_ptr(
      static_cast<const Element*>(params.v) +
      seq.k_offset(params.v_batch_stride, params.v_row_stride, params.v_head_stride, head_kv));
  Tensor gK = local_tile(make_tensor(k_ptr, make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                                     make_stride(params.k_row_stride, _1{})),
                         TileKV{}, make_coord(n_block, 0));
  Tensor gV = local_tile(make_tensor(v_ptr, make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                                     make_stride(params.v_row_stride, _1{})),
                         TileKV{}, make_coord(n_block, 0));
  const auto query_tile = [&](const void* ptr, int64_t batch_stride, int64_t row_stride,
                              int64_t head_stride, int head, int m_block) {
    auto p = make_gmem_ptr(static_cast<const Element*>(ptr) +
                           seq.q_offset(batch_stride, row_stride, head_stride, head));
    return local_tile(
        make_tensor(p, make_shape(seq.seqlen_q, Int<kHeadDim>{}), make_stride(row_stride, _1{})),
        TileQ{}, make_coord(m_block, 0));
  };

  typename Traits::GmemTiledCopy gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(TileQ{}));
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(TileKV{}));
  Tensor col_ok = make_tensor<bool>(make_shape(size<2>(tQcQ)));
  CUTE_UNROLL
  for (int k = 0; k < size(col_ok); ++k) {
    col_ok(k) = kPlain || int(get<1>(tQcQ(0, 0, k))) < params.head_dim;
  }

  // The steps visit the query blocks of one query head in order, then those of the next head;
  // the cursor advances by a compare rather than a division per step.
  struct Cursor {
    int head, m_block;
  };
  const auto advance = [&](Cursor c) {
    return ++c.m_block == blocks.end ? Cursor{c.head + 1, blocks.begin} : c;
  };
  const auto load_query_pair = [&](Cursor c, int stage) {
    int const rows = seq.seqlen_q - c.m_block * kBlockM;
    const auto load = [&](auto check_rows) {
      constexpr bool kCheckRows = decltype(check_rows)::value;
      copy_tile_in<kCheckRows>(
          gmem_copy,
          gmem_thr.partition_S(query_tile(params.q, params.q_batch_stride, params.q_row_stride,
                                          params.q_head_stride, c.head, c.m_block)),
          gmem_thr.partition_D(sQ(stage)), tQcQ, col_ok, rows);
      copy_tile_in<kCheckRows>(gmem_copy,
                               gmem_thr.partition_S(query_tile(
                                   params.dout, params.dout_batch_stride, params.dout_row_stride,
                                   params.dout_head_stride, c.head, c.m_block)),
                               gmem_thr.partition_D(sdO(stage)), tQcQ, col_ok, rows);
    };
    // Only the sequence's last query block has rows to zero-fill.
    if (rows >= kBlockM) {
      load(cute::false_type{});
    } else {
      load(cute::true_type{});
    }
  };
  Cursor const first{head_kv * group, blocks.begin};

  typename Traits::TiledMmaDkv mma_kv;
  auto thr_kv = mma_kv.get_thread_slice(tid);
  Tensor acc_dk = partition_fragment_C(mma_kv, TileKV{});
  Tensor acc_dv = partition_fragment_C(mma_kv, TileKV{});
  clear(acc_dk);
  clear(acc_dv);

  if (steps > 0) {
    int const key_rows = seq.seqlen_k - key_begin;
    copy_tile_in<true>(gmem_copy, gmem_thr.partition_S(gK), gmem_thr.partition_D(sK), tKVcKV,
                       col_ok, key_rows);
    copy_tile_in<true>(gmem_copy, gmem_thr.partition_S(gV), gmem_thr.partition_D(sV), tKVcKV,
                       col_ok, key_rows);
    if constexpr (kStages > 1) load_query_pair(first, 0);
    cp_async_fence();
  }

  // dV += P^T dO and dK += dS^T Q read P, dS, dO and Q transposed.
  Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutPt{});
  Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutPt{});
  Tensor frag_pt = thr_kv.partition_fragment_A(
      make_tensor(sP.data().get(), typename Traits::SmemLayoutPtNoSwizzle{}));
  Tensor frag_qt =
      thr_kv.partition_fragment_B(make_tensor(base, typename Traits::SmemLayoutQtNoSwizzle{}));
  auto copy_kv_a = make_tiled_copy_A(typename Traits::SmemCopyAtomTransposed{}, mma_kv);
  auto copy_kv_b = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_kv);
  auto thr_copy_kv_a = copy_kv_a.get_thread_slice(tid);
  auto thr_copy_kv_b = copy_kv_b.get_thread_slice(tid);

  const auto step = [&](int i, Cursor c, Cursor next, auto masked_step)
      __attribute__((always_inline)) {
    constexpr bool kMasked = decltype(masked_step)::value;
    int const stage = kStages > 1 ? i % kStages : 0;
    int const head = c.head;
    int const row0 = c.m_block * kBlockM;
    cp_async_wait<0>();
    __syncthreads();  // this pair has landed; the last step no longer reads P, dS or the stage
    if constexpr (kStages > 1) {
      if (i + 1 < steps) {
        load_query_pair(next, (i + 1) % kStages);
        cp_async_fence();
      }
    } else {
      load_query_pair(c, 0);
      cp_async_fence();
      cp_async_wait<0>();
      __syncthreads();
    }
    Tensor sQi = sQ(stage);
    Tensor sdOi = sdO(stage);
    auto const stats = load_row_stats<Traits>(params, seq, head, row0);
    ScoreTransform<!kPlain> const transform(params, blockIdx.z, head);  // ALiBi's slope is per head
    score_gradients<Traits, kMasked, true>(sQi, sK, sdOi, sV, sP, sdS, stats, transform, mask, row0,
                                           key_begin);
    __syncthreads();  // P and dS are in shared memory

    Tensor sdOt = make_tensor(sdOi.data(), typename Traits::SmemLayoutQt{});
    Tensor sQt = make_tensor(sQi.data(), typename Traits::SmemLayoutQt{});
    gemm_smem_smem(acc_dv, frag_pt, frag_qt, thr_copy_kv_a.partition_S(sPt),
                   thr_copy_kv_b.partition_S(sdOt), mma_kv, copy_kv_a, copy_kv_b);
    // dQ's atomics go out before dK's GEMM, which runs while they drain.
    if constexpr (kAccumulateDq) {
      accumulate_dq<Traits>(params, seq, head, c.m_block, sdS, sK);
    }
    gemm_smem_smem(acc_dk, frag_pt, frag_qt, thr_copy_kv_a.partition_S(sdSt),
                   thr_copy_kv_b.partition_S(sQt), mma_kv, copy_kv_a, copy_kv_b);
  };
  Cursor c = first;
  for (int i = 0; i < steps; ++i) {
    Cursor const next = advance(c);
    if (masked.contains(c.m_block)) {
      step(i, c, next, cute::true_type{});
    } else {
      step(i, c, next, cute::false_type{});
    }
    c = next;
  }
  cp_async_wait<0>();

  // dK is the gradient of the scaled scores' keys: scale it.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= params.softmax_scale;
  int const key_rows = seq.seqlen_k - key_begin;
  store_gradient<Traits, typename Traits::TiledMmaDkv, TileKV>(
      acc_dk,
      static_cast<Element*>(params.dk) +
          seq.k_offset(params.dk_batch_stride, params.dk_row_stride, params.dk_head_stride,
                       head_kv) +
          int64_t(key_begin) * params.dk_row_stride,
      params.dk_row_stride, key_rows, params.head_dim);
  store_gradient<Traits, typename Traits::TiledMmaDkv, TileKV>(
      acc_dv,
      static_cast<Element*>(params.dv) +
          seq.k_offset(params.dv_batch_stride, params.dv_row_stride, params.dv_head_stride,
                       head_kv) +
          int64_t(key_begin) * params.dv_row_stride,
      params.dv_row_stride, key_rows, params.head_dim);
}

}  // namespace flashcute::sm80::backward

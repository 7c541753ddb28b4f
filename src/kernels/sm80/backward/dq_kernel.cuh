// The deterministic backward's dQ kernel: one thread block owns one query block of one head and
// sums dQ = dS K over the key blocks it sees in a fixed order, recomputing S, dP and dS there
// (score_gradients) instead of receiving them through atomics. Paired with
// dkdv_kernel<Traits, false>, every gradient is bitwise reproducible.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/backward_params.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/score_modifiers.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/sm80/backward/gradient_store.cuh"
#include "kernels/sm80/backward/score_gradients.cuh"
#include "kernels/sm80/predicated_copy.cuh"

namespace flashcute::sm80::backward {

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    dq_kernel(const __grid_constant__ BackwardParams params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStagesKVDq;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  int const tid = int(threadIdx.x);

  int const m_block = blockIdx.x;
  int const head = blockIdx.y;
  SequenceInfo<> const seq(params.sequences(), blockIdx.z);
  int const row0 = m_block * kBlockM;
  if (row0 >= seq.seqlen_q) return;
  AttentionMask const mask(seq.seqlen_q, seq.seqlen_k, params.bottom_right, params.window_left,
                           params.window_right);
  BlockRange const blocks = mask.key_blocks<kBlockM, kBlockN>(m_block);
  MaskedBlocks const masked = mask.masked_key_blocks<kBlockM, kBlockN>(m_block);
  int const steps = max(blocks.end - blocks.begin, 0);
  int const head_kv = head / params.heads_per_kv_head;

  extern __shared__ char smem[];
  Element* const base = reinterpret_cast<Element*>(smem);
  constexpr int kQElems = kBlockM * kHeadDim;
  constexpr int kKVElems = kBlockN * kHeadDim;
  Tensor sQ = make_tensor(make_smem_ptr(base), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(base + kQElems), typename Traits::SmemLayoutQ{});
  const auto sK = [&](int stage) {
    return make_tensor(make_smem_ptr(base + 2 * kQElems + stage * kKVElems),
                       typename Traits::SmemLayoutKV{});
  };
  const auto sV = [&](int stage) {
    return make_tensor(make_smem_ptr(base + 2 * kQElems + (kStages + stage) * kKVElems),
                       typename Traits::SmemLayoutKV{});
  };
  Tensor sdS = make_tensor(make_smem_ptr(base + 2 * kQElems + 2 * kStages * kKVElems),
                           typename Traits::SmemLayoutP{});

  const auto tile = [&](const void* ptr, int64_t offset, int rows, int64_t row_stride, auto shape,
                        int block) {
    auto p = make_gmem_ptr(static_cast<const Element*>(ptr) + offset);
    return local_tile(
        make_tensor(p, make_shape(rows, Int<kHeadDim>{}), make_stride(row_stride, _1{})), shape,
        make_coord(block, 0));
  };
  Tensor gQ =
      tile(params.q,
           seq.q_offset(params.q_batch_stride, params.q_row_stride, params.q_head_stride, head),
           seq.seqlen_q, params.q_row_stride, TileQ{}, m_block);
  Tensor gdO = tile(
      params.dout,
      seq.q_offset(params.dout_batch_stride, params.dout_row_stride, params.dout_head_stride, head),
      seq.seqlen_q, params.dout_row_stride, TileQ{}, m_block);
  int64_t const k_offset =
      seq.k_offset(params.k_batch_stride, params.k_row_stride, params.k_head_stride, head_kv);
  int64_t const v_offset =
      seq.k_offset(params.v_batch_stride, params.v_row_stride, params.v_head_stride, head_kv);

  typename Traits::GmemTiledCopy gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(TileQ{}));
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(TileKV{}));
  Tensor col_ok = make_tensor<bool>(make_shape(size<2>(tQcQ)));
  CUTE_UNROLL
  for (int k = 0; k < size(col_ok); ++k) col_ok(k) = int(get<1>(tQcQ(0, 0, k))) < params.head_dim;
  const auto load_key_block = [&](int n_block, int stage) {
    int const rows = seq.seqlen_k - n_block * kBlockN;
    copy_tile_in<true>(gmem_copy,
                       gmem_thr.partition_S(tile(params.k, k_offset, seq.seqlen_k,
                                                 params.k_row_stride, TileKV{}, n_block)),
                       gmem_thr.partition_D(sK(stage)), tKVcKV, col_ok, rows);
    copy_tile_in<true>(gmem_copy,
                       gmem_thr.partition_S(tile(params.v, v_offset, seq.seqlen_k,
                                                 params.v_row_stride, TileKV{}, n_block)),
                       gmem_thr.partition_D(sV(stage)), tKVcKV, col_ok, rows);
  };

  typename Traits::TiledMmaDq mma_dq;
  Tensor acc_dq = partition_fragment_C(mma_dq, TileQ{});
  clear(acc_dq);

  if (steps > 0) {
    int const rows = seq.seqlen_q - row0;
    copy_tile_in<true>(gmem_copy, gmem_thr.partition_S(gQ), gmem_thr.partition_D(sQ), tQcQ, col_ok,
                       rows);
    copy_tile_in<true>(gmem_copy, gmem_thr.partition_S(gdO), gmem_thr.partition_D(sdO), tQcQ,
                       col_ok, rows);
    if constexpr (kStages > 1) load_key_block(blocks.begin, 0);
    cp_async_fence();
  }
  auto const stats = load_row_stats<Traits>(params, seq, head, row0);
  ScoreTransform<true> const transform(params, blockIdx.z, head);

  // Key blocks in ascending order: the order of the sums is fixed by the launch alone.
  const auto step = [&](int i, auto masked_step) __attribute__((always_inline)) {
    constexpr bool kMasked = decltype(masked_step)::value;
    int const n_block = blocks.begin + i;
    int const stage = kStages > 1 ? i % kStages : 0;
    cp_async_wait<0>();
    __syncthreads();  // this key block has landed; the last step no longer reads dS or the stage
    if constexpr (kStages > 1) {
      if (i + 1 < steps) {
        load_key_block(n_block + 1, (i + 1) % kStages);
        cp_async_fence();
      }
    } else {
      load_key_block(n_block, 0);
      cp_async_fence();
      cp_async_wait<0>();
      __syncthreads();
    }
    Tensor sKi = sK(stage);
    score_gradients<Traits, kMasked, false>(sQ, sKi, sdO, sV(stage), sdS, sdS, stats, transform,
                                            mask, row0, n_block * kBlockN);
    __syncthreads();  // dS is in shared memory
    dq_gemm<Traits>(acc_dq, sdS, sKi);
  };
  for (int i = 0; i < steps; ++i) {
    if (masked.contains(blocks.begin + i)) {
      step(i, cute::true_type{});
    } else {
      step(i, cute::false_type{});
    }
  }
  cp_async_wait<0>();

  CUTE_UNROLL
  for (int i = 0; i < size(acc_dq); ++i) acc_dq(i) *= params.softmax_scale;
  store_gradient<Traits, typename Traits::TiledMmaDq, TileQ>(
      acc_dq,
      static_cast<Element*>(params.dq) +
          seq.q_offset(params.dq_batch_stride, params.dq_row_stride, params.dq_head_stride, head) +
          int64_t(row0) * params.dq_row_stride,
      params.dq_row_stride, seq.seqlen_q - row0, params.head_dim);
}

}  // namespace flashcute::sm80::backward

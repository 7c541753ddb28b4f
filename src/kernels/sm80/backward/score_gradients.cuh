// What both SM80-family backward kernels compute for one (query block, key block) pair: the
// scores S = Q K^T and dP = dO V^T, then P = exp2(S' - lse) (S' the scores after scale, softcap,
// ALiBi and mask, in the exp2 domain) and dS = P (dP - rowsum(dO O)), times the softcap's slope.
// P and dS go to shared memory in the input type, where the next GEMMs read them (transposed for
// dK and dV). dS here is the gradient of the scaled score: the callers multiply by softmax_scale.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/backward_params.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/online_softmax.hpp"
#include "kernels/common/score_modifiers.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/sm80/fragment_layouts.cuh"
#include "kernels/sm80/gemm.cuh"

namespace flashcute::sm80::backward {

// A query block's per-row values for the rows this thread holds in the S accumulator.
template <int kRows>
struct RowStats {
  float lse_log2[kRows];  // +inf for rows past the sequence: their P is 0
  float dout_dot_out[kRows];
};

template <class Traits>
struct ScoreTile {
  using Shape = cute::Shape<cute::Int<Traits::kBlockM>, cute::Int<Traits::kBlockN>>;
  using Coords =
      decltype(rowcol_view(typename Traits::TiledMmaSdP{}.get_thread_slice(0).partition_C(
          cute::make_identity_tensor(Shape{}))));
  static constexpr int kRows = decltype(cute::size<0>(std::declval<Coords>()))::value;

  // (row, col) of each score this thread holds, within the tile.
  static __device__ auto coords() {
    return rowcol_view(typename Traits::TiledMmaSdP{}
                           .get_thread_slice(int(threadIdx.x))
                           .partition_C(cute::make_identity_tensor(Shape{})));
  }
};

template <class Traits>
__device__ RowStats<ScoreTile<Traits>::kRows> load_row_stats(const BackwardParams& p,
                                                             const SequenceInfo<>& seq, int head,
                                                             int row0) {
  using namespace cute;
  RowStats<ScoreTile<Traits>::kRows> stats;
  auto const coords = ScoreTile<Traits>::coords();
  int64_t const base =
      seq.batch * p.lse_batch_stride + head * p.lse_head_stride + seq.q_start + row0;
  float const* const lse = p.lse + base;
  float const* const dout_dot_out = p.dout_dot_out + base;
  int const rows = seq.seqlen_q - row0;
  CUTE_UNROLL
  for (int r = 0; r < ScoreTile<Traits>::kRows; ++r) {
    int const row = int(get<0>(coords(r, 0)));
    bool const valid = row < rows;
    stats.lse_log2[r] = valid ? lse[row] * kLog2e : INFINITY;
    stats.dout_dot_out[r] = valid ? dout_dot_out[row] : 0.f;
  }
  return stats;
}

// sP is written only when kWriteP (the dK/dV kernel needs P for dV; the dQ kernel does not).
// Transform: a ScoreTransform, without modifier passes when the launch has no score modifiers.
template <class Traits, bool kMasked, bool kWriteP, class SmemQ, class SmemK, class SmemDo,
          class SmemV, class SmemP, class SmemDs, int kRows, class Transform>
__device__ void score_gradients(SmemQ const& sQ, SmemK const& sK, SmemDo const& sdO,
                                SmemV const& sV, SmemP& sP, SmemDs& sdS,
                                const RowStats<kRows>& stats, const Transform& transform,
                                const AttentionMask& mask, int row0, int col0) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Shape = typename ScoreTile<Traits>::Shape;
  int const tid = int(threadIdx.x);
  typename Traits::TiledMmaSdP mma;
  auto thr_mma = mma.get_thread_slice(tid);
  auto copy_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma);
  auto copy_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma);
  auto thr_copy_a = copy_a.get_thread_slice(tid);
  auto thr_copy_b = copy_b.get_thread_slice(tid);

  Tensor acc_s = partition_fragment_C(mma, Shape{});
  Tensor acc_dp = partition_fragment_C(mma, Shape{});
  clear(acc_s);
  clear(acc_dp);
  {
    Tensor frag_q = thr_mma.partition_fragment_A(sQ);
    Tensor frag_k = thr_mma.partition_fragment_B(sK);
    gemm_smem_smem(acc_s, frag_q, frag_k, thr_copy_a.partition_S(sQ), thr_copy_b.partition_S(sK),
                   mma, copy_a, copy_b);
  }
  {
    Tensor frag_do = thr_mma.partition_fragment_A(sdO);
    Tensor frag_v = thr_mma.partition_fragment_B(sV);
    gemm_smem_smem(acc_dp, frag_do, frag_v, thr_copy_a.partition_S(sdO), thr_copy_b.partition_S(sV),
                   mma, copy_a, copy_b);
  }

  Tensor scores = rowcol_view(acc_s);
  Tensor grads = rowcol_view(acc_dp);
  auto const coords = ScoreTile<Traits>::coords();
  transform.apply<kMasked>(scores, coords, row0, col0, mask);
  float const multiplier = transform.exp2_multiplier();
  bool const capped = transform.has_softcap();
  CUTE_UNROLL
  for (int r = 0; r < size<0>(scores); ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(scores); ++c) {
      float const score = scores(r, c);
      float const p = fast_exp2(score * multiplier - stats.lse_log2[r]);
      float ds = p * (grads(r, c) - stats.dout_dot_out[r]);
      // A hidden score is infinite: its slope is not taken (its P, and so its dS, is 0).
      if (capped && p != 0.f) {
        ds *= transform.softcap_slope(score, row0 + int(get<0>(coords(r, c))),
                                      col0 + int(get<1>(coords(r, c))), mask);
      }
      scores(r, c) = p;
      grads(r, c) = ds;
    }
  }

  auto store = make_tiled_copy_C(typename Traits::SmemCopyAtomStore{}, mma);
  auto thr_store = store.get_thread_slice(tid);
  if constexpr (kWriteP) {
    Tensor probs = make_tensor<Element>(acc_s.layout());
    convert_fragment(acc_s, probs);
    copy(store, thr_store.retile_S(probs), thr_store.partition_D(sP));
  }
  Tensor dscores = make_tensor<Element>(acc_dp.layout());
  convert_fragment(acc_dp, dscores);
  copy(store, thr_store.retile_S(dscores), thr_store.partition_D(sdS));
}

}  // namespace flashcute::sm80::backward

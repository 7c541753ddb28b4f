// The SM80-family forward kernel: one thread block computes one (query block, head, batch) tile.
//
// Per key block (the masked ones first, then the rest from the top down):
//   wait for K; start loading V; S = Q K^T (overlaps V's load); scale, bias and mask S;
//   wait for V; start loading the next K; online softmax; O += P V (overlaps K's load).
// K and V are single-buffered: the two barriers per iteration also guard their reuse.
//
// The automatic tile of each bucket is compiled twice. The plain kernel (kPlain) serves launches
// that fit it (fits_plain_kernel: no score modifier, a positive scale, a head_dim that fills the
// padded bucket): no modifier pass, column predicate, zero fill of padding columns or branch on
// the scale's sign reaches its main loop. The other kernel serves everything.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/mask.hpp"
#include "kernels/common/online_softmax.hpp"
#include "kernels/common/params.hpp"
#include "kernels/common/score_modifiers.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/sm80/fragment_layouts.cuh"
#include "kernels/sm80/gemm.cuh"
#include "kernels/sm80/predicated_copy.cuh"

namespace flashcute::sm80 {

// The row maximum follows the scores exactly, over one chain; the general kernel takes a scale of
// either sign, the plain one only a positive scale (fits_plain_kernel), so its rows need no branch.
template <bool kPlain>
using SoftmaxPolicySm80 = SoftmaxPolicy<1, 0, !kPlain>;

template <class Traits, bool kPlain>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    forward_kernel(const __grid_constant__ AttentionParams params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;

  // The last query blocks carry the most keys under a causal mask: start them first.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const SequenceInfo<> seq(params.sequences(), batch);
  const int row_begin = m_block * kBlockM;
  if (row_begin >= seq.seqlen_q) return;  // variable length: this sequence is shorter
  const AttentionMask mask(seq.seqlen_q, seq.seqlen_k, params.bottom_right, params.window_left,
                           params.window_right);
  const BlockRange blocks = mask.key_blocks<kBlockM, kBlockN>(m_block);
  const MaskedBlocks masked = mask.masked_key_blocks<kBlockM, kBlockN>(m_block);

  extern __shared__ char smem[];
  Tensor sQ =
      make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
  Tensor sVtNoSwizzle = make_tensor(sV.data().get(), typename Traits::SmemLayoutVtNoSwizzle{});
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutQ{});  // Q's buffer, reused

  // Global views; columns past head_dim exist only in the padded tile and are predicated off.
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  const int head_kv = head / params.heads_per_kv_head;
  auto q_ptr = make_gmem_ptr(
      static_cast<const Element*>(params.q) +
      seq.q_offset(params.q_batch_stride, params.q_row_stride, params.q_head_stride, head));
  auto k_ptr = make_gmem_ptr(
      static_cast<const Element*>(params.k) +
      seq.k_offset(params.k_batch_stride, params.k_row_stride, params.k_head_stride, head_kv));
  auto v_ptr = make_gmem_ptr(
      static_cast<const Element*>(params.v) +
      seq.k_offset(params.v_batch_stride, params.v_row_stride, params.v_head_stride, head_kv));
  auto o_ptr = make_gmem_ptr(
      static_cast<Element*>(params.o) +
      seq.q_offset(params.o_batch_stride, params.o_row_stride, params.o_head_stride, head));
  Tensor gQ = local_tile(make_tensor(q_ptr, make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                                     make_stride(params.q_row_stride, _1{})),
                         TileQ{}, make_coord(m_block, 0));
  Tensor gO = local_tile(make_tensor(o_ptr, make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                                     make_stride(params.o_row_stride, _1{})),
                         TileQ{}, make_coord(m_block, 0));
  Tensor gK = local_tile(make_tensor(k_ptr, make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                                     make_stride(params.k_row_stride, _1{})),
                         TileKV{}, make_coord(_, 0));  // (n, d, key block)
  Tensor gV = local_tile(make_tensor(v_ptr, make_shape(seq.seqlen_k, Int<kHeadDim>{}),
                                     make_stride(params.v_row_stride, _1{})),
                         TileKV{}, make_coord(_, 0));

  typename Traits::GmemTiledCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(int(threadIdx.x));
  Tensor tQgQ = gmem_thr.partition_S(gQ);
  Tensor tQsQ = gmem_thr.partition_D(sQ);
  Tensor tKgK = gmem_thr.partition_S(gK);
  Tensor tKsK = gmem_thr.partition_D(sK);
  Tensor tVgV = gmem_thr.partition_S(gV);
  Tensor tVsV = gmem_thr.partition_D(sV);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(TileQ{}));
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(TileKV{}));
  // Q and K/V tiles share the column partition, so one column predicate serves both.
  Tensor col_ok = make_tensor<bool>(make_shape(size<2>(tQsQ)));
  CUTE_UNROLL
  for (int k = 0; k < size(col_ok); ++k) {
    col_ok(k) = kPlain || int(get<1>(tQcQ(0, 0, k))) < params.head_dim;
  }

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(int(threadIdx.x));
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSrK = thr_mma.partition_fragment_B(sK);
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);
  Tensor acc_o = partition_fragment_C(tiled_mma, TileQ{});
  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  Tensor tSsQ = smem_copy_q.get_thread_slice(int(threadIdx.x)).partition_S(sQ);
  Tensor tSsK = smem_copy_k.get_thread_slice(int(threadIdx.x)).partition_S(sK);
  Tensor tOsVt = smem_copy_v.get_thread_slice(int(threadIdx.x)).partition_S(sVt);
  // (row, col) of each score this thread holds, for masks and ALiBi.
  Tensor score_coords =
      rowcol_view(thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{})));

  // Visiting order: the blocks that need element masks first (the sequence residue and the
  // causal or right-window diagonal at the top of the range, the left-window edge at its bottom),
  // then the unmasked middle from the top down. Any order is valid for the online softmax;
  // ending on the unmasked blocks keeps the masking state dead, and its registers free, in the
  // hot loop.
  const auto needs_mask = [&](int n) { return masked.contains(n); };
  const int num_blocks = max(blocks.end - blocks.begin, 0);
  int masked_top = 0;
  while (masked_top < num_blocks && needs_mask(blocks.end - 1 - masked_top)) ++masked_top;
  int masked_bottom = 0;
  while (masked_bottom < num_blocks - masked_top && needs_mask(blocks.begin + masked_bottom)) {
    ++masked_bottom;
  }
  const int num_masked = masked_top + masked_bottom;
  const auto block_at = [&](int i) {
    if (i < masked_top) return blocks.end - 1 - i;
    if (i < num_masked) return blocks.begin + (i - masked_top);
    return blocks.end - 1 - masked_top - (i - num_masked);
  };

  const auto valid_key_rows = [&](int key_block) { return seq.seqlen_k - key_block * kBlockN; };
  copy_tile_in<true>(gmem_copy, tQgQ, tQsQ, tQcQ, col_ok, seq.seqlen_q - row_begin);
  if (num_blocks > 0) {
    copy_tile_in<true>(gmem_copy, tKgK(_, _, _, block_at(0)), tKsK, tKVcKV, col_ok,
                       valid_key_rows(block_at(0)));
  }
  cp_async_fence();

  clear(acc_o);
  Tensor acc_o_rows = rowcol_view(acc_o);
  constexpr int kRowsPerThread = decltype(size<0>(acc_o_rows))::value;
  OnlineSoftmax<kRowsPerThread, SoftmaxPolicySm80<kPlain>> softmax;
  softmax.init();
  const ScoreTransform<!kPlain> transform(params, batch, head);

  // One key block, n, then the prefetch of the next one's K (none when next < 0). Masked steps
  // check every score and the key rows they load; the others, the bulk of a long sequence, carry
  // neither cost (an unmasked block is never the partial last one).
  // Forced inline: outlined (as ptxas chose for the widest tiles), the accumulators would pass
  // through local memory on every call.
  const auto key_block_step = [&](int n, int next, auto masked) __attribute__((always_inline)) {
    constexpr bool kMasked = decltype(masked)::value;
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    cp_async_wait<0>();  // K (and, on the first pass, Q) has landed
    __syncthreads();     // ... for every thread, and the last P.V no longer reads V
    copy_tile_in<kMasked>(gmem_copy, tVgV(_, _, _, n), tVsV, tKVcKV, col_ok, valid_key_rows(n));
    cp_async_fence();

    gemm_smem_smem(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_copy_q, smem_copy_k);
    Tensor scores = rowcol_view(acc_s);
    transform.template apply<kMasked>(scores, score_coords, row_begin, n * kBlockN, mask);

    cp_async_wait<0>();  // V has landed
    __syncthreads();     // ... and no thread still reads K
    if (next >= 0) {
      copy_tile_in<kMasked>(gmem_copy, tKgK(_, _, _, next), tKsK, tKVcKV, col_ok,
                            valid_key_rows(next));
      cp_async_fence();
    }

    float correction[kRowsPerThread];
    // Once a row has met its largest scores the maximum stops moving: skip the rescale then.
    if (__any_sync(0xffffffff, softmax.update(scores, transform.exp2_multiplier(), correction))) {
      softmax.scale_rows(acc_o_rows, correction);
    }
    Tensor probs = make_tensor<Element>(acc_s.layout());
    convert_fragment(acc_s, probs);
    Tensor probs_a = make_tensor(probs.data(), accumulator_as_a_operand_layout(probs.layout()));
    gemm_regs_smem(acc_o, probs_a, tOrVt, tOsVt, tiled_mma, smem_copy_v);
  };
  for (int i = 0; i < num_masked; ++i) {
    key_block_step(block_at(i), i + 1 < num_blocks ? block_at(i + 1) : -1, cute::true_type{});
  }
  for (int n = blocks.end - 1 - masked_top, i = num_masked; i < num_blocks; --n, ++i) {
    key_block_step(n, i + 1 < num_blocks ? n - 1 : -1, cute::false_type{});
  }

  float inv_sum[kRowsPerThread], lse[kRowsPerThread];
  softmax.finish(inv_sum, lse);
  softmax.scale_rows(acc_o_rows, inv_sum);

  // O leaves through shared memory so the global stores are 16-byte vectors.
  Tensor o_regs = make_tensor<Element>(acc_o.layout());
  convert_fragment(acc_o, o_regs);
  auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_o = smem_copy_o.get_thread_slice(int(threadIdx.x));
  cp_async_wait<0>();  // Q's load is still pending when no key block was visited
  __syncthreads();     // every warp is done reading Q's buffer
  copy(smem_copy_o, smem_thr_o.retile_S(o_regs), smem_thr_o.partition_D(sO));
  __syncthreads();
  typename Traits::GmemTiledCopyO gmem_copy_o;
  auto gmem_thr_o = gmem_copy_o.get_thread_slice(int(threadIdx.x));
  Tensor tOsO = gmem_thr_o.partition_S(sO);
  Tensor tOgO = gmem_thr_o.partition_D(gO);
  Tensor tOrO = make_tensor<Element>(shape(tOgO));
  copy(gmem_copy_o, tOsO, tOrO);
  copy_tile_out(gmem_copy_o, tOrO, tOgO, tQcQ, col_ok, seq.seqlen_q - row_begin);

  if (params.lse != nullptr) {
    Tensor o_coords = rowcol_view(thr_mma.partition_C(make_identity_tensor(TileQ{})));
    // Packed: (heads, total_q) with the batch stride 0, so the token index places the row.
    const int64_t lse_offset =
        seq.batch * params.lse_batch_stride + head * params.lse_head_stride + seq.q_start;
    if (get<1>(o_coords(0, 0)) == 0) {  // one thread of each quad writes the quad's rows
      CUTE_UNROLL
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int row = row_begin + get<0>(o_coords(r, 0));
        if (row < seq.seqlen_q) params.lse[lse_offset + row] = lse[r];
      }
    }
  }
}

}  // namespace flashcute::sm80

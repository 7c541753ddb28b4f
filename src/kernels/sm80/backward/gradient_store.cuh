// Gradients leaving registers: dQ's GEMM (dQ += dS K, shared by both backward kernels), its
// atomic sum into the fp32 accumulator, and the final store of a gradient tile in the input type.
#pragma once

#include <cutlass/array.h>
#include <cute/tensor.hpp>

#include "kernels/common/backward_params.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/sm80/gemm.cuh"

namespace flashcute::sm80::backward {

// acc (a TiledMmaDq accumulator of kBlockM x kHeadDim) += dS K.
template <class Traits, class Acc, class SmemDs, class SmemK>
__device__ void dq_gemm(Acc& acc, SmemDs const& sdS, SmemK const& sK) {
  using namespace cute;
  int const tid = int(threadIdx.x);
  typename Traits::TiledMmaDq mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});
  Tensor frag_ds = thr_mma.partition_fragment_A(sdS);
  Tensor frag_kt = thr_mma.partition_fragment_B(
      make_tensor(sK.data().get(), typename Traits::SmemLayoutKtNoSwizzle{}));
  auto copy_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma);
  auto copy_b = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma);
  gemm_smem_smem(acc, frag_ds, frag_kt, copy_a.get_thread_slice(tid).partition_S(sdS),
                 copy_b.get_thread_slice(tid).partition_S(sKt), mma, copy_a, copy_b);
}

// This query block's share of dQ / softmax_scale, added to its accumulator block
// (Traits::DqBlocks, register order: no row or column needs a check, padding rows and columns
// add zeros).
template <class Traits, class SmemDs, class SmemK>
__device__ void accumulate_dq(const BackwardParams& p, const SequenceInfo<>& seq, int head,
                              int m_block, SmemDs const& sdS, SmemK const& sK) {
  using namespace cute;
  using TileQ = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>;
  Tensor acc = partition_fragment_C(typename Traits::TiledMmaDq{}, TileQ{});
  clear(acc);
  dq_gemm<Traits>(acc, sdS, sK);
  using DqBlocks = typename Traits::DqBlocks;
  DqBlocks::add(DqBlocks::block(p, seq, int(blockIdx.z), head, m_block), acc, int(threadIdx.x));
}

// Writes an fp32 accumulator of TiledMma over Tile to dst (row-major, row_stride) in the input
// type, rows below valid_rows and columns below valid_cols only. An mma.sync accumulator holds
// column pairs, stored as one 4-byte word (head_dim and row strides are even).
template <class Traits, class TiledMma, class Tile, class Acc>
__device__ void store_gradient(Acc const& acc, typename Traits::Element* dst, int64_t row_stride,
                               int valid_rows, int valid_cols) {
  using namespace cute;
  using Pair = cutlass::AlignedArray<typename Traits::Element, 2, 4>;
  Tensor coords =
      TiledMma{}.get_thread_slice(int(threadIdx.x)).partition_C(make_identity_tensor(Tile{}));
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    int const row = int(get<0>(coords(i))), col = int(get<1>(coords(i)));
    if (row < valid_rows && col < valid_cols) {
      Pair pair;
      pair[0] = typename Traits::Element(acc(i));
      pair[1] = typename Traits::Element(acc(i + 1));
      *reinterpret_cast<Pair*>(dst + row * row_stride + col) = pair;
    }
  }
}

}  // namespace flashcute::sm80::backward

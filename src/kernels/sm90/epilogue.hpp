// The epilogue of one consumer warpgroup: normalise O, write the log-sum-exp, stage O in shared
// memory (O's own buffer, or else the warpgroup's own rows of Q's buffer, free once its last
// QK^T finished) and copy it out with 16-byte stores, skipping rows past the sequence's seqlen_q
// (in a packed batch they are the next sequence's) and columns past head_dim. When O borrowed Q's
// buffer, the copy-out is what frees Q for the next tile.
#pragma once

#include <cutlass/arch/barrier.h>

#include "kernels/sm90/fragment.hpp"
#include "kernels/sm90/tile_info.hpp"
#include "kernels/sm90/traits.hpp"

namespace flashcute::sm90 {

template <class Traits, class Params>
struct Epilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDim = Traits::kHeadDim;

  template <class FragO, class Softmax>
  CUTE_DEVICE static void run(Params const& p, typename Traits::SharedStorage& smem,
                              TileInfo const& tile, int head, int thread, FragO& o,
                              Softmax& softmax) {
    typename Traits::TiledMmaPV mma_pv;
    auto thr_pv = mma_pv.get_thread_slice(thread);
    Tensor o_rc = rowcol_view(o);
    Tensor coords = rowcol_view(thr_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{})));
    constexpr int kRows = decltype(size<0>(o_rc))::value;

    float inv_sum[kRows], lse[kRows];
    softmax.finish(inv_sum, lse);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= inv_sum[r];
    }

    int const row0 = tile.m_block * kBlockM;
    if (p.lse != nullptr && thread % 4 == 0) {
      // Packed: (heads, total_q) with the batch stride 0, so the token index places the row.
      float* lse_ptr = p.lse + tile.batch * p.lse_batch_stride + head * p.lse_head_stride +
                       tile.q_start;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        int row = row0 + get<0>(coords(r, 0));
        if (row < tile.seqlen_q) lse_ptr[row] = lse[r];
      }
    }

    // Registers -> shared memory: each thread holds column pairs, written as 4-byte words.
    Tensor out = convert_fragment<Element>(o);
    Tensor out_rc = rowcol_view(out);
    Element* o_smem;
    if constexpr (Traits::kSeparateO) {
      o_smem = smem.o.data();
    } else {
      o_smem = smem.q.data();
    }
    Tensor sO = make_tensor(make_smem_ptr(o_smem), typename Traits::SmemLayoutO{});
    int const warpgroup = thread / 128;
    // The previous tile's copy-out (other threads of this warpgroup) must have read its rows.
    if constexpr (Traits::kSeparateO) cutlass::arch::NamedBarrier::sync(128, 1 + warpgroup);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out_rc); c += 2) {
        auto rc = coords(r, c);
        uint32_t pair;
        Element two[2] = {out_rc(r, c), out_rc(r, c + 1)};
        memcpy(&pair, two, 4);
        *reinterpret_cast<uint32_t*>(&sO(get<0>(rc), get<1>(rc))) = pair;
      }
    }
    cutlass::arch::NamedBarrier::sync(128, 1 + warpgroup);

    // Shared memory -> global: 8 elements (16 bytes) per thread per step; a 16-byte chunk never
    // straddles a swizzle unit, so it is contiguous in shared memory too.
    constexpr int kChunksPerRow = kHeadDim / 8;
    constexpr int kChunks = 64 * kChunksPerRow;
    Element* o_ptr = p.o + tile.batch * p.o_batch_stride + int64_t(tile.q_start) * p.o_row_stride +
                     head * p.o_head_stride;
    int const local = thread % 128;
    CUTE_UNROLL
    for (int i = local; i < kChunks; i += 128) {
      int r = warpgroup * 64 + i / kChunksPerRow;
      int c = (i % kChunksPerRow) * 8;
      int row = row0 + r;
      if (row < tile.seqlen_q && c < p.head_dim) {
        uint4 v = *reinterpret_cast<uint4 const*>(&sO(r, c));
        *reinterpret_cast<uint4*>(o_ptr + row * p.o_row_stride + c) = v;
      }
    }
    if constexpr (!Traits::kSeparateO) {
      // The next tile's Q is written by TMA (the async proxy) over what these reads just saw.
      cutlass::arch::fence_view_async_shared();
      smem.bar_q_free.arrive();
    }
  }
};

}  // namespace flashcute::sm90

// The forward epilogue of one consumer warpgroup: normalise O, write the log-sum-exp, stage O in
// shared memory with stmatrix (O's own buffer, or else V's, once every warpgroup's last PV GEMM
// has read it), and store it. The warpgroup's 64 rows go out with one TMA store, issued by one
// thread and not waited for: TMA clips the rows past the tensor's end and the columns past
// head_dim. In a packed batch that holds only where all 64 rows belong to the sequence (a box
// reaching past its end would overwrite the next sequence's rows): a warpgroup holding the
// sequence's end copies its rows out with 16-byte stores instead.
#pragma once

#include <cutlass/arch/barrier.h>

#include "kernels/common/params.hpp"
#include "kernels/sm90/fragment.hpp"
#include "kernels/sm90/named_barriers.hpp"
#include "kernels/sm90/tile_info.hpp"
#include "kernels/sm90/traits.hpp"

namespace flashcute::sm90 {

// kOwnBuffer: O is staged in a buffer of its own (SharedStorage), else in V's buffer, which the
// caller then releases after store() (the stores have read it by then).
template <class Traits, bool kOwnBuffer>
struct CollectiveEpilogueFwd {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDim = Traits::kHeadDim;

  struct NoBuffer {};
  struct SharedStorage {
    std::conditional_t<kOwnBuffer,
                       cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutO>, 1024>,
                       NoBuffer>
        o;
  };

  struct Arguments {
    Element* o;
    typename Traits::GmemShape shape_o;  // Q's (rows, head_dim, heads, batches)
    typename Traits::GmemStride stride_o;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    float* lse;  // null = not requested
    int64_t lse_batch_stride, lse_head_stride;
    int head_dim;
    bool packed;  // a packed batch: a warpgroup's rows past the sequence's end are not stored
  };

  struct Params {
    typename Traits::TmaO tma_o;
    typename Traits::GmemShape shape_o;
    Element* o;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    float* lse;
    int64_t lse_batch_stride, lse_head_stride;
    int head_dim;
    bool packed;
  };

  // O has Q's shape; a packed batch's descriptor spans the same rows as Q's (the batch stride of
  // an extent of 1: the row stride).
  static Arguments to_arguments(AttentionParams const& a) {
    bool const packed = a.cu_seqlens_q != nullptr;
    Arguments args{};
    args.o = static_cast<Element*>(a.o);
    args.shape_o = {packed ? int(a.total_q) : a.seqlen_q, a.head_dim, a.heads,
                    packed ? 1 : a.batch};
    args.stride_o = {a.o_row_stride, _1{}, a.o_head_stride,
                     packed ? a.o_row_stride : a.o_batch_stride};
    args.o_batch_stride = a.o_batch_stride;
    args.o_row_stride = a.o_row_stride;
    args.o_head_stride = a.o_head_stride;
    args.lse = a.lse;
    args.lse_batch_stride = a.lse_batch_stride;
    args.lse_head_stride = a.lse_head_stride;
    args.head_dim = a.head_dim;
    args.packed = packed;
    return args;
  }

  static Params to_params(Arguments const& a) {
    auto gmem_o = make_tensor(make_gmem_ptr(a.o), make_layout(a.shape_o, a.stride_o));
    Params p{};
    p.tma_o = make_tma_copy(SM90_TMA_STORE{}, gmem_o, typename Traits::SmemLayoutOWarpgroup{},
                            Shape<_64, Int<kHeadDim>>{}, _1{});
    p.shape_o = a.shape_o;
    p.o = a.o;
    p.o_batch_stride = a.o_batch_stride;
    p.o_row_stride = a.o_row_stride;
    p.o_head_stride = a.o_head_stride;
    p.lse = a.lse;
    p.lse_batch_stride = a.lse_batch_stride;
    p.lse_head_stride = a.lse_head_stride;
    p.head_dim = a.head_dim;
    p.packed = a.packed;
    return p;
  }

  CUTE_DEVICE static void prefetch_descriptors(Params const& p) {
    cute::prefetch_tma_descriptor(p.tma_o.get_tma_descriptor());
  }

  // o_smem: the staging buffer (this storage's, or V's).
  template <class FragO, class Softmax>
  CUTE_DEVICE static void store(Params const& p, Element* o_smem, TileInfo const& tile, int head,
                                int thread, FragO& o, Softmax& softmax) {
    typename Traits::TiledMmaPV mma_pv;
    auto thr_pv = mma_pv.get_thread_slice(thread);
    Tensor o_rc = rowcol_view(o);
    Tensor coords =
        rowcol_view(thr_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{})));
    constexpr int kRows = decltype(size<0>(o_rc))::value;

    float inv_sum[kRows], lse[kRows];
    softmax.finish(inv_sum, lse);
    Softmax::scale_rows(o_rc, inv_sum);

    int const row0 = tile.m_block * kBlockM;
    if (p.lse != nullptr && thread % 4 == 0) {
      // Packed: (heads, total_q) with the batch stride 0, so the token index places the row.
      float* lse_ptr =
          p.lse + tile.batch * p.lse_batch_stride + head * p.lse_head_stride + tile.q_start;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        int row = row0 + get<0>(coords(r, 0));
        if (row < tile.seqlen_q) lse_ptr[row] = lse[r];
      }
    }

    // Registers -> shared memory, 16 bytes per row of an 8x8 matrix (stmatrix).
    Tensor sO = make_tensor(make_smem_ptr(o_smem), typename Traits::SmemLayoutO{});
    auto stage_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
    auto thr_stage = stage_o.get_thread_slice(thread);
    Tensor out = convert_fragment<Element>(o);
    Tensor staged_src = thr_stage.retile_S(out);
    Tensor staged_dst = thr_stage.partition_D(sO);
    int const warpgroup = thread / 128;
    // The warpgroup's first row (dense: q_start 0), and whether its 64 rows are all the
    // sequence's. The branch on it holds a barrier of the warpgroup; taken from lane 0, it is
    // uniform to ptxas too (computed per thread, it made ptxas serialise every wgmma of the
    // kernel, warning C7520).
    int const first_row = row0 + warpgroup * 64;
    bool const whole_rows =
        __shfl_sync(0xffffffff, int(!p.packed || first_row + 64 <= tile.seqlen_q), 0) != 0;
    int const first_token = tile.q_start + first_row;
    int const barrier = barrier_id(BarrierId::kEpilogueWarpgroup0, warpgroup);
    bool const store_issuer = thread % 128 == 0;
    if constexpr (kOwnBuffer) {
      // The previous tile's store (TMA or the other threads' copy-out) must have read these rows.
      if (store_issuer) tma_store_wait<0>();
      cutlass::arch::NamedBarrier::sync(128, barrier);
    } else {
      // V's buffer: every warpgroup's last PV GEMM must have read it (O's rows span its stages).
      cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, int(BarrierId::kConsumers));
    }
    copy(stage_o, staged_src, staged_dst);

    if (whole_rows) {
      // The TMA store reads shared memory through the async proxy: make the stmatrix writes
      // visible to it, then let one thread issue the store once the whole warpgroup wrote.
      tma_store_fence();
      cutlass::arch::NamedBarrier::sync(128, barrier);
      if (store_issuer) {
        Tensor mO = domain_offset(make_coord(first_token, _0{}),
                                  p.tma_o.get_tma_tensor(p.shape_o)(_, _, head, tile.batch));
        Tensor gO = local_tile(mO, Shape<_64, Int<kHeadDim>>{}, make_coord(_0{}, _0{}));
        Tensor sO_warpgroup =
            make_tensor(make_smem_ptr(o_smem + warpgroup * Traits::kOWarpgroupOffset),
                        typename Traits::SmemLayoutOWarpgroup{});
        auto [gmem_part, smem_part] = tma_partition(
            p.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO_warpgroup), group_modes<0, 2>(gO));
        copy(p.tma_o, smem_part, gmem_part);
        tma_store_arrive();
        // V's buffer is reloaded (async proxy) once every consumer thread released it.
        if constexpr (!kOwnBuffer) tma_store_wait<0>();
      }
    } else {
      cutlass::arch::NamedBarrier::sync(128, barrier);
      copy_out_packed(p, tile, head, warpgroup, thread % 128, sO);
      // The next tile's V is written by TMA (the async proxy) over what these reads just saw.
      if constexpr (!kOwnBuffer) cutlass::arch::fence_view_async_shared();
    }
  }

  // Before the CTA exits, its last TMA stores must have read shared memory.
  CUTE_DEVICE static void drain(int thread) {
    if (thread % 128 == 0) tma_store_wait<0>();
  }

 private:
  // Shared memory -> global: 8 elements (16 bytes) per thread per step; a 16-byte chunk never
  // straddles a swizzle unit, so it is contiguous in shared memory too.
  template <class SmemO>
  CUTE_DEVICE static void copy_out_packed(Params const& p, TileInfo const& tile, int head,
                                          int warpgroup, int local, SmemO const& sO) {
    constexpr int kChunksPerRow = kHeadDim / 8;
    constexpr int kChunks = 64 * kChunksPerRow;
    int const row0 = tile.m_block * kBlockM;
    Element* o_ptr = p.o + tile.batch * p.o_batch_stride + int64_t(tile.q_start) * p.o_row_stride +
                     head * p.o_head_stride;
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
  }
};

}  // namespace flashcute::sm90

// Host side of one Hopper kernel: which problems it takes, the TMA descriptors, the launch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "api/kernel_registry.hpp"
#include "kernels/common/params.hpp"
#include "kernels/sm90/kernel.hpp"

namespace flashcute::sm90 {

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// TMA needs 16-byte aligned bases and strides; features this family lacks (softcap, ALiBi) go to
// SM80.
template <class Traits>
bool supports(const AttentionParams& p) {
  bool const varlen = p.cu_seqlens_q != nullptr;
  if (varlen != (p.cu_seqlens_k != nullptr)) return false;
  // Packed: Q's TMA descriptor spans total_q tokens, which arrives as the LSE's head stride; a
  // caller that left it 0 (allowed without LSE) goes to SM80.
  if (varlen && (p.lse_head_stride <= 0 || p.lse_head_stride > INT_MAX)) return false;
  if (p.softcap != 0.f || p.alibi_slopes != nullptr) return false;
  if (p.head_dim > Traits::kHeadDim || p.head_dim % 8 != 0) return false;
  if (p.batch <= 0 || p.seqlen_q <= 0 || p.seqlen_k < 0) return false;
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o)) return false;
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.k_row_stride, p.k_head_stride,
                             p.v_row_stride, p.v_head_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides) {
    if (s % 8 != 0) return false;
  }
  // Packed tokens have no batch stride (launch() does not use it).
  if (varlen) return true;
  const int64_t batch_strides[] = {p.q_batch_stride, p.k_batch_stride, p.v_batch_stride,
                                   p.o_batch_stride};
  for (int64_t s : batch_strides) {
    if (s % 8 != 0) return false;
  }
  return true;
}

template <class Traits>
cudaError_t launch(const AttentionParams& a, cudaStream_t stream) {
  using Element = typename Traits::Element;
  using GmemShape = typename Traits::GmemShape;
  using GmemStride = typename Traits::GmemStride;

  // Packed sequences: one batch of all tokens (batch strides unused: the row stride stands in, a
  // valid TMA stride for an extent of 1). Q spans total_q tokens; for K/V only an upper bound
  // of the total is known here, which is enough because no load reads past a sequence's last
  // key (tile_info.hpp).
  bool const varlen = a.cu_seqlens_q != nullptr;
  int const rows_q = varlen ? int(a.lse_head_stride) : a.seqlen_q;
  int const rows_k =
      varlen ? int(std::min<int64_t>(int64_t(a.batch) * a.seqlen_k, INT_MAX)) : a.seqlen_k;
  int const batches = varlen ? 1 : a.batch;
  int64_t const q_batch_stride = varlen ? a.q_row_stride : a.q_batch_stride;
  int64_t const k_batch_stride = varlen ? a.k_row_stride : a.k_batch_stride;
  int64_t const v_batch_stride = varlen ? a.v_row_stride : a.v_batch_stride;
  GmemShape shape_q{rows_q, a.head_dim, a.heads, batches};
  GmemShape shape_k{rows_k, a.head_dim, a.heads_k, batches};
  // With no key every tile is empty and K/V are never read, but a TMA descriptor needs a
  // non-empty tensor: describe Q's instead (the kernel then writes O = 0, LSE = +inf).
  bool const no_keys = a.seqlen_k == 0;
  const void* k_ptr = no_keys ? a.q : a.k;
  const void* v_ptr = no_keys ? a.q : a.v;
  int64_t const k_strides[3] = {no_keys ? a.q_row_stride : a.k_row_stride,
                                no_keys ? a.q_head_stride : a.k_head_stride,
                                no_keys ? q_batch_stride : k_batch_stride};
  int64_t const v_strides[3] = {no_keys ? a.q_row_stride : a.v_row_stride,
                                no_keys ? a.q_head_stride : a.v_head_stride,
                                no_keys ? q_batch_stride : v_batch_stride};
  GmemShape const shape_kv_desc = no_keys ? shape_q : shape_k;
  auto gmem = [](const void* ptr, GmemShape shape, int64_t row, int64_t head, int64_t batch) {
    return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)),
                       make_layout(shape, GmemStride{row, _1{}, head, batch}));
  };
  // O has Q's shape. A packed batch stores O without TMA (a box would overwrite the next
  // sequence's rows), but its descriptor is built all the same, over the same rows as Q's.
  int64_t const o_batch_stride = varlen ? a.o_row_stride : a.o_batch_stride;
  auto gmem_o = make_tensor(
      make_gmem_ptr(static_cast<Element*>(a.o)),
      make_layout(shape_q, GmemStride{a.o_row_stride, _1{}, a.o_head_stride, o_batch_stride}));
  auto box_q = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{};
  auto box_o = Shape<_64, Int<Traits::kHeadDim>>{};  // one consumer warpgroup's rows
  auto box_kv = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{};
  auto smem_kv = take<0, 2>(typename Traits::SmemLayoutKV{});

  KernelParams<Traits> p{
      make_tma_copy(SM90_TMA_LOAD{},
                    gmem(a.q, shape_q, a.q_row_stride, a.q_head_stride, q_batch_stride),
                    typename Traits::SmemLayoutQ{}, box_q, _1{}),
      make_tma_copy(SM90_TMA_LOAD{},
                    gmem(k_ptr, shape_kv_desc, k_strides[0], k_strides[1], k_strides[2]), smem_kv,
                    box_kv, _1{}),
      make_tma_copy(SM90_TMA_LOAD{},
                    gmem(v_ptr, shape_kv_desc, v_strides[0], v_strides[1], v_strides[2]), smem_kv,
                    box_kv, _1{}),
      make_tma_copy(SM90_TMA_STORE{}, gmem_o, typename Traits::SmemLayoutOWarpgroup{}, box_o, _1{}),
      shape_q,
      shape_kv_desc,
      static_cast<Element*>(a.o),
      a.o_batch_stride,
      a.o_row_stride,
      a.o_head_stride,
      a.lse,
      a.lse_batch_stride,
      a.lse_head_stride,
      a.seqlen_q,
      a.seqlen_k,
      a.head_dim,
      a.heads_per_kv_head,
      (a.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM,
      a.heads,
      a.batch,
      0,
      a.cu_seqlens_q,
      a.cu_seqlens_k,
      a.scale_log2,
      a.window_left,
      a.window_right,
      a.bottom_right,
      a.window_right == 0 && a.window_left < 0,
      {},   // heads_divmod and
      {}};  // paired_per_bh_divmod: prepare() below
  TileScheduler::prepare(p);

  auto kernel = forward_kernel<Traits>;
  constexpr int smem_bytes = Traits::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  if constexpr (Traits::kCtasPerSm > 1) {
    // Ask for the largest shared-memory carve-out, so that the CTAs fit side by side.
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               int(cudaSharedmemCarveoutMaxShared));
    if (err != cudaSuccess) return err;
  }
  // Persistent grid: as many CTAs as fit on the SMs at once (traits.hpp: kCtasPerSm).
  int device = 0, sms = 0;
  if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  int const grid = std::min(p.num_units, sms * Traits::kCtasPerSm);
  kernel<<<grid, Traits::kThreads, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

template <class Traits>
KernelEntry make_entry(fc_dtype dtype) {
  return KernelEntry{FC_FAMILY_SM90,
                     dtype,
                     Traits::kHeadDim,
                     fc_tile_config{Traits::kBlockM, Traits::kBlockN, Traits::kThreads},
                     size_t(Traits::kSmemBytes),
                     90,
                     &launch<Traits>,
                     &supports<Traits>};
}

}  // namespace flashcute::sm90

// Host side of one Hopper kernel: which problems it takes, its parameters, the launch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "kernels/common/params.hpp"
#include "kernels/common/score_modifiers.hpp"
#include "kernels/device_attributes.hpp"
#include "kernels/kernel_registry.hpp"
#include "kernels/sm90/kernel/forward_kernel.hpp"
#include "kernels/sm90/tile_counters.hpp"

namespace flashcute::sm90 {

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// TMA needs 16-byte aligned bases and strides. Softcap and ALiBi need the tile's modifier kernel
// (kModifiers: compiled beside the plain one).
template <class Traits, bool kModifiers>
bool supports(const AttentionParams& p) {
  bool const packed = p.cu_seqlens_q != nullptr;
  if (packed != (p.cu_seqlens_k != nullptr)) return false;
  // Packed: Q's TMA descriptor spans total_q tokens, which a caller without LSE may leave 0.
  if (packed && (p.total_q <= 0 || p.total_q > INT_MAX)) return false;
  if (!kModifiers && has_softcap_or_alibi(p)) return false;
  if (p.head_dim > Traits::kHeadDim || p.head_dim % 8 != 0) return false;
  if (p.batch <= 0 || p.seqlen_q <= 0 || p.seqlen_k < 0) return false;
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o)) return false;
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.k_row_stride, p.k_head_stride,
                             p.v_row_stride, p.v_head_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides) {
    if (s % 8 != 0) return false;
  }
  // Packed tokens have no batch stride (the kernel does not use it).
  if (packed) return true;
  const int64_t batch_strides[] = {p.q_batch_stride, p.k_batch_stride, p.v_batch_stride,
                                   p.o_batch_stride};
  for (int64_t s : batch_strides) {
    if (s % 8 != 0) return false;
  }
  return true;
}

template <class Kernel>
cudaError_t launch_kernel(const AttentionParams& a, cudaStream_t stream) {
  auto kernel = forward_kernel<Kernel>;
  constexpr int smem_bytes = Kernel::kSmemBytes;
  // The caller made the tensors' device current.
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = configure_once_per_device<Kernel>(device, [&] {
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e == cudaSuccess && Kernel::kCtasPerSm > 1) {
      // The largest shared-memory carve-out, so that the CTAs fit side by side.
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               int(cudaSharedmemCarveoutMaxShared));
    }
    return e;
  });
  if (err != cudaSuccess) return err;
  if ((err = multiprocessor_count(device, sms)) != cudaSuccess) return err;
  int* const counters = Kernel::schedules_dynamically(a) ? stream_tile_counters(stream) : nullptr;
  int l2_bytes = 0;
  if (counters != nullptr && (err = l2_cache_bytes(device, l2_bytes)) != cudaSuccess) return err;
  if constexpr (Kernel::kClusterM == 1) {
    int const max_ctas = sms * Kernel::kCtasPerSm;
    typename Kernel::Params const params = Kernel::to_params(a, counters, l2_bytes, max_ctas);
    // Persistent grid: as many CTAs as fit on the SMs at once.
    int const grid = std::min(params.scheduler.num_units, max_ctas);
    kernel<<<grid, Kernel::kThreads, smem_bytes, stream>>>(params);
    return cudaGetLastError();
  } else {
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = Kernel::kClusterM;
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.blockDim = dim3(Kernel::kThreads);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    // Clusters must fit within a GPC, so fewer than sms / kClusterM may be resident at once:
    // the persistent grid takes as many as the driver says fit. None (a partitioned or shared
    // GPU may refuse clusters): cudaErrorNotSupported, nothing launched, so that the caller
    // runs the tile without clusters.
    int max_clusters = 0;
    config.gridDim = dim3(sms / Kernel::kClusterM * Kernel::kClusterM);
    err = cached_per_device<Kernel>(device, max_clusters, [&](int& value) {
      return cudaOccupancyMaxActiveClusters(&value, kernel, &config);
    });
    if (err != cudaSuccess || max_clusters <= 0) {
      cudaGetLastError();  // the query's error is not the call's
      return cudaErrorNotSupported;
    }
    typename Kernel::Params const params = Kernel::to_params(a, nullptr, 0, max_clusters);
    int const clusters = std::min(params.scheduler.num_units, max_clusters);
    config.gridDim = dim3(clusters * Kernel::kClusterM);
    return cudaLaunchKernelEx(&config, kernel, params);
  }
}

// Calls with softcap or ALiBi run the modifier kernel; the plain kernel carries none of its work.
template <class Traits, bool kModifiers>
cudaError_t launch(const AttentionParams& a, cudaStream_t stream) {
  if constexpr (kModifiers) {
    if (has_softcap_or_alibi(a)) return launch_kernel<ForwardKernel<Traits, true>>(a, stream);
  }
  return launch_kernel<ForwardKernel<Traits>>(a, stream);
}

// kModifiers: whether the entry takes softcap and ALiBi (with a second kernel).
template <class Traits, bool kModifiers = false>
KernelEntry make_entry(fc_dtype dtype) {
  KernelEntry entry{};
  entry.family = FC_FAMILY_SM90;
  entry.dtype = dtype;
  entry.head_dim = Traits::kHeadDim;
  entry.tile = fc_tile_config{Traits::kBlockM, Traits::kBlockN, Traits::kThreads};
  entry.smem_bytes = size_t(ForwardKernel<Traits>::kSmemBytes);
  entry.launch = &launch<Traits, kModifiers>;
  entry.supports = &supports<Traits, kModifiers>;
  return entry;
}

}  // namespace flashcute::sm90

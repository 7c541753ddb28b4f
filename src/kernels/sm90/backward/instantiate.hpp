// Registers the Hopper backward of one (dtype, head_dim bucket): which problems it takes, the tile,
// and the launch of the whole pass (the padded row statistics, the main kernel, dQ's post-pass).
// The build generates one translation unit per (dtype, head_dim) that expands
// FLASHCUTE_SM90_BACKWARD_INSTANTIATE (cmake/instantiate.cmake).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <type_traits>

#include "kernels/backward/row_kernels.cuh"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/common/score_modifiers.hpp"
#include "kernels/device_attributes.hpp"
#include "kernels/kernel_registry.hpp"
#include "kernels/sm90/backward/dq_post_pass.hpp"
#include "kernels/sm90/backward/traits.hpp"
#include "kernels/sm90/kernel/backward_kernel.hpp"
#include "kernels/sm90/launch.hpp"  // aligned16

namespace flashcute::sm90 {

// Two Q/dO stages (a third measured 3% slower at d 128 s 8k). Up to head dim 128, 128 keys per
// CTA, 64 per consumer warpgroup; at 256, dK and dV of 64 keys already take 128 registers per
// thread when split by head dim (BackwardSplit::kHeadDim). 64 query rows per step, but 128 at
// head dim 64, where a step's fixed costs (barriers, row statistics, dQ's staging and reduction)
// weigh most against its GEMMs: the main kernel ran 5-10% faster than at 64 rows.
template <class Element, int kHeadDim>
using DefaultBackwardTraits = std::conditional_t<
    kHeadDim <= 64, BackwardTraits<Element, kHeadDim, 128, 128, 2>,
    std::conditional_t<kHeadDim <= 128, BackwardTraits<Element, kHeadDim, 64, 128, 2>,
                       BackwardTraits<Element, kHeadDim, 64, 64, 2, BackwardSplit::kHeadDim>>>;

// TMA (Q, dO) and 16-byte cp.async (K, V) need 16-byte aligned bases and strides. Softcap, ALiBi,
// deterministic gradients at head dim 256 (whose dQ atomics have no order) and problems without
// queries or keys run on the SM80 family.
template <class Traits>
bool supports_backward(const BackwardParams& p) {
  bool const packed = p.cu_seqlens_q != nullptr;
  if (has_softcap_or_alibi(p) || (p.deterministic && Traits::kSplitHeadDim)) return false;
  if (p.head_dim > Traits::kHeadDim || p.head_dim % 8 != 0) return false;
  if (p.batch <= 0 || p.seqlen_q <= 0 || p.seqlen_k <= 0) return false;
  if (packed && (p.cu_seqlens_k == nullptr || p.total_q <= 0 || p.total_q > INT_MAX)) return false;
  for (const void* ptr : {p.q, p.k, p.v, p.dout}) {
    if (!aligned16(ptr)) return false;
  }
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride,   p.k_row_stride,
                             p.v_row_stride, p.dout_row_stride, p.dout_head_stride};
  for (int64_t s : strides) {
    if (s % 8 != 0) return false;
  }
  if (!packed && (p.q_batch_stride % 8 != 0 || p.dout_batch_stride % 8 != 0)) return false;
  return true;
}

// The pre-pass, then the main kernel and dQ's post-pass, each launched to start while the
// grid before it runs (they wait for it as dependent_launch.hpp says).
template <class Traits>
cudaError_t launch_backward(const BackwardParams& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  using Kernel = BackwardKernel<Traits>;
  namespace rows = flashcute::backward;
  rows::dout_dot_out_kernel<Element, true, Traits::kHeadDim>
      <<<rows::padded_row_kernel_grid(p), rows::kRowThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  auto const kernel = backward_kernel<Kernel>;
  int device = 0;
  if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
  err = configure_once_per_device<Kernel>(device, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                Kernel::kSmemBytes);
  });
  if (err != cudaSuccess) return err;
  int multiprocessors = 0, l2_bytes = 0;
  if ((err = multiprocessor_count(device, multiprocessors)) != cudaSuccess) return err;
  if ((err = l2_cache_bytes(device, l2_bytes)) != cudaSuccess) return err;
  auto const params = Kernel::to_params(p, multiprocessors, l2_bytes);
  err = launch_dependent(true, kernel, dim3(params.order.num_ctas()), dim3(Kernel::kThreads),
                         Kernel::kSmemBytes, stream, params);
  if (err != cudaSuccess) return err;
  return DqPostPass<typename Kernel::DqBlocks, Traits::kBlockN, !Traits::kSplitHeadDim>::launch(
      p, device, stream);
}

template <class Element, int kHeadDim>
void add_backward_kernels(BackwardKernelTable& table) {
  using Traits = DefaultBackwardTraits<Element, kHeadDim>;
  static_assert(backward_bucket(kHeadDim) == kHeadDim, "the dQ workspace's block width");
  BackwardKernelEntry entry{};
  entry.family = FC_FAMILY_SM90;
  entry.dtype = dtype_of<Element>();
  entry.head_dim = kHeadDim;
  entry.smem_bytes = size_t(BackwardKernel<Traits>::kSmemBytes);
  entry.launch = &launch_backward<Traits>;
  entry.supports = &supports_backward<Traits>;
  table.push_back(entry);
}

}  // namespace flashcute::sm90

#define FLASHCUTE_SM90_BACKWARD_INSTANTIATE(Element, dtype, head_dim)  \
  namespace flashcute::sm90_backward {                                 \
  void register_##dtype##_hd##head_dim(BackwardKernelTable& table) {   \
    ::flashcute::sm90::add_backward_kernels<Element, head_dim>(table); \
  }                                                                    \
  }

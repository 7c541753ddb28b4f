// Registers the SM80-family backward of one (dtype, head_dim bucket): the row kernels around it,
// dkdv_kernel (atomic dQ, plain or general; or without dQ) and the deterministic dq_kernel,
// behind one launch function. The build generates one translation unit per (dtype, head_dim)
// that expands FLASHCUTE_SM80_BACKWARD_INSTANTIATE (cmake/instantiate.cmake).
#pragma once

#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/backward/row_kernels.cuh"
#include "kernels/kernel_registry.hpp"
#include "kernels/sm80/backward/dkdv_kernel.cuh"
#include "kernels/sm80/backward/dq_kernel.cuh"
#include "kernels/sm80/backward/traits.cuh"
#include "kernels/sm80/dynamic_smem.hpp"

namespace flashcute::sm80::backward {

// Tiles per head_dim bucket: (kBlockM, kBlockN) with the warps of the S/dP, dK/dV and dQ GEMMs
// stacked along M as given, and two Q/dO stages where shared memory allows (every tile fits the
// 163 KB of sm_80).
template <class Element, int kHeadDim>
struct DefaultTraits;
// 128 keys per block halve dQ's atomics and the Q/dO reloads against 64 keys.
template <class Element>
struct DefaultTraits<Element, 64> {
  using type = BackwardTraits<Element, 64, 64, 128, 2, 4, 4, 2>;
};
template <class Element>
struct DefaultTraits<Element, 128> {
  using type = BackwardTraits<Element, 128, 64, 128, 2, 4, 2, 2>;
};
// 64 keys: dK and dV take 128 registers per thread, and one Q/dO stage fits beside K and V
// (144 KB); ptxas reports no spills.
template <class Element>
struct DefaultTraits<Element, 256> {
  using type = BackwardTraits<Element, 256, 64, 64, 4, 2, 2, 1>;
};

template <class Traits, bool kAccumulateDq, bool kPlain>
cudaError_t launch_dkdv(const BackwardParams& p, int device, cudaStream_t stream) {
  auto const kernel = dkdv_kernel<Traits, kAccumulateDq, kPlain>;
  cudaError_t const err = allow_dynamic_smem<
      std::tuple<Traits, std::bool_constant<kAccumulateDq>, std::bool_constant<kPlain>>>(
      device, kernel, Traits::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 const grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, p.heads_k, p.batch);
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p);
  return cudaSuccess;
}

template <class Traits>
cudaError_t launch(const BackwardParams& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  int device = 0;  // the caller made the tensors' device current
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (!p.deterministic && p.seqlen_q > 0) {
    err = Traits::DqBlocks::clear(p, stream);
    if (err != cudaSuccess) return err;
  }
  dim3 const row_grid = flashcute::backward::row_kernel_grid(p);
  if (p.seqlen_q > 0) {
    flashcute::backward::dout_dot_out_kernel<Element>
        <<<row_grid, flashcute::backward::kRowThreads, 0, stream>>>(p);
  }
  if (p.seqlen_k > 0) {
    bool const plain = fits_plain_kernel(p, Traits::kHeadDim);
    err = p.deterministic ? launch_dkdv<Traits, false, false>(p, device, stream)
          : plain         ? launch_dkdv<Traits, true, true>(p, device, stream)
                          : launch_dkdv<Traits, true, false>(p, device, stream);
    if (err != cudaSuccess) return err;
  }
  if (p.seqlen_q > 0) {
    if (p.deterministic) {
      auto const kernel = dq_kernel<Traits>;
      err = allow_dynamic_smem<std::pair<Traits, std::integral_constant<int, 2>>>(
          device, kernel, Traits::kSmemBytesDq);
      if (err != cudaSuccess) return err;
      dim3 const grid((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, p.heads, p.batch);
      kernel<<<grid, Traits::kNThreads, Traits::kSmemBytesDq, stream>>>(p);
    } else {
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
      return flashcute::backward::launch_dq_from_fragments<typename Traits::DqBlocks>(p, device,
                                                                                      stream);
    }
  }
  return cudaGetLastError();
}

template <class Element, int kHeadDim>
void add_backward_kernels(BackwardKernelTable& table) {
  using Traits = typename DefaultTraits<Element, kHeadDim>::type;
  static_assert(backward_bucket(kHeadDim) == kHeadDim, "the dQ workspace's block width");
  BackwardKernelEntry entry{};
  entry.family = FC_FAMILY_SM80;
  entry.dtype = dtype_of<Element>();
  entry.head_dim = kHeadDim;
  entry.smem_bytes = size_t(std::max(Traits::kSmemBytes, Traits::kSmemBytesDq));
  entry.launch = &launch<Traits>;
  table.push_back(entry);
}

}  // namespace flashcute::sm80::backward

#define FLASHCUTE_SM80_BACKWARD_INSTANTIATE(Element, dtype, head_dim)            \
  namespace flashcute::sm80_backward {                                           \
  void register_##dtype##_hd##head_dim(BackwardKernelTable& table) {             \
    ::flashcute::sm80::backward::add_backward_kernels<Element, head_dim>(table); \
  }                                                                              \
  }

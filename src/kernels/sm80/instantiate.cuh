// Registers the SM80-family kernels of one (dtype, head_dim bucket): every tile configuration a
// user may choose in the full set; in the minimal set the automatic choice, plus small_smem_tile
// where the automatic tile does not fit the smallest devices' shared memory. The build
// generates one translation unit per (dtype, head_dim) that expands FLASHCUTE_SM80_INSTANTIATE
// (cmake/instantiate.cmake).
#pragma once

#include <type_traits>
#include <utility>

#include "kernels/kernel_registry.hpp"
#include "kernels/sm80/default_tiles.hpp"
#include "kernels/sm80/dynamic_smem.hpp"
#include "kernels/sm80/kernel.cuh"
#include "kernels/sm80/traits.cuh"

namespace flashcute::sm80 {

template <class Traits, bool kPlain>
cudaError_t launch_variant(const AttentionParams& params, cudaStream_t stream) {
  const auto kernel = forward_kernel<Traits, kPlain>;
  constexpr int kSmem = Traits::kSmemBytes;
  const cudaError_t err =
      allow_dynamic_smem<std::pair<Traits, std::bool_constant<kPlain>>>(kernel, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.heads,
                  params.batch);
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  return cudaGetLastError();
}

// The plain kernel when the launch allows it (see forward_kernel), else the general one. Only
// the automatic tile of a bucket has a plain kernel: one for every tile of the full set would
// double its build time for tiles that run only on request.
template <class Traits, bool kHasPlain>
cudaError_t launch(const AttentionParams& params, cudaStream_t stream) {
  if constexpr (kHasPlain) {
    if (fits_plain_kernel(params, Traits::kHeadDim)) {
      return launch_variant<Traits, true>(params, stream);
    }
  }
  return launch_variant<Traits, false>(params, stream);
}

template <class Element, int kHeadDim, int kBlockM, int kBlockN, int kNThreads>
void add_tile_config(KernelTable& table) {
  if constexpr (tile_config_fits<kHeadDim, kBlockM, kBlockN, kNThreads>()) {
    using Traits = KernelTraits<Element, kHeadDim, kBlockM, kBlockN, kNThreads>;
    constexpr DefaultTile kTile{kBlockM, kBlockN, kNThreads};
    static_assert(Traits::kSmemBytes == tile_smem_bytes(kTile, kHeadDim));
    constexpr bool kIsAutomatic = same_tile(kTile, default_tile(kHeadDim));
    KernelEntry entry{};
    entry.family = FC_FAMILY_SM80;
    entry.dtype = dtype_of<Element>();
    entry.head_dim = kHeadDim;
    entry.tile = fc_tile_config{kBlockM, kBlockN, kNThreads};
    entry.smem_bytes = size_t(Traits::kSmemBytes);
    entry.launch = &launch<Traits, kIsAutomatic>;
    entry.automatic = kIsAutomatic;
    table.push_back(entry);
  }
}

template <class Element, int kHeadDim>
void add_head_dim_kernels(KernelTable& table) {
#if FLASHCUTE_FULL_TILE_SET
  add_tile_config<Element, kHeadDim, 64, 32, 128>(table);
  add_tile_config<Element, kHeadDim, 64, 64, 128>(table);
  add_tile_config<Element, kHeadDim, 64, 128, 128>(table);
  add_tile_config<Element, kHeadDim, 128, 32, 128>(table);
  add_tile_config<Element, kHeadDim, 128, 64, 128>(table);
  add_tile_config<Element, kHeadDim, 128, 128, 128>(table);
  add_tile_config<Element, kHeadDim, 128, 32, 256>(table);
  add_tile_config<Element, kHeadDim, 128, 64, 256>(table);
  add_tile_config<Element, kHeadDim, 128, 128, 256>(table);
#else
  constexpr DefaultTile tile = default_tile(kHeadDim);
  add_tile_config<Element, kHeadDim, tile.m_block, tile.n_block, tile.num_threads>(table);
  // The tile dispatch falls back to on devices whose shared memory cannot hold the automatic one.
  constexpr DefaultTile small = small_smem_tile(kHeadDim);
  if constexpr (!same_tile(small, tile)) {
    static_assert(tile_config_fits<kHeadDim, small.m_block, small.n_block, small.num_threads>());
    add_tile_config<Element, kHeadDim, small.m_block, small.n_block, small.num_threads>(table);
  }
#endif
}

}  // namespace flashcute::sm80

#define FLASHCUTE_SM80_INSTANTIATE(Element, dtype, hd)                                             \
  namespace flashcute::sm80 {                                                                      \
  void register_##dtype##_hd##hd(KernelTable& table) { add_head_dim_kernels<Element, hd>(table); } \
  }

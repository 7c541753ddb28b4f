// The tiles of each head dim and the automatic choice among them. The default tile has 128 query
// rows (two consumer warpgroups) or 192 (three), one CTA per SM; a head dim may add a tile for
// short causal problems and one for long non-causal problems, which the default entry hands those
// problems to. The key block is as wide as registers (S, P and O) and shared memory (Q plus the
// K and V stages, at most 227 KB per SM) allow. The figures behind each choice are in
// bench/NOTES.md.
#pragma once

#include <type_traits>

#include "kernels/sm90/launch.hpp"
#include "kernels/sm90/traits.hpp"

namespace flashcute::sm90 {

template <class Element, int kHeadDim>
struct DefaultConfig;

// Ping-pong at every head dim with two consumer warpgroups. d 64 gains more from a 192-row tile
// (each K/V block serves 192 queries) and keeps three stages for its small, quickly consumed K/V
// blocks; at d 128 a third stage would take O's own buffer.
// clang-format off
template <class E> struct DefaultConfig<E, 64> { using type = Traits<E, 64, 192, 128, 3, false>; };
template <class E> struct DefaultConfig<E, 96> { using type = Traits<E, 96, 128, 128, 2, true>; };
template <class E> struct DefaultConfig<E, 128> { using type = Traits<E, 128, 128, 128, 2, true>; };
template <class E> struct DefaultConfig<E, 192> { using type = Traits<E, 192, 128, 96, 2, true>; };
template <class E> struct DefaultConfig<E, 256> { using type = Traits<E, 256, 128, 80, 2, true>; };
// clang-format on

// The tile of causal problems with seqlen_q <= kShortQueries; void: the default's.
template <class E, int kHeadDim>
struct ShortCausalConfig {
  using type = void;
};
// A short causal tile visits few key blocks, so its start and end cost as much as its main loop:
// 64x64 tiles with one consumer warpgroup each run three CTAs per SM, whose starts, ends and
// softmax overlap (s 512: 1.23x the 128x128 ping-pong tile).
template <class E>
struct ShortCausalConfig<E, 64> {
  using type = Traits<E, 64, 64, 64, 3, false, 3>;
};
// The 80-key block overshoots a 128-row tile's diagonal: 64 keys do 11% less GEMM work at s 512.
template <class E>
struct ShortCausalConfig<E, 256> {
  using type = Traits<E, 256, 128, 64, 2, true>;
};

// The tile of long non-causal problems (seqlen_k >= kLongKeys); void: the default's.
template <class E, int kHeadDim>
struct NonCausalConfig {
  using type = void;
};
// 176 keys pay the per-block cost (barriers, shuffles, rescale) 27% less often; O then borrows V's
// buffer. Shorter sequences and causal problems keep 128 keys (kLongKeys, measured in
// bench/NOTES.md).
template <class E>
struct NonCausalConfig<E, 128> {
  using type = Traits<E, 128, 128, 176, 2, true>;
};

// The same tile in clusters of two CTAs that share each K/V block's load (traits.hpp); problems
// without a mask take it when their query tiles pair up. With 128 query rows a CTA needs K/V
// bytes from L2 at its FLOP rate / 128: 5.5 TB/s over the GPU at 700 TFLOP/s, the order of L2's
// bandwidth (d 64's 192-row tile needs two thirds of that and keeps single CTAs).
template <class T>
struct Clustered;
template <class E, int kHeadDim, int kBlockM, int kBlockN, int kStages, bool kPingPong>
struct Clustered<Traits<E, kHeadDim, kBlockM, kBlockN, kStages, kPingPong>> {
  using type = Traits<E, kHeadDim, kBlockM, kBlockN, kStages, kPingPong, 1, 2>;
};
template <int kHeadDim>
constexpr bool kClusterUnmasked = kHeadDim == 128 || kHeadDim == 256;

// What the default entry runs when the caller left the tile to the library (an explicit tile
// request runs exactly that tile). Causal means a right window edge at the diagonal, with or
// without a left edge. The long-key tile is for attention without a window: under a local window
// a tile visits few key blocks, as in a short sequence, where the 176-key tile loses.
constexpr int kLongKeys = 8192;
// Clusters (Clustered) from this many keys on: below it their set-up and the partner's wait at
// every K/V stage cost more than the halved L2 reads save (the A/B is in bench/NOTES.md).
constexpr int kClusterKeys = 2048;
constexpr int kShortQueries = 1024;

// Softcap and ALiBi run on the default tile, the one compiled with their kernel.
template <class Default, class ShortCausal, class NonCausal, bool kModifiers>
cudaError_t launch_by_problem(const AttentionParams& a, cudaStream_t stream) {
  if constexpr (kModifiers) {
    if (has_softcap_or_alibi(a)) return launch<Default, true>(a, stream);
  }
  bool const causal = a.window_right == 0;
  bool const windowed = a.window_left >= 0 || a.window_right >= 0;
  using Long = std::conditional_t<std::is_void_v<NonCausal>, Default, NonCausal>;
  if constexpr (kClusterUnmasked<Default::kHeadDim>) {
    int const m_blocks = (a.seqlen_q + Default::kBlockM - 1) / Default::kBlockM;
    if (!windowed && a.cu_seqlens_q == nullptr && m_blocks % 2 == 0 && a.seqlen_k >= kClusterKeys) {
      cudaError_t const err = a.seqlen_k >= kLongKeys
                                  ? launch<typename Clustered<Long>::type, false>(a, stream)
                                  : launch<typename Clustered<Default>::type, false>(a, stream);
      if (err != cudaErrorNotSupported) return err;  // else no cluster fits: the plain tile
    }
  }
  if constexpr (!std::is_void_v<NonCausal>) {
    if (!windowed && a.seqlen_k >= kLongKeys) return launch<NonCausal, false>(a, stream);
  }
  if constexpr (!std::is_void_v<ShortCausal>) {
    if (causal && a.seqlen_q <= kShortQueries) return launch<ShortCausal, false>(a, stream);
  }
  return launch<Default, false>(a, stream);
}

// Registers the kernels of one (dtype, head_dim): the default entry (the automatic choice) and
// the extra tiles, which an explicit tile request reaches directly. kModifiers: the default tile
// takes softcap and ALiBi too.
template <class Element, int kHeadDim, bool kModifiers>
void register_head_dim(KernelTable& table) {
  using Default = typename DefaultConfig<Element, kHeadDim>::type;
  using ShortCausal = typename ShortCausalConfig<Element, kHeadDim>::type;
  using NonCausal = typename NonCausalConfig<Element, kHeadDim>::type;
  KernelEntry entry = make_entry<Default, kModifiers>(dtype_of<Element>());
  entry.automatic = true;
  entry.auto_launch = &launch_by_problem<Default, ShortCausal, NonCausal, kModifiers>;
  table.push_back(entry);
  if constexpr (!std::is_void_v<ShortCausal>) table.push_back(make_entry<ShortCausal>(entry.dtype));
  if constexpr (!std::is_void_v<NonCausal>) table.push_back(make_entry<NonCausal>(entry.dtype));
}

}  // namespace flashcute::sm90

// Whether a translation unit compiles the softcap and ALiBi kernels of its default tile; the
// build sets it per dtype (FLASHCUTE_SM90_MODIFIER_DTYPES).
#ifndef FLASHCUTE_SM90_SCORE_MODIFIERS
#define FLASHCUTE_SM90_SCORE_MODIFIERS 1
#endif

// One translation unit per (dtype, head_dim), generated by the build (cmake/instantiate.cmake).
#define FLASHCUTE_SM90_INSTANTIATE(Element, dtype, hd)                           \
  namespace flashcute::sm90 {                                                    \
  void register_##dtype##_hd##hd(KernelTable& table) {                           \
    register_head_dim<Element, hd, bool(FLASHCUTE_SM90_SCORE_MODIFIERS)>(table); \
  }                                                                              \
  }

// The tile chosen for each head dimension: 128 query rows (two consumer warpgroups) or 192
// (three), one CTA per SM; or 64 rows (one consumer warpgroup) with several CTAs per SM. The key
// block is as wide as registers (S, P and O) and shared memory (Q plus two K and two V stages, at
// most 227 KB per SM) allow. A head dim may add a tile for short causal problems and one for
// non-causal problems; the default entry hands those problems to it.
#pragma once

#include <type_traits>

#include "kernels/sm90/launch.hpp"
#include "kernels/sm90/traits.hpp"

namespace flashcute::sm90 {

template <class Element, int kHeadDim>
struct DefaultConfig;

// Measured on the H200 (bf16, see README.md): ping-pong helps at every head dim with two
// consumer warpgroups (d 256: +10-18%); d 64 gains more from a 192-row tile with three consumer
// warpgroups (each K/V block serves 192 queries; +10-20%) than from ping-pong. Its K/V blocks are
// small (16 KB) and quickly consumed, so d 64 keeps three stages: the producer runs a block
// further ahead, which short tiles, whose first loads are the least hidden, need most (measured,
// 3 stages against 2: s 512 363 / 348 TFLOP/s, 1k 409 / 398, 2k 476 / 470; d 128, where a third
// stage makes O borrow Q's buffer, lost up to 11%).
// One line per head dim, read as a table:
// clang-format off
template <class E> struct DefaultConfig<E, 64> { using type = Traits<E, 64, 192, 128, 3, false>; };
template <class E> struct DefaultConfig<E, 96> { using type = Traits<E, 96, 128, 128, 2, true>; };
template <class E> struct DefaultConfig<E, 128> { using type = Traits<E, 128, 128, 128, 2, true>; };
template <class E> struct DefaultConfig<E, 192> { using type = Traits<E, 192, 128, 96, 2, true>; };
template <class E> struct DefaultConfig<E, 256> { using type = Traits<E, 256, 128, 80, 2, true>; };
// clang-format on

// The tile of causal problems with seqlen_q <= kShortQueries; void: the default's. At d 64 a
// short causal tile visits few key blocks (2.5 on average at s 512), so its start and end cost as
// much as its main loop, and two warpgroups sharing a tile wait through them together. 64x64
// tiles with one consumer warpgroup each run as three CTAs per SM (S, P and O need 80 of the 136
// registers left to a consumer), so three independent tiles overlap each other's starts, ends and
// softmax; the 64-key block also follows the diagonal closely. Measured (H200, bf16, b 16384/s,
// h 32, causal, TFLOP/s; 128x128 ping-pong / 64x128 two CTAs per SM / 64x64 three CTAs per SM /
// the default 192x128): s 512 228 / 231 / 281 / 214, 1k 303 / 303 / 351 / 277, 2k 367 / 368 /
// 402 / 403.
template <class E, int kHeadDim>
struct ShortCausalConfig {
  using type = void;
};
template <class E>
struct ShortCausalConfig<E, 64> {
  using type = Traits<E, 64, 64, 64, 3, false, 3>;
};
// d 256's 80-key block does not divide the 128-row tile, so a causal tile's last block overshoots
// its diagonal: at s 512 the four tiles of a head take 2 + 4 + 5 + 7 blocks of 80 keys (1440 key
// rows) against 2 + 4 + 6 + 8 of 64 (1280), 11% less GEMM work for 11% more blocks. Measured
// (H200, bf16, b 16384/s, h 8, causal, 128x80 / 128x64): s 512 314 / 332, 1k 463 / 487, 2k 618 /
// 626 TFLOP/s.
template <class E>
struct ShortCausalConfig<E, 256> {
  using type = Traits<E, 256, 128, 64, 2, true>;
};

// The tile of long non-causal problems (seqlen_k >= kLongKeys); void: the default's. d 128
// takes a 176-key block (FlashAttention-3's choice): 47 instead of 64 main-loop steps at s 8192,
// so the per-block cost (barriers, max/sum shuffles, rescaling O) is paid 27% less often. At 176
// keys O no longer has a buffer of its own (Q 32 KB + 4 x 44 KB of K/V + O 32 KB > 227 KB) and
// borrows Q's, so the next tile's Q loads only after the epilogue: short sequences, where that
// wait is a larger share of a tile, lose. Measured (H200, bf16, b 16384/s, h 16, TFLOP/s,
// 128x128 / 128x176 / 128x160): s 512 454 / 395 / 374, 2k 621 / 591 / 606, 4k 656 / 637 / 646,
// 8k 675 / 680 / 669, 16k 640 / 691 / 686. Causal problems keep 128 keys (16k: 663 / 670).
template <class E, int kHeadDim>
struct NonCausalConfig {
  using type = void;
};
template <class E>
struct NonCausalConfig<E, 128> {
  using type = Traits<E, 128, 128, 176, 2, true>;
};

// What the default entry runs when the caller left the tile to the library (an explicit tile
// request runs exactly that tile). Causal means a right window edge at the diagonal, with or
// without a left edge. The long-key tile is for attention without a window: under a local window
// a tile visits few key blocks, as in a short sequence, where the 176-key tile loses (above).
constexpr int kLongKeys = 8192;
constexpr int kShortQueries = 1024;

template <class Default, class ShortCausal, class NonCausal>
cudaError_t launch_by_problem(const AttentionParams& a, cudaStream_t stream) {
  bool const causal = a.window_right == 0;
  bool const windowed = a.window_left >= 0 || a.window_right >= 0;
  if constexpr (!std::is_void_v<NonCausal>) {
    if (!windowed && a.seqlen_k >= kLongKeys) return launch<NonCausal>(a, stream);
  }
  if constexpr (!std::is_void_v<ShortCausal>) {
    if (causal && a.seqlen_q <= kShortQueries) return launch<ShortCausal>(a, stream);
  }
  return launch<Default>(a, stream);
}

}  // namespace flashcute::sm90

// One translation unit per (dtype, head_dim): defines flashcute::sm90::register_<dtype>_hd<hd>.
// The default entry comes first (it is the automatic choice, dispatch.cpp); the extra tiles
// follow so that an explicit tile request reaches them directly.
#define FLASHCUTE_SM90_INSTANTIATE(element, dtype_name, fc_dtype_value, hd)  \
  namespace flashcute::sm90 {                                                \
  void register_##dtype_name##_hd##hd(KernelTable& table) {                  \
    using Default = typename DefaultConfig<element, hd>::type;               \
    using ShortCausal = typename ShortCausalConfig<element, hd>::type;       \
    using NonCausal = typename NonCausalConfig<element, hd>::type;           \
    KernelEntry entry = make_entry<Default>(fc_dtype_value);                 \
    entry.auto_launch = &launch_by_problem<Default, ShortCausal, NonCausal>; \
    table.push_back(entry);                                                  \
    if constexpr (!std::is_void_v<ShortCausal>)                              \
      table.push_back(make_entry<ShortCausal>(fc_dtype_value));              \
    if constexpr (!std::is_void_v<NonCausal>)                                \
      table.push_back(make_entry<NonCausal>(fc_dtype_value));                \
  }                                                                          \
  }

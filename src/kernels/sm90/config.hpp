// The tile chosen for each head dimension: 128 query rows (two consumer warpgroups) or 192
// (three); the key block is as wide as registers (S, P and O) and shared memory (Q plus two K
// and two V stages, at most 227 KB) allow.
#pragma once

#include "kernels/sm90/traits.hpp"

namespace flashcute::sm90 {

template <class Element, int kHeadDim>
struct DefaultConfig;

// Measured on the H200 (bf16, see README.md): ping-pong helps at every head dim with two
// consumer warpgroups (d 256: +10-18%); d 64 gains more from a 192-row tile with three consumer
// warpgroups (each K/V block serves 192 queries; +10-20%) than from ping-pong.
template <class E> struct DefaultConfig<E, 64> { using type = Traits<E, 64, 192, 128, 2, false>; };
template <class E> struct DefaultConfig<E, 96> { using type = Traits<E, 96, 128, 128, 2, true>; };
template <class E> struct DefaultConfig<E, 128> { using type = Traits<E, 128, 128, 128, 2, true>; };
template <class E> struct DefaultConfig<E, 192> { using type = Traits<E, 192, 128, 96, 2, true>; };
template <class E> struct DefaultConfig<E, 256> { using type = Traits<E, 256, 128, 80, 2, true>; };

// A second tile: the default entry runs it for short causal problems (launch_short_causal), and
// an explicit tile request reaches it directly.
template <class E, int kHeadDim> struct AlternativeConfig { using type = void; };
template <class E> struct AlternativeConfig<E, 64> { using type = Traits<E, 64, 128, 128, 2, true>; };

}  // namespace flashcute::sm90

// One translation unit per (dtype, head_dim): defines flashcute::sm90::register_<dtype>_hd<hd>.
#define FLASHCUTE_SM90_INSTANTIATE(element, dtype_name, fc_dtype_value, hd)                    \
  namespace flashcute::sm90 {                                                                 \
  void register_##dtype_name##_hd##hd(KernelTable& table) {                                   \
    using Default = typename DefaultConfig<element, hd>::type;                                \
    using Alt = typename AlternativeConfig<element, hd>::type;                                \
    KernelEntry entry = make_entry<Default>(fc_dtype_value);                                  \
    if constexpr (!std::is_void_v<Alt>) entry.launch = &launch_short_causal<Default, Alt>;    \
    table.push_back(entry);                                                                   \
    if constexpr (!std::is_void_v<Alt>) table.push_back(make_entry<Alt>(fc_dtype_value));     \
  }                                                                                           \
  }

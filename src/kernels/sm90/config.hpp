// The tile chosen for each head dimension: 128 query rows (two consumer warpgroups); the key
// block is as wide as registers (S and O accumulators) and shared memory (Q plus two K and two V
// stages, at most 227 KB) allow.
#pragma once

#include "kernels/sm90/traits.hpp"

namespace flashcute::sm90 {

template <class Element, int kHeadDim>
struct DefaultConfig;

// Ping-pong pays while the softmax is a large share of the work (head_dim <= 128); at larger
// head dims the GEMMs dominate and the turn hand-overs only add waiting.
#ifndef FLASHCUTE_SM90_PINGPONG
#define FLASHCUTE_SM90_PINGPONG 1
#endif
constexpr bool kPingPongSmallDims = FLASHCUTE_SM90_PINGPONG != 0;

template <class E> struct DefaultConfig<E, 64> { using type = Traits<E, 64, 128, 128, 2, kPingPongSmallDims>; };
template <class E> struct DefaultConfig<E, 96> { using type = Traits<E, 96, 128, 128, 2, kPingPongSmallDims>; };
template <class E> struct DefaultConfig<E, 128> { using type = Traits<E, 128, 128, 128, 2, kPingPongSmallDims>; };
template <class E> struct DefaultConfig<E, 192> { using type = Traits<E, 192, 128, 96, 2, false>; };
template <class E> struct DefaultConfig<E, 256> { using type = Traits<E, 256, 128, 80, 2, false>; };

}  // namespace flashcute::sm90

// One translation unit per (dtype, head_dim): defines flashcute::sm90::register_<dtype>_hd<hd>.
#define FLASHCUTE_SM90_INSTANTIATE(element, dtype_name, fc_dtype_value, hd)                    \
  namespace flashcute::sm90 {                                                                 \
  void register_##dtype_name##_hd##hd(KernelTable& table) {                                   \
    table.push_back(make_entry<typename DefaultConfig<element, hd>::type>(fc_dtype_value));   \
  }                                                                                           \
  }

// The setmaxnreg budgets of a warp-specialised Hopper kernel. A CTA starts with the registers its
// launch bounds allow every thread (a multiple of 8); the producer warpgroup gives back all but
// kProducer per thread and the consumers share the rest (a multiple of 8 each, at most 240).
#pragma once

namespace flashcute::sm90 {

template <int kThreads, int kConsumerThreads, int kCtasPerSm = 1>
struct RegisterBudget {
  static constexpr int kProducer = 24;
  static constexpr int kEntry = 65536 / (kThreads * kCtasPerSm) / 8 * 8;
  static constexpr int kShare = (kEntry * kThreads - kProducer * 128) / kConsumerThreads / 8 * 8;
  static constexpr int kConsumer = kShare < 240 ? kShare : 240;
  // setmaxnreg.inc waits until the registers are free: asking for more than the CTA started with
  // would hang the consumers.
  static_assert(kProducer * 128 + kConsumer * kConsumerThreads <= kEntry * kThreads);
};

}  // namespace flashcute::sm90

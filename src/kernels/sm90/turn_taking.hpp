// Ping-pong between the two consumer warpgroups: a warpgroup issues its GEMMs only on its turn
// and hands the turn over right after issuing, so the tensor cores run one warpgroup's GEMMs
// while the other computes its softmax. Two named barriers (256 threads: one side syncs, the
// other arrives) carry the turns.
#pragma once

#include <cutlass/arch/barrier.h>

namespace flashcute::sm90 {

// Named barrier ids (CUTLASS's user range, 0..7): 1 + wg (up to 3 consumer warpgroups) for the
// epilogue, 4 + wg for turns.
constexpr int kTurnBarrierBase = 4;

template <bool kEnabled>
struct TurnTaking {
  int warpgroup;  // 0 or 1 among the consumers

  // The first turn belongs to warpgroup 0.
  CUTE_DEVICE void start() const {
    if constexpr (kEnabled) {
      if (warpgroup == 1) cutlass::arch::NamedBarrier::arrive(256, kTurnBarrierBase);
    }
  }
  CUTE_DEVICE void wait() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::sync(256, kTurnBarrierBase + warpgroup);
  }
  // The last hand-over of warpgroup 1 would have no matching wait: pass last = true to skip it.
  CUTE_DEVICE void pass(bool last = false) const {
    if constexpr (kEnabled) {
      if (!(last && warpgroup == 1)) {
        cutlass::arch::NamedBarrier::arrive(256, kTurnBarrierBase + (warpgroup ^ 1));
      }
    }
  }
};

}  // namespace flashcute::sm90

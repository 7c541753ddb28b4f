// Ping-pong between the two consumer warpgroups: a warpgroup issues its GEMMs only on its turn
// and hands the turn over right after issuing, so the tensor cores run one warpgroup's GEMMs
// while the other computes its softmax. Two named barriers (256 threads: one side syncs, the
// other arrives) carry the turns. The turns run on across tiles: both warpgroups take the same
// number of turns per tile, so warpgroup 0 starts the next tile's first QK^T while warpgroup 1
// is still in its epilogue (restarting the turns per tile made it wait for that epilogue).
#pragma once

#include <cutlass/arch/barrier.h>

#include "kernels/sm90/named_barriers.hpp"

namespace flashcute::sm90 {

template <bool kEnabled>
struct TurnTaking {
  int warpgroup;  // 0 or 1 among the consumers

  // Once per kernel, before the first tile: the first turn belongs to warpgroup 0.
  CUTE_DEVICE void start() const {
    if constexpr (kEnabled) {
      if (warpgroup == 1) cutlass::arch::NamedBarrier::arrive(256, turn_barrier(0));
    }
  }
  CUTE_DEVICE void wait() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::sync(256, turn_barrier(warpgroup));
  }
  CUTE_DEVICE void pass() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::arrive(256, turn_barrier(warpgroup ^ 1));
  }
  // Once per kernel, after the last tile: warpgroup 0 takes the turn that warpgroup 1's last
  // hand-over gave it, so that no barrier is left half-arrived.
  CUTE_DEVICE void finish() const {
    if constexpr (kEnabled) {
      if (warpgroup == 0) wait();
    }
  }

 private:
  CUTE_DEVICE static int turn_barrier(int owner) {
    return barrier_id(BarrierId::kTurnWarpgroup0, owner);
  }
};

}  // namespace flashcute::sm90

// Every named barrier of the Hopper family in one place (ids 1..15: id 0 is __syncthreads).
#pragma once

namespace flashcute::sm90 {

enum class BarrierId : int {
  // Each consumer warpgroup's epilogue (up to three warpgroups: ids 1..3), 128 threads.
  kEpilogueWarpgroup0 = 1,
  // The ping-pong turns of the two consumer warpgroups (ids 4 and 5), 256 threads.
  kTurnWarpgroup0 = 4,
  // Every consumer thread of the CTA. Backward: K and V loaded, a step's dS written. Forward with
  // O staged in V's buffer: the last PV GEMMs have read V.
  kConsumers = 6,
  // Backward: the consumer threads of one part of a step's dQ and dQ's writer warp (the part is
  // in shared memory: ids 7 and 8; its buffer is free again: ids 9 and 10).
  kBackwardDqFullPart0 = 7,
  kBackwardDqEmptyPart0 = 9,
};

// The barrier of consumer warpgroup `warpgroup` within a group of barriers.
inline __device__ int barrier_id(BarrierId first, int warpgroup) { return int(first) + warpgroup; }

}  // namespace flashcute::sm90

// The counters of the Hopper forward's dynamic schedule (tile_scheduler.hpp): a pair of ints per
// (context, stream), zeroed once when first handed out and left zeroed by every kernel that uses
// them. Calls on one stream run one after another, so they can share a pair; calls on two streams
// may overlap, so each stream has its own, found by its unique id (a stream's handle may be
// reused after it is destroyed, while its last kernel still runs). Kept for the life of the
// context: 8 bytes per stream that ever ran a dynamic schedule.
#pragma once

#include <cuda_runtime.h>

namespace flashcute::sm90 {

// The counters for a kernel on `stream` (of the current device), or null, in which case the kernel
// uses the static schedule: while the stream is being captured into a graph (a graph's replays
// may overlap later calls on the stream), or when the counters cannot be had.
int* stream_tile_counters(cudaStream_t stream);

}  // namespace flashcute::sm90

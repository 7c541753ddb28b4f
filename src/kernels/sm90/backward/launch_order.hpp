// The order in which the Hopper backward's CTAs launch: one CTA per (key block, KV head,
// sequence) on a one-dimensional grid, which the hardware hands out in index order to the SMs as
// they free up. Key blocks go in chunks, every (KV head, sequence) of a chunk before the next
// chunk; within a chunk a head's key blocks are side by side and read the same Q and dO blocks
// from L2. With a right mask edge the lowest key blocks see the most queries: chunks of
// kCostOrderChunk start the costliest CTAs first and leave the cheapest for the end. Without one
// every key block costs the same, and one chunk of every key block (the key block varying
// fastest) keeps the most CTAs of a head together: chunks of 8 there cost 1-6% of the main
// kernel's time (d 64 and 128, bench/NOTES.md). Host-callable, so that a CPU test can check that
// every place is taken once.
#pragma once

#include <cute/config.hpp>

namespace flashcute::sm90 {

struct BackwardPlace {
  int n_block, head_kv, sequence;
};

struct BackwardLaunchOrder {
  static constexpr int kCostOrderChunk = 8;

  int n_blocks, heads_k, sequences;
  int chunk;  // key blocks per chunk

  CUTE_HOST_DEVICE int num_ctas() const { return n_blocks * heads_k * sequences; }

  // The place of CTA `cta`. descend: key blocks from the last (the deterministic turns' order,
  // so that a CTA waits only for CTAs launched before it).
  CUTE_HOST_DEVICE BackwardPlace place(int cta, bool descend) const {
    int const groups = heads_k * sequences;
    int const full_chunks = n_blocks / chunk;
    int const in_full_chunks = full_chunks * chunk * groups;
    int first, width, rest;  // the chunk's first key block, its width, and cta's rank in it
    if (cta < in_full_chunks) {
      first = cta / (chunk * groups) * chunk;
      width = chunk;
      rest = cta % (chunk * groups);
    } else {
      first = full_chunks * chunk;
      width = n_blocks - first;
      rest = cta - in_full_chunks;
    }
    int const group = rest / width;
    int const n_block = first + rest % width;
    return {descend ? n_blocks - 1 - n_block : n_block, group % heads_k, group / heads_k};
  }
};

}  // namespace flashcute::sm90

// The order in which the Hopper backward's CTAs launch: one CTA per (key block, KV head,
// sequence) on a one-dimensional grid, which the hardware hands out in index order to the SMs as
// they free up. Key blocks go in chunks of kLaunchChunk, every (KV head, sequence) of a chunk
// before the next chunk. Under a causal mask the lowest key blocks see the most queries, so the
// costliest CTAs start first and the cheapest fill the end; with the key block varying fastest
// (a (key block, head, sequence) grid), the last heads' costliest CTAs started in the last round,
// which weighs most when a CTA carries a whole GQA group of query heads. Within a chunk, the CTAs
// of one head read the same Q and dO blocks side by side, from L2. Host-callable, so that a CPU
// test can check that every place is taken once.
#pragma once

#include <cute/config.hpp>

namespace flashcute::sm90 {

struct BackwardPlace {
  int n_block, head_kv, sequence;
};

struct BackwardLaunchOrder {
  static constexpr int kLaunchChunk = 8;

  int n_blocks, heads_k, sequences;

  CUTE_HOST_DEVICE int num_ctas() const { return n_blocks * heads_k * sequences; }

  // The place of CTA `cta`. descend: key blocks from the last (the deterministic turns' order,
  // so that a CTA waits only for CTAs launched before it).
  CUTE_HOST_DEVICE BackwardPlace place(int cta, bool descend) const {
    int const groups = heads_k * sequences;
    int const full_chunks = n_blocks / kLaunchChunk;
    int const in_full_chunks = full_chunks * kLaunchChunk * groups;
    int first, width, rest;  // the chunk's first key block, its width, and cta's rank in it
    if (cta < in_full_chunks) {
      first = cta / (kLaunchChunk * groups) * kLaunchChunk;
      width = kLaunchChunk;
      rest = cta % (kLaunchChunk * groups);
    } else {
      first = full_chunks * kLaunchChunk;
      width = n_blocks - first;
      rest = cta - in_full_chunks;
    }
    int const group = rest / width;
    int const n_block = first + rest % width;
    return {descend ? n_blocks - 1 - n_block : n_block, group % heads_k, group / heads_k};
  }
};

}  // namespace flashcute::sm90

// The order in which the Hopper backward's CTAs launch: one CTA per (key block, KV head,
// sequence) on a one-dimensional grid, which the hardware hands out in index order to the SMs as
// they free up. A (KV head, sequence) pair is a group: its CTAs read and add to the same Q, dO and
// dQ rows.
//
// Groups go in sections, every CTA of a section before the next section. Within a section key
// blocks go in chunks, every group of the section in a chunk before the next chunk. With a right
// mask edge (causal, windows) the lowest key blocks see the most queries, so chunks start a
// section's costliest CTAs first. The sections are `section_groups` wide, few enough that their
// rows stay in L2 while every key block reads them; the last one, the tail, is `tail_groups`
// wide, enough groups that the SMs stay busy while its costliest CTA runs. Rows read again from
// DRAM cost power, and under the GPU's power limit power is clock: the causal rows run 2-7%
// faster than with chunks across every group (bench/NOTES.md). Without a right edge every key block
// costs the same and the chunk is every key block: the grid in group order, the key block varying
// fastest, whatever the sections. Host-callable, so that a CPU test can check that every place is
// taken once.
#pragma once

#include <cute/config.hpp>
#include <cute/numeric/math.hpp>

namespace flashcute::sm90 {

struct BackwardPlace {
  int n_block, head_kv, sequence;
};

struct BackwardLaunchOrder {
  static constexpr int kCostOrderChunk = 8;

  int n_blocks, heads_k, sequences;
  int chunk;           // key blocks per chunk
  int section_groups;  // groups per section before the tail (at least 1)
  int tail_groups;     // groups in the last section

  CUTE_HOST_DEVICE int num_ctas() const { return n_blocks * heads_k * sequences; }

  // The tail's width with a right mask edge: the fewest groups whose work, spread over every SM,
  // lasts as long as the costliest CTA (a group of n key blocks holds about n (n + 1) / 2 times
  // that CTA's work when the costs fall linearly).
  CUTE_HOST_DEVICE static int cost_order_tail(int n_blocks, int multiprocessors) {
    return (2 * multiprocessors + n_blocks) / (n_blocks + 1);
  }

  // The place of CTA `cta`. descend: key blocks from the last (the deterministic turns' order,
  // so that a CTA waits only for CTAs launched before it). kSections = false: the whole grid is
  // the tail (chunks across every group), without the sections' arithmetic.
  template <bool kSections = true>
  CUTE_HOST_DEVICE BackwardPlace place(int cta, bool descend) const {
    int const groups = heads_k * sequences;
    int first_group = 0, width = groups;  // the section's first group and its width
    if constexpr (kSections) {
      int const tail = tail_groups < groups ? tail_groups : groups;
      int const in_sections = (groups - tail) * n_blocks;
      if (cta < in_sections) {
        first_group = cta / (section_groups * n_blocks) * section_groups;
        width = cute::min(section_groups, groups - tail - first_group);
      } else {
        first_group = groups - tail;
        width = tail;
      }
    }
    int const rest_of_section = cta - first_group * n_blocks;
    int const full_chunks = n_blocks / chunk;
    int const in_full_chunks = full_chunks * chunk * width;
    int first, size, rest;  // the chunk's first key block, its size, and cta's rank in it
    if (rest_of_section < in_full_chunks) {
      first = rest_of_section / (chunk * width) * chunk;
      size = chunk;
      rest = rest_of_section % (chunk * width);
    } else {
      first = full_chunks * chunk;
      size = n_blocks - first;
      rest = rest_of_section - in_full_chunks;
    }
    int const group = first_group + rest / size;
    int const n_block = first + rest % size;
    return {descend ? n_blocks - 1 - n_block : n_block, group % heads_k, group / heads_k};
  }
};

}  // namespace flashcute::sm90

// How many ranges a decode call cuts each sequence's keys into, from host-known shapes only (so a
// captured CUDA graph stays valid whatever cache_seqlens holds on the device).
// Host-only and CPU-tested.
#pragma once

#include <cstdint>

namespace flashcute::decode {

// blocks: blocks of one split (query-row blocks x head sets x sequences); rounds: key rounds of
// the longest sequence; slots: blocks the device runs at once. The fewest splits whose last wave
// fills at least 95% of the best fill any count reaches, keeping at least kMinRoundsPerSplit
// rounds per split so that a block's fixed cost (Q, the merge, the partial writes) stays small.
constexpr int kMinRoundsPerSplit = 4;

inline int choose_num_splits(int64_t blocks, int64_t rounds, int64_t slots, int max_splits) {
  if (blocks <= 0 || rounds <= 0 || slots <= 0) return 1;
  int64_t limit = rounds / kMinRoundsPerSplit;
  if (limit > max_splits) limit = max_splits;
  if (limit < 1) limit = 1;
  const auto fill = [&](int64_t splits) {
    const int64_t work = blocks * splits;
    const int64_t waves = (work + slots - 1) / slots;
    return double(work) / double(waves * slots);
  };
  double best = 0.0;
  for (int64_t s = 1; s <= limit; ++s) {
    if (fill(s) > best) best = fill(s);
  }
  for (int64_t s = 1; s <= limit; ++s) {
    if (fill(s) >= 0.95 * best) return int(s);
  }
  return 1;
}

}  // namespace flashcute::decode

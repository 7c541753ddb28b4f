// The backward pass's scratch memory, carved from the caller's workspace: one place decides its
// size (the size query) and its layout (the launch). Each part starts on a 256-byte boundary.
#pragma once

#include <cute/config.hpp>

#include <cstdint>

#include "kernels/common/sequence_info.hpp"

namespace flashcute {

// Per-row statistics in padded rows (the Hopper family): sequence b's rows start at a multiple
// of kBlock, and every query block of kBlock rows lies inside its sequence's padded rows, so a
// kernel reads a whole block of statistics without bounds checks. The start
// floor((first_token + b * kBlock) / kBlock) * kBlock leaves each sequence at least its rounded-up
// length before the next one; dense batches use the same rule with first_token = b * seqlen_q.
struct PaddedRows {
  static constexpr int kBlock = 128;  // the largest query block any kernel reads
  CUTE_HOST_DEVICE static constexpr int64_t start(int sequence, int64_t first_token) {
    return (first_token + int64_t(sequence) * kBlock) / kBlock * kBlock;
  }
  // Where sequence `sequence` (seq) starts among one head's padded rows.
  CUTE_HOST_DEVICE static int64_t sequence_start(SequenceInfo<> const& seq, int sequence,
                                                 int seqlen_q) {
    return start(sequence, int64_t(seq.batch) * seqlen_q + seq.q_start);
  }
  CUTE_HOST_DEVICE static constexpr int64_t total(int64_t total_q, int batch) {
    return (total_q + int64_t(batch) * kBlock + kBlock - 1) / kBlock * kBlock;
  }
};

struct BackwardWorkspace {
  // fp32 row statistics: heads * total_q (SM80 family's dout_dot_out) or 2 * heads * PaddedRows
  // (the Hopper family's LSE and dout_dot_out), whichever is larger.
  uint64_t row_stats_offset;
  // fp32 dq sums: heads * PaddedRows * accum_width (whole query blocks in the dQ MMA's register
  // order, both families, each block as wide as the running kernel's head dim, at most
  // accum_width; unused by the SM80 family when deterministic).
  uint64_t dq_accum_offset;
  // One int per 64 padded rows of each head: the Hopper family's count of the key blocks that
  // have finished adding to a dQ block.
  uint64_t dq_counts_offset;
  uint64_t bytes;  // the whole workspace
};

constexpr uint64_t round_up_256(uint64_t bytes) { return (bytes + 255) / 256 * 256; }

constexpr uint64_t larger(uint64_t a, uint64_t b) { return a > b ? a : b; }

// The head-dim bucket of both families' backward kernels (64, 128 or 256), whose width their dQ
// accumulator blocks have.
constexpr int64_t backward_bucket(int64_t head_dim) {
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

// Rows per dQ block counter: the Hopper backward's smallest query block (a block of 128 rows
// takes the counter of its first 64).
constexpr int kDqCountRows = 64;

// accum_width: backward_accum_width (kernel_registry.hpp), the widest dQ block any family's
// kernel for the call would write.
constexpr BackwardWorkspace backward_workspace(int64_t total_q, int batch, int64_t heads,
                                               int64_t accum_width) {
  int64_t const padded = PaddedRows::total(total_q, batch);
  uint64_t const stats = round_up_256(larger(heads * total_q, 2 * heads * padded) * sizeof(float));
  uint64_t const accum = round_up_256(heads * padded * accum_width * sizeof(float));
  uint64_t const counts = round_up_256(heads * (padded / kDqCountRows) * sizeof(int));
  return {0, stats, stats + accum, stats + accum + counts};
}

}  // namespace flashcute

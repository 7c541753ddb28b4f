// Which keys a query sees. One rule covers causal masks of either alignment and local windows:
// query row i sees key j iff j < seqlen_k and i + diag - left <= j <= i + diag + right, with
// diag = seqlen_k - seqlen_q (bottom-right) or 0 (top-left) and a negative bound unbounded.
// Causal is right = 0. Block-level questions let the main loop skip whole blocks and mask only
// the blocks that straddle an edge.
#pragma once

#include "kernels/common/params.hpp"

namespace flashcute {

struct KeyBlockRange {
  int begin, end;  // key blocks [begin, end); empty when end <= begin
};

struct AttentionMask {
  int seqlen_k, diag, left, right;

  __device__ AttentionMask(const AttentionParams& p, int seqlen_q, int seqlen_k_)
      : seqlen_k(seqlen_k_),
        diag(p.bottom_right ? seqlen_k_ - seqlen_q : 0),
        left(p.window_left),
        right(p.window_right) {}

  __device__ bool visible(int row, int col) const {
    return col < seqlen_k && (right < 0 || col <= row + diag + right) &&
           (left < 0 || col >= row + diag - left);
  }

  // The visible keys of one row: [begin, end).
  __device__ void visible_keys(int row, int& begin, int& end) const {
    begin = left >= 0 ? row + diag - left : 0;
    end = right >= 0 ? min(seqlen_k, row + diag + right + 1) : seqlen_k;
  }

  // Key blocks of n_block columns holding at least one key visible to rows [row_begin, row_end).
  __device__ KeyBlockRange key_blocks(int row_begin, int row_end, int n_block) const {
    int end_col = seqlen_k;
    if (right >= 0) end_col = min(end_col, row_end - 1 + diag + right + 1);
    int begin_col = 0;
    if (left >= 0) begin_col = max(0, row_begin + diag - left);
    return {begin_col / n_block, end_col <= 0 ? 0 : (end_col + n_block - 1) / n_block};
  }

  // Whether some (row, key) pair in the block is invisible, so the block needs element masking.
  __device__ bool block_needs_mask(int key_block, int row_begin, int row_end, int n_block) const {
    const int col_begin = key_block * n_block, col_last = col_begin + n_block - 1;
    return col_last >= seqlen_k || (right >= 0 && col_last > row_begin + diag + right) ||
           (left >= 0 && col_begin < row_end - 1 + diag - left);
  }
};

}  // namespace flashcute

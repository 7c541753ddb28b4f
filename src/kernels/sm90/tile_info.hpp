// One work tile: its sequence (dense, or one of a packed variable-length batch), which key blocks
// it visits and which of them need a mask. Blocks are visited from the last to the first, so the
// (at most few) partially visible ones at the right edge come first and the steady state runs
// without any mask arithmetic; a left window edge (local attention) masks the last few blocks
// visited. The producer and every consumer thread build the same TileInfo from the work tile.
// Host-callable too, so that a CPU test can check the block ranges and masks against every pair.
#pragma once

#include <cute/config.hpp>

#include "kernels/sm90/scheduler.hpp"

namespace flashcute::sm90 {

// CUDA's integer min/max on the device (the code the kernels were measured with), plain
// comparisons on the host.
CUTE_HOST_DEVICE int tile_min(int a, int b) {
#if defined(__CUDA_ARCH__)
  return ::min(a, b);
#else
  return a < b ? a : b;
#endif
}
CUTE_HOST_DEVICE int tile_max(int a, int b) {
#if defined(__CUDA_ARCH__)
  return ::max(a, b);
#else
  return a > b ? a : b;
#endif
}

struct TileInfo {
  int m_block;
  int seqlen_q, seqlen_k;  // this sequence's lengths
  int q_start, k_start;    // token index of its first query / key (0 when dense)
  int batch;               // batch coordinate of the tensors (0 when packed: the tokens place it)
  // Key blocks [n_block_min, n_block_max) hold every key a row of the tile sees; none when
  // n_block_max <= n_block_min.
  int n_block_min, n_block_max;
  // Blocks n >= n_block_mask have some hidden (row, key) pair at the right: the key residue
  // (which includes every shifted last block, see key0), or the right edge (the causal diagonal)
  // crossing the block for the tile's first row. Blocks n < n_block_left_mask start before the
  // left window edge of the tile's last row. The rest is derived where it is used: the consumers
  // have no register to spare across their main loop.
  int n_block_mask, n_block_left_mask;

  template <class Traits, class Params>
  CUTE_HOST_DEVICE static TileInfo make(Params const& p, WorkTile const& w) {
    constexpr int kBlockN = Traits::kBlockN;
    TileInfo t;
    t.m_block = w.m_block;
    if (p.cu_seqlens_q != nullptr) {
      t.q_start = p.cu_seqlens_q[w.batch];
      t.k_start = p.cu_seqlens_k[w.batch];
      t.seqlen_q = p.cu_seqlens_q[w.batch + 1] - t.q_start;
      t.seqlen_k = p.cu_seqlens_k[w.batch + 1] - t.k_start;
      t.batch = 0;
    } else {
      t.q_start = 0;
      t.k_start = 0;
      t.seqlen_q = p.seqlen_q;
      t.seqlen_k = p.seqlen_k;
      t.batch = w.batch;
    }
    int const first_row = w.m_block * Traits::kBlockM;
    int const last_row = tile_min(first_row + Traits::kBlockM, t.seqlen_q) - 1;
    int const diag = t.diagonal(p);
    // The last row sees the furthest key on the right, the first row the nearest on the left.
    int visible_end = t.seqlen_k;
    if (p.window_right >= 0)
      visible_end = tile_min(visible_end, last_row + diag + p.window_right + 1);
    t.n_block_max = visible_end <= 0 ? 0 : (visible_end + kBlockN - 1) / kBlockN;
    t.n_block_min =
        p.window_left >= 0 ? tile_max(first_row + diag - p.window_left, 0) / kBlockN : 0;
    // (n + 1) * kBlockN > seqlen_k  <=>  n >= seqlen_k / kBlockN.
    t.n_block_mask = t.seqlen_k / kBlockN;
    if (p.window_right >= 0) {
      // (n + 1) * kBlockN - 1 > first_row + diag + right  <=>  n >= edge / kBlockN, with
      // edge = first_row + diag + right + 1; every block when edge <= 0.
      int const edge = first_row + diag + p.window_right + 1;
      t.n_block_mask = tile_min(t.n_block_mask, edge <= 0 ? 0 : edge / kBlockN);
    }
    // n * kBlockN < last_row + diag - left  <=>  n < ceil(edge / kBlockN) for edge > 0.
    t.n_block_left_mask = 0;
    if (p.window_left >= 0) {
      int const edge = last_row + diag - p.window_left;
      t.n_block_left_mask = edge <= 0 ? 0 : (edge + kBlockN - 1) / kBlockN;
    }
    return t;
  }

  // The diagonal's key offset: query i and key i + diagonal are aligned (bottom-right: the
  // sequences' last query and last key; top-left: their first).
  template <class Params>
  CUTE_HOST_DEVICE int diagonal(Params const& p) const {
    return p.bottom_right ? seqlen_k - seqlen_q : 0;
  }

  // Key index of row 0 of K/V block n as loaded: n * kBlockN, except for a packed sequence's
  // partial last block, which is loaded ending at the sequence's last key so that no load reads
  // past the packed tensors (their total key count is unknown here, and the last sequence's
  // residue would run off their end). Its rows before n * kBlockN repeat the block before, or
  // belong to the previous sequence, or are TMA's zero fill below token 0: all are masked. Dense
  // tensors keep n * kBlockN (TMA zero-fills the residue past seqlen_k).
  template <class Traits, class Params>
  CUTE_HOST_DEVICE int key0(Params const& p, int n_block) const {
    int key = n_block * Traits::kBlockN;
    return p.cu_seqlens_q != nullptr ? tile_min(key, seqlen_k - Traits::kBlockN) : key;
  }
};

}  // namespace flashcute::sm90

// One work tile: its sequence (dense, or one of a packed variable-length batch), which key blocks
// it visits and which of them need a mask. Blocks are visited from the last to the first, so the
// (at most few) partially visible ones come first and the steady state runs without any mask
// arithmetic. The producer and every consumer thread build the same TileInfo from the work tile.
#pragma once

#include <cute/config.hpp>

#include "kernels/sm90/scheduler.hpp"

namespace flashcute::sm90 {

struct TileInfo {
  int m_block;
  int seqlen_q, seqlen_k;  // this sequence's lengths
  int q_start, k_start;    // token index of its first query / key (0 when dense)
  int batch;               // batch coordinate of the tensors (0 when packed: the tokens place it)
  int n_block_max;  // one past the last key block with a visible key; <= 0 means no key visible
  // Blocks n >= n_block_mask have some hidden (row, key) pair: the key residue (which includes
  // every shifted last block, see key0), or the causal diagonal crossing the block for the
  // tile's first row. The rest is derived where it is used: the consumers have no register to
  // spare across their main loop.
  int n_block_mask;

  template <class Traits, class Params>
  CUTE_DEVICE static TileInfo make(Params const& p, WorkTile const& w) {
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
    int visible = t.seqlen_k;
    if (p.causal) {
      // The tile's last row sees the most keys.
      int last_row = min((w.m_block + 1) * Traits::kBlockM, t.seqlen_q) - 1;
      visible = min(visible, last_row + t.causal_offset(p) + 1);
    }
    t.n_block_max = visible <= 0 ? 0 : (visible + Traits::kBlockN - 1) / Traits::kBlockN;
    // (n + 1) * kBlockN > seqlen_k  <=>  n >= seqlen_k / kBlockN.
    t.n_block_mask = t.seqlen_k / Traits::kBlockN;
    if (p.causal) {
      // (n + 1) * kBlockN - 1 > first_row + causal_offset  <=>  n >= diag / kBlockN, with
      // diag = first_row + causal_offset + 1; every block when diag <= 0.
      int diag = w.m_block * Traits::kBlockM + t.causal_offset(p) + 1;
      t.n_block_mask = min(t.n_block_mask, diag <= 0 ? 0 : diag / Traits::kBlockN);
    }
    return t;
  }

  // Key j is visible to query i iff j <= i + causal_offset (when causal).
  template <class Params>
  CUTE_DEVICE int causal_offset(Params const& p) const {
    return p.bottom_right ? seqlen_k - seqlen_q : 0;
  }

  // Key index of row 0 of K/V block n as loaded: n * kBlockN, except for a packed sequence's
  // partial last block, which is loaded ending at the sequence's last key so that no load reads
  // past the packed tensors (their total key count is unknown here, and the last sequence's
  // residue would run off their end). Its rows before n * kBlockN repeat the block before, or
  // belong to the previous sequence, or are TMA's zero fill below token 0: all are masked. Dense
  // tensors keep n * kBlockN (TMA zero-fills the residue past seqlen_k).
  template <class Traits, class Params>
  CUTE_DEVICE int key0(Params const& p, int n_block) const {
    int key = n_block * Traits::kBlockN;
    return p.cu_seqlens_q != nullptr ? min(key, seqlen_k - Traits::kBlockN) : key;
  }
};

}  // namespace flashcute::sm90

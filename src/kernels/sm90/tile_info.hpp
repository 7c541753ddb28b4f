// One work tile as the producer and the consumers see it: its sequence (kernels/common/
// sequence_info.hpp), which key blocks it visits and which of them need a mask (kernels/common/
// mask.hpp). Blocks are visited from the last to the first, so the (at most few) partially
// visible ones at the right edge come first and the steady state runs without any mask
// arithmetic; a left window edge masks the last few blocks visited. The producer and every
// consumer thread build the same TileInfo from the work tile. Host-callable too, for CPU tests.
#pragma once

#include <cute/config.hpp>

#include "kernels/common/mask.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/sm90/tile_scheduler.hpp"

namespace flashcute::sm90 {

struct TileInfo {
  int m_block;
  int seqlen_q, seqlen_k;  // this sequence's lengths
  int q_start, k_start;    // token index of its first query / key (0 when dense)
  int batch;               // batch coordinate of the tensors (0 when packed: the tokens place it)
  // Key blocks [n_block_min, n_block_max) hold every key a row of the tile sees; none when
  // n_block_max <= n_block_min.
  int n_block_min, n_block_max;
  // Blocks n >= n_block_mask or n < n_block_left_mask have a hidden (row, key) pair. The rest is
  // derived where it is used: the consumers have no register to spare across their main loop.
  int n_block_mask, n_block_left_mask;

  // Params: the mainloop's (sequences, bottom_right, window_left, window_right).
  template <class Traits, class Params>
  CUTE_HOST_DEVICE static TileInfo make(Params const& p, WorkTile const& w) {
    SequenceInfo<> const seq(p.sequences, w.batch);
    AttentionMask const mask = make_mask(p, seq);
    BlockRange const blocks = mask.key_blocks<Traits::kBlockM, Traits::kBlockN>(w.m_block);
    MaskedBlocks const masked = mask.masked_key_blocks<Traits::kBlockM, Traits::kBlockN>(w.m_block);
    return TileInfo{w.m_block, seq.seqlen_q, seq.seqlen_k, seq.q_start, seq.k_start,
                    seq.batch, blocks.begin, blocks.end,   masked.from, masked.below};
  }

  template <class Params, class Sequence>
  CUTE_HOST_DEVICE static AttentionMask make_mask(Params const& p, Sequence const& seq) {
    return AttentionMask(seq.seqlen_q, seq.seqlen_k, p.bottom_right, p.window_left, p.window_right);
  }

  // How many leading columns of key block n (as loaded: column c holds key key0(n) + c) some row
  // of the 64 rows from first_row may see: from that column on, the right mask edge or the key
  // residue hides the block from every one of those rows below seqlen_q. At most 0 when the rows
  // see none of it, or when none of them is below seqlen_q.
  template <class Traits, class Params>
  CUTE_HOST_DEVICE int visible_columns(Params const& p, int first_row, int n_block) const {
    int const last_row = geometry_min(first_row + 64, seqlen_q) - 1;
    if (last_row < first_row) return 0;
    return make_mask(p, *this).row_keys(last_row).end - key0<Traits>(p, n_block);
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
    return p.sequences.cu_seqlens_q != nullptr ? geometry_min(key, seqlen_k - Traits::kBlockN)
                                               : key;
  }
};

}  // namespace flashcute::sm90

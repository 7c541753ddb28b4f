// Which key blocks one query tile visits, and which of them need a mask. Blocks are visited from
// the last to the first, so the (at most few) partially visible ones come first and the steady
// state runs without any mask arithmetic.
#pragma once

#include <cute/config.hpp>

namespace flashcute::sm90 {

struct TileInfo {
  int m_block;
  int n_block_max;  // one past the last key block with a visible key; <= 0 means no key visible

  template <class Traits, class Params>
  CUTE_DEVICE static TileInfo make(Params const& p, int m_block) {
    int visible = p.seqlen_k;
    if (p.causal) {
      // The tile's last row sees the most keys.
      int last_row = min((m_block + 1) * Traits::kBlockM, p.seqlen_q) - 1;
      visible = min(visible, last_row + p.causal_offset + 1);
    }
    int n_max = visible <= 0 ? 0 : (visible + Traits::kBlockN - 1) / Traits::kBlockN;
    return TileInfo{m_block, n_max};
  }

  // True when some (row, key) pair of block n is hidden: the key residue, or the causal diagonal
  // crossing the block for the tile's first row.
  template <class Traits, class Params>
  CUTE_DEVICE bool needs_mask(Params const& p, int n_block) const {
    int key_end = (n_block + 1) * Traits::kBlockN;
    if (key_end > p.seqlen_k) return true;
    return p.causal && key_end - 1 > m_block * Traits::kBlockM + p.causal_offset;
  }
};

}  // namespace flashcute::sm90

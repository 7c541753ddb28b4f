// Static tile scheduler for the persistent grid (one CTA per SM, each walking its own list of
// tiles). A causal tile's cost grows with its row index, so causal work is handed out in units
// of two tiles, m and num_m - 1 - m, whose costs sum to about the same for every unit: a plain
// round-robin over equal units is then balanced without any global counter. The middle tile of
// an odd count has half a unit's cost; those units go last, where they fill the tail. Units of
// one (batch, head) are consecutive, so the CTAs running side by side share K and V in L2.
#pragma once

#include <cute/config.hpp>

namespace flashcute::sm90 {

struct WorkTile {
  int m_block, head, batch;
};

struct TileScheduler {
  int unit;    // index of the current unit
  int second;  // 0: the unit's first (heavier) tile, 1: its second

  template <class Params>
  CUTE_HOST_DEVICE static int num_units(Params const& p) {
    int bh = p.heads * p.batch;
    if (!p.causal) return bh * p.num_m_blocks;
    return bh * ((p.num_m_blocks + 1) / 2);
  }

  CUTE_DEVICE explicit TileScheduler(int first_unit) : unit(first_unit), second(0) {}

  template <class Params>
  CUTE_DEVICE bool valid(Params const& p) const {
    return unit < p.num_units;
  }

  template <class Params>
  CUTE_DEVICE WorkTile get(Params const& p) const {
    int bh, m;
    if (!p.causal) {
      bh = unit / p.num_m_blocks;
      m = unit - bh * p.num_m_blocks;
    } else {
      int pairs = p.num_m_blocks / 2;
      int paired_units = p.heads * p.batch * pairs;
      if (unit < paired_units) {
        bh = unit / pairs;
        int k = unit - bh * pairs;
        m = second ? k : p.num_m_blocks - 1 - k;
      } else {
        bh = unit - paired_units;
        m = pairs;  // the middle tile of an odd count
      }
    }
    return WorkTile{m, bh % p.heads, bh / p.heads};
  }

  template <class Params>
  CUTE_DEVICE void advance(Params const& p) {
    bool paired = p.causal && unit < p.heads * p.batch * (p.num_m_blocks / 2);
    if (paired && !second) {
      second = 1;
    } else {
      second = 0;
      unit += int(gridDim.x);
    }
  }
};

}  // namespace flashcute::sm90

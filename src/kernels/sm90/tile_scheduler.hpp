// Static tile scheduler for the persistent grid: each CTA (one or more per SM) walks its own list
// of tiles. A causal tile's cost grows with its row index, so causal work is handed out in units
// of two tiles, m and num_m - 1 - m, whose costs sum to about the same for every unit of a
// sequence: a plain round-robin over equal units is then balanced without any global counter.
// The middle tile of an odd count has half a unit's cost. Units of one (batch, head) are
// consecutive, so the CTAs running side by side share K and V in L2.
//
// Dense batches: every sequence has num_m_blocks tiles, the units are numbered arithmetically,
// and the unpaired middle tiles go last, where they fill the tail.
// Packed batches: the units of each sequence are counted from its own length, so no unit is an
// empty tile past a short sequence's end (sized for the longest sequence, those left whole CTAs
// idle while others ran long sequences). A CTA's units only grow, so it finds each unit's
// sequence by walking a cursor forward over the sequences, reading their lengths from
// cu_seqlens_q (L1-resident) as it goes.
// Host-callable too, so that a CPU test can check that every tile is handed out exactly once.
#pragma once

#include <cutlass/fast_math.h>
#include <cute/config.hpp>

#include <algorithm>

namespace flashcute::sm90 {

struct WorkTile {
  int m_block, head, batch;
};

template <int kBlockM>
struct TileScheduler {
  struct Arguments {
    int batch, heads;  // batch = number of sequences when packed
    int seqlen_q;      // the longest sequence's when packed
    // Pair tiles m and num_m - 1 - m: causal attention without a left window edge, where a
    // tile's cost grows with its row.
    bool pair_tiles;
    const int32_t* cu_seqlens_q;  // packed: token offsets of each sequence; null when dense
  };

  struct Params {
    int heads, batch;
    int num_m_blocks;  // of the longest sequence when packed
    int num_units;     // the grid's work; for a packed batch an upper bound
    bool pair_tiles;
    const int32_t* cu_seqlens_q;
    // Dense schedule: divide by heads, and by the paired units of one (batch, head). FastDivmod:
    // a multiply-high and a shift instead of the ~25 instructions of an integer division.
    cutlass::FastDivmod heads_divmod, paired_per_bh_divmod;
  };

  int unit;    // index of the current unit
  int second;  // 0: the unit's first (heavier) tile, 1: its second
  // Packed batches only: the sequence that holds `unit` (batch = number of sequences when the
  // list is exhausted) and the index of that sequence's first unit.
  int seq, seq_unit0;

  // Host, once per launch.
  static Params to_params(Arguments const& a) {
    Params p{};
    p.heads = a.heads;
    p.batch = a.batch;
    p.num_m_blocks = (a.seqlen_q + kBlockM - 1) / kBlockM;
    p.pair_tiles = a.pair_tiles;
    p.cu_seqlens_q = a.cu_seqlens_q;
    p.num_units = num_units(p);
    p.heads_divmod = cutlass::FastDivmod(p.heads);
    // No paired unit when causal with one tile per sequence; the divisor is then never used.
    p.paired_per_bh_divmod = cutlass::FastDivmod(std::max(paired_units_per_bh(p), 1));
    return p;
  }

  // The grid's size; for a packed batch an upper bound (the host cannot read cu_seqlens).
  CUTE_HOST_DEVICE static int num_units(Params const& p) {
    int bh = p.heads * p.batch;
    if (!p.pair_tiles) return bh * p.num_m_blocks;
    return bh * ((p.num_m_blocks + 1) / 2);
  }

  CUTE_HOST_DEVICE TileScheduler(Params const& p, int first_unit)
      : unit(first_unit), second(0), seq(0), seq_unit0(0) {
    if (p.cu_seqlens_q != nullptr) seek(p);
  }

  CUTE_HOST_DEVICE bool valid(Params const& p) const {
    return p.cu_seqlens_q != nullptr ? seq < p.batch : unit < p.num_units;
  }

  CUTE_HOST_DEVICE WorkTile get(Params const& p) const {
    if (p.cu_seqlens_q != nullptr) {
      PackedPlace const at = packed_place(p);
      return WorkTile{m_block(p, at.index, at.m_blocks), at.head, seq};
    }
    // Dense: the units of every (batch, head) first (pairs when causal), then the middle tiles.
    int const paired_units = p.heads * p.batch * paired_units_per_bh(p);
    int bh, m;
    if (unit < paired_units) {
      int k;
      p.paired_per_bh_divmod(bh, k, unit);
      m = m_block(p, k, p.num_m_blocks);
    } else {
      bh = unit - paired_units;
      m = p.num_m_blocks / 2;  // the middle tile of an odd count
    }
    int batch, head;
    p.heads_divmod(batch, head, bh);
    return WorkTile{m, head, batch};
  }

  CUTE_HOST_DEVICE void advance(Params const& p, int grid_size) {
    if (p.pair_tiles && !second && pairs_with_next(p)) {
      second = 1;
      return;
    }
    second = 0;
    unit += grid_size;
    if (p.cu_seqlens_q != nullptr) seek(p);
  }

 private:
  CUTE_HOST_DEVICE static int seq_m_blocks(Params const& p, int s) {
    int len = p.cu_seqlens_q[s + 1] - p.cu_seqlens_q[s];
    return (len + kBlockM - 1) / kBlockM;
  }

  CUTE_HOST_DEVICE static int units_per_head(Params const& p, int m_blocks) {
    return p.pair_tiles ? (m_blocks + 1) / 2 : m_blocks;
  }

  // Where the current unit of a packed batch lies within its sequence.
  struct PackedPlace {
    int head;
    int index;     // of the unit among the (sequence, head)'s units
    int m_blocks;  // query tiles of the sequence
  };
  CUTE_HOST_DEVICE PackedPlace packed_place(Params const& p) const {
    int const m_blocks = seq_m_blocks(p, seq);
    int const per_head = units_per_head(p, m_blocks);
    int const local = unit - seq_unit0;
    return PackedPlace{local / per_head, local % per_head, m_blocks};
  }

  // Tile of unit index `k` within one (sequence, head): for causal work, unit k < m_blocks / 2
  // pairs the tiles m_blocks - 1 - k (first) and k; the last unit of an odd count is the middle.
  CUTE_HOST_DEVICE int m_block(Params const& p, int k, int m_blocks) const {
    if (!p.pair_tiles) return k;
    if (k == m_blocks / 2) return k;  // odd count: the middle tile, alone
    return second ? k : m_blocks - 1 - k;
  }

  // Whether the current unit holds a second tile.
  CUTE_HOST_DEVICE bool pairs_with_next(Params const& p) const {
    if (p.cu_seqlens_q != nullptr) {
      PackedPlace const at = packed_place(p);
      return at.index < at.m_blocks / 2;
    }
    return unit < p.heads * p.batch * paired_units_per_bh(p);
  }

  // Dense: the units of one (batch, head) that come before the middle tiles (all of its units
  // unless causal).
  CUTE_HOST_DEVICE static int paired_units_per_bh(Params const& p) {
    return p.pair_tiles ? p.num_m_blocks / 2 : p.num_m_blocks;
  }

  // Moves the cursor forward to the sequence holding `unit` (or past the last one).
  CUTE_HOST_DEVICE void seek(Params const& p) {
    while (seq < p.batch) {
      int const units = p.heads * units_per_head(p, seq_m_blocks(p, seq));
      if (unit < seq_unit0 + units) return;
      seq_unit0 += units;
      ++seq;
    }
  }
};

}  // namespace flashcute::sm90

// Tile scheduler of the persistent grid. The producer runs it and hands each tile to the
// consumers through shared memory (collective/mainloop_fwd.hpp), so the consumers keep no
// scheduler state. Two ways to hand out tiles:
//
// Static: each CTA walks its own list, units j, j + G, j + 2 G, ... of a grid of G CTAs. A causal
// tile's cost grows with its row index, so causal work is handed out in units of two tiles, m and
// num_m - 1 - m, whose costs sum to about the same for every unit of a sequence: a plain
// round-robin over equal units is then balanced without any global counter, up to the rounding of
// units over CTAs (the last round of 1024 units on 132 CTAs is three quarters full). The middle
// tile of an odd count has half a unit's cost. Units of one (batch, head) are consecutive, so the
// CTAs running side by side share K and V in L2.
// Dense batches: every sequence has num_m_blocks tiles, the units are numbered arithmetically,
// and the unpaired middle tiles go last, where they fill the tail.
// Packed batches: the units of each sequence are counted from its own length, so no unit is an
// empty tile past a short sequence's end (sized for the longest sequence, those left whole CTAs
// idle while others ran long sequences). A CTA's units only grow, so it finds each unit's
// sequence by walking a cursor forward over the sequences, reading their lengths from
// cu_seqlens_q (L1-resident) as it goes.
//
// Dynamic (calls given a counter): each CTA takes its first unit by its index and every later one
// from a global counter, so the CTA that frees first takes the next unit. Packed batches keep
// their units and order: the units' costs differ with their sequences' lengths, and the static
// round-robin left the CTAs' sums apart by chance (a host model of the benchmark's packed rows:
// 0.88-0.96 balanced, 0.98-0.99 dynamic). Dense causal calls with more than
// kMaxStaticRowBlocks row blocks take every tile as a unit, costliest first within sections of
// (batch, head) pairs, so that the CTA that frees first takes the costliest tile left: no rounding
// of units over CTAs. A section is as wide as the pairs whose K and V fit in half of L2, so that
// its tiles find them there; in a wider one each wave of row blocks reads them from DRAM again.
// Only the last section is widened, to four units per CTA but no more pairs than all of L2
// holds: its costliest tiles start late, and only then do the CTAs still need enough cheaper
// tiles left to even out; before it, the next section's costly tiles fill the gaps. Wider than
// L2, its DRAM reads cost more than the balance gains (bench/NOTES.md has the A/B of the rules).
// The pairs left over form a first section. The last CTA to run out of units sets the counter
// back to zero, so the next call on the stream finds it zeroed without a memset (one counter per
// stream: kernels/sm90/tile_counters.hpp). Host-callable too, so that a CPU test can check that
// every tile is handed out exactly once.
#pragma once

#include <cutlass/fast_math.h>
#include <cute/config.hpp>

#include <algorithm>

namespace flashcute::sm90 {

struct WorkTile {
  int m_block, head, batch;
};

// A cluster of kClusterM CTAs takes each unit of a scheduler whose rows are kClusterM tiles
// tall: CTA `rank` of the cluster runs the rank-th tile of the unit's tile w.
template <int kClusterM>
CUTE_HOST_DEVICE WorkTile tile_of_cluster_member(WorkTile w, int rank) {
  w.m_block = w.m_block * kClusterM + rank;
  return w;
}

template <int kBlockM>
struct TileScheduler {
  struct Arguments {
    int batch, heads;  // batch = number of sequences when packed
    int seqlen_q;      // the longest sequence's when packed
    // Pair tiles m and num_m - 1 - m: causal attention without a left window edge, where a
    // tile's cost grows with its row.
    bool pair_tiles;
    const int32_t* cu_seqlens_q;  // packed: token offsets of each sequence; null when dense
    // Dynamic schedule: two ints, zero on entry (units taken beyond the grid's first, CTAs out of
    // units), left zero on exit; null: static. Packed calls and dense causal ones use it.
    int* counters;
    int l2_section_heads;  // dynamic: (batch, head) pairs whose K and V fit in half of L2
    int max_ctas;          // dynamic: the most CTAs the grid may have
  };

  struct Params {
    int heads, batch;
    int num_m_blocks;  // of the longest sequence when packed
    int num_units;     // the grid's work; for a packed batch an upper bound
    bool pair_tiles;
    const int32_t* cu_seqlens_q;
    int* counters;         // null: static schedule
    bool costliest_first;  // dynamic and dense: every tile a unit, in sections (below)
    // Dense schedule: divide by heads, and by the paired units of one (batch, head). FastDivmod:
    // a multiply-high and a shift instead of the ~25 instructions of an integer division.
    cutlass::FastDivmod heads_divmod, paired_per_bh_divmod;
    // Dynamic schedule: a first section of first_section_heads (batch, head) pairs (those left
    // over; maybe none), then sections of section_heads pairs, then a last one of
    // last_section_heads pairs, its first pair last_section_bh; num_m_blocks units per pair.
    int section_heads, first_section_heads, first_section_units;
    int last_section_heads, last_section_bh, last_section_unit0;
    cutlass::FastDivmod section_units_divmod, section_heads_divmod, first_section_heads_divmod,
        last_section_heads_divmod;
  };

  int unit;    // index of the current unit
  int second;  // paired units: 0: the unit's first (heavier) tile, 1: its second
  // Packed batches only: the sequence that holds `unit` (batch = number of sequences when the
  // list is exhausted) and the index of that sequence's first unit.
  int seq, seq_unit0;

  // Dense causal calls of at most this many row blocks keep the static pairs: with so few rows,
  // a balanced section spans more (batch, head) pairs than CTAs, so that a round's tiles share no
  // K or V and each row block reads its section's again (measured slower at s <= 1k, by up to a
  // fifth at d 256; bench/NOTES.md).
  static constexpr int kMaxStaticRowBlocks = 8;

  // Whether a call with these arguments uses the counters when given them.
  CUTE_HOST_DEVICE static bool schedules_dynamically(Arguments const& a) {
    if (a.cu_seqlens_q != nullptr) return true;
    return a.pair_tiles && (a.seqlen_q + kBlockM - 1) / kBlockM > kMaxStaticRowBlocks;
  }

  // Host, once per launch.
  static Params to_params(Arguments const& a) {
    Params p{};
    p.heads = a.heads;
    p.batch = a.batch;
    p.num_m_blocks = (a.seqlen_q + kBlockM - 1) / kBlockM;
    p.cu_seqlens_q = a.cu_seqlens_q;
    p.counters = schedules_dynamically(a) ? a.counters : nullptr;
    p.costliest_first = p.counters != nullptr && a.cu_seqlens_q == nullptr;
    p.pair_tiles = a.pair_tiles && !p.costliest_first;
    p.num_units = num_units(p);
    p.heads_divmod = cutlass::FastDivmod(p.heads);
    // No paired unit when causal with one tile per sequence; the divisor is then never used.
    p.paired_per_bh_divmod = cutlass::FastDivmod(std::max(paired_units_per_bh(p), 1));
    if (p.costliest_first) {
      int const bh = p.heads * p.batch;
      int const ctas = std::max(std::min(a.max_ctas, p.num_units), 1);
      int const balanced = (4 * ctas + p.num_m_blocks - 1) / p.num_m_blocks;
      p.section_heads = std::min(std::max(a.l2_section_heads, 1), bh);
      p.last_section_heads =
          std::min({std::max(balanced, p.section_heads), 2 * p.section_heads, bh});
      p.last_section_bh = bh - p.last_section_heads;
      p.last_section_unit0 = p.last_section_bh * p.num_m_blocks;
      p.first_section_heads = p.last_section_bh % p.section_heads;
      p.first_section_units = p.first_section_heads * p.num_m_blocks;
      p.section_units_divmod = cutlass::FastDivmod(p.section_heads * p.num_m_blocks);
      p.section_heads_divmod = cutlass::FastDivmod(p.section_heads);
      p.last_section_heads_divmod = cutlass::FastDivmod(p.last_section_heads);
      // Without a first section this divisor is never used.
      p.first_section_heads_divmod = cutlass::FastDivmod(std::max(p.first_section_heads, 1));
    }
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
    int bh, m;
    if (p.costliest_first) {
      // Within a section, the row blocks from the last (costliest) down, every pair of the
      // section at each row block.
      int rank;
      if (unit < p.first_section_units) {
        p.first_section_heads_divmod(rank, bh, unit);
      } else if (unit >= p.last_section_unit0) {
        p.last_section_heads_divmod(rank, bh, unit - p.last_section_unit0);
        bh += p.last_section_bh;
      } else {
        int section, within;
        p.section_units_divmod(section, within, unit - p.first_section_units);
        p.section_heads_divmod(rank, bh, within);
        bh += p.first_section_heads + section * p.section_heads;
      }
      m = p.num_m_blocks - 1 - rank;
    } else {
      // The units of every (batch, head) first (pairs when causal), then the middle tiles.
      int const paired_units = p.heads * p.batch * paired_units_per_bh(p);
      if (unit < paired_units) {
        int k;
        p.paired_per_bh_divmod(bh, k, unit);
        m = m_block(p, k, p.num_m_blocks);
      } else {
        bh = unit - paired_units;
        m = p.num_m_blocks / 2;  // the middle tile of an odd count
      }
    }
    int batch, head;
    p.heads_divmod(batch, head, bh);
    return WorkTile{m, head, batch};
  }

  // Dynamic: the next unit comes from the counter. The atomic's round trip is paid between two
  // tiles' loads, while the consumers still work on the K/V stages already loaded.
  CUTE_HOST_DEVICE void advance(Params const& p, int grid_size) {
    if (p.pair_tiles && !second && pairs_with_next(p)) {
      second = 1;
      return;
    }
    second = 0;
    unit = p.counters != nullptr ? grid_size + fetch_add(p.counters[0]) : unit + grid_size;
    if (p.cu_seqlens_q != nullptr) seek(p);
  }

  // Dynamic: once per CTA, after its last unit. The last CTA out zeroes the counters: every CTA's
  // last take (which found no unit) came before its count here.
  CUTE_HOST_DEVICE static void retire(Params const& p, int grid_size) {
    if (p.counters == nullptr) return;
#if defined(__CUDA_ARCH__)
    __threadfence();
#endif
    if (fetch_add(p.counters[1]) == grid_size - 1) {
      store_zero(p.counters[0]);
      store_zero(p.counters[1]);
    }
  }

 private:
  // One thread (the producer's) calls it. The shuffle from lane 0 tells the compiler that the
  // unit is warp-uniform, so that the tile's coordinates and TMA arithmetic stay in uniform
  // registers; in vector registers they do not fit the producer's 24.
  CUTE_HOST_DEVICE static int fetch_add(int& counter) {
#if defined(__CUDA_ARCH__)
    return __shfl_sync(1u, atomicAdd(&counter, 1), 0);
#else
    return counter++;  // the CPU test runs the CTAs one step at a time
#endif
  }
  CUTE_HOST_DEVICE static void store_zero(int& counter) {
#if defined(__CUDA_ARCH__)
    atomicExch(&counter, 0);
#else
    counter = 0;
#endif
  }

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

// Which keys a query sees, and what that means for tiles. One rule covers causal masks of either
// alignment and local windows: query row i sees key j iff 0 <= j < seqlen_k and
// i + diag - left <= j <= i + diag + right, with diag = seqlen_k - seqlen_q (bottom-right) or 0
// (top-left) and a negative bound unbounded; causal is right = 0.
// Block-level answers let a main loop skip whole blocks and mask only the blocks an edge crosses:
// a query tile's key blocks (forward), and a key tile's query blocks (backward). Rows past
// seqlen_q or keys past seqlen_k in a block count as hidden, so residue blocks are masked.
// Host-callable too: a CPU test checks every answer against every (query, key) pair.
#pragma once

#include <cute/config.hpp>

#include "kernels/common/geometry_math.hpp"

namespace flashcute {

// Blocks [begin, end); empty when end <= begin.
struct BlockRange {
  int begin, end;
};

// Blocks that need an element mask: n >= from or n < below.
struct MaskedBlocks {
  int from, below;
  CUTE_HOST_DEVICE bool contains(int n) const { return n >= from || n < below; }
};

// Visible keys of one row: [begin, end), begin possibly negative (no key lies there).
struct KeyInterval {
  int begin, end;
};

// Queries that see one key: [begin, end), empty when end <= begin.
struct QueryInterval {
  int begin, end;
};

struct AttentionMask {
  int seqlen_q, seqlen_k;
  int diag;         // query i and key i + diag are aligned
  int left, right;  // window edges; negative: unbounded

  CUTE_HOST_DEVICE AttentionMask(int seqlen_q_, int seqlen_k_, bool bottom_right, int left_,
                                 int right_)
      : seqlen_q(seqlen_q_),
        seqlen_k(seqlen_k_),
        diag(bottom_right ? seqlen_k_ - seqlen_q_ : 0),
        left(left_),
        right(right_) {}

  CUTE_HOST_DEVICE bool visible(int row, int key) const {
    return key >= 0 && key < seqlen_k && (right < 0 || key <= row + diag + right) &&
           (left < 0 || key >= row + diag - left);
  }

  CUTE_HOST_DEVICE KeyInterval row_keys(int row) const {
    return {left >= 0 ? row + diag - left : 0,
            right >= 0 ? geometry_min(seqlen_k, row + diag + right + 1) : seqlen_k};
  }

  // Backward, the inverse of row_keys: the rows that see key j (none for a key past seqlen_k).
  CUTE_HOST_DEVICE QueryInterval key_queries(int key) const {
    if (key < 0 || key >= seqlen_k) return {0, 0};
    return {right >= 0 ? geometry_max(key - diag - right, 0) : 0,
            left >= 0 ? geometry_min(seqlen_q, key - diag + left + 1) : seqlen_q};
  }

  // Forward: the query tile m (rows [m * kBlockM, ...) below seqlen_q) over key blocks of kBlockN.
  // The range holds every block with a key some row sees: the tile's last row sees the furthest
  // key on the right, its first row the nearest on the left.
  template <int kBlockM, int kBlockN>
  CUTE_HOST_DEVICE BlockRange key_blocks(int m_block) const {
    int const first_row = m_block * kBlockM;
    int const last_row = geometry_min(first_row + kBlockM, seqlen_q) - 1;
    int end = seqlen_k;
    if (right >= 0) end = geometry_min(end, last_row + diag + right + 1);
    int const begin = left >= 0 ? geometry_max(first_row + diag - left, 0) / kBlockN : 0;
    return {begin, end <= 0 ? 0 : ceil_div(end, kBlockN)};
  }

  // Forward: the key blocks of query tile m with a hidden (row, key) pair. From the right: the key
  // residue ((n + 1) * kBlockN > seqlen_k) and the right edge crossing the block for the first
  // row ((n + 1) * kBlockN - 1 > first_row + diag + right). From the left: the left edge of the
  // last row (n * kBlockN < last_row + diag - left).
  template <int kBlockM, int kBlockN>
  CUTE_HOST_DEVICE MaskedBlocks masked_key_blocks(int m_block) const {
    int const first_row = m_block * kBlockM;
    MaskedBlocks masked{seqlen_k / kBlockN, 0};
    if (right >= 0) {
      int const edge = first_row + diag + right + 1;
      masked.from = geometry_min(masked.from, edge <= 0 ? 0 : edge / kBlockN);
    }
    if (left >= 0) {
      int const last_row = geometry_min(first_row + kBlockM, seqlen_q) - 1;
      int const edge = last_row + diag - left;
      masked.below = edge <= 0 ? 0 : ceil_div(edge, kBlockN);
    }
    return masked;
  }

  // Backward: the key tile n (keys [n * kBlockN, ...) below seqlen_k) over query blocks of
  // kBlockM. Row i sees a key of the tile iff i + diag + right >= the tile's first key and
  // i + diag - left <= its last key.
  template <int kBlockM, int kBlockN>
  CUTE_HOST_DEVICE BlockRange query_blocks(int n_block) const {
    int const first_key = n_block * kBlockN;
    if (first_key >= seqlen_k) return {0, 0};
    int const last_key = geometry_min(first_key + kBlockN, seqlen_k) - 1;
    int end = seqlen_q;
    if (left >= 0) end = geometry_min(end, last_key - diag + left + 1);
    int const begin = right >= 0 ? geometry_max(first_key - diag - right, 0) / kBlockM : 0;
    return {begin, end <= 0 ? 0 : ceil_div(end, kBlockM)};
  }

  // Backward, the inverse of query_blocks: the key tiles whose query range holds block m_block,
  // by bisection over query_blocks itself (both ends of a tile's range grow with the tile, so
  // the tiles are contiguous), so that the tiles counted here are the ones that add to it.
  template <int kBlockM, int kBlockN>
  CUTE_HOST_DEVICE BlockRange key_tiles_of(int m_block) const {
    int const tiles = seqlen_k <= 0 ? 0 : ceil_div(seqlen_k, kBlockN);
    // The first tile in [0, tiles) for which past(tile) holds (tiles if none); past is monotone.
    auto const first = [tiles](auto past) {
      int lo = 0, hi = tiles;
      while (lo < hi) {
        int const mid = (lo + hi) / 2;
        if (past(mid)) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      return lo;
    };
    return {first([&](int n) { return query_blocks<kBlockM, kBlockN>(n).end > m_block; }),
            first([&](int n) { return query_blocks<kBlockM, kBlockN>(n).begin > m_block; })};
  }

  // Backward: the query blocks of key tile n with a hidden pair. Below: the right edge for the
  // tile's last key and the block's first row (m * kBlockM < last_key - diag - right). From:
  // the query residue ((m + 1) * kBlockM > seqlen_q), the left edge for the tile's first key and
  // the block's last row ((m + 1) * kBlockM - 1 > first_key - diag + left), and every block when
  // the tile holds keys past seqlen_k.
  template <int kBlockM, int kBlockN>
  CUTE_HOST_DEVICE MaskedBlocks masked_query_blocks(int n_block) const {
    int const first_key = n_block * kBlockN;
    MaskedBlocks masked{seqlen_q / kBlockM, 0};
    if (first_key + kBlockN > seqlen_k) masked.from = 0;
    if (left >= 0) {
      int const edge = first_key - diag + left + 1;
      masked.from = geometry_min(masked.from, edge <= 0 ? 0 : edge / kBlockM);
    }
    if (right >= 0) {
      int const edge = first_key + kBlockN - 1 - diag - right;
      masked.below = edge <= 0 ? 0 : ceil_div(edge, kBlockM);
    }
    return masked;
  }
};

}  // namespace flashcute

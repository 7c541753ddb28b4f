// The shared geometry (kernels/common: sequence info and mask policy) and the Hopper family's
// TileInfo built on it, run on the host against a brute-force check of every (query, key) pair:
// - forward: a query tile's key-block range holds every block with a key some row sees and ends
//   on such blocks; every visited block with a hidden pair is masked;
// - backward: the same for a key tile's query blocks (rows past seqlen_q count as hidden), and
//   a query block's key tiles are exactly those whose query range holds it;
// - the element mask of each row is exactly its visible keys.
// Windows of both edges, both causal alignments, lengths off the tile grid, for the tile shapes
// of both kernel families; dense and packed sequences, and key lengths read from arrays.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/backward/workspace.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/sm90/tile_info.hpp"

namespace flashcute {
namespace {

struct Problem {
  int sq, sk;
  bool bottom_right;
  int left, right;
};

// Written from the mask's definition, independently of the kernels' arithmetic.
bool sees(const Problem& p, int row, int key) {
  int const diag = p.bottom_right ? p.sk - p.sq : 0;
  if (row < 0 || row >= p.sq || key < 0 || key >= p.sk) return false;
  if (p.right >= 0 && key > row + diag + p.right) return false;
  if (p.left >= 0 && key < row + diag - p.left) return false;
  return true;
}

AttentionMask mask_of(const Problem& p) {
  return AttentionMask(p.sq, p.sk, p.bottom_right, p.left, p.right);
}

// Over the tiles of one dimension ("outer": query tiles forward, key tiles backward) and the
// blocks of the other: every block with a visible pair is in the range, the range ends on such
// blocks, and every block in range with a hidden pair is masked. pair(o, i) gives whether the
// pair is visible; clip_outer: the outer tile's entries past outer_extent are left out.
template <class Range, class Masked, class Pair>
void check_blocks(int outer_tiles, int outer_size, int outer_extent, int inner_blocks,
                  int inner_size, Range range_of, Masked masked_of, Pair pair, bool clip_outer) {
  for (int t = 0; t < outer_tiles; ++t) {
    BlockRange const range = range_of(t);
    MaskedBlocks const masked = masked_of(t);
    int const outer_end =
        clip_outer ? std::min((t + 1) * outer_size, outer_extent) : (t + 1) * outer_size;
    bool any_visible = false;
    std::vector<bool> visible_in(inner_blocks, false), all_visible(inner_blocks, true);
    for (int b = 0; b < inner_blocks; ++b) {
      for (int o = t * outer_size; o < outer_end; ++o) {
        for (int i = b * inner_size; i < (b + 1) * inner_size; ++i) {
          bool const v = pair(o, i);
          visible_in[b] = visible_in[b] || v;
          all_visible[b] = all_visible[b] && v;
        }
      }
      any_visible = any_visible || visible_in[b];
    }
    SCOPED_TRACE(testing::Message()
                 << "tile " << t << " range [" << range.begin << ", " << range.end
                 << ") masked n >= " << masked.from << " or n < " << masked.below);
    for (int b = 0; b < inner_blocks; ++b) {
      bool const visited = b >= range.begin && b < range.end;
      if (visible_in[b]) ASSERT_TRUE(visited) << "block " << b << " holds visible pairs";
      if (visited && !all_visible[b]) ASSERT_TRUE(masked.contains(b)) << "block " << b;
    }
    if (any_visible) {
      ASSERT_GE(range.begin, 0);
      ASSERT_LE(range.end, inner_blocks);
      EXPECT_TRUE(visible_in[range.begin]) << "the range starts on a block with no visible pair";
      EXPECT_TRUE(visible_in[range.end - 1]) << "the range ends on a block with no visible pair";
    }
  }
}

template <int M, int N>
void check_problem(const Problem& p) {
  AttentionMask const mask = mask_of(p);
  // Forward: query tiles of M rows (rows past seqlen_q are never stored), key blocks of N.
  check_blocks((p.sq + M - 1) / M, M, p.sq, (p.sk + N - 1) / N, N,
               [&](int m) { return mask.key_blocks<M, N>(m); },
               [&](int m) { return mask.masked_key_blocks<M, N>(m); },
               [&](int row, int key) { return sees(p, row, key); }, true);
  if (testing::Test::HasFatalFailure()) return;
  // Backward: key tiles of N keys, query blocks of M; a key tile's keys past seqlen_k and a
  // block's rows past seqlen_q are hidden (both are loaded, and must not contribute).
  check_blocks((p.sk + N - 1) / N, N, p.sk, (p.sq + M - 1) / M, M,
               [&](int n) { return mask.query_blocks<M, N>(n); },
               [&](int n) { return mask.masked_query_blocks<M, N>(n); },
               [&](int key, int row) { return sees(p, row, key); }, false);
  if (testing::Test::HasFatalFailure()) return;
  // A key tile's range must not reach past the query blocks that exist.
  for (int n = 0; n * N < p.sk; ++n) {
    BlockRange const rows = mask.query_blocks<M, N>(n);
    ASSERT_LE(rows.end, (p.sq + M - 1) / M);
  }
  // key_tiles_of: exactly the key tiles whose query range holds the block.
  for (int m = 0; m * M < p.sq; ++m) {
    BlockRange const tiles = mask.key_tiles_of<M, N>(m);
    for (int n = 0; n * N < p.sk; ++n) {
      BlockRange const rows = mask.query_blocks<M, N>(n);
      ASSERT_EQ(m >= rows.begin && m < rows.end, n >= tiles.begin && n < tiles.end)
          << "query block " << m << " key tile " << n;
    }
  }
  // Element mask: row_keys is exactly the visible keys of the row.
  for (int row = 0; row < p.sq; ++row) {
    KeyInterval const keys = mask.row_keys(row);
    for (int key = -2; key < p.sk + 2; ++key) {
      bool const in = key >= std::max(keys.begin, 0) && key < keys.end && key < p.sk;
      ASSERT_EQ(in, sees(p, row, key)) << "row " << row << " key " << key;
      ASSERT_EQ(mask.visible(row, key), sees(p, row, key)) << "row " << row << " key " << key;
    }
  }
  // Backward element mask: key_queries is exactly the rows that see the key.
  for (int key = -2; key < p.sk + 2; ++key) {
    QueryInterval const rows = mask.key_queries(key);
    for (int row = -2; row < p.sq + 2; ++row) {
      bool const in = row >= rows.begin && row < rows.end;
      bool const visible = row >= 0 && row < p.sq && sees(p, row, key);
      ASSERT_EQ(in, visible) << "key " << key << " row " << row;
    }
  }
}

template <int M, int N>
void check_random_problems(unsigned seed) {
  std::mt19937 rng(seed);
  int const lengths[] = {1, 2, 31, 63, 64, 65, 79, 127, 128, 129, 175, 176, 177, 300, 511};
  int const lefts[] = {-1, 0, 1, 17, 64, 127, 128, 300, 1000};
  int const rights[] = {-1, 0, 3, 64, 129, 500};
  for (int trial = 0; trial < 150; ++trial) {
    Problem p;
    p.sq = lengths[rng() % std::size(lengths)];
    p.sk = lengths[rng() % std::size(lengths)];
    p.left = lefts[rng() % std::size(lefts)];
    p.right = rights[rng() % std::size(rights)];
    p.bottom_right = rng() % 2;
    SCOPED_TRACE(testing::Message()
                 << "sq " << p.sq << " sk " << p.sk << " window (" << p.left << ", " << p.right
                 << ") " << (p.bottom_right ? "bottom-right" : "top-left"));
    check_problem<M, N>(p);
    if (testing::Test::HasFatalFailure()) return;
  }
}

// The SM80 family's tiles (m_block x n_block).
TEST(MaskPolicy, EveryPairSm80Tile64x32) { check_random_problems<64, 32>(11); }
TEST(MaskPolicy, EveryPairSm80Tile64x64) { check_random_problems<64, 64>(12); }
TEST(MaskPolicy, EveryPairSm80Tile64x128) { check_random_problems<64, 128>(13); }
TEST(MaskPolicy, EveryPairSm80Tile128x32) { check_random_problems<128, 32>(14); }
TEST(MaskPolicy, EveryPairSm80Tile128x64) { check_random_problems<128, 64>(15); }
TEST(MaskPolicy, EveryPairSm80Tile128x128) { check_random_problems<128, 128>(16); }
// The Hopper family's tiles.
TEST(MaskPolicy, EveryPairSm90Tile192x128) { check_random_problems<192, 128>(21); }
TEST(MaskPolicy, EveryPairSm90Tile128x176) { check_random_problems<128, 176>(22); }
TEST(MaskPolicy, EveryPairSm90Tile128x96) { check_random_problems<128, 96>(23); }
TEST(MaskPolicy, EveryPairSm90Tile128x80) { check_random_problems<128, 80>(24); }

// The Hopper backward's padded row statistics: each sequence's rows, rounded up to whole blocks,
// start on a block boundary, stay within the total and never overlap the next sequence's.
TEST(PaddedRows, SequencesGetWholeDisjointBlocks) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    int const batch = 1 + int(rng() % 9);
    bool const packed = trial % 2 == 0;
    int const dense_len = int(rng() % 300);
    std::vector<int32_t> cu(batch + 1, 0);
    for (int b = 0; b < batch; ++b) {
      cu[b + 1] = cu[b] + (packed ? int(rng() % 300) : dense_len);
    }
    int64_t const total = PaddedRows::total(cu[batch], batch);
    int64_t previous_end = 0;
    for (int b = 0; b < batch; ++b) {
      SequenceLayout const layout{
          dense_len, 1,      packed ? cu.data() : nullptr, packed ? cu.data() : nullptr,
          nullptr,   nullptr};
      SequenceInfo<> const seq(layout, b);
      int64_t const start = PaddedRows::sequence_start(seq, b, dense_len);
      int64_t const blocks = (seq.seqlen_q + PaddedRows::kBlock - 1) / PaddedRows::kBlock;
      ASSERT_EQ(start % PaddedRows::kBlock, 0) << "sequence " << b;
      ASSERT_GE(start, previous_end) << "sequence " << b;
      previous_end = start + blocks * PaddedRows::kBlock;
      ASSERT_LE(previous_end, total) << "sequence " << b;
    }
  }
}

TEST(SequenceInfo, DensePackedAndKeyArrays) {
  std::vector<int32_t> cu_q = {0, 5, 5, 12}, cu_k = {0, 7, 9, 20};
  std::vector<int32_t> used = {3, 0, 11}, pad = {1, 0, 4};
  SequenceLayout dense{6, 9, nullptr, nullptr, nullptr, nullptr};
  for (int b = 0; b < 3; ++b) {
    SequenceInfo<> const s(dense, b);
    EXPECT_EQ(s.seqlen_q, 6);
    EXPECT_EQ(s.seqlen_k, 9);
    EXPECT_EQ(s.q_start, 0);
    EXPECT_EQ(s.k_start, 0);
    EXPECT_EQ(s.batch, b);
    EXPECT_EQ(s.q_offset(1000, 10, 3, 2), b * 1000 + 6);
  }
  SequenceLayout packed{7, 11, cu_q.data(), cu_k.data(), nullptr, nullptr};
  for (int b = 0; b < 3; ++b) {
    SequenceInfo<> const s(packed, b);
    EXPECT_EQ(s.seqlen_q, cu_q[b + 1] - cu_q[b]);
    EXPECT_EQ(s.seqlen_k, cu_k[b + 1] - cu_k[b]);
    EXPECT_EQ(s.q_start, cu_q[b]);
    EXPECT_EQ(s.k_start, cu_k[b]);
    EXPECT_EQ(s.batch, 0);
    EXPECT_EQ(s.k_offset(1000, 10, 3, 1), int64_t(cu_k[b]) * 10 + 3);
  }
  // A cache: keys in use and left padding per sequence, dense and packed.
  SequenceLayout cache{1, 64, nullptr, nullptr, used.data(), pad.data()};
  for (int b = 0; b < 3; ++b) {
    SequenceInfo<true> const s(cache, b);
    EXPECT_EQ(s.seqlen_k, used[b] - pad[b]);
    EXPECT_EQ(s.k_start, pad[b]);
    EXPECT_EQ(s.batch, b);
    // A kernel compiled without the arrays ignores them.
    SequenceInfo<false> const plain(cache, b);
    EXPECT_EQ(plain.seqlen_k, 64);
    EXPECT_EQ(plain.k_start, 0);
  }
  SequenceLayout used_only{1, 64, nullptr, nullptr, used.data(), nullptr};
  EXPECT_EQ(SequenceInfo<true>(used_only, 2).seqlen_k, 11);
  SequenceLayout packed_cache{4, 11, cu_q.data(), cu_k.data(), nullptr, pad.data()};
  EXPECT_EQ(SequenceInfo<true>(packed_cache, 2).k_start, cu_k[2] + pad[2]);
  EXPECT_EQ(SequenceInfo<true>(packed_cache, 2).seqlen_k, cu_k[3] - cu_k[2] - pad[2]);
}

// The Hopper family's TileInfo: the shared policy's answers for the tile's own sequence.
struct FakeMainloopParams {
  SequenceLayout sequences;
  bool bottom_right;
  int window_left, window_right;
};

template <int kM, int kN>
struct FakeTraits {
  static constexpr int kBlockM = kM;
  static constexpr int kBlockN = kN;
};

template <int M, int N>
void check_tile_info(unsigned seed) {
  std::mt19937 rng(seed);
  int cut_blocks = 0;  // (slice, block) pairs whose visible columns end inside the block
  for (int trial = 0; trial < 100; ++trial) {
    int const batch = 1 + int(rng() % 4);
    std::vector<int32_t> cu_q(batch + 1, 0), cu_k(batch + 1, 0);
    for (int b = 0; b < batch; ++b) {
      cu_q[b + 1] = cu_q[b] + int(rng() % 400);
      cu_k[b + 1] = cu_k[b] + int(rng() % 400);
    }
    bool const packed = rng() % 2;
    FakeMainloopParams p{{int(rng() % 400), int(rng() % 400), packed ? cu_q.data() : nullptr,
                          packed ? cu_k.data() : nullptr, nullptr, nullptr},
                         bool(rng() % 2),
                         int(rng() % 3) - 1 + int(rng() % 2) * 100,
                         int(rng() % 3) - 1};
    for (int b = 0; b < batch; ++b) {
      SequenceInfo<> const seq(p.sequences, b);
      AttentionMask const mask(seq.seqlen_q, seq.seqlen_k, p.bottom_right, p.window_left,
                               p.window_right);
      for (int m = 0; m * M < seq.seqlen_q; ++m) {
        sm90::TileInfo const t = sm90::TileInfo::make<FakeTraits<M, N>>(p, sm90::WorkTile{m, 0, b});
        ASSERT_EQ(t.seqlen_q, seq.seqlen_q);
        ASSERT_EQ(t.seqlen_k, seq.seqlen_k);
        ASSERT_EQ(t.q_start, seq.q_start);
        ASSERT_EQ(t.k_start, seq.k_start);
        ASSERT_EQ(t.batch, seq.batch);
        BlockRange const r = mask.key_blocks<M, N>(m);
        MaskedBlocks const k = mask.masked_key_blocks<M, N>(m);
        ASSERT_EQ(t.n_block_min, r.begin);
        ASSERT_EQ(t.n_block_max, r.end);
        ASSERT_EQ(t.n_block_mask, k.from);
        ASSERT_EQ(t.n_block_left_mask, k.below);
        // A packed sequence's last block is loaded ending at its last key, never before key 0 of
        // the sequence's block range, and never past the sequence.
        if (seq.seqlen_k >= N) {
          int const n_last = (seq.seqlen_k - 1) / N;
          int const key0 = t.key0<FakeTraits<M, N>>(p, n_last);
          ASSERT_LE(key0 + N, packed ? seq.seqlen_k : n_last * N + N);
          ASSERT_GT(key0 + N, n_last * N);
        }
        // Each 64-row slice of the tile: from its visible_columns on, a block's columns hold no
        // key that one of the slice's rows below seqlen_q sees (columns before the block's first
        // key repeat the block before and are hidden anyway).
        for (int n = r.begin; n < r.end; ++n) {
          int const key0 = t.key0<FakeTraits<M, N>>(p, n);
          for (int first_row = m * M; first_row < (m + 1) * M; first_row += 64) {
            int const cols = t.visible_columns<FakeTraits<M, N>>(p, first_row, n);
            cut_blocks += cols > 0 && cols < N;
            for (int row = first_row; row < std::min(first_row + 64, seq.seqlen_q); ++row) {
              for (int c = std::max(cols, 0); c < N; ++c) {
                int const key = key0 + c;
                ASSERT_FALSE(key >= n * N && mask.visible(row, key))
                    << "row " << row << " key " << key << " block " << n << " columns " << cols;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cut_blocks, 0);
}

TEST(Sm90TileInfo, FollowsTheSharedPolicy64x64) { check_tile_info<64, 64>(31); }
TEST(Sm90TileInfo, FollowsTheSharedPolicy128x128) { check_tile_info<128, 128>(32); }
TEST(Sm90TileInfo, FollowsTheSharedPolicy192x128) { check_tile_info<192, 128>(33); }
TEST(Sm90TileInfo, FollowsTheSharedPolicy128x176) { check_tile_info<128, 176>(34); }

}  // namespace
}  // namespace flashcute

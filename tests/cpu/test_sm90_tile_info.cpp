// The Hopper family's per-tile key-block range and mask flags, run on the host against every
// (query, key) pair: each block holding a key some row of the tile sees lies in the visited
// range, the range ends on such blocks, and every visited block with a hidden pair is masked.
// Windows of both edges, both causal alignments, sequence lengths off the tile grid, dense and
// packed sequences, for the tile shapes the family builds.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/sm90/tile_info.hpp"

namespace flashcute::sm90 {
namespace {

// The fields of KernelParams that TileInfo reads.
struct FakeParams {
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int seqlen_q = 0, seqlen_k = 0;
  int window_left = -1, window_right = -1;
  bool bottom_right = false;
};

template <int kM, int kN>
struct FakeTraits {
  static constexpr int kBlockM = kM;
  static constexpr int kBlockN = kN;
};

// Written from the mask's definition, independently of the kernel's arithmetic.
bool sees(const FakeParams& p, int sq, int sk, int row, int key) {
  int const diag = p.bottom_right ? sk - sq : 0;
  if (key < 0 || key >= sk) return false;
  if (p.window_right >= 0 && key > row + diag + p.window_right) return false;
  if (p.window_left >= 0 && key < row + diag - p.window_left) return false;
  return true;
}

template <class Traits>
void check_sequence(const FakeParams& p, int batch, int sq, int sk) {
  constexpr int M = Traits::kBlockM, N = Traits::kBlockN;
  int const key_blocks = (sk + N - 1) / N;
  for (int m = 0; m * M < sq; ++m) {
    TileInfo const t = TileInfo::make<Traits>(p, WorkTile{m, 0, batch});
    ASSERT_EQ(t.seqlen_q, sq);
    ASSERT_EQ(t.seqlen_k, sk);
    int const rows_end = std::min((m + 1) * M, sq);
    bool any_visible = false;
    std::vector<bool> visible_in(key_blocks, false), all_visible(key_blocks, true);
    for (int n = 0; n < key_blocks; ++n) {
      for (int row = m * M; row < rows_end; ++row) {
        for (int key = n * N; key < (n + 1) * N; ++key) {
          bool const v = sees(p, sq, sk, row, key);
          visible_in[n] = visible_in[n] || v;
          all_visible[n] = all_visible[n] && v;
        }
      }
      any_visible = any_visible || visible_in[n];
    }
    SCOPED_TRACE(testing::Message()
                 << "tile " << m << " range [" << t.n_block_min << ", " << t.n_block_max
                 << ") mask n >= " << t.n_block_mask << " or n < " << t.n_block_left_mask);
    for (int n = 0; n < key_blocks; ++n) {
      bool const visited = n >= t.n_block_min && n < t.n_block_max;
      if (visible_in[n]) ASSERT_TRUE(visited) << "block " << n << " holds visible keys";
      bool const masked = n >= t.n_block_mask || n < t.n_block_left_mask;
      if (visited && !all_visible[n]) ASSERT_TRUE(masked) << "block " << n << " hides a pair";
    }
    if (any_visible) {
      ASSERT_GE(t.n_block_min, 0);
      ASSERT_LE(t.n_block_max, key_blocks);
      EXPECT_TRUE(visible_in[t.n_block_min]) << "the range starts on a block with no visible key";
      EXPECT_TRUE(visible_in[t.n_block_max - 1]) << "the range ends on a block with no visible key";
    }
  }
}

template <class Traits>
void check_random_problems(unsigned seed) {
  std::mt19937 rng(seed);
  int const lengths[] = {1, 2, 63, 64, 65, 127, 128, 129, 175, 176, 177, 300, 511, 700};
  int const lefts[] = {-1, 0, 1, 17, 64, 127, 128, 300, 1000};
  int const rights[] = {-1, 0, 3, 64, 129, 500};
  for (int trial = 0; trial < 300; ++trial) {
    FakeParams p;
    int const sq = lengths[rng() % std::size(lengths)];
    int const sk = lengths[rng() % std::size(lengths)];
    p.window_left = lefts[rng() % std::size(lefts)];
    p.window_right = rights[rng() % std::size(rights)];
    p.bottom_right = rng() % 2;
    SCOPED_TRACE(testing::Message()
                 << "sq " << sq << " sk " << sk << " window (" << p.window_left << ", "
                 << p.window_right << ") " << (p.bottom_right ? "bottom-right" : "top-left"));
    // Dense.
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    check_sequence<Traits>(p, 0, sq, sk);
    if (testing::Test::HasFatalFailure()) return;
    // Packed: the same lengths as the second of three sequences.
    int const other_q = 1 + int(rng() % 200), other_k = 1 + int(rng() % 200);
    std::vector<int32_t> cu_q = {0, other_q, other_q + sq, 2 * other_q + sq};
    std::vector<int32_t> cu_k = {0, other_k, other_k + sk, 2 * other_k + sk};
    p.cu_seqlens_q = cu_q.data();
    p.cu_seqlens_k = cu_k.data();
    p.seqlen_q = std::max(sq, other_q);
    p.seqlen_k = std::max(sk, other_k);
    check_sequence<Traits>(p, 1, sq, sk);
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(Sm90TileInfo, RangesAndMasksCoverEveryPair64x64) {
  check_random_problems<FakeTraits<64, 64>>(1);
}
TEST(Sm90TileInfo, RangesAndMasksCoverEveryPair128x128) {
  check_random_problems<FakeTraits<128, 128>>(2);
}
TEST(Sm90TileInfo, RangesAndMasksCoverEveryPair192x128) {
  check_random_problems<FakeTraits<192, 128>>(3);
}
TEST(Sm90TileInfo, RangesAndMasksCoverEveryPair128x176) {
  check_random_problems<FakeTraits<128, 176>>(4);
}
TEST(Sm90TileInfo, RangesAndMasksCoverEveryPair128x80) {
  check_random_problems<FakeTraits<128, 80>>(5);
}

}  // namespace
}  // namespace flashcute::sm90

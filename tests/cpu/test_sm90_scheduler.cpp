// The Hopper family's persistent-grid scheduler, run on the host: over every CTA of a grid, each
// tile of each (sequence, head) is handed out exactly once, causal tiles come in balanced pairs,
// a packed batch gets no tile past a sequence's end, and packed batches of mixed lengths are
// balanced. The work order of a sorted packed batch (computed on the GPU by one warp) is given
// here by an independent stable sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/sm90/tile_scheduler.hpp"

namespace flashcute::sm90 {
namespace {

constexpr int kBlockM = 128;
using Scheduler = TileScheduler<kBlockM>;  // packed batches in the caller's order
using SortingScheduler = TileScheduler<kBlockM, 4096>;
using SmallSortingScheduler = TileScheduler<kBlockM, 8>;  // sorts batches of at most 8

template <class S = Scheduler>
typename S::Params make_params(int heads, int batch, int longest, bool causal,
                               const int32_t* cu_seqlens_q) {
  return S::to_params({batch, heads, longest, causal, cu_seqlens_q});
}

int m_blocks(int seqlen) { return (seqlen + kBlockM - 1) / kBlockM; }

// The order a sorted batch is worked in: by tile count, capped at 31, descending, ties in the
// caller's order.
std::vector<uint16_t> work_order(const std::vector<int>& seqlens) {
  std::vector<uint16_t> order(seqlens.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = uint16_t(i);
  auto key = [&](int s) { return std::min(m_blocks(seqlens[s]), 31); };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
  return order;
}

struct Visit {
  int cta, order;  // which CTA, and its position in that CTA's list
};

// Runs every CTA's scheduler to the end; the visits of each (batch, head, m_block).
template <class S>
std::map<std::tuple<int, int, int>, std::vector<Visit>> run_grid(const typename S::Params& p,
                                                                 int grid, const uint16_t* order) {
  std::map<std::tuple<int, int, int>, std::vector<Visit>> visits;
  for (int cta = 0; cta < grid; ++cta) {
    int position = 0;
    for (S s(p, cta, order); s.valid(p); s.advance(p, cta, grid, order)) {
      WorkTile w = s.get(p, order);
      visits[{w.batch, w.head, w.m_block}].push_back(Visit{cta, position++});
    }
  }
  return visits;
}

// Each expected tile exactly once, nothing else; a causal pair (m, last - m) runs back to back
// on one CTA.
template <class S = Scheduler>
void expect_each_tile_once(const typename S::Params& p, const std::vector<int>& seqlens, int grid,
                           const uint16_t* order = nullptr) {
  auto visits = run_grid<S>(p, grid, order);
  size_t expected = 0;
  for (int b = 0; b < int(seqlens.size()); ++b) {
    int const nm = m_blocks(seqlens[b]);
    for (int h = 0; h < p.heads; ++h) {
      for (int m = 0; m < nm; ++m) {
        ++expected;
        auto it = visits.find({b, h, m});
        ASSERT_NE(it, visits.end()) << "tile never handed out: b " << b << " h " << h << " m " << m;
        ASSERT_EQ(it->second.size(), 1u)
            << "tile handed out twice: b " << b << " h " << h << " m " << m;
        if (p.pair_tiles && m < nm / 2) {
          auto partner = visits.find({b, h, nm - 1 - m});
          ASSERT_NE(partner, visits.end());
          EXPECT_EQ(partner->second[0].cta, it->second[0].cta)
              << "b " << b << " h " << h << " m " << m;
          EXPECT_EQ(partner->second[0].order + 1, it->second[0].order)
              << "the heavier tile of a pair runs first: b " << b << " h " << h << " m " << m;
        }
      }
    }
  }
  EXPECT_EQ(visits.size(), expected) << "tiles outside the problem were handed out";
}

TEST(Sm90Scheduler, DenseEveryTileOnce) {
  for (bool causal : {false, true})
    for (int seqlen : {1, 128, 129, 384, 1000, 8192})
      for (int grid : {1, 7, 132}) {
        auto const p = make_params(3, 2, seqlen, causal, nullptr);
        SCOPED_TRACE(testing::Message()
                     << "causal " << causal << " seqlen " << seqlen << " grid " << grid);
        expect_each_tile_once(p, std::vector<int>(p.batch, seqlen), std::min(grid, p.num_units));
      }
}

TEST(Sm90Scheduler, PackedEveryTileOnceNoEmptyTiles) {
  std::mt19937 rng(20261130);
  for (int trial = 0; trial < 40; ++trial) {
    int const batch = 1 + int(rng() % 24);
    std::vector<int> seqlens(batch);
    std::vector<int32_t> cu(batch + 1, 0);
    for (int b = 0; b < batch; ++b) {
      // Zero-length sequences and lengths at and around tile edges included.
      int const pick = int(rng() % 4);
      seqlens[b] = pick == 0 ? 0 : pick == 1 ? 128 * int(1 + rng() % 8) : int(rng() % 3000);
      cu[b + 1] = cu[b] + seqlens[b];
    }
    int const heads = 1 + int(rng() % 5);
    bool const causal = rng() % 2;
    int const longest = *std::max_element(seqlens.begin(), seqlens.end());
    int const grid = 1 + int(rng() % 140);
    SCOPED_TRACE(testing::Message() << "trial " << trial << " batch " << batch << " causal "
                                    << causal << " grid " << grid);
    auto const p = make_params(heads, batch, longest, causal, cu.data());
    ASSERT_FALSE(p.sorted);
    expect_each_tile_once(p, seqlens, grid);
    std::vector<uint16_t> const order = work_order(seqlens);
    auto const sorted = make_params<SortingScheduler>(heads, batch, longest, causal, cu.data());
    ASSERT_TRUE(sorted.sorted);
    expect_each_tile_once<SortingScheduler>(sorted, seqlens, grid, order.data());
    // A batch larger than the order's buffer keeps the caller's order.
    auto const small = make_params<SmallSortingScheduler>(heads, batch, longest, causal, cu.data());
    ASSERT_EQ(small.sorted, batch <= 8);
    expect_each_tile_once<SmallSortingScheduler>(small, seqlens, grid, order.data());
  }
}

// On packed batches of mixed lengths no CTA does much more than its share: the total work over
// the grid, divided by the busiest CTA's.
double packed_efficiency(const std::vector<int>& seqlens, bool causal, bool sorted) {
  std::vector<int32_t> cu(seqlens.size() + 1, 0);
  for (size_t b = 0; b < seqlens.size(); ++b) cu[b + 1] = cu[b] + seqlens[b];
  int const batch = int(seqlens.size());
  int const longest = *std::max_element(seqlens.begin(), seqlens.end());
  auto p = make_params<SortingScheduler>(16, batch, longest, causal, cu.data());
  p.sorted = sorted;
  std::vector<uint16_t> const order = work_order(seqlens);
  int const grid = 132;
  // Cost of a tile: the key blocks (of 128) it visits, plus one for its set-up and epilogue.
  std::vector<double> load(grid, 0.0);
  double total = 0;
  for (int cta = 0; cta < grid; ++cta) {
    for (SortingScheduler s(p, cta, order.data()); s.valid(p);
         s.advance(p, cta, grid, order.data())) {
      WorkTile w = s.get(p, order.data());
      int const len = seqlens[w.batch];
      int const visible = causal ? std::min((w.m_block + 1) * 128, len) : len;
      double const cost = (visible + 127) / 128 + 1;
      load[cta] += cost;
      total += cost;
    }
  }
  return total / grid / *std::max_element(load.begin(), load.end());
}

TEST(Sm90Scheduler, PackedLongSequencesAreBalanced) {
  std::vector<int> const seqlens = {8192, 512,  3000, 6100, 128, 4096,
                                    7777, 1024, 2500, 5000, 300, 8000};
  for (bool causal : {false, true}) {
    EXPECT_GT(packed_efficiency(seqlens, causal, true), 0.92) << "causal " << causal;
  }
}

// Many short sequences: each unit is a large part of a CTA's share, so the order matters. In the
// caller's order the busiest CTA gets 1.08 (non-causal) / 1.20 (causal) times the average on
// this draw, sorted 1.01 / 1.01.
TEST(Sm90Scheduler, PackedShortSequencesAreBalancedWhenSorted) {
  std::mt19937 rng(7);
  int const lengths[] = {64, 100, 200, 333, 512, 700, 1024};
  std::vector<int> seqlens(64);
  for (int& len : seqlens) len = lengths[rng() % 7];
  for (bool causal : {false, true}) {
    double const sorted = packed_efficiency(seqlens, causal, true);
    double const unsorted = packed_efficiency(seqlens, causal, false);
    EXPECT_GT(sorted, 0.95) << "causal " << causal;
    EXPECT_GT(sorted, unsorted) << "causal " << causal;
  }
}

}  // namespace
}  // namespace flashcute::sm90

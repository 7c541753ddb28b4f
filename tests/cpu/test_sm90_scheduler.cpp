// The Hopper family's persistent-grid scheduler, run on the host: over every CTA of a grid, each
// tile of each (sequence, head) is handed out exactly once, causal tiles come in balanced pairs,
// and a packed batch gets no tile past a sequence's end.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/sm90/tile_scheduler.hpp"

namespace flashcute::sm90 {
namespace {

using Scheduler = TileScheduler<128>;
using Params = Scheduler::Params;
constexpr int kBlockM = 128;

Params make_params(int heads, int batch, int longest, bool causal, const int32_t* cu_seqlens_q) {
  return Scheduler::to_params({batch, heads, longest, causal, cu_seqlens_q});
}

struct Visit {
  int cta, order;  // which CTA, and its position in that CTA's list
};

// Runs every CTA's scheduler to the end; the visits of each (batch, head, m_block).
std::map<std::tuple<int, int, int>, std::vector<Visit>> run_grid(const Params& p, int grid) {
  std::map<std::tuple<int, int, int>, std::vector<Visit>> visits;
  for (int cta = 0; cta < grid; ++cta) {
    int order = 0;
    for (Scheduler s(p, cta); s.valid(p); s.advance(p, grid)) {
      WorkTile w = s.get(p);
      visits[{w.batch, w.head, w.m_block}].push_back(Visit{cta, order++});
    }
  }
  return visits;
}

int m_blocks(int seqlen) { return (seqlen + kBlockM - 1) / kBlockM; }

// Each expected tile exactly once, nothing else; a causal pair (m, last - m) runs back to back
// on one CTA.
void expect_each_tile_once(const Params& p, const std::vector<int>& seqlens, int grid) {
  auto visits = run_grid(p, grid);
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
        Params const p = make_params(3, 2, seqlen, causal, nullptr);
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
    Params const p = make_params(heads, batch, *std::max_element(seqlens.begin(), seqlens.end()),
                                 causal, cu.data());
    int const grid = 1 + int(rng() % 140);
    SCOPED_TRACE(testing::Message() << "trial " << trial << " batch " << batch << " causal "
                                    << causal << " grid " << grid);
    expect_each_tile_once(p, seqlens, grid);
  }
}

// The static round-robin is balanced only if the units that CTAs take side by side cost about
// the same: on a packed batch of mixed lengths no CTA does much more than its share.
TEST(Sm90Scheduler, PackedLoadIsBalanced) {
  std::vector<int> seqlens = {8192, 512, 3000, 6100, 128, 4096, 7777, 1024, 2500, 5000, 300, 8000};
  std::vector<int32_t> cu(seqlens.size() + 1, 0);
  for (size_t b = 0; b < seqlens.size(); ++b) cu[b + 1] = cu[b] + seqlens[b];
  for (bool causal : {false, true}) {
    Params const p = make_params(16, int(seqlens.size()), 8192, causal, cu.data());
    int const grid = 132;
    // Cost of a tile: the key blocks (of 128) it visits, plus one for its set-up and epilogue.
    std::vector<double> load(grid, 0.0);
    double total = 0;
    for (int cta = 0; cta < grid; ++cta) {
      for (Scheduler s(p, cta); s.valid(p); s.advance(p, grid)) {
        WorkTile w = s.get(p);
        int const len = seqlens[w.batch];
        int const visible = causal ? std::min((w.m_block + 1) * 128, len) : len;
        double const cost = (visible + 127) / 128 + 1;
        load[cta] += cost;
        total += cost;
      }
    }
    double const efficiency = total / grid / *std::max_element(load.begin(), load.end());
    EXPECT_GT(efficiency, 0.92) << (causal ? "causal" : "non-causal");
  }
}

}  // namespace
}  // namespace flashcute::sm90

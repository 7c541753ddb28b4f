// The Hopper family's persistent-grid scheduler, run on the host: over every
// CTA of a grid, each tile of each (sequence, head) is handed out exactly once,
// causal tiles come in balanced pairs, and a packed batch gets no tile past a
// sequence's end; the dynamic schedule hands out the costliest tiles of each L2
// section first and leaves its counters zeroed.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <queue>
#include <random>
#include <string>
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

// Runs every CTA's scheduler to the end; the visits of each (batch, head,
// m_block).
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

// Each expected tile exactly once, nothing else; a causal pair (m, last - m)
// runs back to back on one CTA.
void expect_each_tile_once(const Params& p, const std::vector<int>& seqlens,
                           const std::map<std::tuple<int, int, int>, std::vector<Visit>>& visits) {
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

// Clusters of two CTAs (problems without a mask whose tile count is even): the
// clusters take the units of a scheduler of 256-row tiles, and each CTA runs its
// half. Every 128-row tile once, the two halves of a unit side by side.
TEST(Sm90Scheduler, ClusterMembersEveryTileOnce) {
  using PairScheduler = TileScheduler<2 * kBlockM>;
  for (int seqlen : {256, 250 + 256, 1024, 8192})
    for (int clusters : {1, 5, 66}) {
      auto const p = PairScheduler::to_params({3, 4, seqlen, false, nullptr});
      std::map<std::tuple<int, int, int>, std::vector<Visit>> visits;
      for (int cluster = 0; cluster < clusters; ++cluster) {
        int order = 0;
        for (PairScheduler s(p, cluster); s.valid(p); s.advance(p, clusters), ++order) {
          for (int rank = 0; rank < 2; ++rank) {
            WorkTile const w = tile_of_cluster_member<2>(s.get(p), rank);
            visits[{w.batch, w.head, w.m_block}].push_back(Visit{2 * cluster + rank, order});
          }
        }
      }
      SCOPED_TRACE("seqlen " + std::to_string(seqlen) + " clusters " + std::to_string(clusters));
      expect_each_tile_once(make_params(4, 3, seqlen, false, nullptr), std::vector<int>(3, seqlen),
                            visits);
      for (auto const& [tile, v] : visits) {
        if (std::get<2>(tile) % 2 == 1) continue;
        auto const& partner =
            visits.at({std::get<0>(tile), std::get<1>(tile), std::get<2>(tile) + 1});
        EXPECT_EQ(partner[0].cta, v[0].cta + 1);
        EXPECT_EQ(partner[0].order, v[0].order);
      }
    }
}

TEST(Sm90Scheduler, DenseEveryTileOnce) {
  for (bool causal : {false, true})
    for (int seqlen : {1, 128, 129, 384, 1000, 8192})
      for (int grid : {1, 7, 132}) {
        Params const p = make_params(3, 2, seqlen, causal, nullptr);
        SCOPED_TRACE(testing::Message()
                     << "causal " << causal << " seqlen " << seqlen << " grid " << grid);
        expect_each_tile_once(p, std::vector<int>(p.batch, seqlen),
                              run_grid(p, std::min(grid, p.num_units)));
      }
}

// A packed batch of 1-24 sequences: zero-length sequences and lengths at and around tile edges
// included.
struct PackedBatch {
  std::vector<int> seqlens;
  std::vector<int32_t> cu;  // token offsets, seqlens.size() + 1 of them
  int batch() const { return int(seqlens.size()); }
  int longest() const { return *std::max_element(seqlens.begin(), seqlens.end()); }
};

PackedBatch random_packed_batch(std::mt19937& rng) {
  int const batch = 1 + int(rng() % 24);
  PackedBatch pb{std::vector<int>(batch), std::vector<int32_t>(batch + 1, 0)};
  for (int b = 0; b < batch; ++b) {
    int const pick = int(rng() % 4);
    pb.seqlens[b] = pick == 0 ? 0 : pick == 1 ? 128 * int(1 + rng() % 8) : int(rng() % 3000);
    pb.cu[b + 1] = pb.cu[b] + pb.seqlens[b];
  }
  return pb;
}

// One random trial of a packed schedule: the batch, its heads, the mask and the grid.
struct PackedTrial {
  PackedBatch pb;
  int heads;
  bool causal;
  int grid;
};

PackedTrial random_packed_trial(std::mt19937& rng) {
  PackedTrial t{random_packed_batch(rng), 0, false, 0};
  t.heads = 1 + int(rng() % 5);
  t.causal = rng() % 2;
  t.grid = 1 + int(rng() % 140);
  return t;
}

TEST(Sm90Scheduler, PackedEveryTileOnceNoEmptyTiles) {
  std::mt19937 rng(20261130);
  for (int trial = 0; trial < 40; ++trial) {
    auto const [pb, heads, causal, grid] = random_packed_trial(rng);
    int const batch = pb.batch();
    std::vector<int> const& seqlens = pb.seqlens;
    Params const p = make_params(heads, batch, pb.longest(), causal, pb.cu.data());
    SCOPED_TRACE(testing::Message() << "trial " << trial << " batch " << batch << " causal "
                                    << causal << " grid " << grid);
    expect_each_tile_once(p, seqlens, run_grid(p, grid));
  }
}

// The static round-robin is balanced only if the units that CTAs take side by
// side cost about the same: on a packed batch of mixed lengths no CTA does much
// more than its share.
TEST(Sm90Scheduler, PackedLoadIsBalanced) {
  std::vector<int> seqlens = {8192, 512, 3000, 6100, 128, 4096, 7777, 1024, 2500, 5000, 300, 8000};
  std::vector<int32_t> cu(seqlens.size() + 1, 0);
  for (size_t b = 0; b < seqlens.size(); ++b) cu[b + 1] = cu[b] + seqlens[b];
  for (bool causal : {false, true}) {
    Params const p = make_params(16, int(seqlens.size()), 8192, causal, cu.data());
    int const grid = 132;
    // Cost of a tile: the key blocks (of 128) it visits, plus one for its
    // set-up and epilogue.
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

// The dynamic schedule, with the CTAs taking units as they would on the device:
// the CTA whose work so far is least (cost of a tile: the key blocks of 128 it
// visits, plus one for its start and end) takes the next unit from the counter.
// seqlens: each sequence's length; causal: whether a tile sees the keys up to
// its last row only.
struct DynamicRun {
  std::map<std::tuple<int, int, int>, std::vector<Visit>> visits;
  double efficiency;  // mean CTA load / largest CTA load
};

DynamicRun run_dynamic(const Params& p, const std::vector<int>& seqlens, bool causal, int grid) {
  DynamicRun run{};
  std::vector<Scheduler> ctas;
  std::vector<int> taken(grid, 0);
  using Clock = std::pair<double, int>;  // (work so far, CTA)
  std::priority_queue<Clock, std::vector<Clock>, std::greater<Clock>> ready;
  for (int cta = 0; cta < grid; ++cta) {
    ctas.emplace_back(p, cta);
    ready.push({0.0, cta});
  }
  double total = 0, largest = 0;
  while (!ready.empty()) {
    auto [load, cta] = ready.top();
    ready.pop();
    Scheduler& s = ctas[cta];
    // As on the device, a CTA takes its next unit once its current tile is done.
    if (taken[cta] > 0) s.advance(p, grid);
    if (!s.valid(p)) {
      Scheduler::retire(p, grid);
      largest = std::max(largest, load);
      continue;
    }
    WorkTile const w = s.get(p);
    run.visits[{w.batch, w.head, w.m_block}].push_back(Visit{cta, taken[cta]++});
    int const len = seqlens[w.batch];
    int const visible = causal ? std::min((w.m_block + 1) * kBlockM, len) : len;
    double const cost = (visible + 127) / 128 + 1;
    total += cost;
    ready.push({load + cost, cta});
  }
  run.efficiency = total / grid / largest;
  return run;
}

DynamicRun run_dense_causal(int heads, int batch, int seqlen, int l2_section_heads, int grid,
                            int (&counters)[2]) {
  Params const p =
      Scheduler::to_params({batch, heads, seqlen, true, nullptr, counters, l2_section_heads, grid});
  return run_dynamic(p, std::vector<int>(batch, seqlen), true, std::min(grid, p.num_units));
}

TEST(Sm90Scheduler, DynamicEveryTileOnceCountersLeftZero) {
  for (int seqlen : {1, 128, 129, 1000, 8192})
    for (int l2_section_heads : {0, 1, 2, 5, 64})
      for (int grid : {1, 7, 132}) {
        int const heads = 3, batch = 2;
        SCOPED_TRACE(testing::Message()
                     << "seqlen " << seqlen << " section " << l2_section_heads << " grid " << grid);
        int counters[2] = {0, 0};
        Params const p = Scheduler::to_params(
            {batch, heads, seqlen, true, nullptr, counters, l2_section_heads, grid});
        std::vector<int> const seqlens(batch, seqlen);
        expect_each_tile_once(p, seqlens,
                              run_dynamic(p, seqlens, true, std::min(grid, p.num_units)).visits);
        EXPECT_EQ(counters[0], 0);
        EXPECT_EQ(counters[1], 0);
      }
}

TEST(Sm90Scheduler, PackedDynamicEveryTileOnceCountersLeftZero) {
  std::mt19937 rng(20261204);
  for (int trial = 0; trial < 40; ++trial) {
    auto const [pb, heads, causal, grid] = random_packed_trial(rng);
    int const batch = pb.batch();
    std::vector<int> const& seqlens = pb.seqlens;
    int counters[2] = {0, 0};
    Params const p =
        Scheduler::to_params({batch, heads, pb.longest(), causal, pb.cu.data(), counters, 0, grid});
    SCOPED_TRACE(testing::Message() << "trial " << trial << " batch " << batch << " causal "
                                    << causal << " grid " << grid);
    // The grid is sized by an upper bound of the units: some CTAs may find
    // none.
    expect_each_tile_once(p, seqlens,
                          run_dynamic(p, seqlens, causal, std::min(grid, p.num_units)).visits);
    EXPECT_EQ(counters[0], 0);
    EXPECT_EQ(counters[1], 0);
  }
}

// Units in index order: section by section (the pairs left over first), each
// section's (batch, head) pairs together, row blocks from the last (costliest)
// down within a section; sections as wide as half of L2 allows, the last one
// widened to four units per CTA but at most to twice that width (all of L2).
TEST(Sm90Scheduler, DynamicOrderCostliestFirstBySection) {
  int counters[2] = {0, 0};
  int const heads = 5, batch = 3, seqlen = 1200, l2_section_heads = 4, grid = 14;
  Params const p =
      Scheduler::to_params({batch, heads, seqlen, true, nullptr, counters, l2_section_heads, grid});
  int const nm = m_blocks(seqlen);
  ASSERT_EQ(p.num_units, heads * batch * nm);
  // 15 pairs: the last section 6 (6 pairs * 10 units >= 4 * 14 CTAs), one pair
  // left over first, two sections of four between.
  int const last_heads = 6, last_bh = heads * batch - last_heads;
  EXPECT_EQ(p.section_heads, l2_section_heads);
  EXPECT_EQ(p.last_section_heads, last_heads);
  int const first = last_bh % l2_section_heads;
  ASSERT_EQ(first, 1);
  auto section_of = [&](int bh) {
    if (bh < first) return 0;
    if (bh >= last_bh) return 1 + (last_bh - first) / l2_section_heads;
    return 1 + (bh - first) / l2_section_heads;
  };
  int prev_section = 0, prev_m = nm - 1;
  for (int unit = 0; unit < p.num_units; ++unit) {
    WorkTile const w = Scheduler(p, unit).get(p);
    int const section = section_of(w.batch * heads + w.head);
    ASSERT_GE(section, prev_section) << "unit " << unit;
    if (section == prev_section) {
      ASSERT_LE(w.m_block, prev_m) << "unit " << unit;
    } else {
      EXPECT_EQ(w.m_block, nm - 1) << "a section starts at its costliest row block";
    }
    prev_section = section;
    prev_m = w.m_block;
  }
  EXPECT_EQ(prev_section, 3);
  // With 132 CTAs four units each would take 53 pairs: the last section stops
  // at what all of L2 holds.
  Params const wide =
      Scheduler::to_params({batch, heads, seqlen, true, nullptr, counters, l2_section_heads, 132});
  EXPECT_EQ(wide.last_section_heads, 2 * l2_section_heads);
}

// Where the static schedule leaves the CTAs' loads apart, the dynamic one evens
// them out: the causal rows of the benchmark, whose static pairs leave the last
// round part full (0.95-0.97 of balance), and its packed rows, whose units
// differ in cost (static 0.88-0.96). 132 SMs.
TEST(Sm90Scheduler, DynamicLoadIsBalanced) {
  struct Shape {
    int batch, seqlen, heads,
        l2_section_heads;  // half of the H200's L2 over K and V at d 128
  };
  for (Shape const s : {Shape{8, 2048, 16, 30}, Shape{2, 8192, 16, 7}, Shape{1, 16384, 16, 3},
                        Shape{4, 8192, 16, 7}}) {
    SCOPED_TRACE(testing::Message() << "b " << s.batch << " s " << s.seqlen << " h " << s.heads);
    int counters[2] = {0, 0};
    EXPECT_GT(
        run_dense_causal(s.heads, s.batch, s.seqlen, s.l2_section_heads, 132, counters).efficiency,
        0.985);
  }
  // bench.py's varlen row and the draw of its varlen_short row (seeded, 64 of
  // 64-1024 tokens).
  std::vector<std::vector<int>> const batches = {
      {8192, 512, 3000, 6100, 128, 4096, 7777, 1024, 2500, 5000, 300, 8000},
      {700,  700,  200, 100,  333, 200, 700,  200,  333, 512, 1024, 333, 100,  700,  512,  100,
       1024, 1024, 700, 1024, 200, 700, 1024, 512,  333, 64,  333,  512, 1024, 1024, 333,  1024,
       100,  700,  333, 64,   700, 200, 700,  512,  64,  333, 1024, 100, 200,  1024, 100,  333,
       100,  1024, 700, 333,  64,  200, 333,  1024, 64,  333, 512,  333, 700,  333,  1024, 512}};
  for (auto const& seqlens : batches) {
    std::vector<int32_t> cu(seqlens.size() + 1, 0);
    for (size_t b = 0; b < seqlens.size(); ++b) cu[b + 1] = cu[b] + seqlens[b];
    int const longest = *std::max_element(seqlens.begin(), seqlens.end());
    for (bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << seqlens.size() << " sequences, causal " << causal);
      int counters[2] = {0, 0};
      Params const p = Scheduler::to_params(
          {int(seqlens.size()), 16, longest, causal, cu.data(), counters, 0, 132});
      EXPECT_GT(run_dynamic(p, seqlens, causal, 132).efficiency, 0.97);
    }
  }
}

}  // namespace
}  // namespace flashcute::sm90

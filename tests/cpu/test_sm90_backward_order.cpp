// The Hopper backward's launch order, run on the host: every (key block, KV head, sequence) is
// taken by exactly one CTA; sections of groups go one after another, the tail last, and within a
// section the key blocks go in chunks across its groups (from the last key block when the
// deterministic turns descend); a CTA's earlier turns belong to CTAs launched before it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "kernels/sm90/backward/launch_order.hpp"

namespace flashcute::sm90 {
namespace {

TEST(Sm90BackwardOrder, EveryPlaceOnceInSectionsThenChunks) {
  for (int n_blocks : {1, 3, 8, 9, 17, 64, 130})
    for (int heads_k : {1, 3, 8})
      for (int sequences : {1, 2, 5})
        for (int chunk : {1, 3, BackwardLaunchOrder::kCostOrderChunk, n_blocks})
          for (int section_groups : {1, 2, 7})
            for (int tail_groups : {0, 1, 4, 100})
              for (bool descend : {false, true}) {
                BackwardLaunchOrder const order{n_blocks, heads_k,        sequences,
                                                chunk,    section_groups, tail_groups};
                SCOPED_TRACE(testing::Message()
                             << "key blocks " << n_blocks << " heads " << heads_k << " sequences "
                             << sequences << " chunk " << chunk << " sections of " << section_groups
                             << " tail " << tail_groups << " descend " << descend);
                int const groups = heads_k * sequences;
                int const first_of_tail = groups - std::min(tail_groups, groups);
                auto const section_of = [&](int group) {
                  return group < first_of_tail
                             ? group / section_groups
                             : (first_of_tail + section_groups - 1) / section_groups;
                };
                std::set<std::tuple<int, int, int>> seen;
                int last_section = 0, last_chunk = 0, last_group = 0;
                // For each (head, sequence), the key block its last CTA took.
                std::vector<int> last(groups, -1);
                for (int cta = 0; cta < order.num_ctas(); ++cta) {
                  BackwardPlace const at = order.place(cta, descend);
                  ASSERT_GE(at.n_block, 0);
                  ASSERT_LT(at.n_block, n_blocks);
                  ASSERT_GE(at.head_kv, 0);
                  ASSERT_LT(at.head_kv, heads_k);
                  ASSERT_GE(at.sequence, 0);
                  ASSERT_LT(at.sequence, sequences);
                  ASSERT_TRUE(seen.insert({at.n_block, at.head_kv, at.sequence}).second)
                      << "CTA " << cta << " repeats a place";
                  int const group = at.sequence * heads_k + at.head_kv;
                  int const rank = descend ? n_blocks - 1 - at.n_block : at.n_block;
                  int const section = section_of(group), in_chunk = rank / chunk;
                  ASSERT_GE(section, last_section) << "CTA " << cta << " goes back a section";
                  if (section > last_section) last_chunk = 0, last_group = 0;
                  EXPECT_GE(in_chunk, last_chunk) << "CTA " << cta << " goes back a chunk";
                  if (in_chunk == last_chunk) {
                    EXPECT_GE(group, last_group) << "CTA " << cta << " goes back a group";
                  }
                  last_section = section;
                  last_chunk = in_chunk;
                  last_group = group;
                  int& previous = last[group];
                  EXPECT_GT(rank, previous)
                      << "CTA " << cta << " launches before a turn ahead of it";
                  previous = rank;
                }
                EXPECT_EQ(int(seen.size()), n_blocks * heads_k * sequences);
              }
}

// One chunk of every key block is the (key block, head, sequence) grid, the key block fastest,
// whatever the sections.
TEST(Sm90BackwardOrder, OneChunkIsTheKeyBlockFastestGrid) {
  for (int section_groups : {1, 4})
    for (int tail_groups : {0, 2, 6}) {
      BackwardLaunchOrder const order{5, 3, 2, 5, section_groups, tail_groups};
      for (int cta = 0; cta < order.num_ctas(); ++cta) {
        BackwardPlace const at = order.place(cta, false);
        EXPECT_EQ(at.n_block, cta % 5);
        EXPECT_EQ(at.head_kv, cta / 5 % 3);
        EXPECT_EQ(at.sequence, cta / 15);
      }
    }
}

// Without sections the order is the one with a tail of every group.
TEST(Sm90BackwardOrder, NoSectionsIsATailOfEveryGroup) {
  for (int n_blocks : {1, 9, 64})
    for (int heads_k : {1, 3})
      for (int sequences : {1, 5})
        for (bool descend : {false, true}) {
          BackwardLaunchOrder const order{n_blocks, heads_k, sequences, 8, 1, heads_k * sequences};
          for (int cta = 0; cta < order.num_ctas(); ++cta) {
            BackwardPlace const a = order.place<false>(cta, descend);
            BackwardPlace const b = order.place<true>(cta, descend);
            ASSERT_EQ(std::make_tuple(a.n_block, a.head_kv, a.sequence),
                      std::make_tuple(b.n_block, b.head_kv, b.sequence))
                << "CTA " << cta;
          }
        }
}

// The tail holds at least the costliest CTA's work per SM (2 n per group of n (n + 1) steps).
TEST(Sm90BackwardOrder, CostOrderTailCoversTheCostliestCta) {
  for (int sms : {1, 78, 132})
    for (int n_blocks : {1, 2, 16, 64, 128, 1000}) {
      int const tail = BackwardLaunchOrder::cost_order_tail(n_blocks, sms);
      EXPECT_GE(int64_t(tail) * n_blocks * (n_blocks + 1), int64_t(2) * sms * n_blocks);
      EXPECT_LT(int64_t(tail - 1) * n_blocks * (n_blocks + 1), int64_t(2) * sms * n_blocks);
    }
}

}  // namespace
}  // namespace flashcute::sm90

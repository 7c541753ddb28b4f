// The Hopper backward's launch order, run on the host: every (key block, KV head, sequence) is
// taken by exactly one CTA, key blocks start in chunks from the first (from the last when the
// deterministic turns descend), and a CTA's earlier turns belong to CTAs launched before it.
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <vector>

#include "kernels/sm90/backward/launch_order.hpp"

namespace flashcute::sm90 {
namespace {

TEST(Sm90BackwardOrder, EveryPlaceOnceInChunkOrder) {
  for (int n_blocks : {1, 3, 8, 9, 17, 64, 130})
    for (int heads_k : {1, 3, 8})
      for (int sequences : {1, 2, 5})
        for (int chunk : {1, 3, BackwardLaunchOrder::kCostOrderChunk, n_blocks})
          for (bool descend : {false, true}) {
            BackwardLaunchOrder const order{n_blocks, heads_k, sequences, chunk};
            SCOPED_TRACE(testing::Message()
                         << "key blocks " << n_blocks << " heads " << heads_k << " sequences "
                         << sequences << " chunk " << chunk << " descend " << descend);
            std::set<std::tuple<int, int, int>> seen;
            int last_chunk = 0;
            // For each (head, sequence), the key block its last CTA took.
            std::vector<int> last(heads_k * sequences, -1);
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
              int const rank = descend ? n_blocks - 1 - at.n_block : at.n_block;
              int const in_chunk = rank / chunk;
              EXPECT_GE(in_chunk, last_chunk) << "CTA " << cta << " goes back a chunk";
              last_chunk = in_chunk;
              int& previous = last[at.sequence * heads_k + at.head_kv];
              EXPECT_GT(rank, previous) << "CTA " << cta << " launches before a turn ahead of it";
              previous = rank;
            }
            EXPECT_EQ(int(seen.size()), n_blocks * heads_k * sequences);
          }
}

// One chunk of every key block is the (key block, head, sequence) grid, the key block fastest.
TEST(Sm90BackwardOrder, OneChunkIsTheKeyBlockFastestGrid) {
  BackwardLaunchOrder const order{5, 3, 2, 5};
  for (int cta = 0; cta < order.num_ctas(); ++cta) {
    BackwardPlace const at = order.place(cta, false);
    EXPECT_EQ(at.n_block, cta % 5);
    EXPECT_EQ(at.head_kv, cta / 5 % 3);
    EXPECT_EQ(at.sequence, cta / 15);
  }
}

}  // namespace
}  // namespace flashcute::sm90

// The all-pairs design the GPU suite uses covers what it claims.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "pairwise.hpp"

namespace flashcute {
namespace {

TEST(AllPairs, CoversEveryPairOfValues) {
  for (const std::vector<int>& sizes : std::vector<std::vector<int>>{
           {2, 12, 3, 9, 9, 2}, {3}, {2, 2}, {5, 1, 4}, {2, 3, 4, 5, 6, 7, 8}}) {
    const auto rows = testing::all_pairs(sizes);
    std::set<std::tuple<int, int, int, int>> seen;
    std::set<std::pair<int, int>> singles;
    size_t product = 1;
    for (int s : sizes) product *= s;
    for (const auto& row : rows) {
      ASSERT_EQ(row.size(), sizes.size());
      for (size_t a = 0; a < sizes.size(); ++a) {
        ASSERT_GE(row[a], 0);
        ASSERT_LT(row[a], sizes[a]);
        singles.insert({int(a), row[a]});
        for (size_t b = a + 1; b < sizes.size(); ++b) seen.insert({int(a), row[a], int(b), row[b]});
      }
    }
    size_t pairs = 0, values = 0;
    for (size_t a = 0; a < sizes.size(); ++a) {
      values += sizes[a];
      for (size_t b = a + 1; b < sizes.size(); ++b) pairs += size_t(sizes[a]) * sizes[b];
    }
    EXPECT_EQ(seen.size(), pairs);
    EXPECT_EQ(singles.size(), values);
    EXPECT_LE(rows.size(), product);
  }
  // Far fewer rows than the product for the GPU suite's shape of lists.
  EXPECT_LT(testing::all_pairs({2, 12, 3, 9, 9, 2}).size(), 150u);
}

}  // namespace
}  // namespace flashcute

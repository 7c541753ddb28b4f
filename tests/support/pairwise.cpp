#include "pairwise.hpp"

#include <set>
#include <tuple>

namespace flashcute {
namespace testing {
namespace {

using Pair = std::tuple<int, int, int, int>;  // (parameter a, value, parameter b > a, value)

}  // namespace

// Greedy: each row starts from an uncovered pair, then takes for every other parameter the value
// that covers the most still-uncovered pairs with the values already chosen.
std::vector<std::vector<int>> all_pairs(const std::vector<int>& sizes) {
  const int n = int(sizes.size());
  std::set<Pair> uncovered;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      for (int va = 0; va < sizes[a]; ++va)
        for (int vb = 0; vb < sizes[b]; ++vb) uncovered.insert({a, va, b, vb});

  std::vector<std::vector<int>> rows;
  if (n == 1)
    for (int v = 0; v < sizes[0]; ++v) rows.push_back({v});
  while (!uncovered.empty()) {
    const auto [a, va, b, vb] = *uncovered.begin();
    std::vector<int> row(n, -1);
    row[a] = va;
    row[b] = vb;
    for (int p = 0; p < n; ++p) {
      if (row[p] >= 0) continue;
      int best = 0, best_gain = -1;
      for (int v = 0; v < sizes[p]; ++v) {
        int gain = 0;
        for (int q = 0; q < n; ++q) {
          if (q == p || row[q] < 0) continue;
          const Pair pair = q < p ? Pair{q, row[q], p, v} : Pair{p, v, q, row[q]};
          gain += int(uncovered.count(pair));
        }
        if (gain > best_gain) {
          best = v;
          best_gain = gain;
        }
      }
      row[p] = best;
    }
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) uncovered.erase({p, row[p], q, row[q]});
    rows.push_back(row);
  }
  return rows;
}

}  // namespace testing
}  // namespace flashcute

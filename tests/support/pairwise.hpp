// All-pairs test design: rows of parameter indices such that every value of every list appears and
// every pair of values from two different lists appears together in some row, with far fewer rows
// than the full product.
#pragma once

#include <vector>

namespace flashcute {
namespace testing {

// sizes[p] is the number of values of parameter p; each returned row holds one index per parameter.
// Deterministic: the same sizes give the same rows.
std::vector<std::vector<int>> all_pairs(const std::vector<int>& sizes);

}  // namespace testing
}  // namespace flashcute

// All-pairs coverage of the main lists (dtype, head_dim, mask, seqlen_q, seqlen_k, scores): every
// value of each list and every pair of values across two lists appear in some case, and each case
// runs on every family and every compiled tile configuration against one shared reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "gpu_harness.hpp"
#include "pairwise.hpp"

namespace flashcute {
namespace testing {
namespace {

enum class Mask { kNone, kCausalTopLeft, kCausalBottomRight };
enum class Scores { kNormal, kScaledUp, kNegativeScale, kVeryNegative };

TEST(Coverage, AllPairsOnEveryKernel) {
  FC_REQUIRE_GPU();
  const std::vector<fc_dtype> dtypes = {FC_FLOAT16, FC_BFLOAT16};
  const std::vector<int> head_dims = {8, 32, 40, 64, 72, 96, 128, 136, 160, 192, 200, 256};
  const std::vector<Mask> masks = {Mask::kNone, Mask::kCausalTopLeft, Mask::kCausalBottomRight};
  // Under the sanitizers the long lengths shrink to stay within minutes; the tile +-1 ones stay.
  const bool small = small_mode();
  const std::vector<int> seqlens = {
      0, 1, 17, 64, 127, 128, 129, small ? 200 : 1000, small ? 300 : 4096};
  const std::vector<Scores> scores = {Scores::kNormal, Scores::kScaledUp, Scores::kNegativeScale,
                                      Scores::kVeryNegative};
  const auto rows = all_pairs({int(dtypes.size()), int(head_dims.size()), int(masks.size()),
                               int(seqlens.size()), int(seqlens.size()), int(scores.size())});
  // Under racecheck only an evenly spread subset runs (FLASHCUTE_TEST_MAX_CASES).
  const size_t limit = case_limit(), step = limit && limit < rows.size() ? rows.size() / limit : 1;
  std::printf("[ info ] %zu all-pairs cases, running every %zu\n", rows.size(), step);
  for (size_t r = 0; r < rows.size(); r += step) {
    const std::vector<int>& row = rows[r];
    Case c;
    c.dtype = dtypes[row[0]];
    const int d = head_dims[row[1]];
    c.problem = dense_problem(2, seqlens[row[3]], seqlens[row[4]], 3, 3, d);
    c.problem.causal = masks[row[2]] != Mask::kNone;
    c.problem.bottom_right = masks[row[2]] == Mask::kCausalBottomRight;
    switch (scores[row[5]]) {
      case Scores::kNormal:
        break;
      case Scores::kScaledUp:  // scores reach the hundreds
        c.data = Data::kScaledUp;
        break;
      case Scores::kNegativeScale:
        c.problem.softmax_scale = -2.0f / std::sqrt(float(d));
        break;
      case Scores::kVeryNegative:
        c.data = Data::kPositive;
        c.problem.softmax_scale = very_negative_scale(d);
        break;
    }
    check_case(c);
  }
}

}  // namespace
}  // namespace testing
}  // namespace flashcute

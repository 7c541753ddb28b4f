// Which SM80-family kernel variant a launch may take (fits_plain_kernel). The plain kernel folds
// the scale into its softmax and takes a row's largest raw score as its largest logit, so a launch
// with a negative or zero scale, a score modifier or a head_dim short of the bucket must go to
// the general kernel: the plain one would give it wrong answers without any error.
#include <gtest/gtest.h>

#include "kernels/common/score_modifiers.hpp"

namespace flashcute {
namespace {

AttentionParams plain_params(int head_dim, float softmax_scale) {
  AttentionParams p{};
  p.head_dim = head_dim;
  p.softmax_scale = softmax_scale;
  p.scale_log2 = softmax_scale * kLog2e;
  return p;
}

TEST(KernelVariants, PlainKernelOnlyForAPositiveScaleAndAFullBucket) {
  EXPECT_TRUE(fits_plain_kernel(plain_params(128, 0.088f), 128));
  EXPECT_TRUE(fits_plain_kernel(plain_params(64, 1e-6f), 64));
  EXPECT_FALSE(fits_plain_kernel(plain_params(120, 0.088f), 128));  // padding columns
  EXPECT_FALSE(fits_plain_kernel(plain_params(128, -0.088f), 128));
  EXPECT_FALSE(fits_plain_kernel(plain_params(128, 0.f), 128));
  AttentionParams softcap = plain_params(128, 0.088f);
  softcap.softcap = 30.f;
  EXPECT_FALSE(fits_plain_kernel(softcap, 128));
  AttentionParams alibi = plain_params(128, 0.088f);
  const float slope = 0.5f;
  alibi.alibi_slopes = &slope;
  EXPECT_FALSE(fits_plain_kernel(alibi, 128));
}

}  // namespace
}  // namespace flashcute

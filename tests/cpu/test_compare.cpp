// The comparison, conversion and input helpers the suites and the runner rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "reference/compare.hpp"
#include "reference/host_data.hpp"

namespace flashcute {
namespace {

using ref::compare_lse;
using ref::compare_output;
using ref::default_tolerance;

// Normal values that are not representable in fp16 or bf16, like a real reference's.
std::vector<double> normal_reference(size_t n) {
  const uint64_t seed = ref::fresh_seed();
  const std::vector<float> a = ref::random_inputs(n, ref::InputMode::kNormal, FC_FLOAT16, seed);
  const std::vector<float> b = ref::random_inputs(n, ref::InputMode::kNormal, FC_FLOAT16, seed + 1);
  std::vector<double> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = a[i] + 1e-3 * b[i];
  return r;
}

TEST(Compare, UlpOfEachType) {
  EXPECT_EQ(ref::ulp_at(1.0, FC_FLOAT16), std::ldexp(1.0, -10));
  EXPECT_EQ(ref::ulp_at(1.5, FC_BFLOAT16), std::ldexp(1.0, -7));
  EXPECT_EQ(ref::ulp_at(3.9, FC_BFLOAT16), std::ldexp(1.0, -6));
  EXPECT_EQ(ref::ulp_at(0.0, FC_FLOAT16), 0.0);
}

TEST(Compare, RoundedOutputPasses) {
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    const std::vector<double> r = normal_reference(4096);
    std::vector<float> out(r.size());
    for (size_t i = 0; i < r.size(); ++i)
      out[i] = ref::from_bits(ref::to_bits(float(r[i]), dtype), dtype);
    const ref::Comparison c =
        compare_output(out.data(), r.data(), r.size(), dtype, default_tolerance(dtype));
    EXPECT_TRUE(c.pass) << c.summary();
    EXPECT_GT(c.rel_l2, 0);
  }
}

TEST(Compare, NanNeverPasses) {
  const std::vector<double> r = normal_reference(1000);
  std::vector<float> out(r.begin(), r.end());
  out[517] = NAN;
  const ref::Comparison c =
      compare_output(out.data(), r.data(), r.size(), FC_BFLOAT16, default_tolerance(FC_BFLOAT16));
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.nan_count, 1u);
  EXPECT_EQ(c.worst_index, 517u);
}

TEST(Compare, PoisonedHalfBitsAreNan) {
  EXPECT_TRUE(std::isnan(ref::from_bits(0xFFFF, FC_FLOAT16)));
  EXPECT_TRUE(std::isnan(ref::from_bits(0xFFFF, FC_BFLOAT16)));
}

TEST(Compare, OneLargeErrorFailsTheMaxBound) {
  const std::vector<double> r = normal_reference(100000);
  std::vector<float> out(r.begin(), r.end());
  out[42] += 0.25f;  // far beyond 4 ulps, yet tiny in relative L2 over 1e5 values
  const ref::Comparison c =
      compare_output(out.data(), r.data(), r.size(), FC_BFLOAT16, default_tolerance(FC_BFLOAT16));
  EXPECT_LT(c.rel_l2, 1e-2);
  EXPECT_FALSE(c.pass) << c.summary();
  EXPECT_EQ(c.worst_index, 42u);
}

TEST(Compare, WidespreadSmallErrorFailsRelativeL2) {
  const std::vector<double> r = normal_reference(10000);
  std::vector<float> out(r.size());
  for (size_t i = 0; i < r.size(); ++i) out[i] = float(r[i] * 1.004);  // 4e-3 relative everywhere
  EXPECT_TRUE(
      compare_output(out.data(), r.data(), r.size(), FC_BFLOAT16, default_tolerance(FC_BFLOAT16))
          .pass);
  EXPECT_FALSE(
      compare_output(out.data(), r.data(), r.size(), FC_FLOAT16, default_tolerance(FC_FLOAT16))
          .pass);
}

TEST(Compare, ZeroReferenceNeedsExactZeros) {
  const std::vector<double> r(64, 0.0);
  std::vector<float> out(64, 0.0f);
  EXPECT_TRUE(
      compare_output(out.data(), r.data(), 64, FC_FLOAT16, default_tolerance(FC_FLOAT16)).pass);
  out[3] = 1e-6f;
  EXPECT_FALSE(
      compare_output(out.data(), r.data(), 64, FC_FLOAT16, default_tolerance(FC_FLOAT16)).pass);
}

// Without cancellation (terms a few times the values) a gradient is compared as an output.
TEST(Compare, GradientWithoutCancellationIsAnOutput) {
  const std::vector<double> r = normal_reference(10000);
  std::vector<double> terms(r.size());
  for (size_t i = 0; i < r.size(); ++i) terms[i] = 3 * std::fabs(r[i]);
  std::vector<float> out(r.begin(), r.end());
  out[42] += 2.0f;  // beyond 8 ulps of either type at the largest value (below 8)
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    const ref::Comparison a = compare_output(out.data(), r.data(), r.size(), dtype, {2e-2, 8.0});
    const ref::Comparison g = ref::compare_gradient(out.data(), r.data(), terms.data(), r.size(),
                                                    dtype, {2e-2, 8.0}, 1e-2);
    EXPECT_EQ(g.pass, a.pass);
    EXPECT_DOUBLE_EQ(g.rel_l2, a.rel_l2);
    EXPECT_EQ(g.abs_bound, a.abs_bound);
    EXPECT_FALSE(g.pass) << g.summary();  // the one large error
  }
}

// A gradient that cancels to nothing (here exactly 0) is judged against a share of its terms: fp32
// noise passes, an error of the terms' size does not, and NaN never does.
TEST(Compare, CancelledGradientIsJudgedByItsTerms) {
  const std::vector<double> r(256, 0.0), terms(256, 2.0);
  std::vector<float> out(256, 0.0f);
  for (size_t i = 0; i < out.size(); ++i) out[i] = (i % 2 ? 1 : -1) * 3e-7f;
  EXPECT_FALSE(compare_output(out.data(), r.data(), r.size(), FC_BFLOAT16, {2e-2, 8.0}).pass);
  EXPECT_TRUE(ref::compare_gradient(out.data(), r.data(), terms.data(), r.size(), FC_BFLOAT16,
                                    {2e-2, 8.0}, 1e-2)
                  .pass);
  out[7] = 0.5f;
  EXPECT_FALSE(ref::compare_gradient(out.data(), r.data(), terms.data(), r.size(), FC_BFLOAT16,
                                     {2e-2, 8.0}, 1e-2)
                   .pass);
  out[7] = NAN;
  const ref::Comparison c = ref::compare_gradient(out.data(), r.data(), terms.data(), r.size(),
                                                  FC_BFLOAT16, {2e-2, 8.0}, 1e-2);
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.nan_count, 1u);
}

TEST(Compare, LseInfinityAndNan) {
  const std::vector<double> r = {1.5, INFINITY, -300.0, 20.0};
  std::vector<float> out = {1.5004f, INFINITY, -300.05f, 20.0f};
  EXPECT_TRUE(compare_lse(out.data(), r.data(), r.size()).pass);
  out[1] = 0.0f;  // a row that sees no key must say +inf
  EXPECT_FALSE(compare_lse(out.data(), r.data(), r.size()).pass);
  out[1] = INFINITY;
  out[0] = NAN;
  EXPECT_FALSE(compare_lse(out.data(), r.data(), r.size()).pass);
  out[0] = 1.51f;
  EXPECT_FALSE(compare_lse(out.data(), r.data(), r.size()).pass);
}

TEST(HostData, ConversionRoundsToNearest) {
  EXPECT_EQ(ref::to_bits(1.0f, FC_FLOAT16), 0x3C00);
  EXPECT_EQ(ref::to_bits(1.0f, FC_BFLOAT16), 0x3F80);
  EXPECT_EQ(ref::from_bits(0xC000, FC_FLOAT16), -2.0f);
  EXPECT_EQ(ref::from_bits(0xC000, FC_BFLOAT16), -2.0f);
  // bf16's ulp at 1 is 2^-7; 1 + 2^-8 lies halfway and ties go to the even value, 1.0.
  EXPECT_EQ(ref::to_bits(1.0f + std::ldexp(1.0f, -8), FC_BFLOAT16), 0x3F80);
  EXPECT_EQ(ref::to_bits(1.0f + std::ldexp(1.0f, -7) * 0.75f, FC_BFLOAT16), 0x3F81);
}

TEST(HostData, RandomInputsHaveTheModesStatistics) {
  const size_t n = 200000;
  const uint64_t seed = ref::fresh_seed();
  for (auto [mode, sigma] :
       {std::pair{ref::InputMode::kNormal, 1.0}, std::pair{ref::InputMode::kScaledUp, 6.0}}) {
    const std::vector<float> v = ref::random_inputs(n, mode, FC_BFLOAT16, seed);
    double sum = 0, sum2 = 0;
    for (float x : v) {
      EXPECT_EQ(x, ref::from_bits(ref::to_bits(x, FC_BFLOAT16), FC_BFLOAT16));  // rounded
      sum += x;
      sum2 += double(x) * x;
    }
    EXPECT_NEAR(sum / n, 0.0, 0.02 * sigma);
    EXPECT_NEAR(std::sqrt(sum2 / n), sigma, 0.02 * sigma);
  }
  const std::vector<float> ints = ref::random_inputs(n, ref::InputMode::kInteger, FC_FLOAT16, seed);
  EXPECT_EQ(std::set<float>(ints.begin(), ints.end()), (std::set<float>{-2, -1, 0, 1}));
}

TEST(HostData, SeedsAreFreshAndReproducible) {
  EXPECT_NE(ref::fresh_seed(), ref::fresh_seed());
  const uint64_t seed = ref::fresh_seed();
  EXPECT_EQ(ref::random_inputs(1000, ref::InputMode::kNormal, FC_FLOAT16, seed),
            ref::random_inputs(1000, ref::InputMode::kNormal, FC_FLOAT16, seed));
  EXPECT_NE(ref::random_inputs(1000, ref::InputMode::kNormal, FC_FLOAT16, seed),
            ref::random_inputs(1000, ref::InputMode::kNormal, FC_FLOAT16, seed + 1));
}

}  // namespace
}  // namespace flashcute

// The Hopper softmax's exponential on the FMA pipe (exp2_fma.hpp), run on the host against
// std::exp2 in double precision over the whole range the softmax feeds it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kernels/sm90/exp2_fma.hpp"

namespace flashcute::sm90 {
namespace {

double relative_error(float x) {
  double const exact = std::exp2(double(x));
  return std::abs(double(exp2_on_fma_pipe(x)) - exact) / exact;
}

TEST(Exp2OnFmaPipe, RelativeErrorOverTheSoftmaxRange) {
  // Every 1/1024 from -125 to 8, and random points between.
  double worst = 0.0;
  for (int i = -125 * 1024; i <= 8 * 1024; ++i) worst = std::max(worst, relative_error(i / 1024.f));
  std::mt19937 gen(std::random_device{}());
  std::uniform_real_distribution<float> uniform(-125.f, 8.f);
  for (int i = 0; i < 200000; ++i) worst = std::max(worst, relative_error(uniform(gen)));
  EXPECT_LT(worst, 7.5e-5);  // below half an ulp of bf16 (2^-9) and fp16 (2^-11)
}

TEST(Exp2OnFmaPipe, RoundingHalfwayAndIntegerPoints) {
  // j = round(x) flips at the halves; both sides must give the same continuous function.
  for (int j = -124; j <= 8; ++j) {
    for (float x : {float(j), j - 0.5f, j + 0.5f, std::nextafter(j - 0.5f, -200.f),
                    std::nextafter(j + 0.5f, 200.f)}) {
      if (x < -125.f || x > 8.f) continue;
      EXPECT_LT(relative_error(x), 7.5e-5) << "x = " << x;
    }
  }
}

TEST(Exp2OnFmaPipe, BelowTheRangeClampsAndNaNPropagates) {
  float const floor_value = float(std::exp2(-125.0));
  for (float x : {-125.5f, -126.f, -1000.f, -std::numeric_limits<float>::infinity()}) {
    float const y = exp2_on_fma_pipe(x);
    EXPECT_TRUE(std::isnormal(y)) << "x = " << x;
    EXPECT_NEAR(y, floor_value, floor_value * 1e-4) << "x = " << x;
  }
  EXPECT_TRUE(std::isnan(exp2_on_fma_pipe(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace flashcute::sm90

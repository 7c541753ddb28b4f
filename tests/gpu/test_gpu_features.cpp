// Each feature of the C API against the reference on every kernel: LSE, GQA/MQA, strided views,
// variable length, local windows, softcap, ALiBi, and their combinations. A forced family may
// refuse a feature with FC_ERROR_UNSUPPORTED (printed as a note); the automatic choice never may.
#include <gtest/gtest.h>

#include <iterator>
#include <memory>
#include <random>
#include <vector>

#include "gpu_harness.hpp"

namespace flashcute {
namespace testing {
namespace {

constexpr bool kAllowUnsupported = true;

TEST(Features, LseIsOptional) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    Case c;
    c.dtype = dtype;
    c.problem = dense_problem(2, 300, 257, 4, 4, 64);
    c.lse = false;  // the LSE buffer must then stay untouched
    check_case(c);
    c.lse = true;
    c.problem.causal = true;
    check_case(c);
  }
}

TEST(Features, GroupedAndMultiQueryAttention) {
  FC_REQUIRE_GPU();
  for (int heads_k : {4, 2, 1}) {
    Case c;
    c.dtype = heads_k == 2 ? FC_FLOAT16 : FC_BFLOAT16;
    c.problem = dense_problem(2, 190, 333, 8, heads_k, 128);
    c.problem.causal = heads_k != 4;
    c.problem.bottom_right = heads_k == 1;
    check_case(c);
  }
}

TEST(Features, StridedViews) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    Case c;
    c.dtype = dtype;
    c.problem = dense_problem(2, 257, 257, 4, 2, 96);
    c.placement = Placement::kQkvPacked;
    check_case(c);
    c.problem = dense_problem(3, 100, 517, 4, 4, 64);
    c.problem.causal = true;
    c.problem.bottom_right = true;
    c.placement = Placement::kHeadMajor;
    check_case(c);
  }
}

TEST(Features, VariableLengthWithEmptySequences) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16})
    for (int mask = 0; mask < 3; ++mask) {
      Case c;
      c.dtype = dtype;
      c.problem = dense_problem(1, 0, 0, 4, 4, 64);
      set_varlen(c.problem, {0, 37, 129, 1, 0, 300, 64}, {5, 0, 200, 128, 0, 250, 64});
      c.problem.causal = mask > 0;
      c.problem.bottom_right = mask == 2;
      check_case(c, kAllowUnsupported);
    }
  Case packed;  // varlen through a packed QKV tensor and a head-major one
  packed.problem = dense_problem(1, 0, 0, 2, 2, 128);
  set_varlen(packed.problem, {17, 0, 260}, {17, 0, 260});
  packed.placement = Placement::kQkvPacked;
  check_case(packed, kAllowUnsupported);
  packed.placement = Placement::kHeadMajor;
  check_case(packed, kAllowUnsupported);
}

// Packed batches of many sequences of mixed lengths, zero-length ones among them: the Hopper
// scheduler's cursor walks hundreds of sequences, each CTA over a different stretch of them.
TEST(Features, VariableLengthManySequences) {
  FC_REQUIRE_GPU();
  std::mt19937 rng(20261202);
  for (int head_dim : {64, 128, 256})
    for (bool causal : {false, true}) {
      int const count = head_dim == 256 ? 600 : 100;
      int const longest = head_dim == 256 ? 40 : 400;
      std::vector<int> lengths(count);
      for (int& len : lengths) len = rng() % 8 == 0 ? 0 : int(rng() % (longest + 1));
      Case c;
      c.dtype = causal ? FC_BFLOAT16 : FC_FLOAT16;
      c.problem = dense_problem(1, 0, 0, 2, 2, head_dim);
      set_varlen(c.problem, lengths, lengths);
      c.problem.causal = causal;
      check_case(c, kAllowUnsupported);
    }
}

TEST(Features, LocalWindowsBothAlignments) {
  FC_REQUIRE_GPU();
  const std::vector<std::pair<int, int>> windows = {{0, 0}, {16, -1}, {-1, 16}, {37, 5}, {128, 0}};
  for (bool bottom_right : {false, true})
    for (auto [sq, sk] : {std::pair{300, 700}, std::pair{700, 300}})
      for (auto [left, right] : windows) {
        Case c;
        c.dtype = bottom_right ? FC_BFLOAT16 : FC_FLOAT16;
        c.problem = dense_problem(2, sq, sk, 2, 2, 64);
        c.problem.bottom_right = bottom_right;
        c.problem.window_left = left;
        c.problem.window_right = right;
        c.problem.causal = right == 0 && left == 128;  // causal with a left window
        check_case(c, kAllowUnsupported);
      }
}

TEST(Features, Softcap) {
  FC_REQUIRE_GPU();
  for (float softcap : {1.0f, 30.0f}) {
    Case c;
    c.dtype = softcap > 1 ? FC_BFLOAT16 : FC_FLOAT16;
    c.problem = dense_problem(2, 200, 333, 4, 4, 128);
    c.problem.softcap = softcap;
    c.data = Data::kScaledUp;
    check_case(c, kAllowUnsupported);
    c.problem.causal = true;
    check_case(c, kAllowUnsupported);
  }
}

TEST(Features, AlibiPerHeadAndPerBatchHead) {
  FC_REQUIRE_GPU();
  for (bool per_batch : {false, true})
    for (bool bottom_right : {false, true}) {
      Case c;
      c.dtype = per_batch ? FC_FLOAT16 : FC_BFLOAT16;
      c.problem = dense_problem(3, 150, 400, 4, 2, 64);
      c.problem.bottom_right = bottom_right;
      c.problem.causal = bottom_right;
      c.problem.alibi_slopes = random_slopes(per_batch ? 3 * 4 : 4);
      c.problem.alibi_batch_stride = per_batch ? 4 : 0;
      check_case(c, kAllowUnsupported);
    }
}

// On a Hopper GPU the sm90 family itself takes softcap and ALiBi (its default tiles have a kernel
// for them), at every head dim, alone and together, with GQA, varlen, both alignments and a
// negative scale: the cases above would also pass with these calls on the SM80 family.
TEST(Features, Sm90TakesSoftcapAndAlibi) {
  FC_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the sm90 family needs a compute capability 9.0 device";
  const int head_dims[] = {64, 96, 128, 192, 256, 40};
  for (size_t i = 0; i < std::size(head_dims); ++i) {
    const int d = head_dims[i];
    Case c;
    c.dtype = i % 2 ? FC_FLOAT16 : FC_BFLOAT16;
    c.problem = dense_problem(2, 200 + 37 * int(i), 333, 4, i % 3 ? 2 : 4, d);
    c.problem.causal = i % 2 == 0;
    c.problem.bottom_right = i % 3 != 1;
    std::vector<Case> cases;
    Case softcap = c;
    softcap.problem.softcap = 30.0f;
    softcap.data = Data::kScaledUp;
    cases.push_back(softcap);
    Case alibi = c;
    alibi.problem.alibi_slopes = random_slopes(2 * 4);
    alibi.problem.alibi_batch_stride = 4;
    cases.push_back(alibi);
    Case both = c;  // packed sequences, a window, both modifiers and a negative scale
    set_varlen(both.problem, {100, 0, 513, 64}, {300, 10, 256, 0});
    both.problem.window_left = 50;
    both.problem.alibi_slopes = random_slopes(4);
    both.problem.alibi_batch_stride = 0;
    both.problem.softcap = 10.0f;
    both.problem.softmax_scale = -0.2f;
    cases.push_back(both);
    for (const Case& k : cases) {
      SCOPED_TRACE(k.describe());
      const std::unique_ptr<Inputs> in = make_inputs(k);
      const Outcome out = run_kernel(*in, KernelChoice{FC_FAMILY_SM90, {0, 0, 0}});
      EXPECT_TRUE(matches(*in, reference_for(*in), out));
    }
  }
}

// Without a causal mask most key blocks lie wholly on one side of the diagonal, where the sm90
// family takes ALiBi's bias as a column term per score and a row term per row. Far from the
// diagonal the row term is large against the scores: slopes small enough that keys thousands of
// positions away still weigh in, rows on both sides of their diagonal, both alignments, GQA.
TEST(Features, Sm90AlibiFarFromTheDiagonal) {
  FC_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the sm90 family needs a compute capability 9.0 device";
  for (int d : {64, 128, 256})
    for (bool bottom_right : {false, true}) {
      Case c;
      c.dtype = d == 128 ? FC_FLOAT16 : FC_BFLOAT16;
      c.problem = dense_problem(2, 700, 2500, 4, 2, d);
      c.problem.bottom_right = bottom_right;
      std::vector<float> slopes = random_slopes(4);
      for (float& slope : slopes) slope *= 0.02f;
      c.problem.alibi_slopes = slopes;
      c.problem.alibi_batch_stride = 0;
      SCOPED_TRACE(c.describe());
      const std::unique_ptr<Inputs> in = make_inputs(c);
      const Outcome out = run_kernel(*in, KernelChoice{FC_FAMILY_SM90, {0, 0, 0}});
      EXPECT_TRUE(matches(*in, reference_for(*in), out));
    }
}

TEST(Features, Combinations) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16})
    for (bool bottom_right : {false, true}) {
      Case c;  // GQA + varlen + causal + window
      c.dtype = dtype;
      c.problem = dense_problem(1, 0, 0, 8, 2, 128);
      set_varlen(c.problem, {100, 0, 513, 64}, {300, 10, 256, 0});
      c.problem.causal = true;
      c.problem.bottom_right = bottom_right;
      c.problem.window_left = 50;
      check_case(c, kAllowUnsupported);
      // ... plus ALiBi per batch-head, softcap, a negative scale and head-major tensors.
      c.problem.alibi_slopes = random_slopes(4 * 8);
      c.problem.alibi_batch_stride = 8;
      c.problem.softcap = 10.0f;
      c.problem.softmax_scale = -0.2f;
      c.placement = Placement::kHeadMajor;
      check_case(c, kAllowUnsupported);
    }
}

}  // namespace
}  // namespace testing
}  // namespace flashcute

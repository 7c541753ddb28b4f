// fc_backward against the CPU fp64 backward reference: all-pairs coverage of the main lists, then
// the edges (empty sequences, no keys, no queries), GQA sums, determinism, strided gradients, a
// forced Hopper family, and the calls that must write nothing. Problems stay small enough for the
// CPU reference (a few hundred tokens, few heads): its cost dominates the suite's time here.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backward_harness.hpp"
#include "pairwise.hpp"
#include "reference/poison.hpp"

namespace flashcute {
namespace testing {
namespace {

constexpr bool kAllowUnsupported = true;

enum class Feature { kNone, kWindow, kWindowLeft, kWindowRight, kSoftcap, kAlibi };

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(Backward, AllPairs) {
  FC_REQUIRE_GPU();
  const bool small = small_mode();
  const std::vector<fc_dtype> dtypes = {FC_FLOAT16, FC_BFLOAT16};
  const std::vector<int> head_dims = {8, 40, 64, 96, 128, 136, 200, 256};
  // (seqlen_q, seqlen_k): one token, tile +- 1 both ways, sq > sk and sq < sk.
  const std::vector<std::pair<int, int>> lengths = {
      {1, 1},     {1, small ? 160 : 300},  {127, 129}, {129, 127},
      {128, 128}, {small ? 160 : 300, 77}, {64, 200}};
  const std::vector<int> batches = {1, 2};
  const std::vector<std::pair<int, int>> heads = {{4, 4}, {8, 4}, {8, 1}};
  const std::vector<Feature> features = {Feature::kNone,       Feature::kWindow,
                                         Feature::kWindowLeft, Feature::kWindowRight,
                                         Feature::kSoftcap,    Feature::kAlibi};
  const std::vector<Placement> placements = {Placement::kPacked, Placement::kHeadMajor};
  // The automatic choice (the sm90 family on a Hopper GPU wherever it supports the case) and each
  // family forced; a forced family may refuse what it does not support.
  const std::vector<int> families = {FC_FAMILY_AUTO, FC_FAMILY_SM80, FC_FAMILY_SM90};
  const auto rows = all_pairs({int(dtypes.size()), int(head_dims.size()), int(lengths.size()),
                               int(batches.size()), int(heads.size()), 2, int(features.size()), 2,
                               int(placements.size()), 2, 2, int(families.size())});
  // Under racecheck only an evenly spread subset runs (FLASHCUTE_TEST_MAX_CASES).
  const size_t limit = case_limit(), step = limit && limit < rows.size() ? rows.size() / limit : 1;
  std::printf("[ info ] %zu all-pairs backward cases, running every %zu\n", rows.size(), step);
  const auto start = std::chrono::steady_clock::now();
  for (size_t r = 0; r < rows.size(); r += step) {
    const std::vector<int>& row = rows[r];
    Case c;
    c.dtype = dtypes[row[0]];
    const int d = head_dims[row[1]];
    const auto [sq, sk] = lengths[row[2]];
    const int batch = batches[row[3]];
    const auto [h, hk] = heads[row[4]];
    c.problem = dense_problem(batch, sq, sk, h, hk, d);
    c.problem.causal = row[5] == 1;
    const bool large = row[7] == 1;  // N(0, 6^2) queries and keys: scores reach the hundreds
    c.data = large ? Data::kScaledUp : Data::kNormal;
    switch (features[row[6]]) {
      case Feature::kNone:
        break;
      case Feature::kWindow:
        c.problem.window_left = 40;
        c.problem.window_right = 20;
        break;
      case Feature::kWindowLeft:
        c.problem.window_left = 50;
        break;
      case Feature::kWindowRight:
        c.problem.window_right = 30;
        break;
      case Feature::kSoftcap:  // the tanh bends at the scores' scale
        c.problem.softcap = large ? 30.0f : 3.0f;
        break;
      case Feature::kAlibi:  // per head, or per (batch, head) when there are two sequences
        c.problem.alibi_slopes = random_slopes(size_t(batch) * h);
        c.problem.alibi_batch_stride = batch > 1 ? h : 0;
        break;
    }
    c.placement = placements[row[8]];
    c.problem.bottom_right = row[9] == 1;
    const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
    const int family = families[row[11]];
    check_backward(*bin, BackwardRun{family, row[10] == 1}, family != FC_FAMILY_AUTO);
  }
  std::printf("[ info ] all-pairs backward: %.1f s\n", seconds_since(start));
}

TEST(Backward, VariableLengthWithEmptySequences) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16})
    for (int mask = 0; mask < 3; ++mask) {
      Case c;
      c.dtype = dtype;
      c.problem = dense_problem(1, 0, 0, 4, 2, 64);
      // Sequences with no queries (their keys get zero dK, dV) and with no keys (zero dQ).
      set_varlen(c.problem, {0, 37, 129, 1, 0, 200, 64}, {5, 0, 200, 128, 0, 150, 64});
      c.problem.causal = mask > 0;
      c.problem.bottom_right = mask == 2;
      c.placement = mask == 1 ? Placement::kHeadMajor : Placement::kPacked;
      const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
      for (bool deterministic : {false, true})
        check_backward(*bin, BackwardRun{FC_FAMILY_AUTO, deterministic});
    }
}

TEST(Backward, NoKeysGiveZeroDq) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    Case c;
    c.dtype = dtype;
    c.problem = dense_problem(2, 150, 0, 4, 2, 128);
    const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
    for (bool deterministic : {false, true})
      check_backward(*bin, BackwardRun{FC_FAMILY_AUTO, deterministic});  // dQ must be all zeros
  }
}

TEST(Backward, NoQueriesGiveZeroDkDv) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    Case c;
    c.dtype = dtype;
    c.problem = dense_problem(2, 0, 150, 4, 2, 64);
    const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
    for (bool deterministic : {false, true})
      check_backward(*bin, BackwardRun{FC_FAMILY_AUTO, deterministic});  // dK, dV all zeros
  }
}

// Rows above the diagonal of a bottom-right mask see nothing; keys beyond a top-left one are seen
// by nobody: their gradients are exact zeros.
TEST(Backward, RowsAndKeysOutsideTheMask) {
  FC_REQUIRE_GPU();
  for (bool bottom_right : {false, true}) {
    Case c;
    c.problem = dense_problem(2, bottom_right ? 300 : 90, bottom_right ? 90 : 300, 4, 4, 128);
    c.problem.causal = true;
    c.problem.bottom_right = bottom_right;
    check_backward_case(c, false);
  }
}

// dK and dV of a key/value head sum over its 8 query heads, over many key blocks.
TEST(Backward, GqaRatioEightSumsOverQueryHeads) {
  FC_REQUIRE_GPU();
  const int sk = small_mode() ? 257 : 513;
  for (auto [h, hk] : {std::pair{16, 2}, std::pair{8, 1}}) {
    Case c;
    c.dtype = h == 16 ? FC_BFLOAT16 : FC_FLOAT16;
    c.problem = dense_problem(1, 100, sk, h, hk, 64);
    c.problem.causal = h == 16;
    c.problem.bottom_right = true;
    const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
    for (bool deterministic : {false, true})
      check_backward(*bin, BackwardRun{FC_FAMILY_AUTO, deterministic});
  }
}

// Gradients with their own strides: Q, K and V are slices of one packed tensor, so dQ, dK and dV
// (laid out the same way, one buffer each) have gaps between rows that must stay poison; dO has
// padded rows.
TEST(Backward, StridedGradients) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    Case c;
    c.dtype = dtype;
    c.problem = dense_problem(2, 257, 257, 4, 2, 96);
    c.problem.causal = dtype == FC_BFLOAT16;
    c.placement = Placement::kQkvPacked;
    check_backward_case(c, dtype == FC_FLOAT16);
  }
}

TEST(Backward, Combinations) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    Case c;  // GQA + varlen + causal + window + ALiBi per batch-head + softcap + negative scale
    c.dtype = dtype;
    c.problem = dense_problem(1, 0, 0, 8, 2, 128);
    set_varlen(c.problem, {100, 0, 257, 64}, {200, 10, 256, 0});
    c.problem.causal = true;
    c.problem.bottom_right = dtype == FC_BFLOAT16;
    c.problem.window_left = 50;
    c.problem.alibi_slopes = random_slopes(4 * 8);
    c.problem.alibi_batch_stride = 8;
    c.problem.softcap = 10.0f;
    c.problem.softmax_scale = -0.2f;
    c.placement = Placement::kHeadMajor;
    const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
    for (bool deterministic : {false, true})
      check_backward(*bin, BackwardRun{FC_FAMILY_AUTO, deterministic});
  }
}

// With `deterministic`, three runs give the same bits in every gradient (and the right values),
// in each family: several key blocks add to every dQ block, GQA, a causal mask, a window, packed
// sequences of different lengths, and head dim 256 (which the sm90 family refuses).
TEST(Backward, DeterministicRunsAreBitwiseIdentical) {
  FC_REQUIRE_GPU();
  const bool hopper = device_is_sm90();
  const int s = small_mode() ? 200 : 400;
  std::vector<Case> cases(5);
  cases[0].problem = dense_problem(2, s, s + 13, 8, 2, 128);
  cases[0].problem.causal = true;
  cases[1].dtype = FC_FLOAT16;
  cases[1].problem = dense_problem(1, s + 70, s, 4, 4, 64);
  cases[2].problem = dense_problem(1, s, s, 4, 1, 96);
  cases[2].problem.window_left = 150;
  cases[2].problem.window_right = 20;
  cases[3].problem = dense_problem(1, 0, 0, 4, 2, 128);
  set_varlen(cases[3].problem, {300, 0, 129, 64, 520}, {520, 40, 129, 300, 64});
  cases[3].problem.causal = true;
  cases[3].problem.bottom_right = true;
  cases[4].problem = dense_problem(1, s, s, 2, 2, 256);
  for (const Case& c : cases) {
    const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
    for (int family : {FC_FAMILY_SM80, FC_FAMILY_SM90}) {
      SCOPED_TRACE(c.describe() + (family == FC_FAMILY_SM90 ? " | sm90" : " | sm80"));
      const BackwardRun run{family, true};
      const BackwardOutcome first = run_backward(*bin, run);
      if (first.status == FC_ERROR_UNSUPPORTED &&
          (!bin->forward_compiled ||
           (family == FC_FAMILY_SM90 && (!hopper || c.problem.head_dim > 128)))) {
        EXPECT_TRUE(gradients_untouched(first));
        continue;
      }
      ASSERT_EQ(first.status, FC_OK) << first.message;
      ASSERT_TRUE(gradients_match(*bin, first));
      for (int again = 0; again < 2; ++again) {
        const BackwardOutcome next = run_backward(*bin, run);
        ASSERT_EQ(next.status, FC_OK) << next.message;
        EXPECT_EQ(next.dq_raw, first.dq_raw) << "dq differs in run " << again + 2;
        EXPECT_EQ(next.dk_raw, first.dk_raw) << "dk differs in run " << again + 2;
        EXPECT_EQ(next.dv_raw, first.dv_raw) << "dv differs in run " << again + 2;
      }
    }
  }
}

// On a Hopper GPU the sm90 family takes every plain problem (dense, packed, GQA, masks of both
// alignments, windows) in each of its head-dim buckets and their splits (up to 128: by keys; 256:
// by head dim); elsewhere forcing it is refused as unsupported.
TEST(Backward, Sm90FamilyRunsOnHopper) {
  FC_REQUIRE_GPU();
  const bool hopper = device_is_sm90();
  std::vector<Case> cases;
  for (int d : {64, 128, 72, 256, 200}) {
    Case c;
    c.dtype = d == 64 || d == 200 ? FC_FLOAT16 : FC_BFLOAT16;
    c.problem = dense_problem(2, 200, 333, 8, 2, d);
    c.problem.causal = true;
    c.problem.bottom_right = d != 128;
    cases.push_back(c);
  }
  for (int i : {1, 3}) {
    Case window = cases[i];
    window.problem.causal = false;
    window.problem.window_left = 70;
    window.problem.window_right = 9;
    cases.push_back(window);
  }
  for (int d : {128, 256}) {
    Case packed;
    packed.problem = dense_problem(1, 0, 0, 4, 4, d);
    set_varlen(packed.problem, {0, 130, 7, 300}, {64, 130, 0, 260});
    packed.problem.causal = true;
    cases.push_back(packed);
  }
  for (const Case& c : cases) {
    const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
    check_backward(*bin, BackwardRun{FC_FAMILY_SM90, false}, !hopper);
  }
}

// Invalid calls with real device tensors: refused before anything is launched, so the poisoned
// gradients (guards included) are untouched.
TEST(Backward, RefusalsWriteNothing) {
  FC_REQUIRE_GPU();
  Case c;
  c.problem = dense_problem(2, 130, 200, 4, 2, 64);
  const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
  const BackwardRun run;
  struct Refusal {
    const char* name;
    std::function<void(fc_backward_args&)> change;
  };
  const std::vector<Refusal> refusals = {
      {"workspace", [](fc_backward_args& a) { a.workspace_bytes -= 1; }},
      {"workspace", [](fc_backward_args& a) { a.workspace = nullptr; }},
      {"deterministic", [](fc_backward_args& a) { a.deterministic = 2; }},
      {"softmax_lse", [](fc_backward_args& a) { a.softmax_lse = nullptr; }},
      {"dq", [](fc_backward_args& a) { a.dq.seq_stride += 4; }},
      {"dout", [](fc_backward_args& a) { a.dout.data = nullptr; }},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.name);
    const BackwardOutcome out = run_backward(*bin, run, r.change);
    EXPECT_EQ(out.status, FC_ERROR_INVALID_ARGUMENT) << out.message;
    EXPECT_NE(out.message.find(r.name), std::string::npos) << out.message;
    EXPECT_TRUE(gradients_untouched(out));
  }

  // A gradient in host memory is not device memory: refused, and the host buffer is unchanged.
  std::vector<uint16_t> host_dk(bin->dk_span + 64, ref::kPoison16);
  const std::vector<uint16_t> before = host_dk;
  const BackwardOutcome host =
      run_backward(*bin, run, [&](fc_backward_args& a) { a.dk.data = host_dk.data() + 8; });
  EXPECT_EQ(host.status, FC_ERROR_INVALID_ARGUMENT) << host.message;
  EXPECT_NE(host.message.find("dk"), std::string::npos) << host.message;
  EXPECT_EQ(host_dk, before);
  EXPECT_TRUE(gradients_untouched(host));
}

}  // namespace
}  // namespace testing
}  // namespace flashcute

// flashcute_run's option parsing: the example runner's defaults, every flag, and rejected values.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runner_options.hpp"

namespace flashcute {
namespace {

using runner::Options;

bool parse(std::vector<const char*> args, Options* o, std::string* error) {
  args.insert(args.begin(), "flashcute_run");
  return runner::parse_options(int(args.size()), args.data(), o, error);
}

Options parsed(std::vector<const char*> args) {
  Options o;
  std::string error;
  EXPECT_TRUE(parse(args, &o, &error)) << error;
  return o;
}

TEST(RunnerOptions, DefaultsAreTheSeeds) {
  const Options o = parsed({});
  EXPECT_EQ(o.dtype, FC_BFLOAT16);
  EXPECT_EQ(o.batch_size, 4);
  EXPECT_EQ(o.seqlen_q, 8192);
  EXPECT_EQ(o.seqlen_k, 8192);
  EXPECT_EQ(o.num_head, 16);
  EXPECT_EQ(o.head_dim, 128);
  EXPECT_EQ(o.softmax_scale, 0.5f);
  EXPECT_EQ(o.m_block_size, 128);
  EXPECT_EQ(o.n_block_size, 64);
  EXPECT_EQ(o.num_threads, 128);
  EXPECT_FALSE(o.is_causal);
  EXPECT_EQ(o.warmup_iterations, 3);
  EXPECT_EQ(o.iterations, 10);
  EXPECT_FALSE(o.skip_ref_check);
  EXPECT_FALSE(o.use_cold_l2);
  EXPECT_EQ(o.family, FC_FAMILY_AUTO);
  EXPECT_FALSE(o.auto_tile);
  EXPECT_EQ(o.inputs, runner::InputKind::kNormal);
  EXPECT_EQ(o.causal_alignment, FC_CAUSAL_TOP_LEFT);
  EXPECT_EQ(o.num_head_k, 0);
  EXPECT_EQ(o.window_left, -1);
  EXPECT_EQ(o.window_right, -1);
  EXPECT_EQ(o.softcap, 0.0f);
  EXPECT_FALSE(o.alibi);
  EXPECT_FALSE(o.varlen);
  EXPECT_FALSE(o.lse);
}

TEST(RunnerOptions, EveryValueFlag) {
  const Options o = parsed({"--dtype",
                            "Float16",
                            "--batch_size",
                            "2",
                            "--seqlen_q",
                            "100",
                            "--seqlen_k=300",
                            "--num_head",
                            "8",
                            "--num_head_k",
                            "2",
                            "--head_dim",
                            "72",
                            "--softmax_scale",
                            "-0.125",
                            "--m_block_size",
                            "64",
                            "--n_block_size",
                            "32",
                            "--num_threads",
                            "256",
                            "--warmup_iterations",
                            "0",
                            "--iterations",
                            "7",
                            "--family",
                            "sm90",
                            "--causal_alignment",
                            "bottom_right",
                            "--window_left",
                            "16",
                            "--window_right",
                            "0",
                            "--softcap",
                            "30"});
  EXPECT_EQ(o.dtype, FC_FLOAT16);
  EXPECT_EQ(o.batch_size, 2);
  EXPECT_EQ(o.seqlen_q, 100);
  EXPECT_EQ(o.seqlen_k, 300);
  EXPECT_EQ(o.num_head, 8);
  EXPECT_EQ(o.num_head_k, 2);
  EXPECT_EQ(o.head_dim, 72);
  EXPECT_EQ(o.softmax_scale, -0.125f);
  EXPECT_EQ(o.m_block_size, 64);
  EXPECT_EQ(o.n_block_size, 32);
  EXPECT_EQ(o.num_threads, 256);
  EXPECT_EQ(o.warmup_iterations, 0);
  EXPECT_EQ(o.iterations, 7);
  EXPECT_EQ(o.family, FC_FAMILY_SM90);
  EXPECT_EQ(o.causal_alignment, FC_CAUSAL_BOTTOM_RIGHT);
  EXPECT_EQ(o.window_left, 16);
  EXPECT_EQ(o.window_right, 0);
  EXPECT_EQ(o.softcap, 30.0f);
  EXPECT_EQ(parsed({"--family", "sm80"}).family, FC_FAMILY_SM80);
  EXPECT_EQ(parsed({"--family", "auto"}).family, FC_FAMILY_AUTO);
  EXPECT_EQ(parsed({"--dtype", "BFloat16"}).dtype, FC_BFLOAT16);
  EXPECT_EQ(parsed({"--causal_alignment", "top_left"}).causal_alignment, FC_CAUSAL_TOP_LEFT);
}

TEST(RunnerOptions, EverySwitch) {
  const Options o = parsed({"--is_causal", "--skip_ref_check", "--use_cold_l2", "--auto_tile",
                            "--integer_inputs", "--alibi", "--varlen", "--lse"});
  EXPECT_TRUE(o.is_causal);
  EXPECT_TRUE(o.skip_ref_check);
  EXPECT_TRUE(o.use_cold_l2);
  EXPECT_TRUE(o.auto_tile);
  EXPECT_EQ(o.inputs, runner::InputKind::kInteger);
  EXPECT_TRUE(o.alibi);
  EXPECT_TRUE(o.varlen);
  EXPECT_TRUE(o.lse);
  EXPECT_TRUE(parsed({"--help"}).help);
}

TEST(RunnerOptions, BadValuesAreRejectedWithAMessage) {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--dtype", "Float32"}, "--dtype"},
      {{"--batch_size", "-1"}, "--batch_size"},
      {{"--seqlen_q", "12x"}, "--seqlen_q"},
      {{"--num_head", "0"}, "--num_head"},
      {{"--head_dim", ""}, "--head_dim"},
      {{"--softmax_scale", "nan"}, "--softmax_scale"},
      {{"--softmax_scale", "inf"}, "--softmax_scale"},
      {{"--family", "sm70"}, "--family"},
      {{"--causal_alignment", "center"}, "--causal_alignment"},
      {{"--window_left", "-2"}, "--window_left"},
      {{"--softcap", "-1"}, "--softcap"},
      {{"--iterations", "0"}, "--iterations"},
      {{"--seqlen_k", "99999999999999999999"}, "--seqlen_k"},
      {{"--num_threads"}, "--num_threads"},
      {{"--is_causal=1"}, "--is_causal"},
      {{"--bogus"}, "--bogus"},
  };
  for (const auto& [args, flag] : cases) {
    Options o;
    std::string error;
    EXPECT_FALSE(parse(args, &o, &error)) << flag;
    EXPECT_NE(error.find(flag), std::string::npos)
        << "message '" << error << "' should name " << flag;
  }
}

TEST(RunnerOptions, FailedParseLeavesOptionsAlone) {
  Options o;
  o.batch_size = 77;
  std::string error;
  EXPECT_FALSE(parse({"--batch_size", "3", "--dtype", "x"}, &o, &error));
  EXPECT_EQ(o.batch_size, 77);
}

}  // namespace
}  // namespace flashcute

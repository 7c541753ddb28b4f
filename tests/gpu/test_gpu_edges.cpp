// Edges of the problem space and of the API contract: empty problems, no keys, key lengths at
// key-block boundaries, a tensor beyond 2^31 elements, tensors on another device, repeatability,
// and the calls the library must refuse without writing anything.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpu_harness.hpp"

namespace flashcute {
namespace testing {
namespace {

TEST(Edges, EmptyBatchAndEmptyQueriesWriteNothing) {
  FC_REQUIRE_GPU();
  for (auto [batch, seqlen_q] : {std::pair{0, 128}, std::pair{2, 0}}) {
    Case c;
    c.problem = dense_problem(batch, seqlen_q, 64, 4, 4, 64);
    const std::unique_ptr<Inputs> in = make_inputs(c);
    for (const KernelChoice& k : kernel_choices(c.dtype, 64)) {
      SCOPED_TRACE(c.describe() + " | " + k.describe());
      const Outcome out = run_kernel(*in, k);
      EXPECT_EQ(out.status, FC_OK) << out.message;
      EXPECT_TRUE(untouched(*in, out));
    }
  }
}

TEST(Edges, NoKeysGiveZerosAndInfiniteLse) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    Case c;
    c.dtype = dtype;
    c.problem = dense_problem(2, 200, 0, 4, 2, 128);
    check_case(c);  // the reference holds zeros and +inf; poison elsewhere must fail
  }
}

TEST(Edges, RowsAboveTheDiagonalSeeNothing) {
  FC_REQUIRE_GPU();
  Case c;  // bottom-right causal with sq > sk: the first sq - sk rows see no key
  c.problem = dense_problem(2, 500, 130, 2, 2, 64);
  c.problem.causal = true;
  c.problem.bottom_right = true;
  check_case(c);
}

// Key lengths around one and two key blocks of each d 128 tile (128 and 176 keys): a block
// with no residue takes the unmasked path, one key more adds a block that is all residue.
TEST(Edges, KeyBlockBoundaries) {
  FC_REQUIRE_GPU();
  bool causal = false;
  for (int seqlen_k : {127, 128, 129, 175, 176, 177, 256, 352, 353}) {
    Case c;
    c.problem = dense_problem(2, 150, seqlen_k, 2, 2, 128);
    c.problem.causal = causal;
    c.problem.bottom_right = true;
    check_case(c);
    causal = !causal;
  }
}

// Q and O hold more than 2^31 elements; K and V are short, so the work stays small.
TEST(Edges, TensorAboveTwoToThe31Elements) {
  FC_REQUIRE_GPU();
  Case c;
  c.problem = dense_problem(1, (1 << 24) + 100, 48, 2, 2, 64);
  ASSERT_GT(int64_t{c.problem.seqlen_q} * 2 * 64, int64_t{1} << 31);
  const std::unique_ptr<Inputs> in = make_inputs(c);
  const Reference ref = reference_for(*in);
  const Outcome out = run_kernel(*in, KernelChoice{});
  EXPECT_TRUE(matches(*in, ref, out));
}

TEST(Edges, TensorsOnAnotherDevice) {
  FC_REQUIRE_GPU();
  if (device_count() < 2) GTEST_SKIP() << "only one GPU: cannot place tensors on a second device";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  Case c;
  c.problem = dense_problem(2, 129, 200, 4, 2, 128);
  c.problem.causal = true;
  const std::unique_ptr<Inputs> in = make_inputs(c);  // allocated on device 1
  const Reference ref = reference_for(*in);
  const Outcome out = run_kernel(*in, KernelChoice{}, /*call_device=*/0);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_TRUE(matches(*in, ref, out));
  // Mixing devices in one call is an argument error naming the tensor.
  DeviceBuffer o_on_0(in->o_span * 2 + 16);
  const fc_forward_args a = forward_args(*in, o_on_0.get(), nullptr, KernelChoice{});
  EXPECT_EQ(fc_forward(&a), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("o "), std::string::npos) << fc_last_error();
}

TEST(Edges, RepeatedRunsAreBitwiseIdentical) {
  FC_REQUIRE_GPU();
  Case c;
  c.problem = dense_problem(2, 1000, 1000, 4, 2, 128);
  c.problem.causal = true;
  const std::unique_ptr<Inputs> in = make_inputs(c);
  for (const KernelChoice& k : kernel_choices(c.dtype, 128)) {
    SCOPED_TRACE(k.describe());
    const Outcome first = run_kernel(*in, k);
    ASSERT_EQ(first.status, FC_OK) << first.message;
    for (int run = 0; run < 2; ++run) {
      const Outcome again = run_kernel(*in, k);
      EXPECT_EQ(again.o_raw, first.o_raw);
      EXPECT_EQ(std::memcmp(again.lse_raw.data(), first.lse_raw.data(), first.lse_raw.size() * 4),
                0);
    }
  }
}

TEST(Edges, RefusalsWriteNothing) {
  FC_REQUIRE_GPU();
  Case c;
  c.problem = dense_problem(2, 256, 256, 4, 4, 64);
  const std::unique_ptr<Inputs> in = make_inputs(c);

  // A tile that no build compiles.
  const Outcome odd_tile = run_kernel(*in, KernelChoice{FC_FAMILY_SM80, {48, 40, 96}});
  EXPECT_EQ(odd_tile.status, FC_ERROR_UNSUPPORTED);
  EXPECT_NE(odd_tile.message.find("tile"), std::string::npos) << odd_tile.message;
  EXPECT_TRUE(untouched(*in, odd_tile));

  // The Hopper family on another architecture, or with no Hopper kernel compiled.
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major * 10 + minor != 90 ||
      fc_compiled_tile_configs(FC_FAMILY_SM90, c.dtype, 64, nullptr, 0) == 0) {
    const Outcome sm90 = run_kernel(*in, KernelChoice{FC_FAMILY_SM90, {0, 0, 0}});
    EXPECT_EQ(sm90.status, FC_ERROR_UNSUPPORTED) << sm90.message;
    EXPECT_FALSE(sm90.message.empty());
    EXPECT_TRUE(untouched(*in, sm90));
  }

  // Host memory is not device memory.
  std::vector<uint16_t> host_o(in->o_span + 64);
  const fc_forward_args host_args = forward_args(*in, host_o.data(), nullptr, KernelChoice{});
  const std::vector<uint16_t> before = host_o;
  EXPECT_EQ(fc_forward(&host_args), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("o "), std::string::npos) << fc_last_error();
  EXPECT_EQ(host_o, before);

  // An invalid argument with real device tensors: nothing is launched.
  DeviceBuffer o(in->o_span * 2 + 16);
  fc_forward_args bad = forward_args(*in, o.get(), nullptr, KernelChoice{});
  bad.head_dim = 60;
  EXPECT_EQ(fc_forward(&bad), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("head_dim"), std::string::npos);
}

}  // namespace
}  // namespace testing
}  // namespace flashcute

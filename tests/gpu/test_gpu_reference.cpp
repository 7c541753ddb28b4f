// The GPU fp32 reference agrees with the CPU fp64 reference on every feature, so that large cases
// checked against it are checked against the same semantics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gpu_harness.hpp"
#include "reference/cpu_reference.hpp"
#include "reference/gpu_reference.hpp"

namespace flashcute {
namespace testing {
namespace {

void expect_references_agree(const Case& c) {
  SCOPED_TRACE(c.describe());
  const std::unique_ptr<Inputs> in = make_inputs(c);
  ASSERT_FALSE(in->host.empty());
  const ref::Problem& p = c.problem;
  const float* h = in->host.data();
  const ref::CpuOutput cpu =
      ref::cpu_reference(p, {h + in->q_offset, in->q_layout}, {h + in->k_offset, in->k_layout},
                         {h + in->v_offset, in->v_layout});
  DeviceBuffer o(p.o_elements() * 4 + 4), lse(p.lse_elements() * 4 + 4);
  const char* base = in->data->get();
  ASSERT_EQ(ref::gpu_reference(
                p, c.dtype, {base + 2 * in->q_offset, in->q_layout},
                {base + 2 * in->k_offset, in->k_layout}, {base + 2 * in->v_offset, in->v_layout},
                reinterpret_cast<float*>(o.get()), reinterpret_cast<float*>(lse.get())),
            cudaSuccess);
  std::vector<float> go(p.o_elements()), gl(p.lse_elements());
  ASSERT_EQ(cudaMemcpy(go.data(), o.get(), go.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gl.data(), lse.get(), gl.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  double max_ref = 0;
  for (double x : cpu.o) max_ref = std::max(max_ref, std::fabs(x));
  for (size_t i = 0; i < go.size(); ++i)
    ASSERT_NEAR(go[i], cpu.o[i], 1e-5 * (1 + max_ref)) << "O at " << i;
  for (size_t i = 0; i < gl.size(); ++i) {
    if (std::isinf(cpu.lse[i]))
      ASSERT_EQ(gl[i], INFINITY) << "LSE at " << i;
    else
      ASSERT_NEAR(gl[i], cpu.lse[i], 1e-5 * (1 + std::fabs(cpu.lse[i]))) << "LSE at " << i;
  }
}

TEST(GpuReference, MatchesCpuReferenceOnEveryFeature) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    Case c;
    c.dtype = dtype;
    c.problem = dense_problem(2, 77, 131, 4, 2, 72);
    expect_references_agree(c);
    c.problem.causal = true;
    c.problem.bottom_right = true;
    c.placement = Placement::kHeadMajor;
    expect_references_agree(c);
    c.problem = dense_problem(1, 100, 100, 2, 1, 256);
    c.problem.window_left = 7;
    c.problem.window_right = 3;
    c.problem.softcap = 2.0f;
    c.data = Data::kScaledUp;
    c.placement = Placement::kQkvPacked;
    expect_references_agree(c);
    c.problem = dense_problem(3, 0, 0, 4, 4, 8);
    c.problem.cu_seqlens_q = {0, 30, 30, 95};
    c.problem.cu_seqlens_k = {0, 0, 40, 90};
    c.problem.seqlen_q = 65;
    c.problem.seqlen_k = 50;
    c.problem.causal = true;
    c.problem.alibi_slopes = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f,
                              0.7f, 0.8f, 0.9f, 1.0f, 1.1f, 1.2f};
    c.problem.alibi_batch_stride = 4;
    c.problem.softmax_scale = -0.3f;
    c.data = Data::kNormal;
    c.placement = Placement::kPacked;
    expect_references_agree(c);
  }
}

}  // namespace
}  // namespace testing
}  // namespace flashcute

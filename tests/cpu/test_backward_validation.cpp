// fc_backward's and fc_backward_workspace_size's argument checks, which run before any CUDA call:
// each bad argument gives FC_ERROR_INVALID_ARGUMENT with a message naming it, and nothing is
// written. The tensors and the workspace are host buffers: the checks under test never get as far
// as looking at where they live. (A forced SM90 family is refused only once a device is looked at,
// so the GPU suite tests that.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "flashcute/flashcute.h"

namespace flashcute {
namespace {

constexpr int64_t B = 2, S = 16, H = 4, Hk = 2, D = 64;

class BackwardValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto* buffer : {&q_, &o_, &dout_, &dq_}) buffer->assign(B * S * H * D + 64, 0x5A5A);
    for (auto* buffer : {&k_, &v_, &dk_, &dv_}) buffer->assign(B * S * Hk * D + 64, 0x5A5A);
    lse_.assign(B * H * S + 16, 7.0f);
    fc_backward_args_init(&args_);
    auto tensor = [](std::vector<uint16_t>& b, int64_t heads) {
      return fc_tensor{aligned(b.data(), 16), S * heads * D, heads * D, D};
    };
    args_.q = tensor(q_, H);
    args_.k = tensor(k_, Hk);
    args_.v = tensor(v_, Hk);
    args_.o = tensor(o_, H);
    args_.dout = tensor(dout_, H);
    args_.dq = tensor(dq_, H);
    args_.dk = tensor(dk_, Hk);
    args_.dv = tensor(dv_, Hk);
    args_.dtype = FC_FLOAT16;
    args_.batch = B;
    args_.seqlen_q = args_.seqlen_k = S;
    args_.heads = H;
    args_.heads_k = Hk;
    args_.head_dim = D;
    args_.softmax_scale = 0.125f;
    args_.softmax_lse = lse_.data();
    ASSERT_EQ(fc_backward_workspace_size(&args_, &workspace_bytes_), FC_OK) << fc_last_error();
    workspace_.assign(workspace_bytes_ + 512, 0x33);
    args_.workspace = workspace_bytes_ > 0 ? aligned(workspace_.data(), 256) : nullptr;
    args_.workspace_bytes = workspace_bytes_;
  }

  template <typename T>
  static T* aligned(T* p, uintptr_t alignment) {
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + alignment - 1) / alignment * alignment;
    return reinterpret_cast<T*>(a);
  }

  // fc_backward refuses the change as invalid with a message naming `name`, and writes nothing.
  void expect_backward_rejected(const std::function<void(fc_backward_args&)>& change,
                                const std::string& name) {
    fc_backward_args a = args_;
    change(a);
    const std::vector<uint16_t> dq = dq_, dk = dk_, dv = dv_;
    const std::vector<uint8_t> workspace = workspace_;
    EXPECT_EQ(fc_backward(&a), FC_ERROR_INVALID_ARGUMENT) << name;
    const std::string message = fc_last_error();
    EXPECT_NE(message.find(name), std::string::npos)
        << "fc_backward's message '" << message << "' should name " << name;
    EXPECT_EQ(dq_, dq) << name;
    EXPECT_EQ(dk_, dk) << name;
    EXPECT_EQ(dv_, dv) << name;
    EXPECT_EQ(workspace_, workspace) << name;
  }

  // Both the size query and the call refuse it (the size query checks the arguments first).
  void expect_rejected(const std::function<void(fc_backward_args&)>& change,
                       const std::string& name) {
    fc_backward_args a = args_;
    change(a);
    uint64_t bytes = 12345;
    EXPECT_EQ(fc_backward_workspace_size(&a, &bytes), FC_ERROR_INVALID_ARGUMENT) << name;
    const std::string message = fc_last_error();
    EXPECT_NE(message.find(name), std::string::npos)
        << "fc_backward_workspace_size's message '" << message << "' should name " << name;
    expect_backward_rejected(change, name);
  }

  std::vector<uint16_t> q_, k_, v_, o_, dout_, dq_, dk_, dv_;
  std::vector<float> lse_;
  std::vector<uint8_t> workspace_;
  uint64_t workspace_bytes_ = 0;
  fc_backward_args args_;
};

TEST_F(BackwardValidation, NullArgs) {
  EXPECT_EQ(fc_backward(nullptr), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("args"), std::string::npos) << fc_last_error();
  uint64_t bytes = 0;
  EXPECT_EQ(fc_backward_workspace_size(nullptr, &bytes), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("args"), std::string::npos) << fc_last_error();
  EXPECT_EQ(fc_backward_workspace_size(&args_, nullptr), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_STRNE(fc_last_error(), "");
}

TEST_F(BackwardValidation, InitGivesDocumentedDefaults) {
  fc_backward_args a;
  std::memset(&a, 0x7F, sizeof(a));
  fc_backward_args_init(&a);
  EXPECT_EQ(a.abi_version, FC_ABI_VERSION);
  EXPECT_EQ(a.window_left, -1);
  EXPECT_EQ(a.window_right, -1);
  EXPECT_EQ(a.causal_alignment, FC_CAUSAL_BOTTOM_RIGHT);
  EXPECT_EQ(a.family, FC_FAMILY_AUTO);
  EXPECT_EQ(a.causal, 0);
  EXPECT_EQ(a.softcap, 0.0f);
  EXPECT_EQ(a.deterministic, 0);
  EXPECT_EQ(a.softmax_lse, nullptr);
  EXPECT_EQ(a.cu_seqlens_q, nullptr);
  EXPECT_EQ(a.cu_seqlens_k, nullptr);
  EXPECT_EQ(a.alibi_slopes, nullptr);
  EXPECT_EQ(a.workspace, nullptr);
  EXPECT_EQ(a.workspace_bytes, 0u);
  EXPECT_EQ(a.dq.data, nullptr);
  EXPECT_EQ(a.stream, nullptr);
}

TEST_F(BackwardValidation, AbiVersion) {
  expect_rejected([](fc_backward_args& a) { a.abi_version = 0; }, "abi_version");
  expect_rejected([](fc_backward_args& a) { a.abi_version = FC_ABI_VERSION + 1; }, "abi_version");
}

TEST_F(BackwardValidation, SoftmaxLseIsRequired) {
  expect_rejected([](fc_backward_args& a) { a.softmax_lse = nullptr; }, "softmax_lse");
  expect_rejected(
      [](fc_backward_args& a) {
        a.softmax_lse =
            reinterpret_cast<const float*>(reinterpret_cast<const char*>(a.softmax_lse) + 2);
      },
      "softmax_lse");
}

TEST_F(BackwardValidation, DeterministicIsZeroOrOne) {
  expect_rejected([](fc_backward_args& a) { a.deterministic = 2; }, "deterministic");
  expect_rejected([](fc_backward_args& a) { a.deterministic = -1; }, "deterministic");
}

TEST_F(BackwardValidation, GradientTensorsAndOutputGradient) {
  for (auto [name, member] :
       {std::pair{"dout", &fc_backward_args::dout}, std::pair{"dq", &fc_backward_args::dq},
        std::pair{"dk", &fc_backward_args::dk}, std::pair{"dv", &fc_backward_args::dv}}) {
    SCOPED_TRACE(name);
    expect_rejected([member = member](fc_backward_args& a) { (a.*member).data = nullptr; },
                    std::string(name) + ": ");
    expect_rejected(
        [member = member](fc_backward_args& a) {
          (a.*member).data = static_cast<char*>((a.*member).data) + 2;
        },
        std::string(name) + ": ");
  }
  expect_rejected([](fc_backward_args& a) { a.dout.seq_stride = 3; }, "dout.seq_stride");
  expect_rejected([](fc_backward_args& a) { a.dq.seq_stride = H * D + 4; }, "dq.seq_stride");
  expect_rejected([](fc_backward_args& a) { a.dq.batch_stride = -S * H * D; }, "dq.batch_stride");
  expect_rejected([](fc_backward_args& a) { a.dk.head_stride = 12; }, "dk.head_stride");
  expect_rejected([](fc_backward_args& a) { a.dv.seq_stride = Hk * D + 2; }, "dv.seq_stride");
  expect_rejected([](fc_backward_args& a) { a.dv.batch_stride = -8; }, "dv.batch_stride");
}

// The forward's own arguments are checked by the forward's rules.
TEST_F(BackwardValidation, ForwardArgumentsAreChecked) {
  expect_rejected([](fc_backward_args& a) { a.dtype = 2; }, "dtype");
  expect_rejected([](fc_backward_args& a) { a.head_dim = 60; }, "head_dim");
  expect_rejected([](fc_backward_args& a) { a.heads_k = 3; }, "heads_k");
  expect_rejected([](fc_backward_args& a) { a.seqlen_k = -1; }, "seqlen_k");
  expect_rejected([](fc_backward_args& a) { a.softmax_scale = NAN; }, "softmax_scale");
  expect_rejected([](fc_backward_args& a) { a.softcap = -1.0f; }, "softcap");
  expect_rejected([](fc_backward_args& a) { a.causal = 2; }, "causal");
  expect_rejected([](fc_backward_args& a) { a.causal_alignment = 2; }, "causal_alignment");
  expect_rejected([](fc_backward_args& a) { a.window_left = -2; }, "window_left");
  expect_rejected([](fc_backward_args& a) { a.family = 70; }, "family");
  static int32_t cu[B + 1] = {0, 5, 16};
  expect_rejected([](fc_backward_args& a) { a.cu_seqlens_q = cu; }, "cu_seqlens");
  expect_rejected([](fc_backward_args& a) { a.alibi_batch_stride = -1; }, "alibi_batch_stride");
  expect_rejected([](fc_backward_args& a) { a.q.data = nullptr; }, "q: ");
  expect_rejected([](fc_backward_args& a) { a.o.data = nullptr; }, "o: ");
  expect_rejected([](fc_backward_args& a) { a.k.seq_stride = Hk * D + 4; }, "k.seq_stride");
  expect_rejected([](fc_backward_args& a) { a.v.head_stride = 12; }, "v.head_stride");
}

TEST_F(BackwardValidation, Workspace) {
  if (workspace_bytes_ == 0) GTEST_SKIP() << "this problem needs no workspace";
  expect_backward_rejected(
      [this](fc_backward_args& a) { a.workspace_bytes = workspace_bytes_ - 1; }, "workspace");
  expect_backward_rejected([](fc_backward_args& a) { a.workspace_bytes = 0; }, "workspace");
  expect_backward_rejected([](fc_backward_args& a) { a.workspace = nullptr; }, "workspace");
  expect_backward_rejected(
      [](fc_backward_args& a) {
        a.workspace = static_cast<char*>(a.workspace) + 16;  // 16- but not 256-byte aligned
      },
      "workspace");
}

// The size is a function of the shapes and `deterministic` alone: pointers, strides, masks and
// score modifiers do not change it, and neither does the workspace passed in.
TEST_F(BackwardValidation, WorkspaceSizeDependsOnShapesAndDeterminismOnly) {
  for (int deterministic : {0, 1}) {
    fc_backward_args a = args_;
    a.deterministic = deterministic;
    uint64_t base = 0;
    ASSERT_EQ(fc_backward_workspace_size(&a, &base), FC_OK) << fc_last_error();
    std::swap(a.q.data, a.dq.data);
    a.dq.batch_stride = S * H * D + 64;
    a.dout.head_stride = 2 * D;
    a.dout.seq_stride = 2 * H * D;
    a.dout.batch_stride = 2 * S * H * D;
    a.causal = 1;
    a.window_left = 3;
    a.softcap = 10.0f;
    a.softmax_scale = -1.0f;
    a.workspace = nullptr;
    a.workspace_bytes = 0;
    uint64_t changed = 0;
    ASSERT_EQ(fc_backward_workspace_size(&a, &changed), FC_OK) << fc_last_error();
    EXPECT_EQ(changed, base) << "deterministic " << deterministic;
  }
}

// Empty problems succeed before any device work, so this holds with or without a GPU.
TEST_F(BackwardValidation, EmptyBatchSucceedsAndWritesNothing) {
  for (auto change : std::vector<std::function<void(fc_backward_args&)>>{
           [](fc_backward_args& a) { a.batch = 0; },
           [](fc_backward_args& a) { a.heads = a.heads_k = 0; },
           [](fc_backward_args& a) {
             a.batch = 0;
             a.q.data = a.k.data = a.v.data = a.o.data = a.dout.data = nullptr;
             a.dq.data = a.dk.data = a.dv.data = nullptr;
             a.softmax_lse = nullptr;
           }}) {
    fc_backward_args a = args_;
    change(a);
    uint64_t bytes = 0;
    ASSERT_EQ(fc_backward_workspace_size(&a, &bytes), FC_OK) << fc_last_error();
    EXPECT_LE(bytes, workspace_bytes_);
    const std::vector<uint16_t> dq = dq_, dk = dk_, dv = dv_;
    EXPECT_EQ(fc_backward(&a), FC_OK) << fc_last_error();
    EXPECT_EQ(dq_, dq);
    EXPECT_EQ(dk_, dk);
    EXPECT_EQ(dv_, dv);
  }
}

// Host buffers pass the argument checks but must never be launched on: without a GPU the call
// fails with a CUDA error, with one it is rejected as not device memory.
TEST_F(BackwardValidation, HostMemoryIsNotAccepted) {
  const std::vector<uint16_t> dq = dq_, dk = dk_, dv = dv_;
  const fc_status status = fc_backward(&args_);
  EXPECT_TRUE(status == FC_ERROR_INVALID_ARGUMENT || status == FC_ERROR_CUDA) << fc_last_error();
  EXPECT_STRNE(fc_last_error(), "");
  EXPECT_EQ(dq_, dq);
  EXPECT_EQ(dk_, dk);
  EXPECT_EQ(dv_, dv);
}

}  // namespace
}  // namespace flashcute

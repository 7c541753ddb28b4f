// fc_forward's argument checks, which run before any CUDA call: each bad argument gives
// FC_ERROR_INVALID_ARGUMENT with a message naming it, and nothing is written. The tensors are host
// buffers: the checks under test never get as far as looking at where they live.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "flashcute/flashcute.h"

namespace flashcute {
namespace {

constexpr int64_t B = 2, S = 16, H = 4, D = 64;

class Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto* buffer : {&q_, &k_, &v_, &o_}) buffer->assign(B * S * H * D + 64, 0x5A5A);
    lse_.assign(B * H * S + 16, 7.0f);
    fc_forward_args_init(&args_);
    auto tensor = [](std::vector<uint16_t>& b) {
      return fc_tensor{aligned(b.data()), S * H * D, H * D, D};
    };
    args_.q = tensor(q_);
    args_.k = tensor(k_);
    args_.v = tensor(v_);
    args_.o = tensor(o_);
    args_.dtype = FC_FLOAT16;
    args_.batch = B;
    args_.seqlen_q = args_.seqlen_k = S;
    args_.heads = args_.heads_k = H;
    args_.head_dim = D;
    args_.softmax_scale = 0.125f;
    args_.softmax_lse = lse_.data();
  }

  static uint16_t* aligned(uint16_t* p) {
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + 15) / 16 * 16;
    return reinterpret_cast<uint16_t*>(a);
  }

  // The change must be rejected as invalid with a message naming `name`; outputs stay untouched.
  void expect_rejected(const std::function<void(fc_forward_args&)>& change,
                       const std::string& name) {
    fc_forward_args a = args_;
    change(a);
    const std::vector<uint16_t> o_before = o_;
    const std::vector<float> lse_before = lse_;
    EXPECT_EQ(fc_forward(&a), FC_ERROR_INVALID_ARGUMENT) << name;
    const std::string message = fc_last_error();
    EXPECT_NE(message.find(name), std::string::npos)
        << "message '" << message << "' should name " << name;
    EXPECT_EQ(o_, o_before) << name;
    EXPECT_EQ(std::memcmp(lse_.data(), lse_before.data(), lse_.size() * 4), 0) << name;
  }

  std::vector<uint16_t> q_, k_, v_, o_;
  std::vector<float> lse_;
  fc_forward_args args_;
};

TEST_F(Validation, NullArgs) {
  EXPECT_EQ(fc_forward(nullptr), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("args"), std::string::npos);
}

TEST_F(Validation, InitGivesDocumentedDefaults) {
  fc_forward_args a;
  std::memset(&a, 0x7F, sizeof(a));
  fc_forward_args_init(&a);
  EXPECT_EQ(a.abi_version, FC_ABI_VERSION);
  EXPECT_EQ(a.window_left, -1);
  EXPECT_EQ(a.window_right, -1);
  EXPECT_EQ(a.family, FC_FAMILY_AUTO);
  EXPECT_EQ(a.tile.m_block, 0);
  EXPECT_EQ(a.tile.n_block, 0);
  EXPECT_EQ(a.tile.num_threads, 0);
  EXPECT_EQ(a.softmax_lse, nullptr);
  EXPECT_EQ(a.cu_seqlens_q, nullptr);
  EXPECT_EQ(a.alibi_slopes, nullptr);
  EXPECT_EQ(a.softcap, 0.0f);
  EXPECT_EQ(a.causal, 0);
  EXPECT_EQ(a.stream, nullptr);
}

TEST_F(Validation, AbiVersionAndDtype) {
  expect_rejected([](fc_forward_args& a) { a.abi_version = 0; }, "abi_version");
  expect_rejected([](fc_forward_args& a) { a.dtype = 2; }, "dtype");
  expect_rejected([](fc_forward_args& a) { a.dtype = -1; }, "dtype");
}

TEST_F(Validation, Sizes) {
  expect_rejected([](fc_forward_args& a) { a.batch = -1; }, "batch");
  expect_rejected([](fc_forward_args& a) { a.seqlen_q = -3; }, "seqlen_q");
  expect_rejected([](fc_forward_args& a) { a.seqlen_k = -1; }, "seqlen_k");
  expect_rejected([](fc_forward_args& a) { a.heads = -4; }, "heads");
  expect_rejected([](fc_forward_args& a) { a.heads_k = -1; }, "heads_k");
  expect_rejected([](fc_forward_args& a) { a.seqlen_q = int64_t{INT_MAX} + 1; }, "seqlen_q");
  expect_rejected([](fc_forward_args& a) { a.batch = 65536; }, "batch");
}

TEST_F(Validation, HeadDim) {
  for (int64_t bad : {-8, 0, 12, 60, 257, 264, 512})
    expect_rejected([bad](fc_forward_args& a) { a.head_dim = bad; }, "head_dim");
}

TEST_F(Validation, ZeroHeadsWithKeyHeadsNamesHeads) {
  fc_forward_args a = args_;
  a.heads = 0;
  EXPECT_EQ(fc_forward(&a), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(fc_last_error()).rfind("heads:", 0), 0u) << fc_last_error();
}

TEST_F(Validation, HeadsMustBeAMultipleOfHeadsK) {
  expect_rejected([](fc_forward_args& a) { a.heads_k = 3; }, "heads_k");
  expect_rejected([](fc_forward_args& a) { a.heads_k = 8; }, "heads_k");
  expect_rejected([](fc_forward_args& a) { a.heads_k = 0; }, "heads_k");
}

TEST_F(Validation, ScaleAndSoftcap) {
  expect_rejected([](fc_forward_args& a) { a.softmax_scale = NAN; }, "softmax_scale");
  expect_rejected([](fc_forward_args& a) { a.softmax_scale = INFINITY; }, "softmax_scale");
  expect_rejected([](fc_forward_args& a) { a.softmax_scale = -INFINITY; }, "softmax_scale");
  expect_rejected([](fc_forward_args& a) { a.softcap = -1.0f; }, "softcap");
  expect_rejected([](fc_forward_args& a) { a.softcap = NAN; }, "softcap");
  expect_rejected([](fc_forward_args& a) { a.softcap = INFINITY; }, "softcap");
}

TEST_F(Validation, MaskOptions) {
  expect_rejected([](fc_forward_args& a) { a.causal = 2; }, "causal");
  expect_rejected([](fc_forward_args& a) { a.causal_alignment = 2; }, "causal_alignment");
  expect_rejected([](fc_forward_args& a) { a.window_left = -2; }, "window_left");
  expect_rejected([](fc_forward_args& a) { a.window_right = -5; }, "window_right");
}

TEST_F(Validation, FamilyAndTile) {
  expect_rejected([](fc_forward_args& a) { a.family = 70; }, "family");
  expect_rejected([](fc_forward_args& a) { a.family = 1; }, "family");
  expect_rejected([](fc_forward_args& a) { a.tile = {128, 0, 0}; }, "tile");
  expect_rejected([](fc_forward_args& a) { a.tile = {128, 64, -128}; }, "tile");
}

TEST_F(Validation, VariableLengthArguments) {
  static int32_t cu[B + 1] = {0, 5, 16};
  expect_rejected([](fc_forward_args& a) { a.cu_seqlens_q = cu; }, "cu_seqlens");
  expect_rejected([](fc_forward_args& a) { a.cu_seqlens_k = cu; }, "cu_seqlens");
  expect_rejected(
      [](fc_forward_args& a) {
        a.cu_seqlens_q = a.cu_seqlens_k = cu;
        a.total_q = -1;
      },
      "total_q");
  expect_rejected([](fc_forward_args& a) { a.alibi_batch_stride = -1; }, "alibi_batch_stride");
}

TEST_F(Validation, PointersAndStrides) {
  auto shift = [](fc_tensor& t) { t.data = static_cast<char*>(t.data) + 2; };
  expect_rejected([&](fc_forward_args& a) { shift(a.q); }, "q: ");
  expect_rejected([&](fc_forward_args& a) { shift(a.k); }, "k: ");
  expect_rejected([&](fc_forward_args& a) { shift(a.v); }, "v: ");
  expect_rejected([&](fc_forward_args& a) { shift(a.o); }, "o: ");
  expect_rejected([](fc_forward_args& a) { a.q.data = nullptr; }, "q: ");
  expect_rejected([](fc_forward_args& a) { a.o.data = nullptr; }, "o: ");
  expect_rejected([](fc_forward_args& a) { a.k.seq_stride = H * D + 4; }, "k.seq_stride");
  expect_rejected([](fc_forward_args& a) { a.v.head_stride = 12; }, "v.head_stride");
  expect_rejected([](fc_forward_args& a) { a.q.batch_stride = -S * H * D; }, "q.batch_stride");
  expect_rejected([](fc_forward_args& a) { a.o.seq_stride = 3; }, "o.seq_stride");
  expect_rejected(
      [](fc_forward_args& a) {
        a.softmax_lse = reinterpret_cast<float*>(reinterpret_cast<char*>(a.softmax_lse) + 2);
      },
      "softmax_lse");
}

// Empty problems succeed before any device work, so this holds with or without a GPU.
TEST_F(Validation, EmptyProblemsSucceedAndWriteNothing) {
  for (auto change : std::vector<std::function<void(fc_forward_args&)>>{
           [](fc_forward_args& a) { a.batch = 0; }, [](fc_forward_args& a) { a.seqlen_q = 0; },
           [](fc_forward_args& a) {
             a.batch = 0;
             a.q.data = a.k.data = a.v.data = a.o.data = nullptr;
           }}) {
    fc_forward_args a = args_;
    change(a);
    const std::vector<uint16_t> before = o_;
    EXPECT_EQ(fc_forward(&a), FC_OK) << fc_last_error();
    EXPECT_EQ(o_, before);
  }
}

// Host buffers pass the shape checks but must never be launched on: without a GPU the call fails
// with a CUDA error, with one it is rejected as not device memory.
TEST_F(Validation, HostMemoryIsNotAccepted) {
  const std::vector<uint16_t> before = o_;
  const fc_status status = fc_forward(&args_);
  EXPECT_TRUE(status == FC_ERROR_INVALID_ARGUMENT || status == FC_ERROR_CUDA) << fc_last_error();
  EXPECT_STRNE(fc_last_error(), "");
  EXPECT_EQ(o_, before);
}

}  // namespace
}  // namespace flashcute

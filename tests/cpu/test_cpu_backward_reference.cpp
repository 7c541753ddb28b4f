// The CPU fp64 backward reference against central finite differences of the fp64 forward
// reference's loss sum(O * dO), on tiny problems covering every mask and score modifier, GQA and
// variable length with empty sequences; plus the structural facts the GPU suite relies on (zeros
// where nothing is seen, O and LSE equal to the forward reference's, strides only addressing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "reference/cpu_backward_reference.hpp"
#include "reference/cpu_reference.hpp"
#include "reference/host_data.hpp"
#include "reference/semantics.hpp"

namespace flashcute {
namespace {

using ref::CpuBackwardOutput;
using ref::HostTensor;
using ref::packed_layout;
using ref::Problem;

// Packed tensors: q and dout (tokens, heads, dim), k and v (tokens, heads_k, dim), so that an
// element's index is also its index in the canonical gradient.
struct Tensors {
  std::vector<float> q, k, v, dout;
};

int64_t tokens(const Problem& p, bool query) {
  if (p.varlen()) return query ? p.cu_seqlens_q.back() : p.cu_seqlens_k.back();
  return int64_t{p.batch} * (query ? p.seqlen_q : p.seqlen_k);
}

// bf16-rounded values carry 8 significant bits, so x +- 2^-10 is exact in fp32 for |x| < 2^13:
// the finite differences below perturb the inputs by exactly the step they divide by.
Tensors random_tensors(const Problem& p, ref::InputMode mode = ref::InputMode::kNormal) {
  const uint64_t seed = ref::fresh_seed();
  const int64_t qn = tokens(p, true) * p.heads * p.head_dim;
  const int64_t kn = tokens(p, false) * p.heads_k * p.head_dim;
  return {ref::random_inputs(qn, mode, FC_BFLOAT16, seed),
          ref::random_inputs(kn, mode, FC_BFLOAT16, seed + 1),
          ref::random_inputs(kn, ref::InputMode::kNormal, FC_BFLOAT16, seed + 2),
          ref::random_inputs(qn, ref::InputMode::kNormal, FC_BFLOAT16, seed + 3)};
}

ref::Layout q_layout(const Problem& p) { return packed_layout(p.seqlen_q, p.heads, p.head_dim); }
ref::Layout kv_layout(const Problem& p) { return packed_layout(p.seqlen_k, p.heads_k, p.head_dim); }

CpuBackwardOutput backward(const Problem& p, const Tensors& t) {
  return ref::cpu_backward_reference(p, {t.q.data(), q_layout(p)}, {t.k.data(), kv_layout(p)},
                                     {t.v.data(), kv_layout(p)}, {t.dout.data(), q_layout(p)});
}

// The loss whose gradients the backward reference gives: sum(O * dO), O from the forward reference.
double loss(const Problem& p, const Tensors& t) {
  const ref::CpuOutput out = ref::cpu_reference(
      p, {t.q.data(), q_layout(p)}, {t.k.data(), kv_layout(p)}, {t.v.data(), kv_layout(p)});
  double total = 0;
  for (size_t i = 0; i < out.o.size(); ++i) total += out.o[i] * t.dout[i];
  return total;
}

// Central differences with step 2^-10 of every element of q, k and v against the gradients: the
// truncation error is O(step^2) times the loss's third derivative, far below the bound.
void check_against_finite_differences(const Problem& p,
                                      ref::InputMode mode = ref::InputMode::kNormal) {
  Tensors t = random_tensors(p, mode);
  const CpuBackwardOutput g = backward(p, t);
  const double step = 0x1.0p-10;
  struct Named {
    const char* name;
    std::vector<float>* input;
    const std::vector<double>* grad;
  };
  for (const Named& n :
       {Named{"dq", &t.q, &g.dq}, Named{"dk", &t.k, &g.dk}, Named{"dv", &t.v, &g.dv}}) {
    ASSERT_EQ(n.input->size(), n.grad->size()) << n.name;
    double max_grad = 0;
    for (double x : *n.grad) max_grad = std::max(max_grad, std::fabs(x));
    for (size_t e = 0; e < n.input->size(); ++e) {
      const float x = (*n.input)[e];
      (*n.input)[e] = x + float(step);
      const double up = loss(p, t);
      (*n.input)[e] = x - float(step);
      const double down = loss(p, t);
      (*n.input)[e] = x;
      const double fd = (up - down) / (2 * step);
      ASSERT_NEAR((*n.grad)[e], fd, 1e-5 * (1 + max_grad))
          << n.name << " element " << e << " of " << n.input->size();
    }
  }
}

Problem dense(int batch, int sq, int sk, int heads, int heads_k, int dim) {
  Problem p;
  p.batch = batch;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.heads = heads;
  p.heads_k = heads_k;
  p.head_dim = dim;
  p.softmax_scale = float(1 / std::sqrt(double(dim)));
  return p;
}

Problem varlen_with_empty_sequences() {
  Problem p = dense(4, 0, 0, 4, 2, 8);
  p.cu_seqlens_q = {0, 3, 3, 8, 10};  // sequence 1 has no queries
  p.cu_seqlens_k = {0, 4, 9, 9, 15};  // sequence 2 has no keys
  p.seqlen_q = 5;
  p.seqlen_k = 6;
  return p;
}

TEST(CpuBackwardReference, FiniteDifferencesPlainAndGqa) {
  check_against_finite_differences(dense(2, 5, 7, 2, 2, 8));
  check_against_finite_differences(dense(2, 5, 7, 4, 2, 8));
  check_against_finite_differences(dense(1, 6, 3, 4, 1, 16));
}

TEST(CpuBackwardReference, FiniteDifferencesCausalBothAlignments) {
  for (bool bottom_right : {false, true})
    for (auto [sq, sk] : {std::pair{6, 4}, std::pair{4, 6}}) {
      SCOPED_TRACE(std::string(bottom_right ? "bottom-right" : "top-left") + " sq " +
                   std::to_string(sq) + " sk " + std::to_string(sk));
      Problem p = dense(2, sq, sk, 4, 2, 8);
      p.causal = true;
      p.bottom_right = bottom_right;
      check_against_finite_differences(p);
    }
}

TEST(CpuBackwardReference, FiniteDifferencesLocalWindows) {
  for (bool bottom_right : {false, true})
    for (auto [left, right] : {std::pair{2, 1}, std::pair{1, -1}, std::pair{-1, 0}}) {
      SCOPED_TRACE("window " + std::to_string(left) + "," + std::to_string(right));
      Problem p = dense(2, 7, 5, 2, 1, 8);
      p.bottom_right = bottom_right;
      p.window_left = left;
      p.window_right = right;
      check_against_finite_differences(p);
    }
}

TEST(CpuBackwardReference, FiniteDifferencesSoftcap) {
  Problem p = dense(2, 5, 6, 2, 2, 8);
  p.softcap = 2.0f;  // scores of a few units: the tanh bends
  p.softmax_scale = 0.5f;
  check_against_finite_differences(p);
  p.softmax_scale = -0.4f;
  p.causal = true;
  check_against_finite_differences(p);
}

TEST(CpuBackwardReference, FiniteDifferencesAlibi) {
  Problem p = dense(2, 6, 5, 2, 1, 8);
  p.alibi_slopes = {0.5f, 0.25f};  // per head
  check_against_finite_differences(p);
  p.alibi_slopes = {0.1f, 0.7f, 0.3f, 0.9f};  // per (batch, head)
  p.alibi_batch_stride = 2;
  p.causal = true;
  p.bottom_right = true;
  check_against_finite_differences(p);
}

TEST(CpuBackwardReference, FiniteDifferencesVariableLengthWithEmptySequences) {
  Problem p = varlen_with_empty_sequences();
  check_against_finite_differences(p);
  p.causal = true;
  p.bottom_right = true;
  p.softcap = 3.0f;
  p.alibi_slopes = {0.3f, 0.1f, 0.7f, 0.2f};
  check_against_finite_differences(p);
}

TEST(CpuBackwardReference, FiniteDifferencesCombined) {
  Problem p = dense(2, 6, 9, 4, 2, 8);  // causal + window + softcap + ALiBi, scores in the tens
  p.causal = true;
  p.window_left = 3;
  p.softcap = 5.0f;
  p.alibi_slopes = {0.2f, 0.4f, 0.6f, 0.8f};
  check_against_finite_differences(p, ref::InputMode::kScaledUp);
}

// What the GPU suite checks exactly rather than within a tolerance.
TEST(CpuBackwardReference, NothingSeenGivesExactZeros) {
  Problem p = varlen_with_empty_sequences();
  const Tensors t = random_tensors(p);
  const CpuBackwardOutput g = backward(p, t);
  const int64_t row = int64_t{p.heads_k} * p.head_dim;
  for (int64_t e = 4 * row; e < 9 * row; ++e) {  // the keys of sequence 1, which has no queries
    EXPECT_EQ(g.dk[e], 0.0);
    EXPECT_EQ(g.dv[e], 0.0);
  }
  for (int64_t e = p.o_index(2, 0, 0); e < p.o_index(3, 0, 0); ++e) EXPECT_EQ(g.dq[e], 0.0);

  p = dense(1, 6, 2, 2, 2, 8);  // bottom-right causal: rows 0..3 lie above the diagonal
  p.causal = true;
  p.bottom_right = true;
  const Tensors u = random_tensors(p);
  const CpuBackwardOutput h = backward(p, u);
  for (int64_t e = 0; e < p.o_index(0, 4, 0); ++e) EXPECT_EQ(h.dq[e], 0.0);
  // Row 4 sees key 0 alone, whose probability is exactly 1, so its dQ is zero too; row 5 sees two.
  EXPECT_TRUE(std::any_of(h.dq.begin() + p.o_index(0, 5, 0), h.dq.end(),
                          [](double x) { return x != 0.0; }));

  p = dense(2, 4, 0, 2, 1, 8);  // no keys at all: dQ is zero, dK and dV are empty
  const CpuBackwardOutput none = backward(p, random_tensors(p));
  for (double x : none.dq) EXPECT_EQ(x, 0.0);
  EXPECT_TRUE(none.dk.empty());
  EXPECT_TRUE(none.dv.empty());

  p = dense(2, 0, 5, 2, 1, 8);  // no queries: dK and dV are zero
  const CpuBackwardOutput no_queries = backward(p, random_tensors(p));
  EXPECT_TRUE(no_queries.dq.empty());
  for (double x : no_queries.dk) EXPECT_EQ(x, 0.0);
  for (double x : no_queries.dv) EXPECT_EQ(x, 0.0);
}

TEST(CpuBackwardReference, OutputIsTheForwardReferences) {
  Problem p = varlen_with_empty_sequences();
  p.causal = true;
  p.window_left = 2;
  p.softcap = 4.0f;
  p.alibi_slopes = {0.3f, 0.1f, 0.7f, 0.2f};
  const Tensors t = random_tensors(p);
  const CpuBackwardOutput g = backward(p, t);
  const ref::CpuOutput f = ref::cpu_reference(
      p, {t.q.data(), q_layout(p)}, {t.k.data(), kv_layout(p)}, {t.v.data(), kv_layout(p)});
  EXPECT_EQ(g.o, f.o);
  EXPECT_EQ(g.lse, f.lse);
}

// GQA: dK and dV of a key/value head are the sums over its query heads of what each query head
// would get with its own copy of that key/value head.
TEST(CpuBackwardReference, GqaSumsOverQueryHeads) {
  Problem p = dense(2, 9, 11, 6, 2, 16);
  p.causal = true;
  p.alibi_slopes = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  const Tensors t = random_tensors(p);
  const CpuBackwardOutput grouped = backward(p, t);
  Problem expanded_p = p;
  expanded_p.heads_k = p.heads;
  Tensors expanded = t;
  const int64_t D = p.head_dim, sk_rows = tokens(p, false);
  expanded.k.assign(sk_rows * p.heads * D, 0.0f);
  expanded.v.assign(expanded.k.size(), 0.0f);
  for (int64_t r = 0; r < sk_rows; ++r)
    for (int h = 0; h < p.heads; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int hk = h / 3;
        expanded.k[(r * p.heads + h) * D + d] = t.k[(r * p.heads_k + hk) * D + d];
        expanded.v[(r * p.heads + h) * D + d] = t.v[(r * p.heads_k + hk) * D + d];
      }
  const CpuBackwardOutput separate = backward(expanded_p, expanded);
  EXPECT_EQ(grouped.dq, separate.dq);
  for (int64_t r = 0; r < sk_rows; ++r)
    for (int hk = 0; hk < p.heads_k; ++hk)
      for (int64_t d = 0; d < D; ++d) {
        double dk = 0, dv = 0;
        for (int h = 3 * hk; h < 3 * hk + 3; ++h) {
          dk += separate.dk[(r * p.heads + h) * D + d];
          dv += separate.dv[(r * p.heads + h) * D + d];
        }
        const int64_t at = (r * p.heads_k + hk) * D + d;
        EXPECT_NEAR(grouped.dk[at], dk, 1e-12 * (1 + std::fabs(dk)));
        EXPECT_NEAR(grouped.dv[at], dv, 1e-12 * (1 + std::fabs(dv)));
      }
}

// The same data through strided views (head-major q and dout, k and v interleaved in one tensor)
// gives bitwise the same gradients as packed tensors.
TEST(CpuBackwardReference, StridesOnlyChangeAddressing) {
  Problem p = dense(2, 9, 14, 4, 2, 16);
  p.causal = true;
  p.bottom_right = true;
  const Tensors t = random_tensors(p);
  const CpuBackwardOutput packed = backward(p, t);
  const int64_t q_head = 9 * 16 + 8;  // (B, H, S, D) with padding between heads
  std::vector<float> q(2 * 4 * q_head, NAN), dout(q.size(), NAN), kv(2 * 14 * 2 * 2 * 16, NAN);
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 9; ++s)
      for (int h = 0; h < 4; ++h)
        for (int d = 0; d < 16; ++d) {
          q[(b * 4 + h) * q_head + s * 16 + d] = t.q[((b * 9 + s) * 4 + h) * 16 + d];
          dout[(b * 4 + h) * q_head + s * 16 + d] = t.dout[((b * 9 + s) * 4 + h) * 16 + d];
        }
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 14; ++s)
      for (int h = 0; h < 2; ++h)
        for (int d = 0; d < 16; ++d) {
          kv[(((b * 14 + s) * 2 + 0) * 2 + h) * 16 + d] = t.k[((b * 14 + s) * 2 + h) * 16 + d];
          kv[(((b * 14 + s) * 2 + 1) * 2 + h) * 16 + d] = t.v[((b * 14 + s) * 2 + h) * 16 + d];
        }
  const ref::Layout head_major{4 * q_head, 16, q_head}, interleaved{14 * 64, 64, 16};
  const CpuBackwardOutput strided = ref::cpu_backward_reference(
      p, HostTensor{q.data(), head_major}, HostTensor{kv.data(), interleaved},
      HostTensor{kv.data() + 32, interleaved}, HostTensor{dout.data(), head_major});
  EXPECT_EQ(strided.dq, packed.dq);
  EXPECT_EQ(strided.dk, packed.dk);
  EXPECT_EQ(strided.dv, packed.dv);
}

}  // namespace
}  // namespace flashcute

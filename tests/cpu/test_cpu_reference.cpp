// The CPU fp64 reference against hand-checkable cases and against a naive implementation written
// differently here: a full score matrix per (sequence, head) with an explicit visibility predicate,
// packed tensors only, and variable length handled by slicing sequences out of the packed data.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "reference/cpu_reference.hpp"
#include "reference/host_data.hpp"

namespace flashcute {
namespace {

using ref::cpu_reference;
using ref::CpuOutput;
using ref::HostTensor;
using ref::packed_layout;
using ref::Problem;

const double kInf = std::numeric_limits<double>::infinity();

struct NaiveResult {
  std::vector<double> o;    // (tokens, heads, dim)
  std::vector<double> lse;  // (heads, tokens)
};

// One sequence: q is (sq, H, D), k and v are (sk, Hk, D), packed.
void naive_sequence(const Problem& p, int b, int sq, int sk, const float* q, const float* k,
                    const float* v, double* o, double* lse, int64_t lse_stride) {
  const int H = p.heads, Hk = p.heads_k, D = p.head_dim;
  const int64_t shift = p.bottom_right ? sk - sq : 0;
  for (int h = 0; h < H; ++h) {
    const int kv = h * Hk / H;
    const double slope = p.alibi_slopes.empty() ? 0 : p.alibi_slopes[b * p.alibi_batch_stride + h];
    for (int i = 0; i < sq; ++i) {
      std::vector<double> s(sk, -kInf);
      for (int j = 0; j < sk; ++j) {
        const int64_t behind = i + shift - j;  // how far key j lies left of the query's diagonal
        const int64_t right = p.causal ? 0 : p.window_right;
        const bool visible =
            (p.window_left < 0 || behind <= p.window_left) && (right < 0 || -behind <= right);
        if (!visible) continue;
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += double(q[(i * H + h) * D + d]) * k[(j * Hk + kv) * D + d];
        double x = dot * p.softmax_scale;
        if (p.softcap > 0) x = std::tanh(x / p.softcap) * p.softcap;
        s[j] = x - slope * std::abs(double(behind));
      }
      double m = -kInf;
      for (double x : s) m = std::max(m, x);
      double total = 0;
      for (double x : s) total += m == -kInf ? 0 : std::exp(x - m);
      const double row_lse = total > 0 ? m + std::log(total) : kInf;
      lse[h * lse_stride + i] = row_lse;
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int j = 0; j < sk; ++j)
          if (s[j] > -kInf) acc += std::exp(s[j] - row_lse) * v[(j * Hk + kv) * D + d];
        o[(int64_t(i) * H + h) * D + d] = acc;
      }
    }
  }
}

// Packed inputs; dense problems are (B, S, H, D), varlen ones (tokens, H, D). The result is in the
// reference's canonical layout.
NaiveResult naive(const Problem& p, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v) {
  NaiveResult r;
  r.o.assign(p.o_elements(), -1.0);
  r.lse.assign(p.lse_elements(), -1.0);
  std::vector<double> lse_bh;
  int64_t q_tok = 0, k_tok = 0;
  for (int b = 0; b < p.batch; ++b) {
    const int sq = p.varlen() ? p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] : p.seqlen_q;
    const int sk = p.varlen() ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : p.seqlen_k;
    const int64_t qrow = int64_t(p.heads) * p.head_dim, krow = int64_t(p.heads_k) * p.head_dim;
    lse_bh.assign(int64_t(p.heads) * sq, 0);
    naive_sequence(p, b, sq, sk, q.data() + q_tok * qrow, k.data() + k_tok * krow,
                   v.data() + k_tok * krow, r.o.data() + q_tok * qrow, lse_bh.data(), sq);
    for (int h = 0; h < p.heads; ++h)
      for (int i = 0; i < sq; ++i) {
        const int64_t at =
            p.varlen() ? h * p.out_rows() + q_tok + i : (int64_t(b) * p.heads + h) * p.seqlen_q + i;
        r.lse[at] = lse_bh[int64_t(h) * sq + i];
      }
    q_tok += sq;
    k_tok += sk;
  }
  return r;
}

int64_t tokens(const Problem& p, bool query) {
  if (p.varlen()) return query ? p.cu_seqlens_q.back() : p.cu_seqlens_k.back();
  return int64_t(p.batch) * (query ? p.seqlen_q : p.seqlen_k);
}

CpuOutput reference_packed(const Problem& p, const std::vector<float>& q,
                           const std::vector<float>& k, const std::vector<float>& v) {
  return cpu_reference(p, {q.data(), packed_layout(p.seqlen_q, p.heads, p.head_dim)},
                       {k.data(), packed_layout(p.seqlen_k, p.heads_k, p.head_dim)},
                       {v.data(), packed_layout(p.seqlen_k, p.heads_k, p.head_dim)});
}

void expect_close(const std::vector<double>& actual, const std::vector<double>& expected,
                  const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isinf(expected[i])) {
      ASSERT_EQ(actual[i], expected[i]) << what << " at " << i;
    } else {
      ASSERT_NEAR(actual[i], expected[i], 1e-9 * (1 + std::abs(expected[i])))
          << what << " at " << i;
    }
  }
}

struct Inputs {
  std::vector<float> q, k, v;
};

Inputs random_inputs(const Problem& p, ref::InputMode mode = ref::InputMode::kNormal) {
  const uint64_t seed = ref::fresh_seed();
  const int64_t qn = tokens(p, true) * p.heads * p.head_dim;
  const int64_t kn = tokens(p, false) * p.heads_k * p.head_dim;
  return {ref::random_inputs(qn, mode, FC_BFLOAT16, seed),
          ref::random_inputs(kn, mode, FC_BFLOAT16, seed + 1),
          ref::random_inputs(kn, mode, FC_BFLOAT16, seed + 2)};
}

void check_against_naive(const Problem& p, ref::InputMode mode = ref::InputMode::kNormal) {
  const Inputs in = random_inputs(p, mode);
  const CpuOutput got = reference_packed(p, in.q, in.k, in.v);
  const NaiveResult want = naive(p, in.q, in.k, in.v);
  expect_close(got.o, want.o, "O");
  expect_close(got.lse, want.lse, "LSE");
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

TEST(CpuReference, OneKeyGivesThatValueRow) {
  Problem p = dense(2, 3, 1, 2, 2, 8);
  const Inputs in = random_inputs(p);
  const CpuOutput out = reference_packed(p, in.q, in.k, in.v);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      for (int h = 0; h < 2; ++h) {
        for (int d = 0; d < 8; ++d)
          EXPECT_DOUBLE_EQ(out.o[p.o_index(b, i, h) + d], in.v[(b * 2 + h) * 8 + d]);
        double dot = 0;
        for (int d = 0; d < 8; ++d)
          dot += double(in.q[((b * 3 + i) * 2 + h) * 8 + d]) * in.k[(b * 2 + h) * 8 + d];
        EXPECT_NEAR(out.lse[p.lse_index(b, i, h)], dot * p.softmax_scale, 1e-12);
      }
}

TEST(CpuReference, EqualScoresAverageTheValues) {
  Problem p = dense(1, 2, 5, 1, 1, 8);
  Inputs in = random_inputs(p);
  in.q.assign(in.q.size(), 0.0f);  // every score is 0
  const CpuOutput out = reference_packed(p, in.q, in.k, in.v);
  for (int i = 0; i < 2; ++i) {
    for (int d = 0; d < 8; ++d) {
      double mean = 0;
      for (int j = 0; j < 5; ++j) mean += in.v[j * 8 + d] / 5.0;
      EXPECT_NEAR(out.o[p.o_index(0, i, 0) + d], mean, 1e-12);
    }
    EXPECT_NEAR(out.lse[p.lse_index(0, i, 0)], std::log(5.0), 1e-12);
  }
}

// With equal scores and V = identity, O[i][j] = 1/(keys row i sees) where j is visible, else 0:
// the output spells out the mask.
std::vector<std::vector<int>> visibility(Problem p) {
  p.batch = 1;
  p.heads = p.heads_k = 1;
  p.head_dim = 8;
  std::vector<float> q(p.seqlen_q * 8, 0.0f), k(p.seqlen_k * 8, 1.0f), v(p.seqlen_k * 8, 0.0f);
  for (int j = 0; j < p.seqlen_k; ++j) v[j * 8 + j] = 1.0f;
  const CpuOutput out = reference_packed(p, q, k, v);
  std::vector<std::vector<int>> seen(p.seqlen_q, std::vector<int>(p.seqlen_k));
  for (int i = 0; i < p.seqlen_q; ++i)
    for (int j = 0; j < p.seqlen_k; ++j) seen[i][j] = out.o[i * 8 + j] > 0 ? 1 : 0;
  return seen;
}

TEST(CpuReference, MaskPatternsByHand) {
  Problem p = dense(1, 3, 5, 1, 1, 8);
  p.causal = true;
  EXPECT_EQ(visibility(p),
            (std::vector<std::vector<int>>{{1, 0, 0, 0, 0}, {1, 1, 0, 0, 0}, {1, 1, 1, 0, 0}}));
  p.bottom_right = true;
  EXPECT_EQ(visibility(p),
            (std::vector<std::vector<int>>{{1, 1, 1, 0, 0}, {1, 1, 1, 1, 0}, {1, 1, 1, 1, 1}}));
  p.causal = false;
  p.window_left = 1;
  p.window_right = 0;  // bottom-right: row i sees keys i+1 and i+2
  EXPECT_EQ(visibility(p),
            (std::vector<std::vector<int>>{{0, 1, 1, 0, 0}, {0, 0, 1, 1, 0}, {0, 0, 0, 1, 1}}));
  p.bottom_right = false;
  p.window_left = 0;
  p.window_right = 2;  // top-left: row i sees keys i..i+2
  EXPECT_EQ(visibility(p),
            (std::vector<std::vector<int>>{{1, 1, 1, 0, 0}, {0, 1, 1, 1, 0}, {0, 0, 1, 1, 1}}));
  p.window_left = -1;
  p.window_right = -1;
  EXPECT_EQ(visibility(p), (std::vector<std::vector<int>>(3, std::vector<int>(5, 1))));
}

TEST(CpuReference, RowsThatSeeNoKeyGiveZeroAndInfiniteLse) {
  Problem p = dense(1, 5, 2, 1, 1, 8);
  p.causal = true;
  p.bottom_right = true;  // rows 0..2 lie above the diagonal
  const Inputs in = random_inputs(p);
  const CpuOutput out = reference_packed(p, in.q, in.k, in.v);
  for (int i = 0; i < 5; ++i) {
    const bool empty = i < 3;
    EXPECT_EQ(std::isinf(out.lse[i]), empty) << i;
    if (empty) {
      EXPECT_GT(out.lse[i], 0);
      for (int d = 0; d < 8; ++d) EXPECT_EQ(out.o[i * 8 + d], 0.0);
    }
  }
  p = dense(2, 3, 0, 2, 1, 16);  // no keys at all
  const Inputs none = random_inputs(p);
  const CpuOutput zero = reference_packed(p, none.q, none.k, none.v);
  for (double x : zero.o) EXPECT_EQ(x, 0.0);
  for (double x : zero.lse) EXPECT_EQ(x, kInf);
}

TEST(CpuReference, VeryNegativeScoresStayAccurate) {
  Problem p = dense(1, 4, 7, 1, 1, 8);
  Inputs in = random_inputs(p);
  for (float& x : in.k) x += 30.0f;  // q.k shifts by 30 * sum(q), large in magnitude
  for (float& x : in.q) x = std::abs(x) + 1.0f;
  p.softmax_scale = -2.0f;  // every scaled score is far below -100
  const CpuOutput got = reference_packed(p, in.q, in.k, in.v);
  const NaiveResult want = naive(p, in.q, in.k, in.v);
  expect_close(got.o, want.o, "O");
  expect_close(got.lse, want.lse, "LSE");
  for (double x : got.lse) EXPECT_LT(x, -100);
}

TEST(CpuReference, MatchesNaiveDense) {
  check_against_naive(dense(2, 33, 47, 4, 4, 24));
  check_against_naive(dense(1, 64, 17, 2, 2, 8), ref::InputMode::kScaledUp);
  check_against_naive(dense(1, 9, 9, 1, 1, 40), ref::InputMode::kInteger);
}

TEST(CpuReference, MatchesNaiveWithMasks) {
  for (bool bottom_right : {false, true})
    for (auto [sq, sk] : {std::pair{20, 13}, std::pair{13, 20}}) {
      Problem p = dense(2, sq, sk, 2, 1, 16);
      p.bottom_right = bottom_right;
      p.causal = true;
      check_against_naive(p);
      p.causal = false;
      p.window_left = 3;
      p.window_right = 5;
      check_against_naive(p);
      p.window_right = -1;
      check_against_naive(p);
      p.window_left = -1;
      p.window_right = 0;
      check_against_naive(p);
      p.causal = true;  // causal and a left window
      p.window_left = 4;
      check_against_naive(p);
    }
}

TEST(CpuReference, MatchesNaiveWithScoreModifiers) {
  Problem p = dense(2, 19, 23, 4, 2, 32);
  p.softmax_scale = -0.3f;
  check_against_naive(p);
  p.softmax_scale = 0.5f;
  p.softcap = 3.0f;
  check_against_naive(p, ref::InputMode::kScaledUp);
  p.softcap = 0;
  p.alibi_slopes = {0.5f, 0.25f, 0.125f, 1.0f};  // per head
  check_against_naive(p);
  p.bottom_right = true;
  check_against_naive(p);
  p.alibi_slopes = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};  // per (batch, head)
  p.alibi_batch_stride = 4;
  p.causal = true;
  p.softcap = 5.0f;
  check_against_naive(p);
}

TEST(CpuReference, MatchesNaiveWithGqaAndMqa) {
  check_against_naive(dense(2, 11, 13, 8, 2, 16));
  check_against_naive(dense(2, 11, 13, 6, 1, 16));
}

TEST(CpuReference, MatchesNaiveVariableLength) {
  Problem p = dense(5, 0, 0, 4, 2, 16);
  p.cu_seqlens_q = {0, 7, 7, 30, 31, 31};  // includes empty sequences
  p.cu_seqlens_k = {0, 12, 20, 20, 45, 46};
  p.seqlen_q = 23;
  p.seqlen_k = 25;
  check_against_naive(p);
  p.causal = true;
  p.bottom_right = true;
  p.window_left = 6;
  p.alibi_slopes = {0.3f, 0.1f, 0.7f, 0.2f};
  check_against_naive(p);
}

// The same data seen through strided views gives the same result as packed tensors.
TEST(CpuReference, StridesOnlyChangeAddressing) {
  Problem p = dense(2, 9, 14, 4, 2, 16);
  p.causal = true;
  const Inputs in = random_inputs(p);
  const CpuOutput packed = reference_packed(p, in.q, in.k, in.v);
  // Q as (B, H, S, D) with padding between heads; K and V interleaved in one (B, S, 2, Hk, D).
  const int64_t q_head = 9 * 16 + 8;
  std::vector<float> q(2 * 4 * q_head, NAN), kv(2 * 14 * 2 * 2 * 16, NAN);
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 9; ++s)
      for (int h = 0; h < 4; ++h)
        for (int d = 0; d < 16; ++d)
          q[(b * 4 + h) * q_head + s * 16 + d] = in.q[((b * 9 + s) * 4 + h) * 16 + d];
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 14; ++s)
      for (int h = 0; h < 2; ++h)
        for (int d = 0; d < 16; ++d) {
          kv[(((b * 14 + s) * 2 + 0) * 2 + h) * 16 + d] = in.k[((b * 14 + s) * 2 + h) * 16 + d];
          kv[(((b * 14 + s) * 2 + 1) * 2 + h) * 16 + d] = in.v[((b * 14 + s) * 2 + h) * 16 + d];
        }
  const ref::Layout q_layout{4 * q_head, 16, q_head}, kv_layout{14 * 64, 64, 16};
  const CpuOutput strided =
      cpu_reference(p, HostTensor{q.data(), q_layout}, HostTensor{kv.data(), kv_layout},
                    HostTensor{kv.data() + 32, kv_layout});
  EXPECT_EQ(strided.o, packed.o);
  EXPECT_EQ(strided.lse, packed.lse);
}

}  // namespace
}  // namespace flashcute

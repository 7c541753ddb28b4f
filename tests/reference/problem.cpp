#include "reference/problem.hpp"

namespace flashcute {
namespace ref {

Layout packed_layout(int64_t seqlen, int64_t heads, int64_t head_dim) {
  return Layout{seqlen * heads * head_dim, heads * head_dim, head_dim};
}

int Problem::seq_q(int b) const {
  return varlen() ? cu_seqlens_q[b + 1] - cu_seqlens_q[b] : seqlen_q;
}

int Problem::seq_k(int b) const {
  return varlen() ? cu_seqlens_k[b + 1] - cu_seqlens_k[b] : seqlen_k;
}

int64_t Problem::q_token0(int b) const { return varlen() ? cu_seqlens_q[b] : 0; }

int64_t Problem::k_token0(int b) const { return varlen() ? cu_seqlens_k[b] : 0; }

int64_t Problem::out_rows() const {
  return varlen() ? cu_seqlens_q[batch] : int64_t{batch} * seqlen_q;
}

int64_t Problem::o_index(int b, int64_t i, int h) const {
  const int64_t row = varlen() ? cu_seqlens_q[b] + i : int64_t{b} * seqlen_q + i;
  return (row * heads + h) * head_dim;
}

int64_t Problem::lse_index(int b, int64_t i, int h) const {
  if (varlen()) return int64_t{h} * out_rows() + cu_seqlens_q[b] + i;
  return (int64_t{b} * heads + h) * seqlen_q + i;
}

int64_t Problem::kv_rows() const {
  return varlen() ? cu_seqlens_k[batch] : int64_t{batch} * seqlen_k;
}

int64_t Problem::kv_index(int b, int64_t j, int h) const {
  const int64_t row = varlen() ? cu_seqlens_k[b] + j : int64_t{b} * seqlen_k + j;
  return (row * heads_k + h) * head_dim;
}

double Problem::work() const {
  double total = 0;
  for (int b = 0; b < batch; ++b) total += double(seq_q(b)) * seq_k(b);
  return total * heads * head_dim;
}

}  // namespace ref
}  // namespace flashcute

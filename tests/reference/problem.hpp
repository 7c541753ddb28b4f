// The attention problem as both references see it: sizes, optional variable-length sequences, and
// the mask and score modifiers of the C API, plus the canonical layout of reference outputs.
#pragma once

#include <cstdint>
#include <vector>

namespace flashcute {
namespace ref {

// Element strides of a (batch, seqlen, heads, head_dim) tensor; head_dim is contiguous. Variable
// length tensors ignore batch_stride: their rows are packed tokens.
struct Layout {
  int64_t batch_stride = 0;
  int64_t seq_stride = 0;
  int64_t head_stride = 0;
};

// Packed (batch, seqlen, heads, head_dim) strides.
Layout packed_layout(int64_t seqlen, int64_t heads, int64_t head_dim);

struct Problem {
  int batch = 1;
  int seqlen_q = 0;  // maxima when variable length
  int seqlen_k = 0;
  int heads = 1;
  int heads_k = 1;
  int head_dim = 0;
  // Variable length: batch + 1 token offsets each (host copies); empty for a dense problem.
  std::vector<int32_t> cu_seqlens_q;
  std::vector<int32_t> cu_seqlens_k;
  float softmax_scale = 1.0f;
  bool causal = false;
  bool bottom_right = false;  // alignment of the causal mask, the window and ALiBi
  int64_t window_left = -1;   // -1 = unbounded
  int64_t window_right = -1;
  float softcap = 0.0f;  // > 0 enables it
  // ALiBi: empty, or slopes indexed by b * alibi_batch_stride + h.
  std::vector<float> alibi_slopes;
  int64_t alibi_batch_stride = 0;

  bool varlen() const { return !cu_seqlens_q.empty(); }
  int seq_q(int b) const;
  int seq_k(int b) const;
  // First token of sequence b in a packed varlen tensor (0 for a dense one: batch_stride applies).
  int64_t q_token0(int b) const;
  int64_t k_token0(int b) const;
  // Rows of the canonical output: batch * seqlen_q, or total query tokens when variable length.
  int64_t out_rows() const;
  int64_t o_elements() const { return out_rows() * heads * head_dim; }
  int64_t lse_elements() const { return out_rows() * heads; }
  // Canonical output O: (out_rows, heads, head_dim), row = b * seqlen_q + i or cu_seqlens_q[b] + i.
  int64_t o_index(int b, int64_t i, int h) const;
  // Canonical LSE: (batch, heads, seqlen_q), or (heads, total_q) when variable length, like the
  // API.
  int64_t lse_index(int b, int64_t i, int h) const;
  // Rows of a canonical K-like tensor: batch * seqlen_k, or total key tokens when variable length.
  int64_t kv_rows() const;
  int64_t kv_elements() const { return kv_rows() * heads_k * head_dim; }
  // Canonical dK and dV: (kv_rows, heads_k, head_dim), row = b * seqlen_k + j or cu_seqlens_k[b] +
  // j.
  int64_t kv_index(int b, int64_t j, int h) const;
  // Multiply-adds of Q K^T and P V summed over sequences, for sizing a reference.
  double work() const;
};

}  // namespace ref
}  // namespace flashcute

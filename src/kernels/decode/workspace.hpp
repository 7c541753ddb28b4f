// The caller's scratch memory for one KV-cache call: the contract check's verdict (debug), the
// rotated q (rotary), and the splits' fp32 partial outputs and log-sum-exps (more than one split);
// each piece 256-byte aligned.
#pragma once

#include <cstdint>

namespace flashcute::decode {

struct DecodeWorkspace {
  uint64_t contract_offset, q_rotated_offset, o_partial_offset, lse_partial_offset;
  uint64_t bytes;
};

inline uint64_t align_256(uint64_t n) { return (n + 255) / 256 * 256; }

// q_elements: batch * seqlen_q * heads * head_dim (rotary); rows: total query tokens * heads.
inline DecodeWorkspace decode_workspace(bool debug_checks, bool rotary, uint64_t q_elements,
                                        int num_splits, uint64_t rows, int head_dim) {
  DecodeWorkspace w{};
  uint64_t at = 0;
  w.contract_offset = at;
  if (debug_checks) at += 256;
  w.q_rotated_offset = at;
  if (rotary) at += align_256(q_elements * 2);
  w.o_partial_offset = at;
  w.lse_partial_offset = at;
  if (num_splits > 1) {
    at += align_256(uint64_t(num_splits) * rows * head_dim * sizeof(float));
    w.lse_partial_offset = at;
    at += align_256(uint64_t(num_splits) * rows * sizeof(float));
  }
  w.bytes = at;
  return w;
}

}  // namespace flashcute::decode

// The backward pass's scratch memory, carved from the caller's workspace: one place decides its
// size (the size query) and its layout (the launch). Each part starts on a 256-byte boundary.
#pragma once

#include <cstdint>

namespace flashcute {

struct BackwardWorkspace {
  uint64_t dout_dot_out_offset;  // fp32, heads * total_q
  uint64_t dq_accum_offset;      // fp32, total_q * heads * head_dim; absent when deterministic
  uint64_t bytes;                // the whole workspace
};

constexpr uint64_t round_up_256(uint64_t bytes) { return (bytes + 255) / 256 * 256; }

constexpr BackwardWorkspace backward_workspace(int64_t total_q, int64_t heads, int64_t head_dim,
                                               bool deterministic) {
  uint64_t const dots = round_up_256(uint64_t(heads * total_q) * sizeof(float));
  uint64_t const accum =
      deterministic ? 0 : round_up_256(uint64_t(total_q * heads * head_dim) * sizeof(float));
  return {0, dots, dots + accum};
}

}  // namespace flashcute

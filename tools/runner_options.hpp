// Command-line options of flashcute_run: the flags and defaults of the CuTe DSL FlashAttention-2
// example's runner in CUTLASS, plus ours.
#pragma once

#include <cstdint>
#include <string>

#include "flashcute/flashcute.h"

namespace flashcute {
namespace runner {

enum class InputKind { kNormal, kInteger };

struct Options {
  // The example runner's flags.
  fc_dtype dtype = FC_BFLOAT16;
  int64_t batch_size = 4;
  int64_t seqlen_q = 8192;
  int64_t seqlen_k = 8192;
  int64_t num_head = 16;
  int64_t head_dim = 128;
  float softmax_scale = 0.5f;
  int m_block_size = 128;
  int n_block_size = 64;
  int num_threads = 128;
  bool is_causal = false;
  int warmup_iterations = 3;
  int iterations = 10;
  bool skip_ref_check = false;
  bool use_cold_l2 = false;
  // Ours.
  fc_kernel_family family = FC_FAMILY_AUTO;
  bool auto_tile = false;  // m/n/threads = 0: the library chooses
  InputKind inputs = InputKind::kNormal;
  fc_causal_alignment causal_alignment = FC_CAUSAL_TOP_LEFT;
  int64_t num_head_k = 0;  // 0 = num_head
  int64_t window_left = -1;
  int64_t window_right = -1;
  float softcap = 0.0f;
  bool alibi = false;
  bool varlen = false;
  bool lse = false;
  bool help = false;
};

// Parses argv[1..argc). On failure returns false with a message naming the flag or value.
bool parse_options(int argc, const char* const* argv, Options* options, std::string* error);

std::string usage();

}  // namespace runner
}  // namespace flashcute

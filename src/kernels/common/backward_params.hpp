// The validated backward problem: the forward's problem (AttentionParams, whose lse is the
// forward's log-sum-exp, read here) plus the output gradient, the gradients to write and the
// caller's workspace.
#pragma once

#include <cstdint>

#include "kernels/common/params.hpp"

namespace flashcute {

struct BackwardParams : AttentionParams {
  const void* dout;
  int64_t dout_batch_stride, dout_row_stride, dout_head_stride;
  void* dq;
  void* dk;
  void* dv;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

  // rowsum(dout * out) per query row, fp32, laid out like the LSE (its strides). SM80 family.
  float* dout_dot_out;
  // Hopper family: the forward's LSE times log2(e) and rowsum(dout * out), per head in rows padded
  // per sequence (backward/workspace.hpp, PaddedRows), so that a query block's values are one
  // aligned bulk copy; the padding holds +inf and 0 (P = 0 there). They share the workspace with
  // dout_dot_out: one family runs.
  float* lse_log2_padded;
  float* dout_dot_out_padded;
  int64_t padded_rows;  // per head
  // fp32 sums of dq / softmax_scale over key blocks, one block per (head, query block) in the dQ
  // MMA's register order (backward::DqFragments); unused by the SM80 family when deterministic.
  float* dq_accum;
  // Hopper family: per dQ block (64 padded rows of one head), how many key blocks have finished
  // adding to it (deterministic: each adds in its turn, in key-block order); zeroed by the
  // pre-pass. dQ's post-pass converts a block once its count is complete.
  int* dq_counts;

  bool deterministic;
};

}  // namespace flashcute

// The backward pass's row-wise kernel, the same for every kernel family: before the main
// kernels, rowsum(dout * out) per query row (the softmax gradient's correction term). It is
// memory-bound: groups of 8 threads read a row in 16-byte vectors.
#pragma once

#include <cutlass/array.h>
#include <cute/config.hpp>

#include "kernels/backward/workspace.hpp"
#include "kernels/common/backward_params.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/common/score_modifiers.hpp"
#include "kernels/common/sequence_info.hpp"

namespace flashcute::backward {

constexpr int kRowThreads = 128;
constexpr int kLanesPerRow = 8;
constexpr int kRowsPerPass = kRowThreads / kLanesPerRow;
constexpr int kRowsPerBlock = 64;
constexpr int kVector = 8;  // elements per 16-byte access

// Grid: (ceil(seqlen_q / kRowsPerBlock), heads, batch).
inline dim3 row_kernel_grid(const AttentionParams& p) {
  return dim3((p.seqlen_q + kRowsPerBlock - 1) / kRowsPerBlock, p.heads, p.batch);
}

// Grid of the padded pre-pass: every row of each sequence's padded block (workspace.hpp).
inline dim3 padded_row_kernel_grid(const AttentionParams& p) {
  int const blocks = (p.seqlen_q + PaddedRows::kBlock - 1) / PaddedRows::kBlock;
  return dim3(blocks * (PaddedRows::kBlock / kRowsPerBlock), p.heads, p.batch);
}

// kPadded = false: dout_dot_out with the LSE's strides (the SM80 family). kPadded = true: the
// padded rows of the Hopper family, the LSE in log2 units beside it, the padding filled, and
// (kAccumWidth > 0) the same rows of dQ's accumulator zeroed (kAccumWidth floats a row) with
// their blocks' counts: its main kernel adds whole blocks of those rows, and no separate clear
// pass is needed. The main kernel may launch at once (programmatic dependent launch) and waits
// for this grid before it reads.
template <class Element, bool kPadded = false, int kAccumWidth = 0>
__global__ void __launch_bounds__(kRowThreads) dout_dot_out_kernel(const BackwardParams p) {
  static_assert(kAccumWidth == 0 || (kPadded && kAccumWidth % (4 * kLanesPerRow) == 0));
  allow_dependent_launch();
  using Vector = cutlass::AlignedArray<Element, kVector, 16>;
  const int head = blockIdx.y;
  const SequenceInfo<> seq(p.sequences(), blockIdx.z);
  const int lane = threadIdx.x % kLanesPerRow;
  const int64_t lse_base = seq.batch * p.lse_batch_stride + head * p.lse_head_stride + seq.q_start;
  const int64_t padded_base =
      head * p.padded_rows + PaddedRows::sequence_start(seq, blockIdx.z, p.seqlen_q);
  const int rows_written =
      kPadded ? (seq.seqlen_q + PaddedRows::kBlock - 1) / PaddedRows::kBlock * PaddedRows::kBlock
              : seq.seqlen_q;
  if constexpr (kAccumWidth > 0) {
    static_assert(kRowsPerBlock == kDqCountRows, "one count per block of rows");
    int64_t const first_row = padded_base + int64_t(blockIdx.x) * kRowsPerBlock;
    if (threadIdx.x == 0 && int(blockIdx.x) * kRowsPerBlock < rows_written) {
      p.dq_counts[first_row / kDqCountRows] = 0;
    }
  }
  for (int r = threadIdx.x / kLanesPerRow; r < kRowsPerBlock; r += kRowsPerPass) {
    const int row = blockIdx.x * kRowsPerBlock + r;
    if (row >= rows_written) break;
    if constexpr (kAccumWidth > 0) {
      float4* const accum =
          reinterpret_cast<float4*>(p.dq_accum + (padded_base + row) * kAccumWidth);
      CUTE_UNROLL
      for (int c = lane; c < kAccumWidth / 4; c += kLanesPerRow) accum[c] = make_float4(0, 0, 0, 0);
    }
    if (kPadded && row >= seq.seqlen_q) {
      if (lane == 0) {
        p.lse_log2_padded[padded_base + row] = INFINITY;
        p.dout_dot_out_padded[padded_base + row] = 0.f;
      }
      continue;
    }
    const Element* dout =
        static_cast<const Element*>(p.dout) +
        seq.q_offset(p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride, head) +
        int64_t(row) * p.dout_row_stride;
    const Element* out = static_cast<const Element*>(p.o) +
                         seq.q_offset(p.o_batch_stride, p.o_row_stride, p.o_head_stride, head) +
                         int64_t(row) * p.o_row_stride;
    float sum = 0.f;
    for (int c = lane * kVector; c < p.head_dim; c += kLanesPerRow * kVector) {
      const Vector a = *reinterpret_cast<const Vector*>(dout + c);
      const Vector b = *reinterpret_cast<const Vector*>(out + c);
      CUTE_UNROLL
      for (int i = 0; i < kVector; ++i) sum += float(a[i]) * float(b[i]);
    }
    CUTE_UNROLL
    for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(0xffffffff, sum, offset);
    }
    if (lane == 0) {
      if constexpr (kPadded) {
        p.lse_log2_padded[padded_base + row] = p.lse[lse_base + row] * kLog2e;
        p.dout_dot_out_padded[padded_base + row] = sum;
      } else {
        p.dout_dot_out[lse_base + row] = sum;
      }
    }
  }
}

}  // namespace flashcute::backward

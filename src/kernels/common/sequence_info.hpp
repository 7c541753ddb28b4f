// Where one sequence of a batch lives and how long it is, for dense batches (every sequence has
// the batch's lengths and its own batch coordinate) and packed ones (cu_seqlens: the sequences'
// tokens follow each other in one batch row), and optionally per-sequence key counts read from
// device arrays (a KV cache: keys in use, and leading slots to skip).
// Host-callable too, so that CPU tests run the same code as the kernels.
#pragma once

#include <cute/config.hpp>

#include <cstdint>

namespace flashcute {

// The batch layout as the kernels receive it.
struct SequenceLayout {
  int seqlen_q, seqlen_k;  // every sequence's lengths when dense; the maxima when packed
  // Packed: token offsets of each sequence (batch + 1 entries); null when dense. Both or neither.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  // Optional (null: unused): keys in use per sequence, replacing the length above (a cache
  // filled to different depths), and key slots to skip at each sequence's start (left padding).
  const int32_t* seqused_k;
  const int32_t* leftpad_k;
};

// One sequence's lengths and offsets. kKeyArrays: whether seqused_k / leftpad_k may be set; a
// kernel that never takes them compiles without their reads.
template <bool kKeyArrays = false>
struct SequenceInfo {
  int seqlen_q, seqlen_k;
  // Token index of the sequence's first query / key among the rows of its batch coordinate: 0
  // when dense (plus the left padding), the packed offset when packed.
  int q_start, k_start;
  int batch;  // batch coordinate of the tensors: the sequence when dense, 0 when packed

  CUTE_HOST_DEVICE SequenceInfo(SequenceLayout const& s, int sequence) {
    if (s.cu_seqlens_q != nullptr) {
      q_start = s.cu_seqlens_q[sequence];
      k_start = s.cu_seqlens_k[sequence];
      seqlen_q = s.cu_seqlens_q[sequence + 1] - q_start;
      seqlen_k = s.cu_seqlens_k[sequence + 1] - k_start;
      batch = 0;
    } else {
      q_start = 0;
      k_start = 0;
      seqlen_q = s.seqlen_q;
      seqlen_k = s.seqlen_k;
      batch = sequence;
    }
    if constexpr (kKeyArrays) {
      if (s.seqused_k != nullptr) seqlen_k = s.seqused_k[sequence];
      if (s.leftpad_k != nullptr) {
        int const pad = s.leftpad_k[sequence];
        k_start += pad;
        seqlen_k -= pad;
      }
    }
  }

  // Element offset of row 0 of this sequence in a tensor of the given strides, for one head.
  CUTE_HOST_DEVICE int64_t q_offset(int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                                    int head) const {
    return batch * batch_stride + int64_t(q_start) * row_stride + head * head_stride;
  }
  CUTE_HOST_DEVICE int64_t k_offset(int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                                    int head) const {
    return batch * batch_stride + int64_t(k_start) * row_stride + head * head_stride;
  }
};

}  // namespace flashcute

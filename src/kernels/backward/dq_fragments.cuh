// dQ's fp32 accumulator in register order, shared by the backward kernels that add dQ per query
// block with atomics or bulk reductions. Block m_block of a head is a contiguous kBlockM x kWidth
// block in the head's padded rows (PaddedRows). The threads form groups of kGroupThreads (all of
// them by default), each group's values one contiguous part of the block: value v of thread t
// lies in float4 (t / G) * (V / 4) * G + (v / 4) * G + t % G (G threads of V values each), so a
// warp's 16-byte additions cover 512 contiguous bytes (row-major blocks scatter each into 8 rows)
// and a group can hand its part on alone. convert_dq_block reads a block back through the same
// MMA partition, scales it and converts it.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cute/tensor.hpp>

#include "kernels/backward/workspace.hpp"
#include "kernels/common/backward_params.hpp"
#include "kernels/common/sequence_info.hpp"
#include "kernels/device_attributes.hpp"

namespace flashcute::backward {

// TiledMmaDq: the MMA whose accumulator of kBlockM x kWidth holds a query block's dQ, over
// kThreads threads.
template <class Element_, class TiledMmaDq_, int kBlockM_, int kWidth_, int kThreads_,
          int kGroupThreads_ = kThreads_>
struct DqFragments {
  using Element = Element_;
  using TiledMmaDq = TiledMmaDq_;
  static constexpr int kBlockM = kBlockM_, kWidth = kWidth_, kThreads = kThreads_;
  static constexpr int kGroupThreads = kGroupThreads_;
  static_assert(kThreads % kGroupThreads == 0);
  // float4 vectors per thread, and per group (one contiguous part of a block).
  static constexpr int kVectors = kBlockM * kWidth / 4 / kThreads;
  static constexpr int kGroupVectors = kVectors * kGroupThreads;
  using Tile = cute::Shape<cute::Int<kBlockM>, cute::Int<kWidth>>;
  // The post-pass's block in row order, rows padded against bank conflicts.
  static constexpr int kRowFloats = kWidth + 4;
  static constexpr int kSmemBytes = kBlockM * kRowFloats * int(sizeof(float));

  // Where block m_block of `head` sums its dQ.
  CUTE_HOST_DEVICE static float* block(BackwardParams const& p, SequenceInfo<> const& seq,
                                       int sequence, int head, int m_block) {
    int64_t const row = head * p.padded_rows +
                        PaddedRows::sequence_start(seq, sequence, p.seqlen_q) +
                        int64_t(m_block) * kBlockM;
    return p.dq_accum + row * kWidth;
  }

  // The count of the block at `block` (the Hopper family's dQ counts, one per kDqCountRows
  // padded rows: a longer block takes its first rows' count).
  CUTE_HOST_DEVICE static int* count(BackwardParams const& p, float const* block) {
    static_assert(kBlockM % kDqCountRows == 0, "a dQ block of whole counts");
    return p.dq_counts + (block - p.dq_accum) / (kDqCountRows * kWidth);
  }

  // The float4 of a block that holds values 4 j .. 4 j + 3 of `thread`.
  CUTE_HOST_DEVICE static int vector_index(int j, int thread) {
    if constexpr (kGroupThreads == kThreads) return j * kThreads + thread;
    return thread / kGroupThreads * kGroupVectors + j * kGroupThreads + thread % kGroupThreads;
  }

  // Zeroes every head's blocks (before a main kernel adds to them).
  static cudaError_t clear(BackwardParams const& p, cudaStream_t stream) {
    return cudaMemsetAsync(p.dq_accum, 0, size_t(p.heads) * p.padded_rows * kWidth * sizeof(float),
                           stream);
  }

  // Adds this thread's accumulator (the dQ MMA's partition of the tile) to `dst`'s block.
  template <class Fragment>
  CUTE_DEVICE static void add(float* dst, Fragment const& dq, int thread) {
    static_assert(decltype(cute::size(dq))::value % 4 == 0);
    float4* const vectors = reinterpret_cast<float4*>(dst);
    CUTE_UNROLL
    for (int j = 0; j < cute::size(dq) / 4; ++j) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(vectors + vector_index(j, thread),
                make_float4(dq(4 * j), dq(4 * j + 1), dq(4 * j + 2), dq(4 * j + 3)));
#else
      float* const floats = reinterpret_cast<float*>(vectors + vector_index(j, thread));
      CUTE_UNROLL
      for (int i = 0; i < 4; ++i) atomicAdd(floats + i, dq(4 * j + i));
#endif
    }
  }
};

// Blocks one thread until a dQ block's count reaches `expected` (acquire: what its adders wrote
// before raising it is visible). kBackOff: a pause between reads, sparing L2 the polling of many
// waiting CTAs (the post-pass); without, for a wait on the main kernel's path (the deterministic
// turns).
template <bool kBackOff>
CUTE_DEVICE void wait_for_count(int const* count, int expected) {
  int done;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(done) : "l"(count) : "memory");
    if (done >= expected) return;
    if constexpr (kBackOff) __nanosleep(256);
  }
}

// Block m_block of dQ's accumulator, scaled and converted into dq: the CTA's threads are the
// dQ MMA's, and the dynamic shared memory holds Fragments::kSmemBytes. The accumulator is read
// through L2 (a kernel still running may have just completed it).
template <class Fragments>
CUTE_DEVICE void convert_dq_block(BackwardParams const& p, SequenceInfo<> const& seq, int sequence,
                                  int head, int m_block) {
  using namespace cute;
  using Element = typename Fragments::Element;
  constexpr int kBlockM = Fragments::kBlockM, kWidth = Fragments::kWidth;
  constexpr int kThreads = Fragments::kThreads;
  extern __shared__ float4 tile_raw[];
  auto tile = reinterpret_cast<float(*)[Fragments::kRowFloats]>(tile_raw);
  int const thread = threadIdx.x, row0 = m_block * kBlockM;
  Tensor coords = typename Fragments::TiledMmaDq{}.get_thread_slice(thread).partition_C(
      make_identity_tensor(typename Fragments::Tile{}));
  float4 const* const src =
      reinterpret_cast<float4 const*>(Fragments::block(p, seq, sequence, head, m_block));
  CUTE_UNROLL
  for (int j = 0; j < size(coords) / 4; ++j) {
    float4 const v = __ldcg(src + Fragments::vector_index(j, thread));
    float const values[4] = {v.x, v.y, v.z, v.w};
    CUTE_UNROLL
    for (int i = 0; i < 4; i += 2) {
      int const row = int(get<0>(coords(4 * j + i))), col = int(get<1>(coords(4 * j + i)));
      *reinterpret_cast<float2*>(&tile[row][col]) =
          make_float2(values[i] * p.softmax_scale, values[i + 1] * p.softmax_scale);
    }
  }
  __syncthreads();
  using Vector = cutlass::AlignedArray<Element, 8, 16>;
  cutlass::NumericArrayConverter<Element, float, 8> convert;
  Element* const dq = static_cast<Element*>(p.dq) +
                      seq.q_offset(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, head) +
                      int64_t(row0) * p.dq_row_stride;
  int const rows = seq.seqlen_q - row0;
  constexpr int kVectorsPerRow = kWidth / 8;
  CUTE_UNROLL
  for (int v = thread; v < kBlockM * kVectorsPerRow; v += kThreads) {
    int const row = v / kVectorsPerRow, col = v % kVectorsPerRow * 8;
    if (row < rows && col < p.head_dim) {
      cutlass::Array<float, 8> values;
      CUTE_UNROLL
      for (int i = 0; i < 8; ++i) values[i] = tile[row][col + i];
      Vector out;
      static_cast<cutlass::Array<Element, 8>&>(out) = convert(values);
      *reinterpret_cast<Vector*>(dq + int64_t(row) * p.dq_row_stride + col) = out;
    }
  }
}

// Grid: (query blocks, heads, batch), one thread per thread of the dQ MMA.
template <class Fragments>
__global__ void __launch_bounds__(Fragments::kThreads)
    dq_from_fragments_kernel(const BackwardParams p) {
  int const m_block = blockIdx.x, sequence = blockIdx.z;
  SequenceInfo<> const seq(p.sequences(), sequence);
  if (m_block * Fragments::kBlockM >= seq.seqlen_q) return;
  convert_dq_block<Fragments>(p, seq, sequence, int(blockIdx.y), m_block);
}

// `device`: the current device, which the caller made the tensors' device.
template <class Fragments>
cudaError_t launch_dq_from_fragments(BackwardParams const& p, int device, cudaStream_t stream) {
  auto const kernel = dq_from_fragments_kernel<Fragments>;
  cudaError_t const err = configure_once_per_device<Fragments>(device, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                Fragments::kSmemBytes);
  });
  if (err != cudaSuccess) return err;
  dim3 const grid((p.seqlen_q + Fragments::kBlockM - 1) / Fragments::kBlockM, p.heads, p.batch);
  kernel<<<grid, Fragments::kThreads, Fragments::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashcute::backward

// A C entry point to FlashAttention-3's Hopper forward, so that bench.py can time it beside ours
// in one process (bench/fa3_peer.py loads it). scripts/build_fa3_peer.sh compiles this file
// against FlashAttention-3's public source; nothing of that source is in this repository.
//
// It covers what the benchmark rows need: bf16, head dims 64, 128 and 256, dense or packed
// (cu_seqlens) batches, causal or not, one split and no GQA packing, which is what
// FlashAttention-3's own heuristics pick for every such row (each has at least 0.8 x SMs query
// tiles). It fills FlashAttention-3's parameters the way its Python entry does for those calls,
// including the scheduler's metadata: dense causal calls take a zeroed tile counter (the entry
// zeroes it on the stream before every call); packed calls have FlashAttention-3's prepare kernel
// write it.
#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <cstring>

#include "flash.h"

// Mirrors _Args in bench/fa3_peer.py: 64-bit fields only, so both sides agree on the layout
// without padding rules. Not in the anonymous namespace: the entry point takes it, and a type of
// internal linkage would hide the entry point from the library's exports.
struct Fa3PeerArgs {
  void* q;
  void* k;
  void* v;
  void* out;
  void* lse;           // fp32: (batch, heads, seqlen_q) dense, (heads, total_q) packed
  void* cu_seqlens_q;  // int32 (batch + 1) or null
  void* cu_seqlens_k;
  void* metadata;  // int32, fa3_peer_metadata_ints(...) of them
  int64_t batch, seqlen_q, seqlen_k, total_q, total_k, heads, heads_k, head_dim;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t causal;
  double softmax_scale;
};
static_assert(sizeof(Fa3PeerArgs) == 240, "out of step with bench/fa3_peer.py");

namespace {

// Where FlashAttention-3's scheduler reads and writes in the metadata buffer: per-batch vectors
// (rounded to 4 ints for 16-byte alignment) followed by the tile counter.
struct MetadataLayout {
  int batch_rounded;
  int vectors;
  bool needs_counter;
  int counter_offset() const { return batch_rounded * vectors; }
  int ints() const { return counter_offset() + (needs_counter ? 1 : 0); }
};

MetadataLayout metadata_layout(int64_t batch, bool packed, bool causal) {
  MetadataLayout m;
  m.batch_rounded = int((batch + 3) / 4 * 4);
  // Packed: splits and query blocks per sequence; the sorted sequence order (always, as there is
  // no local window here); with a causal mask, the heads that fit in L2.
  m.vectors = (packed ? 2 : 0) + 1 + (causal ? 1 : 0);
  m.needs_counter = causal || packed;
  return m;
}

int multiprocessors() {
  int device = 0;
  int count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count;
}

}  // namespace

extern "C" {

int fa3_peer_metadata_ints(int64_t batch, int64_t packed, int64_t causal) {
  return metadata_layout(batch, packed != 0, causal != 0).ints();
}

// Returns a cudaError_t (cudaErrorInvalidValue for a call this build does not cover).
int fa3_peer_forward(Fa3PeerArgs const* a, cudaStream_t stream) {
  bool const packed = a->cu_seqlens_q != nullptr;
  bool const causal = a->causal != 0;
  if (a->head_dim != 64 && a->head_dim != 128 && a->head_dim != 256) return cudaErrorInvalidValue;
  if ((a->cu_seqlens_k != nullptr) != packed) return cudaErrorInvalidValue;

  Flash_fwd_params p;
  std::memset(&p, 0, sizeof(p));
  p.is_bf16 = true;
  p.q_ptr = a->q;
  p.k_ptr = a->k;
  p.v_ptr = a->v;
  p.o_ptr = a->out;
  p.softmax_lse_ptr = a->lse;
  // Element strides; the batch strides are 0 for packed tensors (bench/fa3_peer.py).
  p.q_batch_stride = a->q_batch_stride, p.q_row_stride = a->q_row_stride;
  p.k_batch_stride = a->k_batch_stride, p.k_row_stride = a->k_row_stride;
  p.v_batch_stride = a->v_batch_stride, p.v_row_stride = a->v_row_stride;
  p.o_batch_stride = a->o_batch_stride, p.o_row_stride = a->o_row_stride;
  p.q_head_stride = a->q_head_stride, p.k_head_stride = a->k_head_stride;
  p.v_head_stride = a->v_head_stride, p.o_head_stride = a->o_head_stride;
  p.v_dim_stride = 1;
  p.cu_seqlens_q = static_cast<int*>(a->cu_seqlens_q);
  p.cu_seqlens_k = static_cast<int*>(a->cu_seqlens_k);

  auto round128 = [](int64_t x) { return int((x + 127) / 128 * 128); };
  p.b = p.b_k = int(a->batch);
  p.h = int(a->heads);
  p.h_k = int(a->heads_k);
  p.seqlen_q = int(a->seqlen_q);  // packed: the longest sequence
  p.seqlen_k = int(a->seqlen_k);
  p.seqlen_q_rounded = round128(a->seqlen_q);
  p.seqlen_k_rounded = round128(a->seqlen_k);
  p.total_q = int(a->total_q);
  p.total_k = int(a->total_k);
  p.d = p.d_rounded = p.dv = p.dv_rounded = int(a->head_dim);
  p.page_size = 1;

  p.scale_softmax = float(a->softmax_scale);
  p.p_dropout = 1.f;  // the probability of keeping
  p.rp_dropout = 1.f;
  p.p_dropout_in_uint8_t = 255;
  // A window edge of -1 means none; FlashAttention-3 stores it as the full extent.
  p.is_causal = causal;
  p.window_size_left = p.seqlen_k - 1;
  p.window_size_right = causal ? 0 : p.seqlen_q - 1;

  p.arch = 90;
  static int const sms = multiprocessors();
  p.num_sm = sms;
  p.num_splits = 1;
  p.pack_gqa = false;

  MetadataLayout const m = metadata_layout(a->batch, packed, causal);
  int* const meta = static_cast<int*>(a->metadata);
  p.varlen_sort_batches = true;
  p.head_swizzle = causal;
  p.prepare_varlen_pdl = packed && a->batch <= 992;
  p.tile_count_semaphore_offset = m.counter_offset();
  p.tile_count_semaphore = m.needs_counter ? meta + m.counter_offset() : nullptr;
  if (packed) {
    p.num_splits_dynamic_ptr = meta;
    p.num_m_blocks_ptr = meta + m.batch_rounded;
    p.varlen_batch_idx_ptr = meta + 2 * m.batch_rounded;
    p.num_nheads_in_l2_ptr = causal ? meta + 3 * m.batch_rounded : nullptr;
  } else if (m.needs_counter) {
    cudaError_t const err = cudaMemsetAsync(meta, 0, sizeof(int) * m.ints(), stream);
    if (err != cudaSuccess) return err;
  }

  switch (a->head_dim) {
    case 64:
      run_mha_fwd_<90, cutlass::bfloat16_t, 64, 64, false, false, false, false>(p, stream);
      break;
    case 128:
      run_mha_fwd_<90, cutlass::bfloat16_t, 128, 128, false, false, false, false>(p, stream);
      break;
    default:
      run_mha_fwd_<90, cutlass::bfloat16_t, 256, 256, false, false, false, false>(p, stream);
      break;
  }
  return cudaGetLastError();
}

}  // extern "C"

// The SM80-family decode kernel: attention of a few query tokens over a KV cache (dense or
// paged), one block per (16 packed query rows, key split, KV head or query head, sequence).
//
// Rows: with pack_gqa the query heads of one KV head share the block, row r being query token
// r / group and head kv_head * group + r % group, so each cache element is read once per KV head.
// Keys: the block's visible keys are cut into num_splits ranges; its warps take the range's
// tiles in turn (warp w: tiles w, w + kWarps, ...), each through its own cp.async pipeline and
// online softmax, and merge through shared memory at the end. A block of a split writes its
// normalised fp32 output and log2-domain log-sum-exp for combine_kernel; a lone split writes the
// output directly.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/common/decode_params.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/common/kv_cache.hpp"
#include "kernels/common/mask.hpp"
#include "kernels/common/online_softmax.hpp"
#include "kernels/common/score_modifiers.hpp"
#include "kernels/sm80/fragment_layouts.cuh"
#include "kernels/sm80/gemm.cuh"

namespace flashcute::sm80::decode {

using DecodeSoftmaxPolicy = SoftmaxPolicy<1, 0, true>;

// The query rows of one block: packed (token, head) pairs of one sequence.
struct QueryRows {
  int token_begin;  // the sequence's first token among q's rows (packed) or 0 (dense)
  int seqlen;       // query tokens of the sequence
  int batch;        // batch coordinate of q and o: the sequence when dense, 0 when packed
  int group;        // heads per block row set: heads_per_kv_head when packed, else 1
  int first_head;   // head of packed row 0

  CUTE_DEVICE QueryRows(const DecodeParams& p, int sequence, int head_slot) {
    if (p.cu_seqlens_q != nullptr) {
      token_begin = p.cu_seqlens_q[sequence];
      seqlen = p.cu_seqlens_q[sequence + 1] - token_begin;
      batch = 0;
    } else {
      token_begin = 0;
      seqlen = p.seqlen_q;
      batch = sequence;
    }
    group = p.pack_gqa ? p.heads_per_kv_head : 1;
    first_head = head_slot * group;
  }
  CUTE_DEVICE int rows() const { return seqlen * group; }
  CUTE_DEVICE int token(int row) const { return row / group; }
  CUTE_DEVICE int head(int row) const { return first_head + row % group; }
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    decode_kernel(const __grid_constant__ DecodeParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kWarpKeys = Traits::kWarpKeys;
  constexpr int kWarps = Traits::kWarps;
  constexpr int kStages = Traits::kStages;

  allow_dependent_launch();  // the combine may launch now; it waits for this grid to finish
  const int heads_per_block_set = p.pack_gqa ? p.heads_k : p.heads;
  const int m_blocks = gridDim.x / heads_per_block_set;
  const int m_block = blockIdx.x % m_blocks;  // fastest: blocks sharing K/V run together
  const int head_slot = blockIdx.x / m_blocks;
  const int split = blockIdx.y;
  const int sequence = blockIdx.z;
  const QueryRows q_rows(p, sequence, head_slot);
  const int row_begin = m_block * kBlockM;
  if (row_begin >= q_rows.rows()) return;
  const int kv_head = q_rows.first_head / p.heads_per_kv_head;
  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;

  const CacheSequence cache(p, sequence);
  const AttentionMask mask(q_rows.seqlen, cache.num_keys, true, p.window_left, p.window_right);
  // Keys some row of the block sees (rows are in token order), then this split's share, in
  // whole block rounds.
  const int last_row = min(row_begin + kBlockM, q_rows.rows()) - 1;
  const int keys_begin = max(mask.row_keys(q_rows.token(row_begin)).begin, 0);
  const int keys_end = mask.row_keys(q_rows.token(last_row)).end;
  const int rounds =
      keys_end > keys_begin ? ceil_div(keys_end - keys_begin, Traits::kBlockKeys) : 0;
  const int rounds_per_split = ceil_div(rounds, p.num_splits);
  const int split_begin = keys_begin + split * rounds_per_split * Traits::kBlockKeys;
  const int split_end = min(keys_end, split_begin + rounds_per_split * Traits::kBlockKeys);
  const int num_tiles = split_end > split_begin ? ceil_div(split_end - split_begin, kWarpKeys) : 0;
  const int warp_tiles = num_tiles > warp ? ceil_div(num_tiles - warp, kWarps) : 0;

  extern __shared__ char smem[];
  Element* const smem_q = reinterpret_cast<Element*>(smem);
  Element* const smem_warp =
      smem_q + Traits::kSmemElemsQ + warp * kStages * Traits::kSmemElemsStage;
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  const auto stage_k = [&](int stage) { return smem_warp + stage * Traits::kSmemElemsStage; };
  const auto stage_v = [&](int stage) { return stage_k(stage) + Traits::kTileElems; };

  // Q: 16 packed rows, zero past the block's rows and past head_dim.
  constexpr int kChunksPerRow = kHeadDim / 8;
  for (int chunk = int(threadIdx.x); chunk < kBlockM * kChunksPerRow; chunk += Traits::kThreads) {
    const int r = chunk / kChunksPerRow, col = chunk % kChunksPerRow * 8;
    const int row = row_begin + r;
    const bool valid = row < q_rows.rows() && col < p.head_dim;
    const Element* src = static_cast<const Element*>(p.q);
    if (valid) {
      src += q_rows.batch * p.q_batch_stride +
             int64_t(q_rows.token_begin + q_rows.token(row)) * p.q_row_stride +
             q_rows.head(row) * p.q_head_stride + col;
    }
    SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>::copy(*reinterpret_cast<const uint128_t*>(src),
                                                     *reinterpret_cast<uint128_t*>(&sQ(r, col)),
                                                     valid);
  }
  cp_async_fence();

  // The warp's tile j holds keys [key0, key0 + kWarpKeys), key0 = split_begin + (warp + j *
  // kWarps) * kWarpKeys. Lane l looks up the cache slot of tile rows l (and l + 32, ...); the lanes
  // copying a row take its location by shuffle. A tile's lookups are issued right after the
  // copies of the tile before, so a paged cache's block-table reads wait behind a tile of compute
  // instead of in front of the copies.
  const Element* const k_base = static_cast<const Element*>(p.k);
  const Element* const v_base = static_cast<const Element*>(p.v);
  constexpr int kRowsPerPass = 32 / kChunksPerRow > 0 ? 32 / kChunksPerRow : 1;
  constexpr int kLookups = (kWarpKeys + 31) / 32;
  const int lane_col = kChunksPerRow >= 32 ? 0 : lane % kChunksPerRow * 8;
  const int lane_row = kChunksPerRow >= 32 ? 0 : lane / kChunksPerRow;
  Tensor sK_layout = make_tensor(make_smem_ptr(smem_warp), typename Traits::SmemLayoutKV{});
  const auto tile_key0 = [&](int j) { return split_begin + (warp + j * kWarps) * kWarpKeys; };
  SlotLocation loc[kLookups];  // the slots of tile next_tile's rows
  int next_tile = 0;
  const auto look_up = [&](int j) {
    CUTE_UNROLL
    for (int u = 0; u < kLookups; ++u) {
      const int key = tile_key0(j) + u * 32 + lane;
      loc[u] = key < split_end ? locate_slot(p, cache, cache.leftpad + key) : SlotLocation{0, 0};
    }
  };
  const auto load_next_tile = [&](int stage) {
    const int key0 = tile_key0(next_tile);
    Element* const sk = stage_k(stage);
    Element* const sv = stage_v(stage);
    CUTE_UNROLL
    for (int pass = 0; pass < kWarpKeys / kRowsPerPass; ++pass) {
      CUTE_UNROLL
      for (int cc = 0; cc < (kChunksPerRow >= 32 ? kChunksPerRow / 32 : 1); ++cc) {
        const int row = pass * kRowsPerPass + lane_row;
        const int col = kChunksPerRow >= 32 ? (cc * 32 + lane) * 8 : lane_col;
        const int u = pass * kRowsPerPass / 32;  // the same for every lane of a pass
        const SlotLocation at{__shfl_sync(0xffffffff, loc[u].page, row % 32),
                              __shfl_sync(0xffffffff, loc[u].offset, row % 32)};
        const bool valid = key0 + row < split_end && col < p.head_dim;
        const Element* k_src = k_base;
        const Element* v_src = v_base;
        if (valid) {
          k_src +=
              slot_offset(at, p.k_batch_stride, p.k_row_stride, p.k_head_stride, kv_head) + col;
          v_src +=
              slot_offset(at, p.v_batch_stride, p.v_row_stride, p.v_head_stride, kv_head) + col;
        }
        const int dst = sK_layout.layout()(row, col);
        SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>::copy(*reinterpret_cast<const uint128_t*>(k_src),
                                                         *reinterpret_cast<uint128_t*>(sk + dst),
                                                         valid);
        SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>::copy(*reinterpret_cast<const uint128_t*>(v_src),
                                                         *reinterpret_cast<uint128_t*>(sv + dst),
                                                         valid);
      }
    }
    if (++next_tile < warp_tiles) look_up(next_tile);
  };

  if (warp_tiles > 0) look_up(0);
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < warp_tiles) load_next_tile(s);
    cp_async_fence();
  }
  cp_async_wait<kStages - 1>();  // Q, the oldest group, has landed for this thread
  __syncthreads();               // ... and for every thread

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(lane);
  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSsQ = smem_copy_q.get_thread_slice(lane).partition_S(sQ);
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  clear(acc_o);
  Tensor acc_o_rows = rowcol_view(acc_o);
  using TileS = Shape<Int<kBlockM>, Int<kWarpKeys>>;
  Tensor score_coords = rowcol_view(thr_mma.partition_C(make_identity_tensor(TileS{})));
  constexpr int kRowsPerThread = decltype(size<0>(score_coords))::value;

  // Each of this thread's rows sees keys [row_lo, row_hi) of the split.
  int row_lo[kRowsPerThread], row_hi[kRowsPerThread];
  CUTE_UNROLL
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int row = min(row_begin + int(get<0>(score_coords(r, 0))), q_rows.rows() - 1);
    const KeyInterval keys = mask.row_keys(q_rows.token(row));
    row_lo[r] = keys.begin;
    row_hi[r] = min(keys.end, split_end);
  }
  const ScoreTransform<true> transform(p, sequence, q_rows.first_head);
  OnlineSoftmax<kRowsPerThread, DecodeSoftmaxPolicy> softmax;
  softmax.init();

  for (int i = 0; i < warp_tiles; ++i) {
    __syncwarp();  // every lane is done reading the stage the next load overwrites
    if (i + kStages - 1 < warp_tiles) load_next_tile((i + kStages - 1) % kStages);
    cp_async_fence();
    cp_async_wait<kStages - 1>();  // this lane's copies of tile i have landed
    __syncwarp();                  // ... and every lane's

    const int stage = i % kStages;
    const int key0 = split_begin + (warp + i * kWarps) * kWarpKeys;
    Tensor sK = make_tensor(make_smem_ptr(stage_k(stage)), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(stage_v(stage)), typename Traits::SmemLayoutVt{});
    Tensor sVtNoSwizzle =
        make_tensor(make_smem_ptr(stage_v(stage)), typename Traits::SmemLayoutVtNoSwizzle{});
    Tensor tSrK = thr_mma.partition_fragment_B(sK);
    Tensor tSsK = smem_copy_k.get_thread_slice(lane).partition_S(sK);
    Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);
    Tensor tOsVt = smem_copy_v.get_thread_slice(lane).partition_S(sVt);

    Tensor acc_s = partition_fragment_C(tiled_mma, TileS{});
    clear(acc_s);
    gemm_smem_smem(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_copy_q, smem_copy_k, lane);
    Tensor scores = rowcol_view(acc_s);
    transform.cap_or_scale(scores);
    transform.add_alibi(scores, score_coords, row_begin, key0, mask);  // unpacked when ALiBi
    bool edge = false;
    CUTE_UNROLL
    for (int r = 0; r < kRowsPerThread; ++r) {
      edge |= key0 < row_lo[r] || key0 + kWarpKeys > row_hi[r];
    }
    if (__any_sync(0xffffffff, edge)) {
      CUTE_UNROLL
      for (int r = 0; r < kRowsPerThread; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          const int key = key0 + int(get<1>(score_coords(r, c)));
          if (key < row_lo[r] || key >= row_hi[r]) scores(r, c) = transform.masked_value;
        }
      }
    }
    float correction[kRowsPerThread];
    if (__any_sync(0xffffffff, softmax.update(scores, transform.exp2_multiplier(), correction))) {
      softmax.scale_rows(acc_o_rows, correction);
    }
    Tensor probs = make_tensor<Element>(acc_s.layout());
    convert_fragment(acc_s, probs);
    Tensor probs_a = make_tensor(probs.data(), accumulator_as_a_operand_layout(probs.layout()));
    gemm_regs_smem(acc_o, probs_a, tOrVt, tOsVt, tiled_mma, smem_copy_v, lane);
  }

  // Merge the warps: each publishes its unnormalised output, row maxima and row sums.
  cp_async_wait<0>();
  __syncthreads();  // no warp still reads its pipeline (or Q) when the merge overwrites them
  float* const merge_o = reinterpret_cast<float*>(smem);  // (warp, row, col)
  float* const merge_max = merge_o + kWarps * kBlockM * kHeadDim;
  float* const merge_sum = merge_max + kWarps * kBlockM;
  Tensor o_coords =
      rowcol_view(thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{})));
  CUTE_UNROLL
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int row = int(get<0>(o_coords(r, 0)));
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc_o_rows); ++c) {
      merge_o[(warp * kBlockM + row) * kHeadDim + int(get<1>(o_coords(r, c)))] = acc_o_rows(r, c);
    }
    const float sum = quad_sum(softmax.row_sum[r]);
    if (lane % 4 == 0) {
      merge_max[warp * kBlockM + row] = softmax.row_max[r];
      merge_sum[warp * kBlockM + row] = sum;
    }
  }
  __syncthreads();

  // Each row of the block goes to kThreads / kBlockM threads, each with whole 16-byte chunks.
  constexpr int kThreadsPerRow = Traits::kThreads / kBlockM;
  constexpr int kColsPerThread = kHeadDim / kThreadsPerRow;
  const int r = int(threadIdx.x) / kThreadsPerRow;
  const int col0 = int(threadIdx.x) % kThreadsPerRow * kColsPerThread;
  const int row = row_begin + r;
  if (row >= q_rows.rows()) return;
  float block_max = -INFINITY;
  CUTE_UNROLL
  for (int w = 0; w < kWarps; ++w) block_max = fmaxf(block_max, merge_max[w * kBlockM + r]);
  // A warp whose keys this row never saw has maximum -inf and sum 0: it weighs nothing.
  float weight[kWarps];
  float total = 0.f;
  CUTE_UNROLL
  for (int w = 0; w < kWarps; ++w) {
    const float m = merge_max[w * kBlockM + r];
    weight[w] = m == -INFINITY ? 0.f : fast_exp2(m - block_max);
    total += weight[w] * merge_sum[w * kBlockM + r];
  }
  const float inv_total = total > 0.f ? 1.f / total : 0.f;
  // log2-domain log-sum-exp; -inf for a row that saw no key of this split.
  const float lse2 = total > 0.f ? block_max + __log2f(total) : -INFINITY;
  const int token = q_rows.token(row);
  const int head = q_rows.head(row);

  if (p.num_splits == 1) {
    Element* const out = static_cast<Element*>(p.o) + q_rows.batch * p.o_batch_stride +
                         int64_t(q_rows.token_begin + token) * p.o_row_stride +
                         head * p.o_head_stride;
    CUTE_UNROLL
    for (int c = 0; c < kColsPerThread; c += 8) {
      if (col0 + c >= p.head_dim) break;
      cutlass::Array<Element, 8> chunk;
      CUTE_UNROLL
      for (int j = 0; j < 8; ++j) {
        float acc = 0.f;
        CUTE_UNROLL
        for (int w = 0; w < kWarps; ++w) {
          acc += weight[w] * merge_o[(w * kBlockM + r) * kHeadDim + col0 + c + j];
        }
        chunk[j] = Element(acc * inv_total);
      }
      *reinterpret_cast<cutlass::Array<Element, 8>*>(out + col0 + c) = chunk;
    }
    if (p.lse != nullptr && col0 == 0) {
      p.lse[sequence * p.lse_batch_stride + head * p.lse_head_stride + q_rows.token_begin + token] =
          total > 0.f ? lse2 * kLn2 : INFINITY;
    }
  } else {
    const int64_t total_rows = p.total_q * p.heads;
    const int64_t partial_row =
        split * total_rows +
        (int64_t(p.cu_seqlens_q != nullptr ? q_rows.token_begin : sequence * p.seqlen_q) + token) *
            p.heads +
        head;
    float* const out = p.o_partial + partial_row * p.head_dim;
    CUTE_UNROLL
    for (int c = 0; c < kColsPerThread; c += 4) {
      if (col0 + c >= p.head_dim) break;
      float4 v;
      float* const vf = &v.x;
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {
        float acc = 0.f;
        CUTE_UNROLL
        for (int w = 0; w < kWarps; ++w) {
          acc += weight[w] * merge_o[(w * kBlockM + r) * kHeadDim + col0 + c + j];
        }
        vf[j] = acc * inv_total;
      }
      *reinterpret_cast<float4*>(out + col0 + c) = v;
    }
    if (col0 == 0) p.lse_partial[partial_row] = lse2;
  }
}

}  // namespace flashcute::sm80::decode

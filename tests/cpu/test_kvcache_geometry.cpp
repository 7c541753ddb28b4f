// The KV-cache path's host-callable pieces, on the host:
// - CacheSequence / locate_slot / slot_offset (kernels/common/kv_cache.hpp), the one rule the
//   append, attention and contract-check kernels share, against caches built the way the API
//   describes them: dense rows (picked by cache_batch_idx or not), and paged caches made by cutting
//   each sequence's logical row into pages and storing page j at block_table[b][j];
// - choose_num_splits (decode/split_heuristic.hpp) against its definition, computed here from
//   scratch for many shapes;
// - decode_workspace (decode/workspace.hpp): every piece 256-byte aligned, large enough, disjoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "flashcute/flashcute.h"
#include "kernels/common/decode_params.hpp"
#include "kernels/common/kv_cache.hpp"
#include "kernels/decode/split_heuristic.hpp"
#include "kernels/decode/workspace.hpp"

namespace flashcute {
namespace {

// A cache's element strides: (row or page, slot, head, dim), dim contiguous.
struct Strides {
  int64_t page, row, head;
};

// Packed (pages, slots, heads, dim) or head-major (pages, heads, slots, dim).
Strides cache_strides(int slots, int heads, int dim, bool head_major) {
  if (head_major) return {int64_t(heads) * slots * dim, dim, int64_t(slots) * dim};
  return {int64_t(slots) * heads * dim, int64_t(heads) * dim, dim};
}

// A distinct value for every (sequence, slot, head) of the logical caches.
int64_t logical_id(int b, int slot, int h) { return (int64_t(b) * 100000 + slot) * 16 + h; }

struct DenseCase {
  std::vector<int32_t> seqlens;  // empty: the scalar cache_seqlen
  int scalar_seqlen = 0;
  std::vector<int32_t> leftpad;    // empty: none
  std::vector<int32_t> batch_idx;  // empty: sequence b uses row b
  int seqlen_new = 0;
  int batch = 0;
  int batch_cache = 0;
  int capacity = 0;
};

void check_dense(const DenseCase& c, bool head_major) {
  constexpr int kHeads = 3, kDim = 8;
  DecodeParams p{};
  p.batch = c.batch;
  p.cache_seqlens = c.seqlens.empty() ? nullptr : c.seqlens.data();
  p.cache_seqlen = c.scalar_seqlen;
  p.cache_leftpad = c.leftpad.empty() ? nullptr : c.leftpad.data();
  p.cache_batch_idx = c.batch_idx.empty() ? nullptr : c.batch_idx.data();
  p.seqlen_new = c.seqlen_new;
  p.page_size = c.capacity;
  p.batch_cache = c.batch_cache;
  const Strides s = cache_strides(c.capacity, kHeads, kDim, head_major);

  // The physical cache: row r holds the logical row of every sequence that maps to it; the
  // others hold -1.
  std::vector<int64_t> cache(size_t(c.batch_cache) * c.capacity * kHeads * kDim, -1);
  for (int b = 0; b < c.batch; ++b) {
    const int row = c.batch_idx.empty() ? b : c.batch_idx[b];
    for (int slot = 0; slot < c.capacity; ++slot)
      for (int h = 0; h < kHeads; ++h)
        cache[row * s.page + slot * s.row + h * s.head] = logical_id(b, slot, h);
  }

  for (int b = 0; b < c.batch; ++b) {
    SCOPED_TRACE(::testing::Message() << "sequence " << b << (head_major ? " head-major" : ""));
    const CacheSequence seq(p, b);
    const int seqlen = c.seqlens.empty() ? c.scalar_seqlen : c.seqlens[b];
    const int leftpad = c.leftpad.empty() ? 0 : c.leftpad[b];
    EXPECT_EQ(seq.seqlen, seqlen);
    EXPECT_EQ(seq.leftpad, leftpad);
    EXPECT_EQ(seq.row, c.batch_idx.empty() ? b : c.batch_idx[b]);
    EXPECT_EQ(seq.num_keys, seqlen + c.seqlen_new - leftpad);
    EXPECT_EQ(seq.rotary_offset(), seqlen);  // the first new slot, left padding included
    // Visible key j is slot leftpad + j; the new tokens go to [seqlen, seqlen + seqlen_new).
    for (int key = 0; key < seq.num_keys; ++key) {
      const int slot = leftpad + key;
      const SlotLocation loc = locate_slot(p, seq, slot);
      ASSERT_EQ(loc.page, seq.row) << "key " << key;
      ASSERT_EQ(loc.offset, slot) << "key " << key;
      for (int h = 0; h < kHeads; ++h) {
        const int64_t at = slot_offset(loc, s.page, s.row, s.head, h);
        ASSERT_EQ(at, seq.row * s.page + slot * s.row + h * s.head);
        ASSERT_EQ(cache[at], logical_id(b, slot, h)) << "key " << key << " head " << h;
      }
    }
  }
}

TEST(KvcacheGeometry, DenseCacheRows) {
  DenseCase c;
  c.batch = 4;
  c.capacity = 140;
  c.batch_cache = 4;
  c.seqlens = {0, 1, 37, 129};
  for (bool head_major : {false, true}) {
    c.seqlen_new = 0;
    check_dense(c, head_major);
    c.seqlen_new = 11;  // 129 + 11 fills the row
    check_dense(c, head_major);
  }
}

TEST(KvcacheGeometry, DenseCacheWithBatchIdxAndLeftpad) {
  DenseCase c;
  c.batch = 4;
  c.capacity = 200;
  c.batch_cache = 7;
  c.seqlens = {5, 0, 150, 64};
  c.batch_idx = {6, 0, 3, 5};  // rows 1, 2 and 4 serve nobody
  for (bool head_major : {false, true}) {
    c.leftpad.clear();
    c.seqlen_new = 3;
    check_dense(c, head_major);
    c.leftpad = {5, 0, 17, 63};  // all skipped, none, some, all but one
    check_dense(c, head_major);
    c.seqlen_new = 0;
    check_dense(c, head_major);
  }
}

TEST(KvcacheGeometry, ScalarCacheSeqlen) {
  DenseCase c;
  c.batch = 3;
  c.capacity = 64;
  c.batch_cache = 5;
  c.scalar_seqlen = 40;
  c.seqlen_new = 24;
  c.batch_idx = {4, 2, 0};
  check_dense(c, false);
  c.leftpad = {0, 39, 40};
  check_dense(c, true);
}

// A paged cache made the way the API describes it: each sequence's logical row of
// pages_per_sequence * page_size slots is cut into pages, and its page j is stored at physical
// page block_table[b * stride + j]; unused pages and unused table entries hold -1.
void check_paged(int page_size, bool head_major, bool leftpad, unsigned seed) {
  constexpr int kHeads = 2, kDim = 8, kBatch = 3, kSparePages = 5;
  const std::vector<int32_t> seqlens = {0, 100, 3 * page_size + 1};
  const int seqlen_new = 7;
  int capacity_needed = 0;
  for (int32_t l : seqlens) capacity_needed = std::max(capacity_needed, l + seqlen_new);
  const int pages_per_sequence = (capacity_needed + page_size - 1) / page_size;
  const int stride = pages_per_sequence + 2;  // table rows wider than needed
  const int num_pages = kBatch * pages_per_sequence + kSparePages;

  std::vector<int32_t> all(num_pages);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> table(size_t(kBatch) * stride, -1);
  for (int b = 0; b < kBatch; ++b)
    for (int j = 0; j < pages_per_sequence; ++j)
      table[b * stride + j] = all[b * pages_per_sequence + j];
  std::vector<int32_t> pads(kBatch, 0);
  if (leftpad) pads = {0, 37, 2 * page_size + 1};  // whole pages skipped in the last

  const Strides s = cache_strides(page_size, kHeads, kDim, head_major);
  std::vector<int64_t> cache(size_t(num_pages) * page_size * kHeads * kDim, -1);
  for (int b = 0; b < kBatch; ++b)
    for (int j = 0; j < pages_per_sequence; ++j) {
      const int page = table[b * stride + j];
      for (int r = 0; r < page_size; ++r)
        for (int h = 0; h < kHeads; ++h)
          cache[page * s.page + r * s.row + h * s.head] = logical_id(b, j * page_size + r, h);
    }

  DecodeParams p{};
  p.batch = kBatch;
  p.cache_seqlens = seqlens.data();
  p.cache_leftpad = leftpad ? pads.data() : nullptr;
  p.block_table = table.data();
  p.block_table_stride = stride;
  p.page_size = page_size;
  p.pages_per_sequence = pages_per_sequence;
  p.batch_cache = num_pages;
  p.seqlen_new = seqlen_new;

  std::set<int> pages_used;
  for (int b = 0; b < kBatch; ++b) {
    SCOPED_TRACE(::testing::Message()
                 << "page " << page_size << " sequence " << b << (head_major ? " head-major" : "")
                 << (leftpad ? " leftpad" : ""));
    const CacheSequence seq(p, b);
    EXPECT_EQ(seq.row, b) << "a paged cache's row is the sequence's row of the block table";
    EXPECT_EQ(seq.num_keys, seqlens[b] + seqlen_new - pads[b]);
    EXPECT_EQ(seq.rotary_offset(), seqlens[b]);
    for (int key = 0; key < seq.num_keys; ++key) {
      const int slot = pads[b] + key;
      const SlotLocation loc = locate_slot(p, seq, slot);
      ASSERT_EQ(loc.page, table[b * stride + slot / page_size]) << "slot " << slot;
      ASSERT_EQ(loc.offset, slot % page_size) << "slot " << slot;
      pages_used.insert(loc.page);
      for (int h = 0; h < kHeads; ++h) {
        const int64_t at = slot_offset(loc, s.page, s.row, s.head, h);
        ASSERT_EQ(cache[at], logical_id(b, slot, h)) << "slot " << slot << " head " << h;
      }
    }
  }
  // Only pages of the sequences' own table rows are ever located.
  std::set<int> pages_owned;
  for (int b = 0; b < kBatch; ++b)
    for (int j = 0; j < pages_per_sequence; ++j) pages_owned.insert(table[b * stride + j]);
  for (int page : pages_used) EXPECT_EQ(pages_owned.count(page), 1u) << "page " << page;
}

TEST(KvcacheGeometry, PagedCacheShuffledBlockTable) {
  unsigned seed = 7;
  for (int page_size : {16, 64})
    for (bool head_major : {false, true})
      for (bool leftpad : {false, true}) check_paged(page_size, head_major, leftpad, seed++);
}

// choose_num_splits from its definition: fill(s) = blocks * s / (waves * slots) with
// waves = ceil(blocks * s / slots); the answer is the smallest s in [1, limit] whose fill is at
// least 95% of the best fill over [1, limit], limit = clamp(rounds / kMinRoundsPerSplit, 1,
// max_splits).
double fill(int64_t blocks, int64_t splits, int64_t slots) {
  const int64_t work = blocks * splits;
  const int64_t waves = (work + slots - 1) / slots;
  return double(work) / double(waves * slots);
}

int64_t split_limit(int64_t rounds, int max_splits) {
  return std::max<int64_t>(1, std::min<int64_t>(rounds / decode::kMinRoundsPerSplit, max_splits));
}

void check_splits(int64_t blocks, int64_t rounds, int64_t slots, int max_splits) {
  SCOPED_TRACE(::testing::Message() << "blocks " << blocks << " rounds " << rounds << " slots "
                                    << slots << " max " << max_splits);
  const int got = decode::choose_num_splits(blocks, rounds, slots, max_splits);
  const int64_t limit = split_limit(rounds, max_splits);
  ASSERT_GE(got, 1);
  ASSERT_LE(got, limit);
  ASSERT_LE(got, std::max<int64_t>(1, rounds / decode::kMinRoundsPerSplit));
  double best = 0;
  for (int64_t s = 1; s <= limit; ++s) best = std::max(best, fill(blocks, s, slots));
  EXPECT_GE(fill(blocks, got, slots), 0.95 * best);
  for (int64_t s = 1; s < got; ++s)
    EXPECT_LT(fill(blocks, s, slots), 0.95 * best) << "a smaller count " << s << " also fills";
}

TEST(KvcacheSplitHeuristic, OneSplitWhenTheBlocksFillTheDevice) {
  for (int64_t slots : {78, 132, 264})
    for (int64_t blocks : {slots, 2 * slots, 10 * slots, slots - 1})
      EXPECT_EQ(decode::choose_num_splits(blocks, 1024, slots, FC_KVCACHE_MAX_SPLITS), 1)
          << "blocks " << blocks << " slots " << slots;
}

TEST(KvcacheSplitHeuristic, BatchOneLongCacheSplits) {
  // 8 blocks (one sequence, 8 KV heads) on 132 SMs, 256 key rounds.
  const int got = decode::choose_num_splits(8, 256, 132, FC_KVCACHE_MAX_SPLITS);
  EXPECT_GT(got, 1);
  EXPECT_LE(got, 256 / decode::kMinRoundsPerSplit);
  check_splits(8, 256, 132, FC_KVCACHE_MAX_SPLITS);
  check_splits(1, 4096, 132, FC_KVCACHE_MAX_SPLITS);
  EXPECT_GT(decode::choose_num_splits(1, 4096, 132, FC_KVCACHE_MAX_SPLITS), 1);
}

TEST(KvcacheSplitHeuristic, BoundedByRoundsAndMaxSplits) {
  for (int64_t blocks : {1, 2, 3, 8, 13, 32, 64, 100, 131, 133, 200, 300})
    for (int64_t rounds : {1, 3, 4, 7, 8, 17, 64, 255, 1000, 100000})
      for (int64_t slots : {1, 78, 132, 264})
        for (int max_splits : {1, 2, 8, 128}) check_splits(blocks, rounds, slots, max_splits);
  // Fewer rounds than kMinRoundsPerSplit never split; the maximum is never passed.
  EXPECT_EQ(decode::choose_num_splits(1, decode::kMinRoundsPerSplit - 1, 132, 128), 1);
  EXPECT_LE(decode::choose_num_splits(1, 1 << 20, 132, 16), 16);
  EXPECT_LE(decode::choose_num_splits(1, 1 << 20, 100000, 128), 128);
}

TEST(KvcacheSplitHeuristic, DegenerateInputsGiveOneSplit) {
  for (int64_t bad : {0, -1, -1000}) {
    EXPECT_EQ(decode::choose_num_splits(bad, 256, 132, 128), 1);
    EXPECT_EQ(decode::choose_num_splits(8, bad, 132, 128), 1);
    EXPECT_EQ(decode::choose_num_splits(8, 256, bad, 128), 1);
  }
  EXPECT_EQ(decode::choose_num_splits(8, 256, 132, 0), 1);
  EXPECT_EQ(decode::choose_num_splits(8, 256, 132, -5), 1);
}

TEST(KvcacheWorkspace, PiecesAreAlignedLargeEnoughAndDisjoint) {
  for (bool debug : {false, true})
    for (bool rotary : {false, true})
      for (int splits : {1, 2, 3, 64, 128})
        for (uint64_t q_elements : {uint64_t{8}, uint64_t{3 * 16 * 8 * 80}, uint64_t{4096 * 257}})
          for (uint64_t rows : {uint64_t{1}, uint64_t{7}, uint64_t{4096}})
            for (int head_dim : {64, 80, 128, 256}) {
              SCOPED_TRACE(::testing::Message()
                           << "debug " << debug << " rotary " << rotary << " splits " << splits
                           << " q " << q_elements << " rows " << rows << " d " << head_dim);
              const decode::DecodeWorkspace w =
                  decode::decode_workspace(debug, rotary, q_elements, splits, rows, head_dim);
              EXPECT_EQ(w.bytes % 256, 0u);
              std::vector<std::pair<uint64_t, uint64_t>> pieces;  // [begin, end)
              if (debug) pieces.push_back({w.contract_offset, w.contract_offset + 2 * 4});
              if (rotary)
                pieces.push_back({w.q_rotated_offset, w.q_rotated_offset + q_elements * 2});
              if (splits > 1) {
                pieces.push_back(
                    {w.o_partial_offset, w.o_partial_offset + splits * rows * head_dim * 4});
                pieces.push_back({w.lse_partial_offset, w.lse_partial_offset + splits * rows * 4});
              }
              if (pieces.empty()) {
                EXPECT_EQ(w.bytes, 0u) << "nothing to keep, no workspace";
              }
              for (size_t i = 0; i < pieces.size(); ++i) {
                EXPECT_EQ(pieces[i].first % 256, 0u) << "piece " << i;
                EXPECT_LE(pieces[i].second, w.bytes) << "piece " << i;
                for (size_t j = i + 1; j < pieces.size(); ++j)
                  EXPECT_TRUE(pieces[i].second <= pieces[j].first ||
                              pieces[j].second <= pieces[i].first)
                      << "pieces " << i << " and " << j << " overlap";
              }
            }
}

}  // namespace
}  // namespace flashcute

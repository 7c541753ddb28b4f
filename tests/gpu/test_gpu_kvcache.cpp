// fc_kvcache against the CPU fp64 forward reference over the keys each sequence sees (the cache
// slots [leftpad, seqlen + seqlen_new) after the append), with the caches checked element by
// element: all-pairs coverage of the main lists, then packed queries over a paged cache, append
// only, sequences with no key, rotary over the whole head, a negative scale, the device-memory
// contract under debug_checks, repeatability, CUDA-graph replay with changing cache_seqlens,
// tensors on another device, and the calls that must write nothing. Shapes stay small enough for
// the CPU reference.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kvcache_harness.hpp"
#include "pairwise.hpp"
#include "reference/poison.hpp"

namespace flashcute {
namespace testing {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

enum class Mask { kNone, kCausal, kWindow, kCausalLeft };
enum class Modifier { kNone, kSoftcap, kAlibiPerHead, kAlibiPerBatchHead };
enum class Rotary { kNone, kInterleaved, kHalf };

TEST(Kvcache, AllPairs) {
  FC_REQUIRE_GPU();
  const bool small = small_mode();
  const std::vector<fc_dtype> dtypes = {FC_FLOAT16, FC_BFLOAT16};
  const std::vector<int> head_dims = {64, 128, 256, 80};
  // (layout, page size)
  const std::vector<std::pair<CacheLayout, int>> layouts = {{CacheLayout::kDense, 0},
                                                            {CacheLayout::kDenseBatchIdx, 0},
                                                            {CacheLayout::kPaged, 16},
                                                            {CacheLayout::kPaged, 64},
                                                            {CacheLayout::kPaged, 256}};
  // Per-sequence cache lengths: empty, one slot, tile +- 1, long, one very long sequence.
  const std::vector<std::vector<int>> lengths = {
      {0, 1, 129}, {127, small ? 300 : 1000}, {small ? 700 : 5000}};
  const std::vector<int> seqlens_q = {1, 4, 16};
  const std::vector<std::pair<int, int>> heads = {{4, 4}, {8, 2}, {8, 1}};  // GQA 1, 4, 8
  const std::vector<int> splits = {0, 1, 3, 64};
  const std::vector<Rotary> rotaries = {Rotary::kNone, Rotary::kInterleaved, Rotary::kHalf};
  const std::vector<Mask> masks = {Mask::kNone, Mask::kCausal, Mask::kWindow, Mask::kCausalLeft};
  const std::vector<Modifier> modifiers = {Modifier::kNone, Modifier::kSoftcap,
                                           Modifier::kAlibiPerHead, Modifier::kAlibiPerBatchHead};
  // New tokens: none, as many as queries (decode, speculative decoding), or 3.
  const int kNewNone = 0, kNewAsQueries = 1;
  // The lists above in order, new tokens (3 kinds) after the splits, then four on/off switches:
  // left padding, scaled-up data, no LSE, a head-major cache.
  const auto rows =
      all_pairs({int(dtypes.size()), int(head_dims.size()), int(layouts.size()),
                 int(lengths.size()), int(seqlens_q.size()), int(heads.size()), int(splits.size()),
                 3, int(rotaries.size()), int(masks.size()), int(modifiers.size()), 2, 2, 2, 2});
  // Under racecheck at most FLASHCUTE_TEST_MAX_CASES rows run, evenly spread.
  const size_t limit = case_limit();
  const size_t step = limit && limit < rows.size() ? (rows.size() + limit - 1) / limit : 1;
  std::printf("[ info ] %zu all-pairs KV-cache cases, running every %zu\n", rows.size(), step);
  const auto start = std::chrono::steady_clock::now();
  for (size_t r = 0; r < rows.size(); r += step) {
    const std::vector<int>& row = rows[r];
    KvCase c;
    c.dtype = dtypes[row[0]];
    c.head_dim = head_dims[row[1]];
    c.layout = layouts[row[2]].first;
    c.page_size = layouts[row[2]].second;
    c.cache_seqlens = lengths[row[3]];
    c.seqlen_q = seqlens_q[row[4]];
    c.heads = heads[row[5]].first;
    c.heads_k = heads[row[5]].second;
    const int num_splits = splits[row[6]];
    c.seqlen_new = row[7] == kNewNone ? 0 : row[7] == kNewAsQueries ? c.seqlen_q : 3;
    switch (rotaries[row[8]]) {
      case Rotary::kNone:
        break;
      case Rotary::kInterleaved:
        c.rotary_dim = 32;
        c.rotary_interleaved = true;
        break;
      case Rotary::kHalf:
        c.rotary_dim = c.head_dim / 2;
        break;
    }
    switch (masks[row[9]]) {
      case Mask::kNone:
        break;
      case Mask::kCausal:
        c.causal = true;
        break;
      case Mask::kWindow:
        c.window_left = 37;
        c.window_right = 5;
        break;
      case Mask::kCausalLeft:
        c.causal = true;
        c.window_left = 200;
        break;
    }
    c.data = row[12] == 1 ? Data::kScaledUp : Data::kNormal;
    switch (modifiers[row[10]]) {
      case Modifier::kNone:
        break;
      case Modifier::kSoftcap:  // the tanh bends at the scores' scale
        c.softcap = c.data == Data::kScaledUp ? 30.0f : 3.0f;
        break;
      case Modifier::kAlibiPerHead:
        c.alibi = Alibi::kPerHead;
        break;
      case Modifier::kAlibiPerBatchHead:
        c.alibi = Alibi::kPerBatchHead;
        break;
    }
    c.leftpad = row[11] == 1 ? Leftpad::kThird : Leftpad::kNone;
    c.lse = row[13] == 0;
    c.cache_head_major = row[14] == 1;
    const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
    check_kvcache(*in, KvRun{num_splits});
  }
  std::printf("[ info ] all-pairs KV-cache: %.1f s\n", seconds_since(start));
}

// Chunked prefill over a paged cache: packed queries of different lengths (one sequence without
// any), the LSE as (heads, total_q); one and several splits.
TEST(Kvcache, PackedQueriesOverPagedCache) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    KvCase c;
    c.dtype = dtype;
    c.heads = 8;
    c.heads_k = 2;
    c.head_dim = dtype == FC_FLOAT16 ? 128 : 64;
    c.q_lengths = {3, 0, 16, 1, 9};
    c.seqlen_q = 16;
    c.cache_seqlens = {300, 50, small_mode() ? 400 : 1000, 0, 129};
    c.layout = CacheLayout::kPaged;
    c.page_size = 64;
    c.causal = true;
    c.leftpad = dtype == FC_BFLOAT16 ? Leftpad::kThird : Leftpad::kNone;
    const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
    for (int splits : {0, 1, 5}) check_kvcache(*in, KvRun{splits});
    // Windowed and with ALiBi (one head per block) over the same cache.
    KvCase w = c;
    w.causal = false;
    w.window_left = 20;
    w.window_right = 3;
    w.alibi = Alibi::kPerBatchHead;
    w.cache_head_major = true;
    const std::unique_ptr<KvInputs> win = make_kv_inputs(w);
    for (int splits : {1, 4}) check_kvcache(*win, KvRun{splits});
  }
}

// The scalar cache_seqlen (no array), and appending with no query at all: the cache is updated and
// nothing else is written.
TEST(Kvcache, ScalarCacheSeqlenAndAppendOnly) {
  FC_REQUIRE_GPU();
  for (CacheLayout layout : {CacheLayout::kDense, CacheLayout::kPaged}) {
    KvCase c;
    c.dtype = layout == CacheLayout::kPaged ? FC_FLOAT16 : FC_BFLOAT16;
    c.heads = 8;
    c.heads_k = 4;
    c.head_dim = 128;
    c.layout = layout;
    c.page_size = 16;
    c.cache_seqlens = {77, 77, 77};
    c.seqlens_array = false;
    c.seqlen_q = 4;
    c.seqlen_new = 4;
    c.causal = true;
    c.rotary_dim = 64;
    c.rotary_interleaved = layout == CacheLayout::kDense;
    const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
    for (int splits : {0, 2}) check_kvcache(*in, KvRun{splits});
    c.seqlen_q = 0;  // append only
    c.seqlen_new = 5;
    c.causal = false;
    const std::unique_ptr<KvInputs> append = make_kv_inputs(c);
    check_kvcache(*append, KvRun{});
  }
}

// Sequences that see no key (an empty cache and no new token, or left padding over every slot):
// zeros and an LSE of +inf, whatever the split.
TEST(Kvcache, NoKeysGiveZerosAndInfiniteLse) {
  FC_REQUIRE_GPU();
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    KvCase c;
    c.dtype = dtype;
    c.heads = 4;
    c.heads_k = 2;
    c.head_dim = 64;
    c.seqlen_q = 3;
    c.cache_seqlens = {0, 0};
    c.layout = dtype == FC_FLOAT16 ? CacheLayout::kDense : CacheLayout::kPaged;
    c.page_size = 16;
    const std::unique_ptr<KvInputs> empty = make_kv_inputs(c);
    for (int splits : {0, 1, 4}) check_kvcache(*empty, KvRun{splits});
    c.cache_seqlens = {5, 130};
    c.leftpad = Leftpad::kAll;  // every filled slot skipped
    c.causal = true;
    const std::unique_ptr<KvInputs> padded = make_kv_inputs(c);
    for (int splits : {1, 3}) check_kvcache(*padded, KvRun{splits});
  }
}

// rotary_dim == head_dim, both pairings, one position per sequence (no mask) and one per token
// (causal, and a window alone), with left padding shifting the positions.
TEST(Kvcache, RotaryOverTheWholeHead) {
  FC_REQUIRE_GPU();
  for (bool interleaved : {false, true})
    for (int mask = 0; mask < 3; ++mask) {
      KvCase c;
      c.dtype = interleaved ? FC_FLOAT16 : FC_BFLOAT16;
      c.heads = 4;
      c.heads_k = 1;
      c.head_dim = 80;
      c.rotary_dim = 80;
      c.rotary_interleaved = interleaved;
      c.seqlen_q = 5;
      c.seqlen_new = 5;
      c.cache_seqlens = {40, 0, 200};
      c.leftpad = Leftpad::kThird;
      c.causal = mask == 1;
      if (mask == 2) c.window_left = 30;
      c.layout = mask == 0 ? CacheLayout::kDenseBatchIdx : CacheLayout::kPaged;
      c.page_size = 64;
      const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
      check_kvcache(*in, KvRun{mask == 2 ? 3 : 0});
    }
}

// A negative scale (the extreme score is the smallest) and scores in the hundreds, with softcap.
TEST(Kvcache, NegativeScaleAndLargeScores) {
  FC_REQUIRE_GPU();
  for (bool softcap : {false, true}) {
    KvCase c;
    c.dtype = softcap ? FC_BFLOAT16 : FC_FLOAT16;
    c.heads = 8;
    c.heads_k = 8;
    c.head_dim = 128;
    c.seqlen_q = 2;
    c.seqlen_new = 1;
    c.cache_seqlens = {333, 64};
    c.softmax_scale = -0.15f;
    c.softcap = softcap ? 20.0f : 0.0f;
    c.data = Data::kScaledUp;
    c.causal = true;
    const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
    for (int splits : {1, 4}) check_kvcache(*in, KvRun{splits});
  }
}

// debug_checks: valid arrays give the right answer; an array that breaks the device-memory
// contract is refused, naming it, before anything is written (O, the LSE and the caches, new
// slots included, stay as they were).
TEST(Kvcache, DebugChecksCatchBadDeviceArrays) {
  FC_REQUIRE_GPU();
  KvCase c;
  c.heads = 4;
  c.heads_k = 2;
  c.head_dim = 64;
  c.seqlen_q = 2;
  c.seqlen_new = 2;
  c.cache_seqlens = {40, 0, 100};
  c.layout = CacheLayout::kPaged;
  c.page_size = 16;
  c.leftpad = Leftpad::kThird;
  c.causal = true;
  c.rotary_dim = 32;
  const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
  const KvRun debug{0, true};
  check_kvcache(*in, debug);
  check_kvcache(*in, KvRun{3, true});

  std::vector<std::unique_ptr<DeviceBuffer>> arrays;
  auto device_array = [&](const std::vector<int32_t>& host) {
    arrays.push_back(std::make_unique<DeviceBuffer>(host.size() * 4));
    cuda_ok(cudaMemcpy(arrays.back()->get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice),
            "upload");
    return reinterpret_cast<const int32_t*>(arrays.back()->get());
  };
  struct Bad {
    const char* name;
    std::function<void(fc_kvcache_args&)> change;
  };
  std::vector<int32_t> table_high = in->block_table, table_low = in->block_table;
  // The page of sequence 2's last new slot, and the first page of sequence 0.
  table_high[2 * in->table_stride + (100 + 1) / 16] = in->batch_cache;
  table_low[0] = -1;
  const int32_t* high = device_array(table_high);
  const int32_t* low = device_array(table_low);
  const int32_t* overflow = device_array({40, 0, in->capacity - 1});  // + 2 new slots
  const int32_t* negative = device_array({40, -1, 100});
  const int32_t* past_seqlen = device_array({41, 0, 0});  // leftpad 41 > seqlen 40
  const int32_t* negative_pad = device_array({0, -2, 0});
  const std::vector<Bad> bad = {
      {"block_table", [&](fc_kvcache_args& a) { a.block_table = high; }},
      {"block_table", [&](fc_kvcache_args& a) { a.block_table = low; }},
      {"cache_seqlens", [&](fc_kvcache_args& a) { a.cache_seqlens = overflow; }},
      {"cache_seqlens", [&](fc_kvcache_args& a) { a.cache_seqlens = negative; }},
      {"cache_leftpad", [&](fc_kvcache_args& a) { a.cache_leftpad = past_seqlen; }},
      {"cache_leftpad", [&](fc_kvcache_args& a) { a.cache_leftpad = negative_pad; }},
      {"rotary_cos", [&](fc_kvcache_args& a) { a.rotary_seqlen = 60; }},  // 100 - 33 + 2 > 60
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    const KvOutcome out = run_kvcache(*in, debug, b.change);
    EXPECT_EQ(out.status, FC_ERROR_INVALID_ARGUMENT) << out.message;
    EXPECT_NE(out.message.find(b.name), std::string::npos) << out.message;
    EXPECT_TRUE(kv_untouched(*in, out));
  }

  // cache_batch_idx outside the cache's rows.
  KvCase d = c;
  d.layout = CacheLayout::kDenseBatchIdx;
  const std::unique_ptr<KvInputs> dense = make_kv_inputs(d);
  check_kvcache(*dense, debug);
  std::vector<int32_t> idx = dense->batch_idx;
  idx[1] = dense->batch_cache;
  const int32_t* bad_idx = device_array(idx);
  const KvOutcome out =
      run_kvcache(*dense, debug, [&](fc_kvcache_args& a) { a.cache_batch_idx = bad_idx; });
  EXPECT_EQ(out.status, FC_ERROR_INVALID_ARGUMENT) << out.message;
  EXPECT_NE(out.message.find("cache_batch_idx"), std::string::npos) << out.message;
  EXPECT_TRUE(kv_untouched(*dense, out));
}

// The same call three times gives the same bits in O, the LSE and the caches, whether the keys
// are split or not.
TEST(Kvcache, RepeatedCallsAreBitwiseIdentical) {
  FC_REQUIRE_GPU();
  KvCase c;
  c.heads = 16;
  c.heads_k = 2;
  c.head_dim = 128;
  c.seqlen_q = 4;
  c.seqlen_new = 4;
  c.cache_seqlens = {small_mode() ? 600 : 3000};
  c.layout = CacheLayout::kPaged;
  c.page_size = 64;
  c.causal = true;
  c.rotary_dim = 64;
  const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
  for (int splits : {0, 1, 7}) {
    SCOPED_TRACE(KvRun{splits}.describe());
    const KvOutcome first = run_kvcache(*in, KvRun{splits});
    ASSERT_TRUE(kv_matches(*in, first));
    for (int again = 0; again < 2; ++again) {
      const KvOutcome next = run_kvcache(*in, KvRun{splits});
      ASSERT_EQ(next.status, FC_OK) << next.message;
      EXPECT_EQ(next.o_raw, first.o_raw) << "O differs in run " << again + 2;
      EXPECT_EQ(std::memcmp(next.lse_raw.data(), first.lse_raw.data(), first.lse_raw.size() * 4), 0)
          << "the LSE differs in run " << again + 2;
      EXPECT_EQ(next.k_cache, first.k_cache) << "k_cache differs in run " << again + 2;
      EXPECT_EQ(next.v_cache, first.v_cache) << "v_cache differs in run " << again + 2;
    }
  }
}

// An automatic split is chosen from host-known shapes only, so a call captured in a CUDA graph
// stays right when cache_seqlens changes on the device between replays (appended slots, rotary
// positions and key counts all follow).
TEST(Kvcache, CudaGraphReplayWithChangingCacheSeqlens) {
  FC_REQUIRE_GPU();
  KvCase c;
  c.heads = 8;
  c.heads_k = 2;
  c.head_dim = 128;
  c.seqlen_q = 2;
  c.seqlen_new = 2;
  c.cache_seqlens = {100, 0, 500};
  c.layout = CacheLayout::kPaged;
  c.page_size = 64;
  c.capacity = 640;
  c.causal = true;
  c.rotary_dim = 32;
  c.rotary_interleaved = true;
  const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
  const KvRun run{0};
  const KvOutputs out = make_outputs(*in, run);
  if (out.workspace_bytes == 0 && in->c.rotary_dim > 0) {
    ADD_FAILURE() << "rotary needs a workspace for the rotated queries";
    return;
  }
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  fc_kvcache_args a = kvcache_args(*in, out, run);
  a.stream = stream;

  // Outside a graph first, on the same stream.
  reset(*in, out);
  fc_status status = fc_kvcache(&a);
  const KvOutcome direct = collect(*in, out, status, fc_last_error());
  if (direct.status == FC_ERROR_UNSUPPORTED) {
    cudaStreamDestroy(stream);
    GTEST_SKIP() << direct.message;
  }
  ASSERT_TRUE(kv_matches(*in, direct));

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  status = fc_kvcache(&a);
  const std::string message = fc_last_error();
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  ASSERT_EQ(status, FC_OK) << message;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const std::vector<std::vector<int>> replays = {
      {100, 0, 500}, {638, 5, 1}, {0, 0, 0}, {63, 64, 65}, {320, 639 - 2, 17}};
  for (const std::vector<int>& lengths : replays) {
    SCOPED_TRACE(::testing::Message() << "cache_seqlens {" << lengths[0] << ", " << lengths[1]
                                      << ", " << lengths[2] << "}");
    set_cache_seqlens(*in, lengths);
    reset(*in, out);
    cuda_ok(cudaGraphLaunch(exec, stream), "graph launch");
    EXPECT_TRUE(kv_matches(*in, collect(*in, out, FC_OK, "")));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Everything on device 1 while device 0 is current: the call runs on the tensors' device. An
// output on the other device is an argument error naming it.
TEST(Kvcache, TensorsOnAnotherDevice) {
  FC_REQUIRE_GPU();
  if (device_count() < 2) GTEST_SKIP() << "only one GPU: cannot place tensors on a second device";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  KvCase c;
  c.heads = 8;
  c.heads_k = 2;
  c.head_dim = 128;
  c.seqlen_q = 2;
  c.seqlen_new = 2;
  c.cache_seqlens = {300, 17};
  c.layout = CacheLayout::kPaged;
  c.page_size = 64;
  c.causal = true;
  c.rotary_dim = 64;
  const std::unique_ptr<KvInputs> in = make_kv_inputs(c);  // allocated on device 1
  const KvRun run{3};
  const KvOutputs out = make_outputs(*in, run);
  reset(*in, out);
  fc_kvcache_args a = kvcache_args(*in, out, run);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const fc_status status = fc_kvcache(&a);
  const std::string message = fc_last_error();
  int current = -1;
  cudaGetDevice(&current);
  EXPECT_EQ(current, 0) << "the call changed the current device";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  const KvOutcome outcome = collect(*in, out, status, message);
  EXPECT_TRUE(kv_matches(*in, outcome));

  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  DeviceBuffer o_on_0(in->o_span * 2 + 16);
  a.o.data = o_on_0.get();
  EXPECT_EQ(fc_kvcache(&a), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("o "), std::string::npos) << fc_last_error();
}

// Nothing to do: success, no workspace, nothing written.
TEST(Kvcache, EmptyProblemsWriteNothing) {
  FC_REQUIRE_GPU();
  KvCase c;
  c.heads = 4;
  c.heads_k = 4;
  c.head_dim = 64;
  c.seqlen_q = 3;
  c.cache_seqlens = {10, 20};
  c.layout = CacheLayout::kPaged;
  c.page_size = 16;
  const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
  const std::vector<std::function<void(fc_kvcache_args&)>> empties = {
      [](fc_kvcache_args& a) { a.batch = 0; }, [](fc_kvcache_args& a) { a.seqlen_q = 0; },
      [](fc_kvcache_args& a) { a.heads = a.heads_k = 0; }};
  for (const auto& empty : empties) {
    const KvOutcome out = run_kvcache(*in, KvRun{3}, [&](fc_kvcache_args& a) {
      empty(a);
      uint64_t bytes = 1;
      EXPECT_EQ(fc_kvcache_workspace_size(&a, &bytes), FC_OK) << fc_last_error();
      EXPECT_EQ(bytes, 0u);
    });
    EXPECT_EQ(out.status, FC_OK) << out.message;
    EXPECT_TRUE(kv_untouched(*in, out));
  }
}

// Invalid calls with real device tensors: refused before anything is launched.
TEST(Kvcache, RefusalsWriteNothing) {
  FC_REQUIRE_GPU();
  KvCase c;
  c.heads = 4;
  c.heads_k = 2;
  c.head_dim = 64;
  c.seqlen_q = 2;
  c.seqlen_new = 2;
  c.cache_seqlens = {50, 90};
  c.rotary_dim = 32;  // a workspace for the rotated queries
  const std::unique_ptr<KvInputs> in = make_kv_inputs(c);
  const KvRun run{3};
  struct Refusal {
    const char* name;
    fc_status status;
    std::function<void(fc_kvcache_args&)> change;
  };
  std::vector<uint16_t> host_cache(in->cache_elements + 64, ref::kPoison16);
  const std::vector<uint16_t> host_before = host_cache;
  const std::vector<Refusal> refusals = {
      {"workspace", FC_ERROR_INVALID_ARGUMENT, [](fc_kvcache_args& a) { a.workspace_bytes -= 1; }},
      {"workspace", FC_ERROR_INVALID_ARGUMENT, [](fc_kvcache_args& a) { a.workspace = nullptr; }},
      {"workspace", FC_ERROR_INVALID_ARGUMENT,
       [](fc_kvcache_args& a) { a.workspace = static_cast<char*>(a.workspace) + 16; }},
      {"o.seq_stride", FC_ERROR_INVALID_ARGUMENT, [](fc_kvcache_args& a) { a.o.seq_stride += 4; }},
      {"num_splits", FC_ERROR_INVALID_ARGUMENT, [](fc_kvcache_args& a) { a.num_splits = 1000; }},
      {"k_cache", FC_ERROR_INVALID_ARGUMENT,
       [&](fc_kvcache_args& a) { a.k_cache.data = host_cache.data() + 8; }},
      {"family", FC_ERROR_UNSUPPORTED, [](fc_kvcache_args& a) { a.family = FC_FAMILY_SM90; }},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.name);
    const KvOutcome out = run_kvcache(*in, run, r.change);
    EXPECT_EQ(out.status, r.status) << out.message;
    EXPECT_NE(out.message.find(r.name), std::string::npos) << out.message;
    EXPECT_TRUE(kv_untouched(*in, out));
  }
  EXPECT_EQ(host_cache, host_before);
}

}  // namespace
}  // namespace testing
}  // namespace flashcute

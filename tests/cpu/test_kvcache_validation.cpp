// fc_kvcache's and fc_kvcache_workspace_size's argument checks, which run before any CUDA call:
// each bad argument gives FC_ERROR_INVALID_ARGUMENT with a message naming it, and nothing is
// written. The tensors and the small device arrays (cache_seqlens, block_table, rotary tables) are
// host buffers, 16-byte aligned: every case is also run through validate_kvcache_arguments itself,
// so a case can only pass by failing in validation (and never, say, because find_tensor_device
// finds host memory, whose message would name a tensor too). What only the device can check
// (cache_seqlens, cache_leftpad, block-table entries) is left to the GPU suite's debug_checks.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "flashcute/attention.hpp"
#include "flashcute/flashcute.h"

namespace flashcute {
namespace {

// Two sequences of 4 query tokens, 4 heads over 2 KV heads of 64; a dense cache of 3 rows of 64
// slots, 4 new tokens each, rotary over half the head.
constexpr int64_t B = 2, S = 4, H = 4, Hk = 2, D = 64;
constexpr int64_t kCacheRows = 3, kCacheSlots = 64, kNew = 4, kRotaryDim = 32, kRotaryLen = 128;
// The paged variant: 16 pages of 16 slots, 4 pages per sequence.
constexpr int64_t kPages = 16, kPageSize = 16, kPagesPerSequence = 4;

// Phrases of the device lookup that follows validation: a case failing with these did not fail
// in validation.
bool is_device_lookup_message(const std::string& m) {
  return m.find("is not CUDA device memory") != std::string::npos ||
         m.find("cannot query the pointer") != std::string::npos;
}

class KvcacheValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto* buffer : {&q_, &o_}) buffer->assign(B * S * H * D + 64, 0x5A5A);
    for (auto* buffer : {&k_new_, &v_new_}) buffer->assign(B * kNew * Hk * D + 64, 0x1234);
    for (auto* buffer : {&k_cache_, &v_cache_})
      buffer->assign(kCacheRows * kCacheSlots * Hk * D + 64, 0x4321);
    lse_.assign(B * H * S + 16, 7.0f);
    rotary_.assign(kRotaryLen * kRotaryDim / 2 + 64, 0x3C00);
    seqlens_.assign(8 + 4, 10);
    table_.assign(B * kPagesPerSequence + 8, 1);
    cu_q_.assign(B + 1 + 8, 0);

    fc_kvcache_args_init(&args_);
    auto tensor = [](std::vector<uint16_t>& b, int64_t seqlen, int64_t heads) {
      return fc_tensor{aligned(b.data()), seqlen * heads * D, heads * D, D};
    };
    args_.q = tensor(q_, S, H);
    args_.o = tensor(o_, S, H);
    args_.k_cache = tensor(k_cache_, kCacheSlots, Hk);
    args_.v_cache = tensor(v_cache_, kCacheSlots, Hk);
    args_.k_new = tensor(k_new_, kNew, Hk);
    args_.v_new = tensor(v_new_, kNew, Hk);
    args_.dtype = FC_FLOAT16;
    args_.batch = B;
    args_.seqlen_q = S;
    args_.heads = H;
    args_.heads_k = Hk;
    args_.head_dim = D;
    args_.seqlen_new = kNew;
    args_.batch_cache = kCacheRows;
    args_.seqlen_cache = kCacheSlots;
    args_.cache_seqlens = aligned(seqlens_.data());
    args_.rotary_cos = aligned(rotary_.data());
    args_.rotary_sin = aligned(rotary_.data()) + 16;
    args_.rotary_dim = kRotaryDim;
    args_.rotary_seqlen = kRotaryLen;
    args_.softmax_lse = aligned(lse_.data());
    args_.softmax_scale = 0.125f;

    // The same problem over a paged cache: the cache tensors are then (pages, page size, ...).
    paged_ = args_;
    paged_.k_cache = tensor(k_cache_, kPageSize, Hk);
    paged_.v_cache = tensor(v_cache_, kPageSize, Hk);
    paged_.batch_cache = kPages;
    paged_.seqlen_cache = kPageSize;
    paged_.block_table = aligned(table_.data());
    paged_.block_table_stride = kPagesPerSequence;
    paged_.pages_per_sequence = kPagesPerSequence;

    // Packed queries (no new tokens, no rotary): q and o are (total_q, heads, head_dim).
    packed_ = args_;
    packed_.k_new = fc_tensor{};
    packed_.v_new = fc_tensor{};
    packed_.seqlen_new = 0;
    packed_.rotary_cos = packed_.rotary_sin = nullptr;
    packed_.rotary_dim = packed_.rotary_seqlen = 0;
    packed_.cu_seqlens_q = aligned(cu_q_.data());
    packed_.total_q = B * S;
  }

  template <typename T>
  static T* aligned(T* p) {
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + 15) / 16 * 16;
    return reinterpret_cast<T*>(a);
  }

  // The base arguments pass validation (the cases below each break one rule of them).
  static void expect_valid(const fc_kvcache_args& a, const char* what) {
    DecodeParams params{};
    const Status s = validate_kvcache_arguments(a, params);
    EXPECT_TRUE(s.ok()) << what << ": " << s.message;
  }

  // The change is refused by validation itself with a message naming `name`; then the size query
  // and the call refuse it the same way (before looking for a device) and write nothing.
  void expect_rejected(const fc_kvcache_args& base,
                       const std::function<void(fc_kvcache_args&)>& change,
                       const std::string& name) {
    SCOPED_TRACE(name);
    fc_kvcache_args a = base;
    change(a);
    DecodeParams params{};
    const Status s = validate_kvcache_arguments(a, params);
    EXPECT_EQ(s.code, FC_ERROR_INVALID_ARGUMENT) << "validation accepted the change: " << name;
    EXPECT_NE(s.message.find(name), std::string::npos)
        << "validation's message '" << s.message << "' should name " << name;

    uint64_t bytes = 12345;
    EXPECT_EQ(fc_kvcache_workspace_size(&a, &bytes), FC_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(fc_last_error()), s.message);
    EXPECT_EQ(bytes, 12345u) << "the size query wrote its result on failure";

    const std::vector<uint16_t> o = o_, k_cache = k_cache_, v_cache = v_cache_;
    const std::vector<float> lse = lse_;
    EXPECT_EQ(fc_kvcache(&a), FC_ERROR_INVALID_ARGUMENT);
    const std::string message = fc_last_error();
    EXPECT_EQ(message, s.message);
    EXPECT_FALSE(is_device_lookup_message(message)) << message;
    EXPECT_EQ(o_, o);
    EXPECT_EQ(k_cache_, k_cache);
    EXPECT_EQ(v_cache_, v_cache);
    EXPECT_EQ(std::memcmp(lse_.data(), lse.data(), lse_.size() * 4), 0);

    // The C++ API is the same function.
    EXPECT_EQ(kvcache(a).message, s.message);
    uint64_t cpp_bytes = 0;
    EXPECT_EQ(kvcache_workspace_size(a, cpp_bytes).message, s.message);
  }

  void expect_rejected(const std::function<void(fc_kvcache_args&)>& change,
                       const std::string& name) {
    expect_rejected(args_, change, name);
  }

  std::vector<uint16_t> q_, o_, k_cache_, v_cache_, k_new_, v_new_, rotary_;
  std::vector<float> lse_;
  std::vector<int32_t> seqlens_, table_, cu_q_;
  fc_kvcache_args args_, paged_, packed_;
};

TEST_F(KvcacheValidation, BaseArgumentsAreValid) {
  expect_valid(args_, "dense");
  expect_valid(paged_, "paged");
  expect_valid(packed_, "packed");
}

TEST_F(KvcacheValidation, NullArgs) {
  EXPECT_EQ(fc_kvcache(nullptr), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("args"), std::string::npos) << fc_last_error();
  uint64_t bytes = 0;
  EXPECT_EQ(fc_kvcache_workspace_size(nullptr, &bytes), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("args"), std::string::npos) << fc_last_error();
  EXPECT_EQ(fc_kvcache_workspace_size(&args_, nullptr), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("bytes"), std::string::npos) << fc_last_error();
  fc_kvcache_args_init(nullptr);  // a no-op, not a crash
}

TEST_F(KvcacheValidation, InitGivesDocumentedDefaults) {
  fc_kvcache_args a;
  std::memset(&a, 0x7F, sizeof(a));
  fc_kvcache_args_init(&a);
  EXPECT_EQ(a.abi_version, FC_ABI_VERSION);
  EXPECT_EQ(a.window_left, -1);
  EXPECT_EQ(a.window_right, -1);
  EXPECT_EQ(a.family, FC_FAMILY_AUTO);
  EXPECT_EQ(a.num_splits, 0);
  EXPECT_EQ(a.debug_checks, 0);
  EXPECT_EQ(a.causal, 0);
  EXPECT_EQ(a.softcap, 0.0f);
  EXPECT_EQ(a.k_new.data, nullptr);
  EXPECT_EQ(a.v_new.data, nullptr);
  EXPECT_EQ(a.seqlen_new, 0);
  EXPECT_EQ(a.cache_seqlens, nullptr);
  EXPECT_EQ(a.cache_batch_idx, nullptr);
  EXPECT_EQ(a.cache_leftpad, nullptr);
  EXPECT_EQ(a.block_table, nullptr);
  EXPECT_EQ(a.cu_seqlens_q, nullptr);
  EXPECT_EQ(a.rotary_cos, nullptr);
  EXPECT_EQ(a.rotary_sin, nullptr);
  EXPECT_EQ(a.rotary_dim, 0);
  EXPECT_EQ(a.rotary_interleaved, 0);
  EXPECT_EQ(a.softmax_lse, nullptr);
  EXPECT_EQ(a.alibi_slopes, nullptr);
  EXPECT_EQ(a.workspace, nullptr);
  EXPECT_EQ(a.workspace_bytes, 0u);
  EXPECT_EQ(a.stream, nullptr);
  const KvcacheArgs cpp = default_kvcache_args();
  EXPECT_EQ(cpp.abi_version, FC_ABI_VERSION);
  EXPECT_EQ(cpp.dtype, a.dtype);
  EXPECT_EQ(cpp.window_left, -1);
  EXPECT_EQ(cpp.window_right, -1);
  EXPECT_EQ(cpp.family, FC_FAMILY_AUTO);
  EXPECT_EQ(cpp.num_splits, 0);
  EXPECT_EQ(cpp.block_table, nullptr);
}

TEST_F(KvcacheValidation, AbiVersionAndDtype) {
  expect_rejected([](fc_kvcache_args& a) { a.abi_version = 0; }, "abi_version");
  expect_rejected([](fc_kvcache_args& a) { a.abi_version = FC_ABI_VERSION + 1; }, "abi_version");
  expect_rejected([](fc_kvcache_args& a) { a.dtype = 2; }, "dtype");
  expect_rejected([](fc_kvcache_args& a) { a.dtype = -1; }, "dtype");
}

TEST_F(KvcacheValidation, NegativeSizes) {
  using Field = int64_t fc_kvcache_args::*;
  const std::pair<const char*, Field> sizes[] = {
      {"batch", &fc_kvcache_args::batch},
      {"seqlen_q", &fc_kvcache_args::seqlen_q},
      {"heads", &fc_kvcache_args::heads},
      {"heads_k", &fc_kvcache_args::heads_k},
      {"head_dim", &fc_kvcache_args::head_dim},
      {"total_q", &fc_kvcache_args::total_q},
      {"seqlen_new", &fc_kvcache_args::seqlen_new},
      {"batch_cache", &fc_kvcache_args::batch_cache},
      {"seqlen_cache", &fc_kvcache_args::seqlen_cache},
      {"cache_seqlen", &fc_kvcache_args::cache_seqlen},
      {"pages_per_sequence", &fc_kvcache_args::pages_per_sequence},
      {"block_table_stride", &fc_kvcache_args::block_table_stride},
      {"rotary_dim", &fc_kvcache_args::rotary_dim},
      {"rotary_seqlen", &fc_kvcache_args::rotary_seqlen},
      {"alibi_batch_stride", &fc_kvcache_args::alibi_batch_stride}};
  for (const auto& [name, field] : sizes) {
    expect_rejected([field = field](fc_kvcache_args& a) { a.*field = -1; }, name);
    expect_rejected(
        paged_, [field = field](fc_kvcache_args& a) { a.*field = -3; }, name);
  }
  expect_rejected([](fc_kvcache_args& a) { a.seqlen_q = int64_t{INT_MAX} + 1; }, "seqlen_q");
  expect_rejected([](fc_kvcache_args& a) { a.batch_cache = int64_t{INT_MAX} + 1; }, "batch_cache");
  expect_rejected([](fc_kvcache_args& a) { a.seqlen_cache = int64_t{1} << 40; }, "seqlen_cache");
  expect_rejected([](fc_kvcache_args& a) { a.batch = 65536; }, "batch");
  expect_rejected(
      [](fc_kvcache_args& a) {
        a.heads = 65536;
        a.heads_k = 1;
      },
      "heads");
}

TEST_F(KvcacheValidation, HeadDim) {
  for (int64_t bad : {0, 12, 60, 257, 264, 512})
    expect_rejected([bad](fc_kvcache_args& a) { a.head_dim = bad; }, "head_dim");
}

TEST_F(KvcacheValidation, HeadsAndKeyHeads) {
  expect_rejected([](fc_kvcache_args& a) { a.heads_k = 3; }, "heads_k");
  expect_rejected([](fc_kvcache_args& a) { a.heads_k = 8; }, "heads_k");
  expect_rejected([](fc_kvcache_args& a) { a.heads_k = 0; }, "heads_k");
  expect_rejected([](fc_kvcache_args& a) { a.heads = 0; }, "heads");
}

TEST_F(KvcacheValidation, ScaleSoftcapAndMaskOptions) {
  expect_rejected([](fc_kvcache_args& a) { a.softmax_scale = NAN; }, "softmax_scale");
  expect_rejected([](fc_kvcache_args& a) { a.softmax_scale = INFINITY; }, "softmax_scale");
  expect_rejected([](fc_kvcache_args& a) { a.softcap = -1.0f; }, "softcap");
  expect_rejected([](fc_kvcache_args& a) { a.softcap = NAN; }, "softcap");
  expect_rejected([](fc_kvcache_args& a) { a.causal = 2; }, "causal");
  expect_rejected([](fc_kvcache_args& a) { a.causal = -1; }, "causal");
  expect_rejected([](fc_kvcache_args& a) { a.window_left = -2; }, "window_left");
  expect_rejected([](fc_kvcache_args& a) { a.window_right = -7; }, "window_right");
}

TEST_F(KvcacheValidation, FlagsAreZeroOrOne) {
  expect_rejected([](fc_kvcache_args& a) { a.debug_checks = 2; }, "debug_checks");
  expect_rejected([](fc_kvcache_args& a) { a.debug_checks = -1; }, "debug_checks");
  expect_rejected([](fc_kvcache_args& a) { a.rotary_interleaved = 2; }, "rotary_interleaved");
  expect_rejected([](fc_kvcache_args& a) { a.rotary_interleaved = -1; }, "rotary_interleaved");
}

TEST_F(KvcacheValidation, NumSplitsRangeAndFamily) {
  expect_rejected([](fc_kvcache_args& a) { a.num_splits = -1; }, "num_splits");
  expect_rejected([](fc_kvcache_args& a) { a.num_splits = FC_KVCACHE_MAX_SPLITS + 1; },
                  "num_splits");
  for (int32_t splits : {0, 1, 3, FC_KVCACHE_MAX_SPLITS}) {
    fc_kvcache_args a = args_;
    a.num_splits = splits;
    expect_valid(a, "num_splits in range");
  }
  expect_rejected([](fc_kvcache_args& a) { a.family = 70; }, "family");
  expect_rejected([](fc_kvcache_args& a) { a.family = 1; }, "family");
}

TEST_F(KvcacheValidation, PagedCacheLayout) {
  for (int64_t page : {0, 8, 24, 40, 100})
    expect_rejected(
        paged_, [page](fc_kvcache_args& a) { a.seqlen_cache = page; }, "seqlen_cache");
  for (int64_t page : {16, 32, 48, 256}) {
    fc_kvcache_args a = paged_;
    a.seqlen_cache = page;
    a.k_cache.batch_stride = a.v_cache.batch_stride = page * Hk * D;
    expect_valid(a, "page size a multiple of 16");
  }
  static int32_t batch_idx[4] = {0, 1, 2, 3};
  expect_rejected(
      paged_, [](fc_kvcache_args& a) { a.cache_batch_idx = batch_idx; }, "cache_batch_idx");
  expect_rejected(
      paged_, [](fc_kvcache_args& a) { a.block_table_stride = kPagesPerSequence - 1; },
      "block_table_stride");
  expect_rejected(
      paged_, [](fc_kvcache_args& a) { a.pages_per_sequence = 0; }, "pages_per_sequence");
  // One sequence has no second row of the block table: its stride is not used.
  fc_kvcache_args one = paged_;
  one.batch = 1;
  one.block_table_stride = 0;
  expect_valid(one, "batch 1, block_table_stride 0");
}

TEST_F(KvcacheValidation, DenseCacheRows) {
  expect_rejected([](fc_kvcache_args& a) { a.batch_cache = B - 1; }, "batch_cache");
  // With cache_batch_idx any number of cache rows may serve the batch.
  static int32_t batch_idx[4] = {0, 0, 0, 0};
  fc_kvcache_args a = args_;
  a.batch_cache = 1;
  a.cache_batch_idx = batch_idx;
  expect_valid(a, "batch_cache 1 with cache_batch_idx");
}

// Without cache_seqlens the host knows every length: the new tokens must fit. (With the array,
// only debug_checks can tell; see the GPU suite.)
TEST_F(KvcacheValidation, ScalarCacheSeqlenMustLeaveRoomForTheNewTokens) {
  auto scalar = [](int64_t seqlen) {
    return [seqlen](fc_kvcache_args& a) {
      a.cache_seqlens = nullptr;
      a.cache_seqlen = seqlen;
    };
  };
  expect_rejected(scalar(kCacheSlots - kNew + 1), "cache_seqlen");
  expect_rejected(paged_, scalar(kPagesPerSequence * kPageSize - kNew + 1), "cache_seqlen");
  fc_kvcache_args a = args_;
  scalar(kCacheSlots - kNew)(a);
  expect_valid(a, "a full dense cache");
  a = paged_;
  scalar(kPagesPerSequence * kPageSize - kNew)(a);
  expect_valid(a, "a full paged cache");
  a = args_;
  a.cache_seqlen = kCacheSlots * 100;  // ignored: cache_seqlens is given
  expect_valid(a, "cache_seqlen ignored with cache_seqlens");
}

TEST_F(KvcacheValidation, NewTokens) {
  expect_rejected([](fc_kvcache_args& a) { a.v_new.data = nullptr; }, "k_new and v_new");
  expect_rejected([](fc_kvcache_args& a) { a.k_new.data = nullptr; }, "v_new");
  expect_rejected(
      [](fc_kvcache_args& a) {
        a.k_new.data = a.v_new.data = nullptr;
        a.rotary_cos = a.rotary_sin = nullptr;
        a.rotary_dim = 0;
      },
      "seqlen_new");
}

TEST_F(KvcacheValidation, Rotary) {
  expect_rejected([](fc_kvcache_args& a) { a.rotary_sin = nullptr; }, "rotary_sin");
  expect_rejected([](fc_kvcache_args& a) { a.rotary_cos = nullptr; }, "rotary_cos");
  for (int64_t bad : {int64_t{0}, int64_t{31}, int64_t{1}, D + 2, D + 8})
    expect_rejected([bad](fc_kvcache_args& a) { a.rotary_dim = bad; }, "rotary_dim");
  expect_rejected(
      [](fc_kvcache_args& a) {
        a.rotary_cos = a.rotary_sin = nullptr;  // rotary_dim stays set
      },
      "rotary_dim");
  expect_rejected([](fc_kvcache_args& a) { a.rotary_seqlen = 0; }, "rotary_seqlen");
  fc_kvcache_args a = args_;
  a.rotary_dim = D;
  expect_valid(a, "rotary_dim == head_dim");
  a.rotary_dim = 2;
  expect_valid(a, "rotary_dim 2");
}

TEST_F(KvcacheValidation, PackedQueriesTakeNoNewTokensNorRotary) {
  expect_rejected(
      [this](fc_kvcache_args& a) {
        a.cu_seqlens_q = aligned(cu_q_.data());
        a.total_q = B * S;
        a.rotary_cos = a.rotary_sin = nullptr;
        a.rotary_dim = 0;
      },
      "cu_seqlens_q");
  expect_rejected(
      [this](fc_kvcache_args& a) {
        a.cu_seqlens_q = aligned(cu_q_.data());
        a.total_q = B * S;
        a.k_new = a.v_new = fc_tensor{};
        a.seqlen_new = 0;
      },
      "cu_seqlens_q");
}

TEST_F(KvcacheValidation, PointersAndStrides) {
  auto shift = [](fc_tensor& t) { t.data = static_cast<char*>(t.data) + 2; };
  expect_rejected([&](fc_kvcache_args& a) { shift(a.q); }, "q: ");
  expect_rejected([&](fc_kvcache_args& a) { shift(a.o); }, "o: ");
  expect_rejected([&](fc_kvcache_args& a) { shift(a.k_cache); }, "k_cache: ");
  expect_rejected([&](fc_kvcache_args& a) { shift(a.v_cache); }, "v_cache: ");
  expect_rejected([&](fc_kvcache_args& a) { shift(a.k_new); }, "k_new: ");
  expect_rejected([&](fc_kvcache_args& a) { shift(a.v_new); }, "v_new: ");
  expect_rejected(
      paged_, [&](fc_kvcache_args& a) { shift(a.k_cache); }, "k_cache: ");
  expect_rejected(
      packed_, [&](fc_kvcache_args& a) { shift(a.q); }, "q: ");
  expect_rejected([](fc_kvcache_args& a) { a.q.data = nullptr; }, "q: ");
  expect_rejected([](fc_kvcache_args& a) { a.o.data = nullptr; }, "o: ");
  expect_rejected([](fc_kvcache_args& a) { a.k_cache.data = nullptr; }, "k_cache: ");
  expect_rejected([](fc_kvcache_args& a) { a.v_cache.data = nullptr; }, "v_cache: ");
  expect_rejected([](fc_kvcache_args& a) { a.q.seq_stride = 3; }, "q.seq_stride");
  expect_rejected([](fc_kvcache_args& a) { a.o.head_stride = D + 4; }, "o.head_stride");
  expect_rejected([](fc_kvcache_args& a) { a.o.batch_stride = -S * H * D; }, "o.batch_stride");
  expect_rejected([](fc_kvcache_args& a) { a.k_cache.seq_stride = Hk * D + 4; },
                  "k_cache.seq_stride");
  expect_rejected([](fc_kvcache_args& a) { a.v_cache.head_stride = 12; }, "v_cache.head_stride");
  expect_rejected([](fc_kvcache_args& a) { a.k_cache.batch_stride = 6; }, "k_cache.batch_stride");
  expect_rejected(
      paged_, [](fc_kvcache_args& a) { a.v_cache.batch_stride = -8; }, "v_cache.batch_stride");
  expect_rejected([](fc_kvcache_args& a) { a.k_new.batch_stride = -8; }, "k_new.batch_stride");
  expect_rejected([](fc_kvcache_args& a) { a.v_new.seq_stride = 2; }, "v_new.seq_stride");
  expect_rejected(
      packed_, [](fc_kvcache_args& a) { a.o.seq_stride = H * D + 1; }, "o.seq_stride");
  expect_rejected(
      [](fc_kvcache_args& a) {
        a.softmax_lse = reinterpret_cast<float*>(reinterpret_cast<char*>(a.softmax_lse) + 2);
      },
      "softmax_lse");
  // Strides of a dimension of extent 1 are never used.
  fc_kvcache_args a = args_;
  a.seqlen_q = 1;
  a.q.seq_stride = a.o.seq_stride = 3;
  expect_valid(a, "the row stride of one query token");
}

// Empty problems succeed before any device work (so with or without a GPU), need no workspace and
// write nothing; their arguments are still checked.
TEST_F(KvcacheValidation, EmptyProblemsSucceedAndWriteNothing) {
  const std::vector<std::function<void(fc_kvcache_args&)>> changes = {
      [](fc_kvcache_args& a) { a.batch = 0; }, [](fc_kvcache_args& a) { a.heads = a.heads_k = 0; },
      [](fc_kvcache_args& a) {  // no query and nothing to append
        a.seqlen_q = 0;
        a.k_new = a.v_new = fc_tensor{};
        a.seqlen_new = 0;
      },
      [](fc_kvcache_args& a) {  // nothing at all: the pointers may be null
        a.batch = 0;
        a.q = a.o = a.k_cache = a.v_cache = a.k_new = a.v_new = fc_tensor{};
        a.seqlen_new = 0;
        a.softmax_lse = nullptr;
        a.cache_seqlens = nullptr;
      }};
  for (const fc_kvcache_args& base : {args_, paged_, packed_}) {
    for (const auto& change : changes) {
      fc_kvcache_args a = base;
      change(a);
      uint64_t bytes = 12345;
      ASSERT_EQ(fc_kvcache_workspace_size(&a, &bytes), FC_OK) << fc_last_error();
      EXPECT_EQ(bytes, 0u);
      const std::vector<uint16_t> o = o_, k_cache = k_cache_, v_cache = v_cache_;
      const std::vector<float> lse = lse_;
      EXPECT_EQ(fc_kvcache(&a), FC_OK) << fc_last_error();
      EXPECT_TRUE(kvcache(a).ok());
      EXPECT_EQ(o_, o);
      EXPECT_EQ(k_cache_, k_cache);
      EXPECT_EQ(v_cache_, v_cache);
      EXPECT_EQ(std::memcmp(lse_.data(), lse.data(), lse_.size() * 4), 0);
    }
  }
  fc_kvcache_args a = args_;
  a.batch = 0;
  a.dtype = 7;
  uint64_t bytes = 0;
  EXPECT_EQ(fc_kvcache_workspace_size(&a, &bytes), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("dtype"), std::string::npos) << fc_last_error();
  a = args_;
  a.heads = a.heads_k = 0;
  a.head_dim = 12;
  EXPECT_EQ(fc_kvcache(&a), FC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fc_last_error()).find("head_dim"), std::string::npos) << fc_last_error();
}

// What validation hands the kernels: the cache's geometry and the options in kernel form.
TEST_F(KvcacheValidation, FillsDecodeParams) {
  DecodeParams p{};
  ASSERT_TRUE(validate_kvcache_arguments(args_, p).ok());
  EXPECT_EQ(kvcache_capacity(args_), kCacheSlots);
  EXPECT_EQ(p.seqlen_k, kCacheSlots);
  EXPECT_EQ(p.page_size, kCacheSlots);
  EXPECT_EQ(p.block_table, nullptr);
  EXPECT_EQ(p.batch_cache, kCacheRows);
  EXPECT_EQ(p.heads_per_kv_head, H / Hk);
  EXPECT_TRUE(p.pack_gqa);
  EXPECT_TRUE(p.bottom_right);
  EXPECT_EQ(p.total_q, B * S);
  EXPECT_EQ(p.lse_batch_stride, H * S);
  EXPECT_EQ(p.lse_head_stride, S);
  EXPECT_EQ(p.seqlen_new, kNew);
  EXPECT_EQ(p.k_new, args_.k_new.data);
  EXPECT_EQ(p.rotary_dim, kRotaryDim);
  EXPECT_FALSE(p.rotary_per_token);  // neither causal nor windowed: one position per sequence
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, -1);
  EXPECT_EQ(p.num_splits, 1);
  EXPECT_EQ(p.contract_status, nullptr);
  EXPECT_EQ(p.q_rotated, nullptr);

  fc_kvcache_args a = args_;
  a.causal = 1;
  a.alibi_slopes = aligned(lse_.data());
  ASSERT_TRUE(validate_kvcache_arguments(a, p).ok());
  EXPECT_EQ(p.window_right, 0);
  EXPECT_TRUE(p.rotary_per_token);
  EXPECT_FALSE(p.pack_gqa) << "ALiBi gives each head its own bias";
  a = args_;
  a.window_left = 5;
  a.window_right = S + kCacheSlots;  // wider than anything: no bound
  ASSERT_TRUE(validate_kvcache_arguments(a, p).ok());
  EXPECT_EQ(p.window_left, 5);
  EXPECT_EQ(p.window_right, -1);
  EXPECT_TRUE(p.rotary_per_token);
  a = args_;
  a.k_new = a.v_new = fc_tensor{};
  a.seqlen_new = 0;
  ASSERT_TRUE(validate_kvcache_arguments(a, p).ok());
  EXPECT_EQ(p.k_new, nullptr);
  EXPECT_EQ(p.v_new, nullptr);

  ASSERT_TRUE(validate_kvcache_arguments(paged_, p).ok());
  EXPECT_EQ(kvcache_capacity(paged_), kPagesPerSequence * kPageSize);
  EXPECT_EQ(p.seqlen_k, kPagesPerSequence * kPageSize);
  EXPECT_EQ(p.page_size, kPageSize);
  EXPECT_EQ(p.pages_per_sequence, kPagesPerSequence);
  EXPECT_EQ(p.block_table_stride, kPagesPerSequence);
  EXPECT_EQ(p.batch_cache, kPages);

  ASSERT_TRUE(validate_kvcache_arguments(packed_, p).ok());
  EXPECT_EQ(p.total_q, B * S);
  EXPECT_EQ(p.lse_batch_stride, 0);
  EXPECT_EQ(p.lse_head_stride, B * S);
  EXPECT_EQ(p.cu_seqlens_q, packed_.cu_seqlens_q);
  EXPECT_EQ(p.rotary_dim, 0);
}

// Host buffers pass validation but must never be launched on: without a GPU the call fails with a
// CUDA error, with one it is rejected as not device memory. Appending with no query is work too.
TEST_F(KvcacheValidation, HostMemoryIsNotAccepted) {
  fc_kvcache_args append_only = args_;
  append_only.seqlen_q = 0;
  for (const fc_kvcache_args& a : {args_, paged_, packed_, append_only}) {
    const std::vector<uint16_t> o = o_, k_cache = k_cache_, v_cache = v_cache_;
    const fc_status status = fc_kvcache(&a);
    EXPECT_TRUE(status == FC_ERROR_INVALID_ARGUMENT || status == FC_ERROR_CUDA) << fc_last_error();
    EXPECT_TRUE(is_device_lookup_message(fc_last_error())) << fc_last_error();
    EXPECT_EQ(o_, o);
    EXPECT_EQ(k_cache_, k_cache);
    EXPECT_EQ(v_cache_, v_cache);
  }
}

}  // namespace
}  // namespace flashcute

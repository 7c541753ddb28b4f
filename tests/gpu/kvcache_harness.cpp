#include "kvcache_harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "reference/compare.hpp"
#include "reference/cpu_reference.hpp"
#include "reference/host_data.hpp"
#include "reference/poison.hpp"

namespace flashcute {
namespace testing {
namespace {

constexpr double kTwoPi = 6.283185307179586;

std::vector<float> values(size_t n, Data data, fc_dtype dtype) {
  const ref::InputMode mode =
      data == Data::kScaledUp ? ref::InputMode::kScaledUp : ref::InputMode::kNormal;
  return ref::random_inputs(n, mode, dtype, ref::fresh_seed());
}

std::unique_ptr<DeviceBuffer> upload(const void* host, size_t bytes) {
  auto buffer = std::make_unique<DeviceBuffer>(bytes);
  if (bytes > 0) cuda_ok(cudaMemcpy(buffer->get(), host, bytes, cudaMemcpyHostToDevice), "upload");
  return buffer;
}

std::unique_ptr<DeviceBuffer> upload_bits(const std::vector<float>& v, fc_dtype dtype) {
  const std::vector<uint16_t> bits = ref::to_bits(v, dtype);
  return upload(bits.data(), bits.size() * 2);
}

void copy_to(DeviceBuffer& buffer, const void* host, size_t bytes) {
  if (bytes > 0) cuda_ok(cudaMemcpy(buffer.get(), host, bytes, cudaMemcpyHostToDevice), "upload");
}

template <typename T>
std::vector<T> download(const DeviceBuffer& buffer, size_t n) {
  std::vector<T> host(n);
  if (n > 0)
    cuda_ok(cudaMemcpy(host.data(), buffer.get(), n * sizeof(T), cudaMemcpyDeviceToHost),
            "download");
  return host;
}

bool per_token_rotary(const KvCase& c) {
  return c.causal || c.window_left >= 0 || c.window_right >= 0;
}

// Rotary embedding as flashcute.h defines it, in double, rounded once to dtype: the first
// rotary_dim columns turn in pairs (2j, 2j + 1) when interleaved, else (j, j + rotary_dim / 2), by
// the angle whose cosine and sine are cos[j] and sin[j]; the rest are copied.
void rotate(const float* x, float* y, const KvCase& c, const float* cos, const float* sin) {
  const int half = c.rotary_dim / 2;
  for (int d = 0; d < c.head_dim; ++d) y[d] = x[d];
  for (int j = 0; j < half; ++j) {
    const int a = c.rotary_interleaved ? 2 * j : j;
    const int b = c.rotary_interleaved ? 2 * j + 1 : j + half;
    const double xa = x[a], xb = x[b], cs = cos[j], sn = sin[j];
    y[a] = ref::from_bits(ref::to_bits(float(xa * cs - xb * sn), c.dtype), c.dtype);
    y[b] = ref::from_bits(ref::to_bits(float(xb * cs + xa * sn), c.dtype), c.dtype);
  }
}

// The rotary position of token i of sequence b: its slot, left padding included (flashcute.h:
// seqlen_b + i).
int rotary_position(const KvInputs& in, int b, int i) { return in.seqlens[b] + i; }

const char* layout_name(const KvCase& c) {
  switch (c.layout) {
    case CacheLayout::kDense:
      return "dense";
    case CacheLayout::kDenseBatchIdx:
      return "dense+batch_idx";
    case CacheLayout::kPaged:
      return "paged";
  }
  return "?";
}

bool same_value(uint16_t a, uint16_t b, bool loose, fc_dtype dtype) {
  if (a == b) return true;
  if (!loose) return false;
  const double x = ref::from_bits(a, dtype), y = ref::from_bits(b, dtype);
  if (!std::isfinite(x) || !std::isfinite(y)) return false;
  return std::fabs(x - y) <= ref::ulp_at(std::max(std::fabs(x), std::fabs(y)), dtype);
}

::testing::AssertionResult cache_equals(const char* name, const std::vector<uint16_t>& got,
                                        const std::vector<uint16_t>& want,
                                        const std::vector<char>* loose, fc_dtype dtype) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << name << ": size " << got.size() << " != " << want.size();
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!same_value(got[i], want[i], loose != nullptr && (*loose)[i] != 0, dtype)) {
      if (wrong++ == 0) first = i;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  char line[200];
  std::snprintf(line, sizeof(line),
                "%s: %zu elements differ; the first at %zu: 0x%04x, expected 0x%04x", name, wrong,
                first, unsigned(got[first]), unsigned(want[first]));
  return ::testing::AssertionFailure() << line;
}

}  // namespace

std::string KvCase::describe() const {
  std::ostringstream s;
  s << (dtype == FC_FLOAT16 ? "fp16" : "bf16") << " b" << batch() << " sq" << seqlen_q << " h"
    << heads << "/" << heads_k << " d" << head_dim << " " << layout_name(*this);
  if (paged()) s << page_size;
  if (cache_head_major) s << " head-major";
  s << " cache_seqlens{";
  for (size_t b = 0; b < cache_seqlens.size(); ++b) s << (b ? "," : "") << cache_seqlens[b];
  s << "}" << (seqlens_array ? "" : " scalar");
  if (packed()) {
    s << " packed q{";
    for (size_t b = 0; b < q_lengths.size(); ++b) s << (b ? "," : "") << q_lengths[b];
    s << "}";
  }
  if (leftpad != Leftpad::kNone) s << (leftpad == Leftpad::kAll ? " leftpad=all" : " leftpad");
  if (seqlen_new > 0) s << " new " << seqlen_new;
  if (rotary_dim > 0)
    s << " rotary " << rotary_dim << (rotary_interleaved ? " interleaved" : " half");
  if (causal) s << " causal";
  if (window_left >= 0 || window_right >= 0)
    s << " window(" << window_left << "," << window_right << ")";
  if (softcap > 0) s << " softcap " << softcap;
  if (alibi != Alibi::kNone) s << (alibi == Alibi::kPerHead ? " alibi" : " alibi per batch-head");
  if (softmax_scale != 0) s << " scale " << softmax_scale;
  if (data == Data::kScaledUp) s << " scaled-up";
  if (!lse) s << " no-lse";
  return s.str();
}

std::string KvRun::describe() const {
  std::ostringstream s;
  s << "splits " << (num_splits == 0 ? std::string("auto") : std::to_string(num_splits));
  if (debug_checks) s << " debug_checks";
  if (family != FC_FAMILY_AUTO) s << " family " << family;
  return s.str();
}

int64_t KvInputs::lse_index(int b, int i, int h) const {
  if (c.packed()) return int64_t(h) * tokens + cu_q[b] + i;
  return (int64_t(b) * c.heads + h) * c.seqlen_q + i;
}

int64_t KvInputs::cache_offset(int b, int slot, int h) const {
  int64_t page = 0, row = slot;
  if (c.paged()) {
    page = block_table[int64_t(b) * table_stride + slot / row_slots];
    row = slot % row_slots;
  } else {
    page = c.layout == CacheLayout::kDenseBatchIdx ? batch_idx[b] : b;
  }
  return page * page_stride + row * slot_stride + h * head_stride;
}

std::unique_ptr<KvInputs> make_kv_inputs(const KvCase& c) {
  auto in = std::make_unique<KvInputs>();
  in->c = c;
  const int B = c.batch(), H = c.heads, Hk = c.heads_k, D = c.head_dim;
  EXPECT_TRUE(!c.packed() || int(c.q_lengths.size()) == B);
  int need = 1;
  for (int l : c.cache_seqlens) need = std::max(need, l + c.seqlen_new);
  std::mt19937 rng(uint32_t(ref::fresh_seed()));

  // The cache: dense rows (one spare, or twice the batch and one with cache_batch_idx), or pages
  // (one spare page, which padding entries of the block table point at).
  if (c.paged()) {
    const int wanted = c.capacity > 0 ? c.capacity : need + 1;
    in->row_slots = c.page_size;
    in->pages_per_sequence = (wanted + c.page_size - 1) / c.page_size;
    in->capacity = in->pages_per_sequence * c.page_size;
    in->table_stride = in->pages_per_sequence + 1;
    in->batch_cache = B * in->pages_per_sequence + 2;
    std::vector<int32_t> pages(in->batch_cache);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    const int32_t spare = pages.back();
    in->block_table.assign(size_t(std::max(B, 1)) * in->table_stride, spare);
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < in->pages_per_sequence; ++j)
        in->block_table[b * in->table_stride + j] = pages[b * in->pages_per_sequence + j];
  } else {
    in->capacity = c.capacity > 0 ? c.capacity : need + 5;
    in->row_slots = in->capacity;
    if (c.layout == CacheLayout::kDenseBatchIdx) {
      in->batch_cache = 2 * B + 1;
      std::vector<int32_t> rows(in->batch_cache);
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), rng);
      in->batch_idx.assign(rows.begin(), rows.begin() + B);
    } else {
      in->batch_cache = B + 1;
    }
  }
  if (c.cache_head_major) {
    in->head_stride = int64_t(in->row_slots) * D;
    in->slot_stride = D;
  } else {
    in->head_stride = D;
    in->slot_stride = int64_t(Hk) * D;
  }
  in->page_stride = int64_t(in->row_slots) * Hk * D;
  in->cache_elements = int64_t(in->batch_cache) * in->page_stride;

  // Queries: (tokens, heads, head_dim) packed; O with 8 padding elements after each row.
  in->cu_q = {0};
  for (int b = 0; b < B; ++b) in->cu_q.push_back(in->cu_q.back() + in->q_length(b));
  in->tokens = in->cu_q.back();
  in->o_row_stride = int64_t(H) * D + 8;
  in->o_span = in->tokens * in->o_row_stride;

  in->q = values(in->tokens * H * D, c.data, c.dtype);
  in->k_new = values(int64_t(B) * c.seqlen_new * Hk * D, c.data, c.dtype);
  in->v_new = values(int64_t(B) * c.seqlen_new * Hk * D, Data::kNormal, c.dtype);
  in->k_values = ref::to_bits(values(in->cache_elements, c.data, c.dtype), c.dtype);
  in->v_values = ref::to_bits(values(in->cache_elements, Data::kNormal, c.dtype), c.dtype);
  if (c.rotary_dim > 0) {
    in->rotary_seqlen = in->capacity + std::max(c.seqlen_q, c.seqlen_new) + 1;
    const size_t n = size_t(in->rotary_seqlen) * (c.rotary_dim / 2);
    std::uniform_real_distribution<double> angle(0.0, kTwoPi);
    in->cos.resize(n);
    in->sin.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const double a = angle(rng);
      in->cos[i] = ref::from_bits(ref::to_bits(float(std::cos(a)), c.dtype), c.dtype);
      in->sin[i] = ref::from_bits(ref::to_bits(float(std::sin(a)), c.dtype), c.dtype);
    }
    in->cos_dev = upload_bits(in->cos, c.dtype);
    in->sin_dev = upload_bits(in->sin, c.dtype);
  }
  if (c.alibi != Alibi::kNone) {
    in->slopes = random_slopes(c.alibi == Alibi::kPerBatchHead ? size_t(B) * H : size_t(H));
    in->slopes_dev = upload(in->slopes.data(), in->slopes.size() * 4);
  }

  in->q_dev = upload_bits(in->q, c.dtype);
  in->k_new_dev = upload_bits(in->k_new, c.dtype);
  in->v_new_dev = upload_bits(in->v_new, c.dtype);
  in->k_cache_dev = std::make_unique<DeviceBuffer>(in->cache_elements * 2);
  in->v_cache_dev = std::make_unique<DeviceBuffer>(in->cache_elements * 2);
  in->seqlens_dev = std::make_unique<DeviceBuffer>(size_t(B) * 4);
  in->leftpad_dev = std::make_unique<DeviceBuffer>(size_t(B) * 4);
  if (!in->batch_idx.empty()) in->batch_idx_dev = upload(in->batch_idx.data(), size_t(B) * 4);
  if (c.paged()) in->table_dev = upload(in->block_table.data(), in->block_table.size() * 4);
  if (c.packed()) in->cu_q_dev = upload(in->cu_q.data(), in->cu_q.size() * 4);
  set_cache_seqlens(*in, c.cache_seqlens);
  return in;
}

void set_cache_seqlens(KvInputs& in, const std::vector<int>& lengths) {
  const KvCase& c = in.c;
  const int B = c.batch(), H = c.heads, Hk = c.heads_k, D = c.head_dim;
  EXPECT_EQ(int(lengths.size()), B);
  in.seqlens.assign(lengths.begin(), lengths.end());
  in.leftpads.assign(B, 0);
  for (int b = 0; b < B; ++b) {
    EXPECT_LE(in.seqlens[b] + c.seqlen_new, in.capacity) << "sequence " << b << " overflows";
    if (c.leftpad == Leftpad::kThird) in.leftpads[b] = in.seqlens[b] / 3;
    if (c.leftpad == Leftpad::kAll) in.leftpads[b] = in.seqlens[b];
  }
  copy_to(*in.seqlens_dev, in.seqlens.data(), size_t(B) * 4);
  copy_to(*in.leftpad_dev, in.leftpads.data(), size_t(B) * 4);

  // The caches: the random values in the live slots [leftpad, seqlen), NaN elsewhere.
  in.k_before.assign(in.cache_elements, ref::kPoison16);
  in.v_before.assign(in.cache_elements, ref::kPoison16);
  for (int b = 0; b < B; ++b)
    for (int slot = in.leftpads[b]; slot < in.seqlens[b]; ++slot)
      for (int h = 0; h < Hk; ++h) {
        const int64_t at = in.cache_offset(b, slot, h);
        std::copy_n(in.k_values.begin() + at, D, in.k_before.begin() + at);
        std::copy_n(in.v_values.begin() + at, D, in.v_before.begin() + at);
      }

  // The append: new token i at slot seqlen + i, its key rotated at its position.
  in.k_after = in.k_before;
  in.v_after = in.v_before;
  in.k_rotated.assign(in.cache_elements, 0);
  std::vector<float> rotated(D);
  const int half = c.rotary_dim / 2;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < c.seqlen_new; ++i)
      for (int h = 0; h < Hk; ++h) {
        const int64_t src = ((int64_t(b) * c.seqlen_new + i) * Hk + h) * D;
        const int64_t at = in.cache_offset(b, in.seqlens[b] + i, h);
        const float* k = in.k_new.data() + src;
        if (c.rotary_dim > 0) {
          const int64_t pos = rotary_position(in, b, i);
          rotate(k, rotated.data(), c, in.cos.data() + pos * half, in.sin.data() + pos * half);
          k = rotated.data();
          std::fill_n(in.k_rotated.begin() + at, c.rotary_dim, 1);
        }
        for (int d = 0; d < D; ++d) {
          in.k_after[at + d] = ref::to_bits(k[d], c.dtype);
          in.v_after[at + d] = ref::to_bits(in.v_new[src + d], c.dtype);
        }
      }

  // The reference: per sequence, the queries (rotated) against the keys it sees, cache slots
  // [leftpad, seqlen + seqlen_new) after the append, as a variable-length forward problem with
  // bottom-right masks.
  ref::Problem p;
  p.batch = B;
  p.heads = H;
  p.heads_k = Hk;
  p.head_dim = D;
  p.cu_seqlens_q = in.cu_q;
  p.cu_seqlens_k = {0};
  for (int b = 0; b < B; ++b)
    p.cu_seqlens_k.push_back(p.cu_seqlens_k.back() + in.seqlens[b] + c.seqlen_new - in.leftpads[b]);
  for (int b = 0; b < B; ++b) {
    p.seqlen_q = std::max(p.seqlen_q, p.seq_q(b));
    p.seqlen_k = std::max(p.seqlen_k, p.seq_k(b));
  }
  p.softmax_scale = c.softmax_scale != 0 ? c.softmax_scale : float(1.0 / std::sqrt(double(D)));
  p.causal = c.causal;
  p.bottom_right = true;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  p.alibi_slopes = in.slopes;
  p.alibi_batch_stride = c.alibi == Alibi::kPerBatchHead ? H : 0;

  std::vector<float> q = in.q;
  if (c.rotary_dim > 0) {
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < in.q_length(b); ++i) {
        const int64_t pos = rotary_position(in, b, per_token_rotary(c) ? i : 0);
        for (int h = 0; h < H; ++h) {
          float* row = q.data() + ((in.q_token0(b) + i) * H + h) * D;
          rotate(row, rotated.data(), c, in.cos.data() + pos * half, in.sin.data() + pos * half);
          std::copy(rotated.begin(), rotated.end(), row);
        }
      }
  }
  const int64_t keys = p.cu_seqlens_k.back();
  std::vector<float> k(keys * Hk * D), v(keys * Hk * D);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < p.seq_k(b); ++j)
      for (int h = 0; h < Hk; ++h) {
        const int64_t at = in.cache_offset(b, in.leftpads[b] + j, h);
        const int64_t to = ((p.cu_seqlens_k[b] + j) * Hk + h) * D;
        for (int d = 0; d < D; ++d) {
          k[to + d] = ref::from_bits(in.k_after[at + d], c.dtype);
          v[to + d] = ref::from_bits(in.v_after[at + d], c.dtype);
        }
      }
  const ref::CpuOutput r = ref::cpu_reference(p, {q.data(), ref::Layout{0, int64_t(H) * D, D}},
                                              {k.data(), ref::Layout{0, int64_t(Hk) * D, D}},
                                              {v.data(), ref::Layout{0, int64_t(Hk) * D, D}});
  in.ref_o = r.o;
  in.ref_lse.assign(in.tokens * H, 0.0);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < in.q_length(b); ++i)
      for (int h = 0; h < H; ++h) in.ref_lse[in.lse_index(b, i, h)] = r.lse[p.lse_index(b, i, h)];
}

fc_kvcache_args kvcache_args(const KvInputs& in, const KvOutputs& out, const KvRun& run) {
  const KvCase& c = in.c;
  const int64_t H = c.heads, Hk = c.heads_k, D = c.head_dim;
  fc_kvcache_args a;
  fc_kvcache_args_init(&a);
  a.dtype = c.dtype;
  a.batch = c.batch();
  a.seqlen_q = c.seqlen_q;
  a.heads = H;
  a.heads_k = Hk;
  a.head_dim = D;
  a.q = fc_tensor{in.q_dev->get(), c.seqlen_q * H * D, H * D, D};
  a.o = fc_tensor{out.o->get() + 2 * kGuard, c.seqlen_q * in.o_row_stride, in.o_row_stride, D};
  a.k_cache = fc_tensor{in.k_cache_dev->get(), in.page_stride, in.slot_stride, in.head_stride};
  a.v_cache = a.k_cache;
  a.v_cache.data = in.v_cache_dev->get();
  if (c.packed()) {
    a.cu_seqlens_q = reinterpret_cast<const int32_t*>(in.cu_q_dev->get());
    a.total_q = in.tokens;
    a.q.batch_stride = a.o.batch_stride = 0;
  }
  if (c.seqlen_new > 0) {
    a.k_new = fc_tensor{in.k_new_dev->get(), c.seqlen_new * Hk * D, Hk * D, D};
    a.v_new = fc_tensor{in.v_new_dev->get(), c.seqlen_new * Hk * D, Hk * D, D};
    a.seqlen_new = c.seqlen_new;
  }
  a.batch_cache = in.batch_cache;
  a.seqlen_cache = in.row_slots;
  if (c.seqlens_array) {
    a.cache_seqlens = reinterpret_cast<const int32_t*>(in.seqlens_dev->get());
  } else {
    a.cache_seqlen = in.seqlens.empty() ? 0 : in.seqlens[0];
  }
  if (c.leftpad != Leftpad::kNone)
    a.cache_leftpad = reinterpret_cast<const int32_t*>(in.leftpad_dev->get());
  if (in.batch_idx_dev)
    a.cache_batch_idx = reinterpret_cast<const int32_t*>(in.batch_idx_dev->get());
  if (c.paged()) {
    a.block_table = reinterpret_cast<const int32_t*>(in.table_dev->get());
    a.block_table_stride = in.table_stride;
    a.pages_per_sequence = in.pages_per_sequence;
  }
  if (c.rotary_dim > 0) {
    a.rotary_cos = in.cos_dev->get();
    a.rotary_sin = in.sin_dev->get();
    a.rotary_dim = c.rotary_dim;
    a.rotary_seqlen = in.rotary_seqlen;
    a.rotary_interleaved = c.rotary_interleaved;
  }
  if (c.lse) a.softmax_lse = reinterpret_cast<float*>(out.lse->get()) + kGuard;
  a.softmax_scale = c.softmax_scale != 0 ? c.softmax_scale : float(1.0 / std::sqrt(double(D)));
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  if (in.slopes_dev) {
    a.alibi_slopes = reinterpret_cast<const float*>(in.slopes_dev->get());
    a.alibi_batch_stride = c.alibi == Alibi::kPerBatchHead ? H : 0;
  }
  a.num_splits = run.num_splits;
  a.debug_checks = run.debug_checks;
  a.family = run.family;
  a.workspace = out.workspace_bytes > 0 ? out.workspace->get() : nullptr;
  a.workspace_bytes = out.workspace_bytes;
  return a;
}

KvOutputs make_outputs(const KvInputs& in, const KvRun& run) {
  KvOutputs out;
  out.o = std::make_unique<DeviceBuffer>((2 * kGuard + in.o_span) * 2);
  out.lse = std::make_unique<DeviceBuffer>((2 * kGuard + in.tokens * in.c.heads) * 4);
  out.workspace = std::make_unique<DeviceBuffer>(16);
  const fc_kvcache_args a = kvcache_args(in, out, run);
  uint64_t bytes = 0;
  const fc_status status = fc_kvcache_workspace_size(&a, &bytes);
  // A build without this head_dim's kernel refuses here already; the call will say so again.
  EXPECT_TRUE(status == FC_OK || status == FC_ERROR_UNSUPPORTED) << fc_last_error();
  if (status == FC_OK && bytes > 0) {
    out.workspace = std::make_unique<DeviceBuffer>(bytes);
    out.workspace_bytes = bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(out.workspace->get()) % 256, 0u);
  }
  return out;
}

void reset(const KvInputs& in, const KvOutputs& out) {
  copy_to(*in.k_cache_dev, in.k_before.data(), in.k_before.size() * 2);
  copy_to(*in.v_cache_dev, in.v_before.data(), in.v_before.size() * 2);
  cuda_ok(ref::poison_device(out.o->get(), (2 * kGuard + in.o_span) * 2), "poison");
  cuda_ok(ref::poison_device(out.lse->get(), (2 * kGuard + in.tokens * in.c.heads) * 4), "poison");
  cuda_ok(ref::poison_device(out.workspace->get(), out.workspace_bytes), "poison");
}

KvOutcome collect(const KvInputs& in, const KvOutputs& out, fc_status status,
                  const std::string& message) {
  cuda_ok(cudaDeviceSynchronize(), "after fc_kvcache");
  KvOutcome r;
  r.status = status;
  r.message = message;
  r.o_raw = download<uint16_t>(*out.o, 2 * kGuard + in.o_span);
  r.lse_raw = download<float>(*out.lse, 2 * kGuard + in.tokens * in.c.heads);
  r.k_cache = download<uint16_t>(*in.k_cache_dev, in.cache_elements);
  r.v_cache = download<uint16_t>(*in.v_cache_dev, in.cache_elements);
  return r;
}

KvOutcome run_kvcache(const KvInputs& in, const KvRun& run,
                      const std::function<void(fc_kvcache_args&)>& change) {
  const KvOutputs out = make_outputs(in, run);
  reset(in, out);
  fc_kvcache_args a = kvcache_args(in, out, run);
  if (change) change(a);
  const fc_status status = fc_kvcache(&a);
  return collect(in, out, status, fc_last_error());
}

::testing::AssertionResult kv_matches(const KvInputs& in, const KvOutcome& out) {
  const KvCase& c = in.c;
  if (out.status != FC_OK)
    return ::testing::AssertionFailure() << "status " << out.status << ": " << out.message;
  const int H = c.heads, D = c.head_dim;
  // O: gather the view (rows padded apart); everything else must still be poison.
  std::vector<float> o(in.tokens * H * D);
  std::vector<char> covered(out.o_raw.size(), 0);
  for (int64_t t = 0; t < in.tokens; ++t)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) {
        const int64_t at = kGuard + t * in.o_row_stride + int64_t(h) * D + d;
        o[(t * H + h) * D + d] = ref::from_bits(out.o_raw[at], c.dtype);
        covered[at] = 1;
      }
  for (size_t i = 0; i < out.o_raw.size(); ++i)
    if (!covered[i] && out.o_raw[i] != ref::kPoison16)
      return ::testing::AssertionFailure() << "O element at offset " << int64_t(i) - kGuard
                                           << " lies outside the view but was written";
  const ref::Comparison oc = ref::compare_output(o.data(), in.ref_o.data(), o.size(), c.dtype,
                                                 ref::default_tolerance(c.dtype));
  if (!oc.pass) return ::testing::AssertionFailure() << "O " << oc.summary();
  const int64_t n = in.tokens * H;
  for (int64_t i = 0; i < int64_t(out.lse_raw.size()); ++i) {
    const bool inside = c.lse && i >= kGuard && i < kGuard + n;
    uint32_t bits;
    std::memcpy(&bits, &out.lse_raw[i], 4);
    if (!inside && bits != ref::kPoison32)
      return ::testing::AssertionFailure() << "LSE element " << i - kGuard << " was written";
  }
  if (c.lse) {
    const ref::Comparison lc = ref::compare_lse(out.lse_raw.data() + kGuard, in.ref_lse.data(), n);
    if (!lc.pass) return ::testing::AssertionFailure() << "LSE " << lc.summary();
  }
  ::testing::AssertionResult k =
      cache_equals("k_cache", out.k_cache, in.k_after, &in.k_rotated, c.dtype);
  if (!k) return k;
  return cache_equals("v_cache", out.v_cache, in.v_after, nullptr, c.dtype);
}

::testing::AssertionResult kv_untouched(const KvInputs& in, const KvOutcome& out) {
  for (size_t i = 0; i < out.o_raw.size(); ++i)
    if (out.o_raw[i] != ref::kPoison16)
      return ::testing::AssertionFailure() << "O element " << int64_t(i) - kGuard << " was written";
  for (size_t i = 0; i < out.lse_raw.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &out.lse_raw[i], 4);
    if (bits != ref::kPoison32)
      return ::testing::AssertionFailure()
             << "LSE element " << int64_t(i) - kGuard << " was written";
  }
  ::testing::AssertionResult k =
      cache_equals("k_cache", out.k_cache, in.k_before, nullptr, in.c.dtype);
  if (!k) return k;
  return cache_equals("v_cache", out.v_cache, in.v_before, nullptr, in.c.dtype);
}

void check_kvcache(const KvInputs& in, const KvRun& run) {
  SCOPED_TRACE(in.c.describe() + " | " + run.describe());
  const KvOutcome out = run_kvcache(in, run);
  if (out.status == FC_ERROR_UNSUPPORTED &&
      out.message.find("no KV-cache kernel compiled") != std::string::npos) {
    std::printf("[ note ] %s: unsupported in this build: %s\n", in.c.describe().c_str(),
                out.message.c_str());
    EXPECT_TRUE(kv_untouched(in, out));
    return;
  }
  EXPECT_TRUE(kv_matches(in, out));
}

}  // namespace testing
}  // namespace flashcute

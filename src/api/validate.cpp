#include "api/validate.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace flashcute {
namespace {

Status invalid(const std::string& message) { return {FC_ERROR_INVALID_ARGUMENT, message}; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Strides must keep every row 16-byte aligned (8 elements of fp16/bf16) for vector loads.
// A stride of a dimension of extent 1 is never used, so it is not checked.
Status check_tensor(const char* name, const fc_tensor& t, int64_t batch, int64_t seqlen,
                    int64_t heads) {
  if (t.data == nullptr) return invalid(std::string(name) + ": data pointer is null");
  if (!aligned16(t.data))
    return invalid(std::string(name) + ": data pointer is not 16-byte aligned");
  const int64_t strides[3] = {t.batch_stride, t.seq_stride, t.head_stride};
  const int64_t extents[3] = {batch, seqlen, heads};
  const char* stride_names[3] = {"batch_stride", "seq_stride", "head_stride"};
  for (int i = 0; i < 3; ++i) {
    if (extents[i] <= 1) continue;
    if (strides[i] < 0) return invalid(std::string(name) + "." + stride_names[i] + " is negative");
    if (strides[i] % 8 != 0) {
      return invalid(std::string(name) + "." + stride_names[i] +
                     " must be a multiple of 8 elements (16-byte aligned rows)");
    }
  }
  return {};
}

// AttentionParams keeps each tensor's strides as three fields (kernels read them by name).
void copy_strides(const fc_tensor& t, int64_t& batch, int64_t& row, int64_t& head) {
  batch = t.batch_stride;
  row = t.seq_stride;
  head = t.head_stride;
}

struct NamedSize {
  const char* name;
  int64_t value;
};

// Every size is non-negative and fits the kernels' 32-bit indices.
Status check_sizes(std::initializer_list<NamedSize> sizes) {
  for (const NamedSize& s : sizes) {
    if (s.value < 0)
      return invalid(std::string(s.name) + " is negative (" + std::to_string(s.value) + ")");
    if (s.value > INT_MAX) return invalid(std::string(s.name) + " exceeds 2^31 - 1");
  }
  return {};
}

// The attention shape every entry shares: grid limits, the head_dim rule, the GQA ratio.
Status check_heads(int64_t batch, int64_t heads, int64_t heads_k, int64_t head_dim) {
  if (batch > 65535) return invalid("batch: at most 65535");
  if (heads > 65535) return invalid("heads: at most 65535");
  if (head_dim == 0 || head_dim % 8 != 0 || head_dim > 256) {
    return invalid("head_dim must be a multiple of 8 in [8, 256] (got " + std::to_string(head_dim) +
                   ")");
  }
  if (heads == 0 || heads_k == 0) {
    // Both 0 is an empty problem; one of them alone is a mistake, named as such.
    if (heads == 0 && heads_k != 0) {
      return invalid("heads: is 0 while heads_k is " + std::to_string(heads_k) +
                     " (an empty problem has both 0)");
    }
    if (heads_k == 0 && heads != 0) return invalid("heads_k: must be >= 1");
  } else if (heads % heads_k != 0) {
    return invalid("heads_k (" + std::to_string(heads_k) + ") must divide heads (" +
                   std::to_string(heads) + ")");
  }
  return {};
}

// The score and mask options every entry shares.
Status check_score_options(float softmax_scale, float softcap, int32_t causal, int64_t window_left,
                           int64_t window_right, int32_t family) {
  if (!std::isfinite(softmax_scale)) return invalid("softmax_scale must be finite");
  if (!std::isfinite(softcap) || softcap < 0) return invalid("softcap must be finite and >= 0");
  if (causal != 0 && causal != 1) return invalid("causal must be 0 or 1");
  if (window_left < -1) return invalid("window_left must be >= 0, or -1 for unbounded");
  if (window_right < -1) return invalid("window_right must be >= 0, or -1 for unbounded");
  if (family != FC_FAMILY_AUTO && family != FC_FAMILY_SM80 && family != FC_FAMILY_SM90) {
    return invalid("family must be FC_FAMILY_AUTO, FC_FAMILY_SM80 or FC_FAMILY_SM90");
  }
  return {};
}

// The tensors and shape of AttentionParams. Packed queries (cu_seqlens_q set): q and o rows are
// total_q tokens and the LSE is (heads, total_q); dense: (batch, heads, seqlen_q).
void fill_problem_params(AttentionParams& p, const fc_tensor& q, const fc_tensor& k,
                         const fc_tensor& v, const fc_tensor& o, float* lse, int64_t batch,
                         int64_t heads, int64_t heads_k, int64_t head_dim, int64_t seqlen_q,
                         int64_t seqlen_k, const int32_t* cu_seqlens_q, int64_t total_q) {
  const bool packed = cu_seqlens_q != nullptr;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = o.data;
  p.lse = lse;
  copy_strides(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  copy_strides(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  copy_strides(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  copy_strides(o, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  p.batch = int(batch);
  p.heads = int(heads);
  p.heads_k = int(heads_k);
  p.heads_per_kv_head = heads_k > 0 ? int(heads / heads_k) : 1;
  p.head_dim = int(head_dim);
  p.seqlen_q = int(seqlen_q);
  p.seqlen_k = int(seqlen_k);
  p.total_q = packed ? total_q : batch * seqlen_q;
  p.cu_seqlens_q = cu_seqlens_q;
  p.lse_head_stride = packed ? total_q : seqlen_q;
  p.lse_batch_stride = packed ? 0 : heads * seqlen_q;
}

// The score fields of AttentionParams: scale, softcap, ALiBi, and the mask with its window
// clamped (a window wider than `span`, every query and key together, is no window; causal fixes
// the right edge at the diagonal).
void fill_score_params(AttentionParams& p, float softmax_scale, float softcap, int32_t causal,
                       bool bottom_right, int64_t window_left, int64_t window_right, int64_t span,
                       const float* alibi_slopes, int64_t alibi_batch_stride) {
  p.softmax_scale = softmax_scale;
  p.scale_log2 = softmax_scale * 1.4426950408889634f;
  p.softcap = softcap;
  p.bottom_right = bottom_right;
  p.window_left = window_left < 0 || window_left >= span ? -1 : int(window_left);
  p.window_right = window_right < 0 || window_right >= span ? -1 : int(window_right);
  if (causal) p.window_right = 0;
  p.alibi_slopes = alibi_slopes;
  p.alibi_batch_stride = alibi_batch_stride;
}

}  // namespace

Status validate_arguments(const ForwardArgs& a, AttentionParams& p) {
  if (a.abi_version != FC_ABI_VERSION) {
    return invalid("abi_version: expected " + std::to_string(FC_ABI_VERSION) +
                   " (call fc_forward_args_init)");
  }
  if (a.dtype != FC_FLOAT16 && a.dtype != FC_BFLOAT16) {
    return invalid("dtype: must be FC_FLOAT16 or FC_BFLOAT16 (got " + std::to_string(a.dtype) +
                   ")");
  }
  Status s = check_sizes({{"batch", a.batch},
                          {"seqlen_q", a.seqlen_q},
                          {"seqlen_k", a.seqlen_k},
                          {"heads", a.heads},
                          {"heads_k", a.heads_k},
                          {"head_dim", a.head_dim}});
  if (s.ok()) s = check_heads(a.batch, a.heads, a.heads_k, a.head_dim);
  if (s.ok()) {
    s = check_score_options(a.softmax_scale, a.softcap, a.causal, a.window_left, a.window_right,
                            a.family);
  }
  if (!s.ok()) return s;
  if (a.causal_alignment != FC_CAUSAL_TOP_LEFT && a.causal_alignment != FC_CAUSAL_BOTTOM_RIGHT) {
    return invalid("causal_alignment must be FC_CAUSAL_TOP_LEFT or FC_CAUSAL_BOTTOM_RIGHT");
  }
  const bool varlen = a.cu_seqlens_q != nullptr || a.cu_seqlens_k != nullptr;
  if (varlen && (a.cu_seqlens_q == nullptr || a.cu_seqlens_k == nullptr)) {
    return invalid("cu_seqlens_q and cu_seqlens_k must be given together");
  }
  if (varlen && a.total_q < 0) return invalid("total_q is negative");
  if (varlen && a.softmax_lse != nullptr && a.total_q == 0 && a.batch > 0 && a.seqlen_q > 0) {
    return invalid("total_q: required with softmax_lse for variable-length batches");
  }
  if (a.alibi_batch_stride < 0) return invalid("alibi_batch_stride is negative");
  const fc_tile_config& t = a.tile;
  const bool auto_tile = t.m_block == 0 && t.n_block == 0 && t.num_threads == 0;
  if (!auto_tile && (t.m_block <= 0 || t.n_block <= 0 || t.num_threads <= 0)) {
    return invalid(
        "tile: m_block, n_block and num_threads must all be positive, or all 0 (automatic)");
  }

  // Nothing to compute: the caller's tensors may then be empty (null) too.
  const bool empty = a.batch == 0 || a.seqlen_q == 0 || a.heads == 0;
  if (!empty) {
    // Packed tokens have no batch stride: their rows run through seq_stride.
    const int64_t batch_extent = varlen ? 1 : a.batch;
    const int64_t q_rows = varlen ? a.total_q : a.seqlen_q;
    const int64_t k_rows = varlen ? INT64_MAX : a.seqlen_k;
    Status s = check_tensor("q", a.q, batch_extent, q_rows, a.heads);
    if (s.ok()) s = check_tensor("o", a.o, batch_extent, q_rows, a.heads);
    if (s.ok() && a.seqlen_k > 0) s = check_tensor("k", a.k, batch_extent, k_rows, a.heads_k);
    if (s.ok() && a.seqlen_k > 0) s = check_tensor("v", a.v, batch_extent, k_rows, a.heads_k);
    if (!s.ok()) return s;
    if (a.softmax_lse != nullptr && reinterpret_cast<uintptr_t>(a.softmax_lse) % 4 != 0) {
      return invalid("softmax_lse is not 4-byte aligned");
    }
  }

  p = AttentionParams{};
  fill_problem_params(p, a.q, a.k, a.v, a.o, a.softmax_lse, a.batch, a.heads, a.heads_k, a.head_dim,
                      a.seqlen_q, a.seqlen_k, a.cu_seqlens_q, a.total_q);
  p.cu_seqlens_k = a.cu_seqlens_k;
  fill_score_params(p, a.softmax_scale, a.softcap, a.causal,
                    a.causal_alignment == FC_CAUSAL_BOTTOM_RIGHT, a.window_left, a.window_right,
                    a.seqlen_q + a.seqlen_k, a.alibi_slopes, a.alibi_batch_stride);
  return {};
}

Status validate_backward_arguments(const BackwardArgs& a, BackwardParams& p) {
  if (a.abi_version != FC_ABI_VERSION) {
    return invalid("abi_version: expected " + std::to_string(FC_ABI_VERSION) +
                   " (call fc_backward_args_init)");
  }
  if (a.deterministic != 0 && a.deterministic != 1) return invalid("deterministic must be 0 or 1");
  // The forward's problem, checked by the forward's rules.
  ForwardArgs f{};
  fc_forward_args_init(&f);
  f.q = a.q;
  f.k = a.k;
  f.v = a.v;
  f.o = a.o;
  f.dtype = a.dtype;
  f.batch = a.batch;
  f.seqlen_q = a.seqlen_q;
  f.seqlen_k = a.seqlen_k;
  f.heads = a.heads;
  f.heads_k = a.heads_k;
  f.head_dim = a.head_dim;
  f.cu_seqlens_q = a.cu_seqlens_q;
  f.cu_seqlens_k = a.cu_seqlens_k;
  f.total_q = a.total_q;
  f.softmax_lse = const_cast<float*>(a.softmax_lse);
  f.softmax_scale = a.softmax_scale;
  f.causal = a.causal;
  f.causal_alignment = a.causal_alignment;
  f.window_left = a.window_left;
  f.window_right = a.window_right;
  f.softcap = a.softcap;
  f.alibi_slopes = a.alibi_slopes;
  f.alibi_batch_stride = a.alibi_batch_stride;
  f.family = a.family;
  f.stream = a.stream;
  AttentionParams forward_params;
  if (Status s = validate_arguments(f, forward_params); !s.ok()) return s;

  const bool varlen = a.cu_seqlens_q != nullptr;
  const int64_t batch_extent = varlen ? 1 : a.batch;
  const int64_t q_rows = varlen ? a.total_q : a.seqlen_q;
  const int64_t k_rows = varlen ? INT64_MAX : a.seqlen_k;
  if (a.batch > 0 && a.heads > 0) {
    Status s;
    if (a.seqlen_q > 0) {
      if (a.softmax_lse == nullptr) {
        return invalid("softmax_lse: required by the backward pass (the forward's log-sum-exp)");
      }
      s = check_tensor("dout", a.dout, batch_extent, q_rows, a.heads);
      if (s.ok()) s = check_tensor("dq", a.dq, batch_extent, q_rows, a.heads);
    }
    if (s.ok() && a.seqlen_k > 0) {
      // With no query rows the forward's check skipped k and v; dk and dv are written anyway.
      s = check_tensor("k", a.k, batch_extent, k_rows, a.heads_k);
      if (s.ok()) s = check_tensor("v", a.v, batch_extent, k_rows, a.heads_k);
      if (s.ok()) s = check_tensor("dk", a.dk, batch_extent, k_rows, a.heads_k);
      if (s.ok()) s = check_tensor("dv", a.dv, batch_extent, k_rows, a.heads_k);
    }
    if (!s.ok()) return s;
  }

  p = BackwardParams{};
  static_cast<AttentionParams&>(p) = forward_params;
  p.dout = a.dout.data;
  copy_strides(a.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  copy_strides(a.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  copy_strides(a.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  copy_strides(a.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  p.deterministic = a.deterministic != 0;
  return {};
}

int64_t kvcache_capacity(const KvcacheArgs& a) {
  return a.block_table != nullptr ? a.pages_per_sequence * a.seqlen_cache : a.seqlen_cache;
}

Status validate_kvcache_arguments(const KvcacheArgs& a, DecodeParams& p) {
  if (a.abi_version != FC_ABI_VERSION) {
    return invalid("abi_version: expected " + std::to_string(FC_ABI_VERSION) +
                   " (call fc_kvcache_args_init)");
  }
  if (a.dtype != FC_FLOAT16 && a.dtype != FC_BFLOAT16) {
    return invalid("dtype: must be FC_FLOAT16 or FC_BFLOAT16 (got " + std::to_string(a.dtype) +
                   ")");
  }
  const bool paged = a.block_table != nullptr;
  const bool packed = a.cu_seqlens_q != nullptr;
  Status s = check_sizes({{"batch", a.batch},
                          {"seqlen_q", a.seqlen_q},
                          {"heads", a.heads},
                          {"heads_k", a.heads_k},
                          {"head_dim", a.head_dim},
                          {"total_q", a.total_q},
                          {"seqlen_new", a.seqlen_new},
                          {"batch_cache", a.batch_cache},
                          {paged ? "seqlen_cache (the page size)" : "seqlen_cache", a.seqlen_cache},
                          {"cache_seqlen", a.cache_seqlen},
                          {"pages_per_sequence", a.pages_per_sequence},
                          {"block_table_stride", a.block_table_stride},
                          {"rotary_dim", a.rotary_dim},
                          {"rotary_seqlen", a.rotary_seqlen},
                          {"alibi_batch_stride", a.alibi_batch_stride}});
  if (s.ok()) s = check_heads(a.batch, a.heads, a.heads_k, a.head_dim);
  if (s.ok()) {
    s = check_score_options(a.softmax_scale, a.softcap, a.causal, a.window_left, a.window_right,
                            a.family);
  }
  if (!s.ok()) return s;
  if (a.rotary_interleaved != 0 && a.rotary_interleaved != 1) {
    return invalid("rotary_interleaved must be 0 or 1");
  }
  if (a.debug_checks != 0 && a.debug_checks != 1) return invalid("debug_checks must be 0 or 1");
  if (a.num_splits < 0 || a.num_splits > FC_KVCACHE_MAX_SPLITS) {
    return invalid("num_splits must be in [0, " + std::to_string(FC_KVCACHE_MAX_SPLITS) +
                   "] (0: automatic)");
  }
  if (a.family != FC_FAMILY_AUTO && a.family != FC_FAMILY_SM80 && a.family != FC_FAMILY_SM90) {
    return invalid("family must be FC_FAMILY_AUTO, FC_FAMILY_SM80 or FC_FAMILY_SM90");
  }

  // The cache's layout.
  if (paged) {
    if (a.cache_batch_idx != nullptr) {
      return invalid("cache_batch_idx: not taken with a paged cache (block_table maps sequences)");
    }
    if (a.seqlen_cache == 0 || a.seqlen_cache % 16 != 0) {
      return invalid(
          "seqlen_cache: the page size of a paged cache must be a positive multiple of "
          "16 (got " +
          std::to_string(a.seqlen_cache) + ")");
    }
    if (a.batch > 1 && a.block_table_stride < a.pages_per_sequence) {
      return invalid("block_table_stride (" + std::to_string(a.block_table_stride) +
                     ") is smaller than pages_per_sequence (" +
                     std::to_string(a.pages_per_sequence) + ")");
    }
  } else if (a.cache_batch_idx == nullptr && a.batch_cache < a.batch) {
    return invalid("batch_cache (" + std::to_string(a.batch_cache) + ") is smaller than batch (" +
                   std::to_string(a.batch) + ") and there is no cache_batch_idx");
  }
  const int64_t capacity = kvcache_capacity(a);
  if (capacity > INT_MAX) return invalid("the cache's capacity per sequence exceeds 2^31 - 1");
  // A window wider than any query and key span is no window.
  const int64_t span = a.seqlen_q + capacity;
  if (a.cache_seqlens == nullptr && a.cache_seqlen + a.seqlen_new > capacity) {
    return invalid("cache_seqlen (" + std::to_string(a.cache_seqlen) + ") + seqlen_new (" +
                   std::to_string(a.seqlen_new) + ") exceeds the cache's capacity (" +
                   std::to_string(capacity) + " slots per sequence)");
  }

  // New tokens, rotary, packed queries.
  const bool has_new = a.k_new.data != nullptr || a.v_new.data != nullptr;
  if (has_new && (a.k_new.data == nullptr || a.v_new.data == nullptr)) {
    return invalid("k_new and v_new must be given together");
  }
  if (!has_new && a.seqlen_new != 0) {
    return invalid("seqlen_new is " + std::to_string(a.seqlen_new) + " without k_new and v_new");
  }
  const bool rotary = a.rotary_cos != nullptr || a.rotary_sin != nullptr;
  if (rotary && (a.rotary_cos == nullptr || a.rotary_sin == nullptr)) {
    return invalid("rotary_cos and rotary_sin must be given together");
  }
  if (!rotary && a.rotary_dim != 0) return invalid("rotary_dim is set without rotary_cos");
  if (rotary) {
    if (a.rotary_dim == 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim) {
      return invalid("rotary_dim must be even, in [2, head_dim] (got " +
                     std::to_string(a.rotary_dim) + ")");
    }
    if (a.rotary_seqlen == 0) return invalid("rotary_seqlen must be >= 1");
    if (reinterpret_cast<uintptr_t>(a.rotary_cos) % 2 != 0 ||
        reinterpret_cast<uintptr_t>(a.rotary_sin) % 2 != 0) {
      return invalid("rotary_cos / rotary_sin: not 2-byte aligned");
    }
  }
  if (packed && (has_new || rotary)) {
    return invalid("cu_seqlens_q: packed queries take neither new tokens nor rotary embedding");
  }

  const bool empty = a.batch == 0 || a.heads == 0;
  if (!empty) {
    // Rotary positions the host knows (one cache length for all): the tables must reach them.
    const bool q_per_token = a.causal != 0 || (a.window_left >= 0 && a.window_left < span) ||
                             (a.window_right >= 0 && a.window_right < span);
    const int64_t rotated_tokens = std::max(a.seqlen_new, q_per_token ? a.seqlen_q : 1);
    if (rotary && a.cache_seqlens == nullptr && a.cache_seqlen + rotated_tokens > a.rotary_seqlen) {
      return invalid("rotary_seqlen (" + std::to_string(a.rotary_seqlen) +
                     ") is shorter than the positions to rotate (up to " +
                     std::to_string(a.cache_seqlen + rotated_tokens) + ")");
    }
    const int64_t batch_extent = packed ? 1 : a.batch;
    const int64_t q_rows = packed ? a.total_q : a.seqlen_q;
    if (a.seqlen_q > 0) {
      s = check_tensor("q", a.q, batch_extent, q_rows, a.heads);
      if (s.ok()) s = check_tensor("o", a.o, batch_extent, q_rows, a.heads);
    }
    if (s.ok()) s = check_tensor("k_cache", a.k_cache, a.batch_cache, a.seqlen_cache, a.heads_k);
    if (s.ok()) s = check_tensor("v_cache", a.v_cache, a.batch_cache, a.seqlen_cache, a.heads_k);
    if (s.ok() && has_new) {
      s = check_tensor("k_new", a.k_new, a.batch, a.seqlen_new, a.heads_k);
      if (s.ok()) s = check_tensor("v_new", a.v_new, a.batch, a.seqlen_new, a.heads_k);
    }
    if (!s.ok()) return s;
    if (a.softmax_lse != nullptr && reinterpret_cast<uintptr_t>(a.softmax_lse) % 4 != 0) {
      return invalid("softmax_lse is not 4-byte aligned");
    }
    if (paged && a.pages_per_sequence == 0) {
      return invalid("pages_per_sequence must be >= 1 with a block_table");
    }
  }

  p = DecodeParams{};
  fill_problem_params(p, a.q, a.k_cache, a.v_cache, a.o, a.softmax_lse, a.batch, a.heads, a.heads_k,
                      a.head_dim, a.seqlen_q, capacity, a.cu_seqlens_q, a.total_q);
  fill_score_params(p, a.softmax_scale, a.softcap, a.causal, true, a.window_left, a.window_right,
                    span, a.alibi_slopes, a.alibi_batch_stride);

  p.cache_seqlens = a.cache_seqlens;
  p.cache_seqlen = int(a.cache_seqlen);
  p.cache_batch_idx = a.cache_batch_idx;
  p.cache_leftpad = a.cache_leftpad;
  p.block_table = a.block_table;
  p.block_table_stride = a.block_table_stride;
  p.page_size = int(a.seqlen_cache);
  p.pages_per_sequence = int(a.pages_per_sequence);
  p.batch_cache = int(a.batch_cache);
  p.k_new = has_new ? a.k_new.data : nullptr;
  p.v_new = has_new ? a.v_new.data : nullptr;
  copy_strides(a.k_new, p.k_new_batch_stride, p.k_new_row_stride, p.k_new_head_stride);
  copy_strides(a.v_new, p.v_new_batch_stride, p.v_new_row_stride, p.v_new_head_stride);
  p.seqlen_new = int(a.seqlen_new);
  p.rotary_cos = a.rotary_cos;
  p.rotary_sin = a.rotary_sin;
  p.rotary_dim = int(a.rotary_dim);
  p.rotary_seqlen = int(a.rotary_seqlen);
  p.rotary_interleaved = a.rotary_interleaved != 0;
  p.rotary_per_token = a.causal != 0 || p.window_left >= 0 || p.window_right >= 0;
  // ALiBi's bias differs per head, and a packed block's rows are several heads.
  p.pack_gqa = p.heads_per_kv_head > 1 && a.alibi_slopes == nullptr;
  p.num_splits = 1;
  return {};
}

namespace {

struct NamedPointer {
  const char* name;
  const void* ptr;
};

// The one device all non-null pointers live on.
template <size_t N>
Status find_device(const NamedPointer (&pointers)[N], int& device) {
  device = -1;
  for (const auto& t : pointers) {
    if (t.ptr == nullptr) continue;
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, t.ptr);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
      return {FC_ERROR_CUDA,
              std::string(t.name) + ": cannot query the pointer (" + cudaGetErrorString(err) + ")"};
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
      return invalid(std::string(t.name) + " is not CUDA device memory");
    }
    if (device < 0) {
      device = attr.device;
    } else if (attr.device != device) {
      return invalid(std::string(t.name) + " is on device " + std::to_string(attr.device) +
                     " but q is on device " + std::to_string(device));
    }
  }
  return {};
}

}  // namespace

Status find_tensor_device(const ForwardArgs& a, int& device) {
  const bool read_kv = a.seqlen_k > 0;
  const NamedPointer tensors[] = {{"q", a.q.data},
                                  {"k", read_kv ? a.k.data : nullptr},
                                  {"v", read_kv ? a.v.data : nullptr},
                                  {"o", a.o.data},
                                  {"softmax_lse", a.softmax_lse},
                                  {"cu_seqlens_q", a.cu_seqlens_q},
                                  {"cu_seqlens_k", a.cu_seqlens_k},
                                  {"alibi_slopes", a.alibi_slopes}};
  return find_device(tensors, device);
}

Status find_tensor_device(const BackwardArgs& a, int& device) {
  const bool has_q = a.seqlen_q > 0, has_k = a.seqlen_k > 0;
  const NamedPointer tensors[] = {{"q", has_q ? a.q.data : nullptr},
                                  {"k", has_k ? a.k.data : nullptr},
                                  {"v", has_k ? a.v.data : nullptr},
                                  {"o", has_q ? a.o.data : nullptr},
                                  {"dout", has_q ? a.dout.data : nullptr},
                                  {"dq", has_q ? a.dq.data : nullptr},
                                  {"dk", has_k ? a.dk.data : nullptr},
                                  {"dv", has_k ? a.dv.data : nullptr},
                                  {"softmax_lse", has_q ? a.softmax_lse : nullptr},
                                  {"cu_seqlens_q", a.cu_seqlens_q},
                                  {"cu_seqlens_k", a.cu_seqlens_k},
                                  {"alibi_slopes", a.alibi_slopes},
                                  {"workspace", a.workspace}};
  return find_device(tensors, device);
}

Status find_tensor_device(const KvcacheArgs& a, int& device) {
  const bool has_q = a.seqlen_q > 0;
  const NamedPointer tensors[] = {{"q", has_q ? a.q.data : nullptr},
                                  {"o", has_q ? a.o.data : nullptr},
                                  {"k_cache", a.k_cache.data},
                                  {"v_cache", a.v_cache.data},
                                  {"k_new", a.k_new.data},
                                  {"v_new", a.v_new.data},
                                  {"cache_seqlens", a.cache_seqlens},
                                  {"cache_batch_idx", a.cache_batch_idx},
                                  {"cache_leftpad", a.cache_leftpad},
                                  {"block_table", a.block_table},
                                  {"cu_seqlens_q", a.cu_seqlens_q},
                                  {"rotary_cos", a.rotary_cos},
                                  {"rotary_sin", a.rotary_sin},
                                  {"softmax_lse", has_q ? a.softmax_lse : nullptr},
                                  {"alibi_slopes", a.alibi_slopes},
                                  {"workspace", a.workspace}};
  return find_device(tensors, device);
}

}  // namespace flashcute

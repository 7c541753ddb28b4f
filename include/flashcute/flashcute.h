/* flashcute: fused attention kernels (forward, backward and KV-cache decode) on CuTe.
 *
 * The C API: a stable ABI for other languages (the Python package loads it with ctypes). Every
 * function returns an fc_status; on failure fc_last_error() gives a message naming the bad
 * argument. Arguments are validated before anything is launched, and outputs are untouched on
 * error. */
#ifndef FLASHCUTE_FLASHCUTE_H_
#define FLASHCUTE_FLASHCUTE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FC_ABI_VERSION 1

typedef enum {
  FC_OK = 0,
  FC_ERROR_INVALID_ARGUMENT = 1, /* a bad shape, stride, pointer, dtype or option */
  FC_ERROR_UNSUPPORTED = 2,      /* valid, but no compiled kernel or this device cannot run it */
  FC_ERROR_CUDA = 3              /* the CUDA runtime reported an error */
} fc_status;

typedef enum { FC_FLOAT16 = 0, FC_BFLOAT16 = 1 } fc_dtype;

/* Which key a query sees under a causal mask (and where a local window is centred):
 * top-left: query i sees key j iff j <= i (PyTorch's is_causal; flashcute_run's default);
 * bottom-right: j <= i + seqlen_k - seqlen_q (FlashAttention's convention). */
typedef enum { FC_CAUSAL_TOP_LEFT = 0, FC_CAUSAL_BOTTOM_RIGHT = 1 } fc_causal_alignment;

/* Kernel families. SM80: the FlashAttention-2 design (mma.sync), any sm_80+ device, every feature
 * of this header. SM90: Hopper (TMA, wgmma, warp specialisation), sm_90a builds on compute
 * capability 9.0, head_dim buckets 64/96/128/192/256, fp16/bf16, causal of either alignment, local
 * windows, GQA, LSE, variable-length batches; softcap and ALiBi in the forward pass; the backward
 * pass (head_dim buckets 64/128/256) without softcap and ALiBi, deterministic up to head_dim 128.
 * The KV-cache path runs on SM80 only. AUTO tries SM90 first on a 9.0 device and falls back to
 * SM80 by itself; forcing SM90 on what it lacks gives FC_ERROR_UNSUPPORTED. */
typedef enum { FC_FAMILY_AUTO = 0, FC_FAMILY_SM80 = 80, FC_FAMILY_SM90 = 90 } fc_kernel_family;

/* A (batch, seqlen, heads, head_dim) tensor on a CUDA device. Strides are in elements; head_dim is
 * contiguous. For variable-length calls the batch stride is unused: rows are packed tokens. */
typedef struct {
  void* data;
  int64_t batch_stride;
  int64_t seq_stride;
  int64_t head_stride;
} fc_tensor;

typedef struct {
  int32_t m_block;     /* rows of Q per thread block; 0 = automatic choice */
  int32_t n_block;     /* rows of K/V per main-loop iteration */
  int32_t num_threads; /* threads per block */
} fc_tile_config;

typedef struct {
  int32_t abi_version; /* FC_ABI_VERSION */
  fc_tensor q, k, v, o;
  int32_t dtype; /* fc_dtype; all four tensors share it */
  int64_t batch, seqlen_q, seqlen_k, heads, heads_k, head_dim;
  /* Variable length: when cu_seqlens_q is set, cu_seqlens_q/k (int32, batch + 1 entries, on the
   * device) give each sequence's token range, seqlen_q/k are the maxima and total_q the total
   * number of query tokens (it sizes the log-sum-exp). */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t total_q;
  /* Optional fp32 natural-log log-sum-exp: (batch, heads, seqlen_q), or (heads, total_q) when
   * variable length; +inf for a row that sees no key. NULL to skip. */
  float* softmax_lse;
  float softmax_scale;
  int32_t causal;             /* 0 or 1 */
  int32_t causal_alignment;   /* fc_causal_alignment; also places the local window and ALiBi */
  int64_t window_left;        /* -1 = unbounded */
  int64_t window_right;       /* -1 = unbounded */
  float softcap;              /* > 0: scores become softcap * tanh(score / softcap) */
  const float* alibi_slopes;  /* optional fp32 (heads) or (batch, heads) on the device */
  int64_t alibi_batch_stride; /* 0 when one slope per head */
  fc_tile_config tile;
  int32_t family; /* fc_kernel_family */
  void* stream;   /* cudaStream_t; NULL = legacy default stream of the tensors' device */
} fc_forward_args;

/* Fills args with defaults: unbounded windows, automatic tile and family, no optional outputs. */
void fc_forward_args_init(fc_forward_args* args);

/* Runs the attention forward pass O = softmax(scale * Q K^T + bias, masked) V.
 * The SM90 family's causal and variable-length calls hand out their tiles from a counter in
 * device memory, one per stream (32 KB per CUDA context, allocated by the first such call and
 * kept for the context's life); each call leaves its counter as it found it, so calls on any
 * streams and from any threads may overlap. A call captured into a CUDA graph uses a static
 * schedule and no counter. */
fc_status fc_forward(const fc_forward_args* args);

/* Backward: from q, k, v, the forward's output o and log-sum-exp, and the output gradient dout,
 * the gradients dq, dk, dv (same dtype and shapes as q, k, v; fp32 accumulation). Every forward
 * option applies and must match the forward call. For GQA, dk and dv of a KV head sum over its
 * query heads. Rows that see no key get zero gradients; softcap and ALiBi slopes get none.
 * Scratch memory comes from the caller: fc_backward_workspace_size gives the bytes (a function of
 * the shapes and dtype alone, for a given build of the library), and workspace points at that
 * many bytes of device memory on the tensors' device, 256-byte aligned, that nothing else uses
 * until the call's work on `stream` is done. Without `deterministic`, dq is summed with fp32
 * atomics, whose order varies; with it, every gradient is bitwise identical run to run (the sm90
 * family, head_dim <= 128: each dq block adds its key blocks in a fixed order; the SM80 family: a
 * separate dq pass recomputes the scores, about 1.4x the matrix work). */
typedef struct {
  int32_t abi_version; /* FC_ABI_VERSION */
  fc_tensor q, k, v, o, dout;
  fc_tensor dq, dk, dv; /* outputs, laid out like q, k, v (their own strides) */
  int32_t dtype;        /* fc_dtype; every tensor shares it */
  int64_t batch, seqlen_q, seqlen_k, heads, heads_k, head_dim;
  const int32_t* cu_seqlens_q; /* variable length, as in fc_forward_args */
  const int32_t* cu_seqlens_k;
  int64_t total_q;
  const float* softmax_lse; /* required: the forward's log-sum-exp, laid out as there */
  float softmax_scale;
  int32_t causal;
  int32_t causal_alignment;
  int64_t window_left;
  int64_t window_right;
  float softcap;
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
  int32_t deterministic; /* 0 or 1 */
  /* fc_kernel_family. AUTO: the sm90 family on a compute capability 9.0 device where it takes the
   * problem (no softcap or ALiBi; deterministic up to head_dim 128), else the SM80 family. */
  int32_t family;
  void* workspace; /* fc_backward_workspace_size bytes; NULL when that size is 0 */
  uint64_t workspace_bytes;
  void* stream; /* cudaStream_t; NULL = legacy default stream of the tensors' device */
} fc_backward_args;

/* Fills args with defaults: unbounded windows, bottom-right alignment, automatic family. */
void fc_backward_args_init(fc_backward_args* args);

/* The workspace fc_backward needs for these arguments, in bytes (checks the arguments first). */
fc_status fc_backward_workspace_size(const fc_backward_args* args, uint64_t* bytes);

/* Runs the attention backward pass. */
fc_status fc_backward(const fc_backward_args* args);

/* Attention over a KV cache (decode, speculative decoding, chunked prefill against a cache), with
 * FlashAttention's flash_attn_with_kvcache semantics. Sequence b attends to the cache slots
 * [leftpad_b, seqlen_b + seqlen_new) of its cache row, where seqlen_b is cache_seqlens[b] (or
 * cache_seqlen for all) and leftpad_b is cache_leftpad[b] (or 0); when k_new and v_new are given
 * they are first written, in place, to slots [seqlen_b, seqlen_b + seqlen_new). Causal masks are
 * bottom-right aligned over those keys.
 * Rotary embedding (rotary_cos given): the new keys are rotated at positions seqlen_b + i (their
 * slots); q is rotated at the same positions when causal or windowed, else every query token at
 * position seqlen_b. The first rotary_dim columns rotate: pairs
 * (2j, 2j + 1) when rotary_interleaved, else (j, j + rotary_dim / 2).
 * Caches: dense, k_cache and v_cache are (batch_cache, seqlen_cache, heads_k, head_dim) and cache
 * row cache_batch_idx[b] (or b) serves sequence b; paged (block_table given), they are
 * (num_pages, page_size, heads_k, head_dim) with batch_stride the page stride, and slot j of
 * sequence b lies at row j % page_size of page block_table[b * block_table_stride + j / page_size].
 * Device-memory contract (not checked on the host, checked on the device with debug_checks):
 * 0 <= leftpad_b <= seqlen_b, seqlen_b + seqlen_new <= the capacity (seqlen_cache, or
 * pages_per_sequence * page_size), cache_batch_idx in [0, batch_cache), and the block-table
 * entries a sequence uses in [0, num_pages), rotary positions below rotary_seqlen, and with
 * cu_seqlens_q every sequence at most seqlen_q long, the last ending at total_q or before (rows
 * past it are left untouched). With debug_checks the call synchronises the stream and fails with
 * FC_ERROR_INVALID_ARGUMENT, naming the array, before anything is written. Scratch memory:
 * fc_kvcache_workspace_size (a function of the shapes, num_splits and the device's SM count), as
 * for the backward pass. num_splits 0 chooses the split of the keys from host-known shapes only, so
 * a captured CUDA graph stays valid when cache_seqlens changes. */
typedef struct {
  int32_t abi_version; /* FC_ABI_VERSION */
  fc_tensor q;         /* (batch, seqlen_q, heads, head_dim) */
  fc_tensor o;         /* like q */
  fc_tensor k_cache;   /* dense or paged, see above */
  fc_tensor v_cache;
  fc_tensor k_new; /* optional (batch, seqlen_new, heads_k, head_dim); data NULL = none */
  fc_tensor v_new;
  int32_t dtype; /* fc_dtype; every tensor (and rotary_cos / rotary_sin) shares it */
  int64_t batch, seqlen_q, heads, heads_k, head_dim;
  /* Optional packed queries (chunked or paged prefill): q and o rows are the tokens of all
   * sequences, cu_seqlens_q (batch + 1 int32 on the device) gives each sequence's range, seqlen_q
   * is the maximum and total_q the token count; the LSE is then (heads, total_q). */
  const int32_t* cu_seqlens_q;
  int64_t total_q;
  int64_t seqlen_new;   /* 0 without k_new / v_new (which are not taken with cu_seqlens_q) */
  int64_t batch_cache;  /* dense: cache rows; paged: num_pages */
  int64_t seqlen_cache; /* dense: slots per cache row; paged: page_size */
  const int32_t* cache_seqlens; /* (batch) int32 on the device, or NULL: cache_seqlen for all */
  int64_t cache_seqlen;
  const int32_t* cache_batch_idx; /* optional (batch) int32, dense caches only */
  const int32_t* cache_leftpad;   /* optional (batch) int32 */
  const int32_t* block_table;     /* optional (batch, pages_per_sequence) int32: paged cache */
  int64_t block_table_stride;     /* elements between two sequences' rows */
  int64_t pages_per_sequence;
  const void* rotary_cos; /* optional (rotary_seqlen, rotary_dim / 2), contiguous */
  const void* rotary_sin;
  int64_t rotary_dim; /* even, <= head_dim */
  int64_t rotary_seqlen;
  int32_t rotary_interleaved; /* 0 or 1 */
  float* softmax_lse;         /* optional fp32 (batch, heads, seqlen_q), or (heads, total_q) */
  float softmax_scale;
  int32_t causal; /* 0 or 1; bottom-right */
  int64_t window_left, window_right;
  float softcap;
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
  int32_t num_splits;   /* 0 = automatic; else 1..FC_KVCACHE_MAX_SPLITS */
  int32_t debug_checks; /* 0 or 1: check the device-memory contract first (synchronises) */
  int32_t family;       /* fc_kernel_family; the decode kernels are the SM80 family's today */
  void* workspace;      /* fc_kvcache_workspace_size bytes, 256-byte aligned; NULL when 0 */
  uint64_t workspace_bytes;
  void* stream; /* cudaStream_t; NULL = legacy default stream of the tensors' device */
} fc_kvcache_args;

#define FC_KVCACHE_MAX_SPLITS 128

/* Fills args with defaults: no new keys, no rotary, unbounded windows, automatic splits. */
void fc_kvcache_args_init(fc_kvcache_args* args);

/* The workspace fc_kvcache needs for these arguments, in bytes (checks the arguments first). */
fc_status fc_kvcache_workspace_size(const fc_kvcache_args* args, uint64_t* bytes);

/* Appends k_new / v_new (rotated) to the cache, then runs attention of q over the cache. */
fc_status fc_kvcache(const fc_kvcache_args* args);

/* The message of the calling thread's last failed call ("" if none). */
const char* fc_last_error(void);

/* Tile configurations compiled in for (dtype, head_dim) of a family, written to out (up to
 * capacity entries); returns how many exist. */
int32_t fc_compiled_tile_configs(int32_t family, int32_t dtype, int32_t head_dim,
                                 fc_tile_config* out, int32_t capacity);

/* The tile configuration the automatic choice takes within a family for (dtype, head_dim).
 * FC_FAMILY_AUTO answers for the SM80 family; on a compute capability 9.0 device an automatic call
 * may run the Hopper family instead (with that family's own tile). */
fc_status fc_default_tile_config(int32_t family, int32_t dtype, int32_t head_dim,
                                 fc_tile_config* out);

/* What this library was built from and for, as one JSON object in a string that lives as long as
 * the library: {"version": "0.1.0", "cuda_version": "13.0.88", "cuda_archs": ["80", "90a"],
 * "tile_set": "minimal", "git_commit": "6e4b612"}. cuda_archs are the machine-code targets
 * (FLASHCUTE_CUDA_ARCHS; "80" also embeds compute_80 PTX), tile_set is "full" or "minimal", and
 * git_commit is "unknown" for a build from outside a git checkout. */
const char* fc_build_info(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCUTE_FLASHCUTE_H_ */

/* flashcute: fused attention kernels (forward and backward) on CuTe.
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
 * windows, GQA, LSE, variable-length batches; softcap, ALiBi and the backward pass run on SM80
 * only. AUTO tries SM90 first on a 9.0 device and falls back to SM80 by itself; forcing SM90 on
 * what it lacks gives FC_ERROR_UNSUPPORTED. */
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

/* Runs the attention forward pass O = softmax(scale * Q K^T + bias, masked) V. */
fc_status fc_forward(const fc_forward_args* args);

/* Backward: from q, k, v, the forward's output o and log-sum-exp, and the output gradient dout,
 * the gradients dq, dk, dv (same dtype and shapes as q, k, v; fp32 accumulation). Every forward
 * option applies and must match the forward call. For GQA, dk and dv of a KV head sum over its
 * query heads. Rows that see no key get zero gradients; softcap and ALiBi slopes get none.
 * Scratch memory comes from the caller: fc_backward_workspace_size gives the bytes (a function of
 * the shapes and `deterministic` alone), and workspace points at that many bytes of device memory
 * on the tensors' device, 256-byte aligned, that nothing else uses until the call's work on
 * `stream` is done. Without `deterministic`, dq is summed with fp32 atomics, whose order varies;
 * with it, every gradient is bitwise identical run to run (a separate dq pass recomputes the
 * scores: about 1.4x the matrix work). */
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
  int32_t family;        /* fc_kernel_family; the backward runs on the SM80 family today */
  void* workspace;       /* fc_backward_workspace_size bytes; NULL when that size is 0 */
  uint64_t workspace_bytes;
  void* stream; /* cudaStream_t; NULL = legacy default stream of the tensors' device */
} fc_backward_args;

/* Fills args with defaults: unbounded windows, bottom-right alignment, automatic family. */
void fc_backward_args_init(fc_backward_args* args);

/* The workspace fc_backward needs for these arguments, in bytes (checks the arguments first). */
fc_status fc_backward_workspace_size(const fc_backward_args* args, uint64_t* bytes);

/* Runs the attention backward pass. */
fc_status fc_backward(const fc_backward_args* args);

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

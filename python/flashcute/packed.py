"""FlashAttention-2's packed entry points: QKV or KV stacked in one array.

Each function takes views of the packed array (qkv[:, :, 0] and so on; no copy for torch and CuPy,
whose slices are strided views) and calls flash_attn_func or flash_attn_varlen_func, which accept
any strides with a contiguous last dimension. So the semantics, options, return values and errors
are those of the unpacked functions; checks on the views name them q, k and v. With torch, autograd
carries the views' gradients back into the packed tensor's.
"""

from . import flash_attn_func, flash_attn_varlen_func

__all__ = [
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
]


def _unstack(packed, name, dims, axis):
    """The slices of `packed` along `axis`, after checking its rank and that axis's extent.

    dims names the expected dimensions, the stacking one by its extent: ("total", "3", ...).
    """
    shape = getattr(packed, "shape", None)
    if shape is None:
        raise TypeError(
            f"{name} must be a torch.Tensor or an array with a shape and __dlpack__, got "
            f"{type(packed).__name__}")
    shape = tuple(shape)
    count = int(dims[axis])
    if len(shape) != len(dims) or shape[axis] != count:
        raise ValueError(f"{name} must have shape ({', '.join(dims)}), got {shape}")
    lead = (slice(None),) * axis
    return tuple(packed[lead + (i,)] for i in range(count))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """FlashAttention-2's flash_attn_qkvpacked_func.

    qkv: (batch, seqlen, 3, heads, head_dim), q, k and v stacked on dim 2 (so heads_k == heads).
    The options and the result are flash_attn_func's: out (batch, seqlen, heads, head_dim), or
    (out, softmax_lse, None) with return_attn_probs.
    """
    q, k, v = _unstack(qkv, "qkv", ("batch", "seqlen", "3", "heads", "head_dim"), 2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """FlashAttention-2's flash_attn_kvpacked_func.

    q: (batch, seqlen_q, heads, head_dim); kv: (batch, seqlen_k, 2, heads_k, head_dim), k and v
    stacked on dim 2, heads a multiple of heads_k. Everything else is flash_attn_func's.
    """
    k, v = _unstack(kv, "kv", ("batch", "seqlen_k", "2", "heads_k", "head_dim"), 2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """FlashAttention-2's flash_attn_varlen_qkvpacked_func.

    qkv: (total, 3, heads, head_dim), sequences packed one after another; cu_seqlens (int32,
    batch + 1) and max_seqlen serve as both the query and the key offsets and bound. Returns out
    (total, heads, head_dim), or (out, softmax_lse (heads, total), None) with return_attn_probs.
    """
    q, k, v = _unstack(qkv, "qkv", ("total", "3", "heads", "head_dim"), 1)
    if cu_seqlens is None:
        raise ValueError("cu_seqlens is required")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=0.0, softmax_scale=None, causal=False,
                                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                    deterministic=False, return_attn_probs=False):
    """FlashAttention-2's flash_attn_varlen_kvpacked_func.

    q: (total_q, heads, head_dim); kv: (total_k, 2, heads_k, head_dim). Everything else is
    flash_attn_varlen_func's.
    """
    k, v = _unstack(kv, "kv", ("total_k", "2", "heads_k", "head_dim"), 1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)

"""flashcute: fused attention kernels on CuTe, with FlashAttention-2's Python API.

`flash_attn_func` and `flash_attn_varlen_func` take FlashAttention's arguments with its semantics
(bottom-right causal, 1/sqrt(head_dim) default scale, GQA, natural-log LSE); `forward` exposes the
library's extensions (top-left causal alignment, a forced kernel family or tile). With torch
tensors they are differentiable: autograd runs the library's backward pass. `backward` calls that
pass directly, for any array type. `flash_attn_with_kvcache` is FlashAttention's decoding entry
point: attention over a (dense or paged) KV cache, appending new keys and values in place.

Inputs may be torch tensors (through the custom ops torch.ops.flashcute.fwd, .bwd and .kvcache, so
autograd, torch.compile and CUDA graphs work) or any DLPack CUDA array (CuPy, JAX). torch is
imported only when a torch tensor is passed.
"""

import sys

from . import _checks
from ._build_info import build_info
from ._library import (
    CudaError,
    FlashCuteError,
    InvalidArgumentError,
    UnsupportedError,
    compiled_tile_configs,
    default_tile_config,
    library_path,
)

__version__ = "0.1.0"

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "forward",
    "backward",
    "compiled_tile_configs",
    "default_tile_config",
    "library_path",
    "build_info",
    "FlashCuteError",
    "InvalidArgumentError",
    "UnsupportedError",
    "CudaError",
]


_torch_module = None  # torch once a call has seen it imported


def _is_torch_tensor(x):
    # A torch tensor cannot exist unless torch was imported, so this never imports torch. The module
    # is kept after the first look: torch.compile then traces a global instead of sys.modules,
    # which another thread may be importing into while the tracer copies it.
    global _torch_module
    if _torch_module is None:
        _torch_module = sys.modules.get("torch")
        if _torch_module is None:
            return False
    return isinstance(x, _torch_module.Tensor)


def _is_array(x):
    """A torch tensor or a DLPack producer (anything else is taken as a scalar)."""
    return _is_torch_tensor(x) or hasattr(x, "__dlpack__")


def _kvcache(tensors, cache_seqlen, max_seqlen_q, options_fn, return_lse):
    """One fc_kvcache call through the front end of q's framework: (out, lse or None)."""
    if _is_torch_tensor(tensors["q"]):
        from . import _torch as frontend
    else:
        from . import _dlpack as frontend
    return frontend.kvcache(tensors, cache_seqlen, max_seqlen_q, options_fn, return_lse)


def forward(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
            max_seqlen_k=None, softmax_scale=None, causal=False, causal_alignment="bottom_right",
            window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_lse=False,
            family="auto", tile=None, deterministic=False):
    """Attention forward with every option the library has; returns out, or (out, lse).

    q: (batch, seqlen_q, heads, head_dim), k/v: (batch, seqlen_k, heads_k, head_dim); or, with
    cu_seqlens_q/k (int32, batch + 1) and max_seqlen_q/k, packed (total, heads, head_dim).
    causal_alignment: "bottom_right" (FlashAttention) or "top_left" (PyTorch's is_causal); it also
    places the local window and ALiBi. family: "auto", "sm80" or "sm90". tile: None (automatic) or
    (m_block, n_block, num_threads), one of compiled_tile_configs(family, dtype, head_dim).
    With torch tensors that require grad, autograd's backward runs flashcute.backward with the same
    options and family (the tile is the forward's alone); deterministic=True makes its gradients
    bitwise reproducible.
    """
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    if (cu_seqlens_q is None and alibi_slopes is None and family == "auto" and tile is None
            and causal_alignment == "bottom_right"):
        # The eager fast path (None where it does not apply; see _torch.py).
        if _is_torch_tensor(q):
            from ._torch import fast_forward
        else:
            from ._dlpack import fast_forward
        result = fast_forward(q, k, v, softmax_scale, causal, window_size, softcap, return_lse)
        if result is not None:
            return result if return_lse else result[0]

    def options_fn(problem):
        return _checks.check_options(problem, softmax_scale, causal, causal_alignment,
                                     window_size, softcap, family, tile)

    if _is_torch_tensor(q):
        from . import _torch

        out, lse = _torch.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  alibi_slopes, options_fn, return_lse, deterministic)
    else:
        from . import _dlpack

        out, lse = _dlpack.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, alibi_slopes, options_fn, return_lse)
    return (out, lse) if return_lse else out


def backward(dout, q, k, v, out, softmax_lse, *, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None, causal=False,
             causal_alignment="bottom_right", window_size=(-1, -1), softcap=0.0,
             alibi_slopes=None, deterministic=False, family="auto"):
    """The attention backward pass: (dq, dk, dv) from the output gradient dout.

    q, k, v and every option are the forward call's; out and softmax_lse are its results
    (forward(..., return_lse=True)): the LSE fp32 and contiguous, (batch, heads, seqlen_q), or
    (heads, total_q) for varlen. dout has out's shape and dtype and may have any strides q may.
    The gradients are new contiguous arrays shaped and typed like q, k and v (dk and dv of a KV
    head summed over its query heads); rows that see no key get zero. softcap and ALiBi slopes
    get no gradient. deterministic=True: bitwise-identical gradients run to run (the SM90 family,
    head_dim <= 128: each dq block sums its key blocks in a fixed order; the SM80 family: dq
    without atomics, at about 1.4x the matrix work). family="auto" runs the SM90 family on an
    H100/H200 where it takes the call (no softcap or ALiBi; deterministic up to head_dim 128),
    else the SM80 family; a forced family that does not take the call raises UnsupportedError.
    For torch tensors this is the custom op torch.ops.flashcute.bwd, which autograd calls; it
    has no gradient of its own.
    """
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")

    def options_fn(problem):
        return _checks.check_options(problem, softmax_scale, causal, causal_alignment,
                                     window_size, softcap, family, None)

    if _is_torch_tensor(q):
        from . import _torch as frontend
    else:
        from . import _dlpack as frontend
    return frontend.backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, alibi_slopes, options_fn,
                             bool(deterministic))


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """FlashAttention-2's flash_attn_func; differentiable with torch tensors.

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, heads_k, head_dim), heads a
    multiple of heads_k (GQA/MQA); fp16 or bf16 on a CUDA device, head_dim a multiple of 8 up to
    256, last dim contiguous. causal is bottom-right aligned. window_size=(left, right), -1 for
    unbounded. softcap > 0 caps scores at softcap * tanh(score / softcap). alibi_slopes: fp32
    (heads,) or (batch, heads). deterministic=True makes the backward pass bitwise reproducible
    (the forward pass always is). Returns out (batch, seqlen_q, heads, head_dim), or with
    return_attn_probs (out, softmax_lse (batch, heads, seqlen_q) fp32, None): no probabilities are
    materialised. Gradients reach q, k and v, not softmax_lse or alibi_slopes (as FlashAttention).
    """
    _checks.check_dropout(dropout_p)
    out = forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                  softcap=softcap, alibi_slopes=alibi_slopes, return_lse=return_attn_probs,
                  deterministic=deterministic)
    if return_attn_probs:
        return out[0], out[1], None
    return out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """FlashAttention-2's flash_attn_varlen_func; differentiable with torch tensors.

    q: (total_q, heads, head_dim), k, v: (total_k, heads_k, head_dim): sequences packed one after
    another, sequence i occupying rows cu_seqlens[i]:cu_seqlens[i + 1] (int32, batch + 1 entries,
    on q's device). max_seqlen_q/k must be at least the longest sequence (they size the launch).
    Causal masks, windows and ALiBi are aligned per sequence. Returns out (total_q, heads,
    head_dim), or (out, softmax_lse (heads, total_q), None) with return_attn_probs. deterministic
    and the gradients are flash_attn_func's.

    With block_table (batch, pages_per_sequence) int32, k and v are a paged KV cache (num_pages,
    page_size, heads_k, head_dim) instead of packed keys: sequence i sees the first
    cu_seqlens_k[i + 1] - cu_seqlens_k[i] slots of its pages (slot j at row j % page_size of page
    block_table[i, j // page_size]), causal bottom-right over them; max_seqlen_k is then unused.
    That call runs flash_attn_with_kvcache's kernels (torch.ops.flashcute.kvcache) and has no
    gradient: a backward through it raises.
    """
    _checks.check_dropout(dropout_p)
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k are required")
    if block_table is not None:
        out, lse = _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table,
                                 softmax_scale, causal, window_size, softcap, alibi_slopes,
                                 return_attn_probs)
        return (out, lse, None) if return_attn_probs else out
    out = forward(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                  max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                  softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                  softcap=softcap, alibi_slopes=alibi_slopes, return_lse=return_attn_probs,
                  deterministic=deterministic)
    if return_attn_probs:
        return out[0], out[1], None
    return out


def _check_cu_seqlens_k(cu_seqlens_k):
    """cu_seqlens_k of a paged varlen call, before its differences become the key counts: int32,
    1-D, on a CUDA device (read from torch's metadata, or from a DLPack array's attributes)."""
    if _is_torch_tensor(cu_seqlens_k):
        from ._torch import describe

        desc = describe(cu_seqlens_k, "cu_seqlens_k", False)
        dtype, shape, (kind, index) = desc.dtype, desc.shape, desc.device
    else:
        from ._dlpack import KDL_CUDA, device_name

        if not _is_array(cu_seqlens_k) or not hasattr(cu_seqlens_k, "shape"):
            raise TypeError(f"cu_seqlens_k must be a torch.Tensor or an array with __dlpack__, "
                            f"got {type(cu_seqlens_k).__name__}")
        dtype = str(getattr(cu_seqlens_k, "dtype", "unknown"))
        shape = tuple(cu_seqlens_k.shape)
        device_type, index = cu_seqlens_k.__dlpack_device__()
        kind = "cuda" if device_type == KDL_CUDA else device_name(device_type)
    if dtype != "int32":
        raise TypeError(f"cu_seqlens_k must have dtype int32, got {dtype}")
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(f"cu_seqlens_k must be 1-D with batch + 1 entries, got shape {shape}")
    if kind != "cuda":  # the key counts are computed where the offsets lie
        raise ValueError(f"cu_seqlens_k must be on a CUDA device, got {kind}:{index}")


def _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, softmax_scale,
                  causal, window_size, softcap, alibi_slopes, return_lse):
    """flash_attn_varlen_func over a paged cache: packed queries against each sequence's first
    cu_seqlens_k[i + 1] - cu_seqlens_k[i] cache slots (the key counts computed on the device, in
    q's framework)."""
    _check_cu_seqlens_k(cu_seqlens_k)
    tensors = dict(q=q, k_cache=k, v_cache=v, k=None, v=None, rotary_cos=None, rotary_sin=None,
                   cache_seqlens=cu_seqlens_k[1:] - cu_seqlens_k[:-1], cache_batch_idx=None,
                   cache_leftpad=None, block_table=block_table, cu_seqlens_q=cu_seqlens_q,
                   alibi_slopes=alibi_slopes)

    def options_fn(problem):
        return _checks.check_kvcache_options(problem, softmax_scale, causal, window_size, softcap,
                                             True, 0, False, "auto")

    return _kvcache(tensors, None, max_seqlen_q, options_fn, return_lse)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            family="auto", debug_checks=False):
    """FlashAttention-2's flash_attn_with_kvcache: attention of q over a KV cache, after writing
    the new keys and values k, v (if given) into it in place. Returns out, or (out, softmax_lse)
    with return_softmax_lse. No gradient (a backward through it raises).

    q: (batch, seqlen_q, heads, head_dim). k_cache, v_cache: (batch_cache, seqlen_cache, heads_k,
    head_dim), sequence b using cache row cache_batch_idx[b] (or b); or, with block_table
    (batch, pages_per_sequence) int32, a paged cache (num_pages, page_size, heads_k, head_dim)
    whose slot j of sequence b is row j % page_size of page block_table[b, j // page_size].
    k, v: optional (batch, seqlen_new, heads_k, head_dim), written to slots
    [cache_seqlens[b], cache_seqlens[b] + seqlen_new). cache_seqlens: an int for every sequence
    or a (batch,) int32 array of the keys already cached; None means the whole cache (and needs
    k=None).
    Sequence b then attends to slots [cache_leftpad[b] (or 0), cache_seqlens[b] + seqlen_new).
    rotary_cos, rotary_sin: (rotary_seqlen, rotary_dim / 2) in q's dtype, contiguous; they rotate
    the first rotary_dim columns of the new keys at positions cache_seqlens[b] + i (their slots),
    and of q at the same positions when causal or windowed, else all of q's rows at position
    cache_seqlens[b]; pairs (2j, 2j + 1) when rotary_interleaved, else
    (j, j + rotary_dim / 2). They need k and v. causal is bottom-right over the keys a sequence
    sees; softmax_scale, window_size, softcap and alibi_slopes are flash_attn_func's. num_splits:
    0 lets the library split each sequence's keys across thread blocks (chosen from the shapes
    alone, so a captured CUDA graph stays valid as cache_seqlens changes), else 1 to 128 parts.
    softmax_lse: fp32 (batch, heads, seqlen_q), +inf for a row that sees no key (its output is 0).

    The values in device memory are not checked on the host: 0 <= cache_leftpad[b] <=
    cache_seqlens[b], cache_seqlens[b] + seqlen_new <= the capacity (seqlen_cache, or
    pages_per_sequence * page_size), cache_batch_idx in [0, batch_cache) and the block-table
    entries a sequence uses in [0, num_pages) are the caller's to keep. Extensions (keyword only):
    debug_checks=True checks them on the device first (synchronising the stream) and raises
    InvalidArgumentError naming the array before anything is written; family forces a kernel
    family ("auto" or "sm80"; the decode kernels are the SM80 family's).
    """
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, rotary_cos=rotary_cos,
                   rotary_sin=rotary_sin, cache_seqlens=cache_seqlens,
                   cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                   block_table=block_table, cu_seqlens_q=None, alibi_slopes=alibi_slopes)
    cache_seqlen = None
    if cache_seqlens is not None and not _is_array(cache_seqlens):
        cache_seqlen, tensors["cache_seqlens"] = cache_seqlens, None

    if (rotary_cos is None and rotary_sin is None and cache_batch_idx is None
            and cache_leftpad is None and alibi_slopes is None and family == "auto"
            and debug_checks is False and cache_seqlens is not None and _is_torch_tensor(q)):
        # The eager fast path of a plain decode step (None where it does not apply; _torch.py).
        from ._torch import fast_kvcache
        result = fast_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                              softmax_scale, causal, window_size, softcap, num_splits,
                              return_softmax_lse)
        if result is not None:
            return result if return_softmax_lse else result[0]

    def options_fn(problem):
        return _checks.check_kvcache_options(problem, softmax_scale, causal, window_size, softcap,
                                             rotary_interleaved, num_splits, debug_checks, family)

    out, lse = _kvcache(tensors, cache_seqlen, None, options_fn, return_softmax_lse)
    return (out, lse) if return_softmax_lse else out


# The packed entry points are views over the functions above, so they are imported after them.
from .packed import (  # noqa: E402
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

"""flashcute: fused attention kernels on CuTe, with FlashAttention-2's Python API.

`flash_attn_func` and `flash_attn_varlen_func` take FlashAttention's arguments with its semantics
(bottom-right causal, 1/sqrt(head_dim) default scale, GQA, natural-log LSE); `forward` exposes the
library's extensions (top-left causal alignment, a forced kernel family or tile). With torch
tensors they are differentiable: autograd runs the library's backward pass. `backward` calls that
pass directly, for any array type.

Inputs may be torch tensors (through the custom ops torch.ops.flashcute.fwd and .bwd, so autograd,
torch.compile and CUDA graphs work) or any DLPack CUDA array (CuPy, JAX). torch is imported only
when a torch tensor is passed.
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


def _is_torch_tensor(x):
    # A torch tensor cannot exist unless torch was imported, so this never imports torch.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


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
    get no gradient. deterministic=True: bitwise-identical gradients run to run (dq without
    atomics, at about 1.4x the matrix work). The backward runs on the SM80 family; family="sm90"
    raises UnsupportedError. For torch tensors this is the custom op torch.ops.flashcute.bwd,
    which autograd calls; it has no gradient of its own.
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
    and the gradients are flash_attn_func's. A paged KV cache (block_table) is not supported.
    """
    _checks.check_dropout(dropout_p)
    if block_table is not None:
        raise NotImplementedError("block_table: flashcute has no paged KV cache")
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k are required")
    out = forward(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                  max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                  softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                  softcap=softcap, alibi_slopes=alibi_slopes, return_lse=return_attn_probs,
                  deterministic=deterministic)
    if return_attn_probs:
        return out[0], out[1], None
    return out


# The packed entry points are views over the two functions above, so they are imported after them.
from .packed import (  # noqa: E402
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

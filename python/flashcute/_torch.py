"""The torch front end: a custom op (flashcute::fwd) so torch.compile and CUDA graphs see one node.

Imported only when a torch tensor is passed, so `import flashcute` works without torch. The Python
wrapper checks metadata (traceable by dynamo); the op's real implementation, which alone sees data
pointers, checks alignment and calls the library on the current torch stream of q's device.

An eager call with plain tensors takes a shorter road (fast_forward): the custom op's dispatch
alone costs several times a tiny kernel's run time, and nothing needs the op when no compiler,
tracer or autograd is watching. The library checks every argument before it launches anything;
when it refuses a call, the call is rerun through the checked path, so every error keeps its
message.
"""

from typing import Optional, Tuple

import torch

from . import _checks, _library

_DTYPES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.int32: "int32",
}


def describe(t, name, with_ptr):
    dtype = _DTYPES.get(t.dtype, str(t.dtype).replace("torch.", ""))
    index = t.device.index if t.device.index is not None else 0
    return _checks.TensorDesc(
        name=name,
        shape=tuple(t.shape),
        strides=tuple(t.stride()),
        dtype=dtype,
        device=(t.device.type, index),
        ptr=t.data_ptr() if with_ptr else None,
        itemsize=t.element_size(),
    )


def _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
           with_ptr):
    dq, dk, dv = (describe(t, n, with_ptr) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    dcq = dck = dalibi = None
    if cu_seqlens_q is None:
        problem = _checks.check_dense(dq, dk, dv)
    else:
        dcq = describe(cu_seqlens_q, "cu_seqlens_q", with_ptr)
        dck = describe(cu_seqlens_k, "cu_seqlens_k", with_ptr)
        problem = _checks.check_varlen(dq, dk, dv, dcq, dck, max_seqlen_q, max_seqlen_k)
    if alibi_slopes is not None:
        dalibi = describe(alibi_slopes, "alibi_slopes", with_ptr)
        _checks.check_alibi(dalibi, problem)
    return problem, (dq, dk, dv, dcq, dck, dalibi)


@torch.library.custom_op("flashcute::fwd", mutates_args=(), device_types="cuda")
def _fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    alibi_slopes: Optional[torch.Tensor],
    softmax_scale: float,
    causal: bool,
    causal_alignment: int,
    window_left: int,
    window_right: int,
    softcap: float,
    return_lse: bool,
    family: int,
    m_block: int,
    n_block: int,
    num_threads: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    problem, (dq, dk, dv, dcq, dck, dalibi) = _check(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, True)
    _checks.check_pointers((dq, dk, dv, dcq, dck, dalibi))
    out = torch.empty(problem.out_shape(), dtype=q.dtype, device=q.device)
    lse_shape = problem.lse_shape() if return_lse else (0,)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    options = _checks.Options(softmax_scale, causal, causal_alignment, window_left, window_right,
                              softcap, family, (m_block, n_block, num_threads))
    args = _checks.build_args(
        problem, options, dq, dk, dv, describe(out, "out", True),
        lse=describe(lse, "softmax_lse", True) if return_lse else None,
        cu_seqlens_q=dcq, cu_seqlens_k=dck, alibi=dalibi,
        stream=torch.cuda.current_stream(q.device).cuda_stream)
    _library.forward(args)
    return out, lse


@_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
              softmax_scale, causal, causal_alignment, window_left, window_right, softcap,
              return_lse, family, m_block, n_block, num_threads):
    if q.dim() == 4:
        batch, seqlen_q, heads, _ = q.shape
        lse_shape = (batch, heads, seqlen_q)
    else:
        total_q, heads, _ = q.shape
        lse_shape = (heads, total_q)
    out = q.new_empty(q.shape)
    lse = q.new_empty(lse_shape if return_lse else (0,), dtype=torch.float32)
    return out, lse


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
            options_fn, return_lse):
    """Checks metadata (raising before anything runs), then calls the op.

    options_fn(problem) checks the scalar options (the default scale needs head_dim).
    """
    for name, t in (("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k), ("alibi_slopes", alibi_slopes)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"q is a torch.Tensor, so {name} must be one too, got {type(t)}")
    problem, _ = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        alibi_slopes, False)
    options = options_fn(problem)
    # Forward only: silently returning an output with no grad_fn would let training run with
    # q/k/v never updated, so we refuse rather than drop gradients.
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise NotImplementedError(
            "backward: flashcute is forward-only and has no autograd; call it under "
            "torch.no_grad() / torch.inference_mode(), or pass detached q, k, v")
    out, lse = torch.ops.flashcute.fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k,
        problem.seqlen_q if problem.varlen else 0,
        problem.seqlen_k if problem.varlen else 0,
        alibi_slopes, options.softmax_scale, options.causal, options.causal_alignment,
        options.window_left, options.window_right, options.softcap, return_lse, options.family,
        *options.tile)
    return out, (lse if return_lse else None)


# The eager fast path. Everything it does not handle with certainty returns None, and the caller
# takes the checked path above.
_FAST_DTYPES = {torch.float16: _library.FLOAT16, torch.bfloat16: _library.BFLOAT16}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_is_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
_dispatch_mode = torch._C._get_dispatch_mode
_any_dispatch_mode = (torch._C._TorchDispatchModeKey.FAKE, torch._C._TorchDispatchModeKey.PROXY,
                      torch._C._TorchDispatchModeKey.FUNCTIONAL)


def fast_forward(q, k, v, softmax_scale, causal, window_size, softcap, return_lse):
    """(out, lse or None) for an eager dense call with default family and tile, or None."""
    tensor = torch.Tensor
    if type(q) is not tensor or type(k) is not tensor or type(v) is not tensor:
        return None
    if _raw_stream is None or torch.compiler.is_compiling():
        return None
    if any(_dispatch_mode(key) is not None for key in _any_dispatch_mode):
        return None
    if torch._C._is_torch_function_mode_enabled():
        return None
    if _is_wrapped is not None and (_is_wrapped(q) or _is_wrapped(k) or _is_wrapped(v)):
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return None
    dtype = q.dtype
    code = _FAST_DTYPES.get(dtype)
    if code is None or k.dtype is not dtype or v.dtype is not dtype or not q.is_cuda:
        return None
    shape_q = q.shape
    dims = _checks.fast_dense_dims(shape_q, k.shape, v.shape)
    if dims is None:
        return None
    for t in (q, k, v):
        if not _checks.fast_layout_ok(t.stride(), t.data_ptr()):
            return None
    options = _checks.fast_options(shape_q[3], softmax_scale, causal, window_size, softcap)
    if options is None:
        return None
    seqlen_k, heads_k = dims
    batch, seqlen_q, heads, _ = shape_q

    device = q.device
    out = torch.empty(shape_q, dtype=dtype, device=device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=device) \
        if return_lse else None
    lib, args, args_ref = _library.thread_args()
    _library.pack_dense_args(
        args, (q.data_ptr(), q.stride()), (k.data_ptr(), k.stride()), (v.data_ptr(), v.stride()),
        (out.data_ptr(), out.stride()), code, shape_q, seqlen_k, heads_k,
        lse.data_ptr() if return_lse else 0, *options, _raw_stream(q.get_device()))
    if lib.fc_forward(args_ref) != _library.OK:
        return None  # refused before any launch: the checked path reports why
    return out, lse

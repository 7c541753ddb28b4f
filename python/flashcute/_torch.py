"""The torch front end: custom ops (flashcute::fwd, flashcute::bwd, flashcute::kvcache) so
torch.compile and CUDA graphs see one node per pass, with flashcute::fwd differentiable through
flashcute::bwd. flashcute::kvcache (attention over a KV cache) writes the new keys and values into
the caches in place and has no gradient.

Imported only when a torch tensor is passed, so `import flashcute` works without torch. The Python
wrappers check metadata (traceable by dynamo); the ops' real implementations, which alone see data
pointers, check alignment and call the library on the current torch stream of q's device. Outputs
and the backward's workspace come from torch's allocator on that stream, so CUDA graph capture and
custom allocators see every allocation.

An eager call with plain tensors takes a shorter road (fast_forward): the custom op's dispatch
alone costs several times a tiny kernel's run time, and nothing needs the op when no compiler,
tracer or autograd is watching. The library checks every argument before it launches anything;
when it refuses a call, the call is rerun through the checked path, so every error keeps its
message.
"""

import ctypes
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


def _check_types(q, named):
    for name, t in named:
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"q is a torch.Tensor, so {name} must be one too, got {type(t)}")


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


def _check_backward(problem, dout, out, lse, with_ptr):
    descs = (describe(dout, "dout", with_ptr), describe(out, "out", with_ptr),
             describe(lse, "softmax_lse", with_ptr))
    _checks.check_backward(problem, *descs)
    return descs


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
    deterministic: bool,
    family: int,
    m_block: int,
    n_block: int,
    num_threads: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    # deterministic does nothing here (the forward pass always is); autograd keeps it for the
    # backward.
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
              return_lse, deterministic, family, m_block, n_block, num_threads):
    if q.dim() == 4:
        batch, seqlen_q, heads, _ = q.shape
        lse_shape = (batch, heads, seqlen_q)
    else:
        total_q, heads, _ = q.shape
        lse_shape = (heads, total_q)
    out = q.new_empty(q.shape)
    lse = q.new_empty(lse_shape if return_lse else (0,), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashcute::bwd", mutates_args=(), device_types="cuda")
def _bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
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
    deterministic: bool,
    family: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Descriptors: of the inputs (named as the user knows them), then of the gradients.
    problem, inputs = _check(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, True)
    desc_dout, desc_out, desc_lse = _check_backward(problem, dout, out, lse, True)
    _checks.check_pointers(inputs + (desc_dout, desc_out, desc_lse))
    desc_q, desc_k, desc_v, desc_cq, desc_ck, desc_alibi = inputs
    grads = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    options = _checks.Options(softmax_scale, causal, causal_alignment, window_left, window_right,
                              softcap, family, (0, 0, 0))
    args = _checks.build_backward_args(
        problem, options, desc_q, desc_k, desc_v, desc_out, desc_dout,
        *(describe(g, name, True) for g, name in zip(grads, ("dq", "dk", "dv"))), desc_lse,
        cu_seqlens_q=desc_cq, cu_seqlens_k=desc_ck, alibi=desc_alibi,
        deterministic=deterministic, stream=torch.cuda.current_stream(q.device).cuda_stream)
    # Allocated on the stream the kernels run on: the caching allocator hands the block out again
    # only to work queued after them. Its blocks are 512-byte aligned (the library asks 256).
    size = _library.backward_workspace_size(args)
    if size:
        workspace = torch.empty((size,), dtype=torch.uint8, device=q.device)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), size
    _library.backward(args)
    return grads


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              alibi_slopes, softmax_scale, causal, causal_alignment, window_left, window_right,
              softcap, deterministic, family):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _kernel_readable(t):
    """t when the kernels can read it where it lies (the layout the checks accept), else a
    contiguous copy. Autograd hands the backward whatever gradient the graph made: the broadcast
    of a sum (stride 0), a transposed view."""
    align = _checks.ALIGN_ELEMENTS
    strides = t.stride()
    if strides[-1] == 1 and t.storage_offset() % align == 0 and all(
            n == 1 or s % align == 0 for n, s in zip(t.shape[:-1], strides[:-1])):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, softmax_scale,
     causal, causal_alignment, window_left, window_right, softcap, _, deterministic, family,
     *_) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    ctx.options = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, causal_alignment,
                   window_left, window_right, softcap, deterministic, family)


def _fwd_backward(ctx, grad_out, grad_lse):
    """Gradients of q, k and v (None where not needed); none for the LSE (as FlashAttention), the
    ALiBi slopes, the offsets and the options."""
    grads = (None,) * len(ctx.needs_input_grad)
    if not any(ctx.needs_input_grad[:3]):
        return grads
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
    (max_seqlen_q, max_seqlen_k, softmax_scale, causal, causal_alignment, window_left,
     window_right, softcap, deterministic, family) = ctx.options
    dq, dk, dv = torch.ops.flashcute.bwd(
        _kernel_readable(grad_out), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, alibi_slopes, softmax_scale, causal, causal_alignment, window_left,
        window_right, softcap, deterministic, family)
    needed = ctx.needs_input_grad
    return (dq if needed[0] else None, dk if needed[1] else None,
            dv if needed[2] else None) + grads[3:]


_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
            options_fn, return_lse, deterministic):
    """Checks metadata (raising before anything runs), then calls the op.

    options_fn(problem) checks the scalar options (the default scale needs head_dim).
    """
    _check_types(q, (("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                     ("cu_seqlens_k", cu_seqlens_k), ("alibi_slopes", alibi_slopes)))
    problem, _ = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        alibi_slopes, False)
    options = options_fn(problem)
    # When autograd records the call, its backward needs the LSE, asked for or not.
    recorded = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    out, lse = torch.ops.flashcute.fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k,
        problem.seqlen_q if problem.varlen else 0,
        problem.seqlen_k if problem.varlen else 0,
        alibi_slopes, options.softmax_scale, options.causal, options.causal_alignment,
        options.window_left, options.window_right, options.softcap, return_lse or recorded,
        bool(deterministic), options.family, *options.tile)
    return out, (lse if return_lse else None)


def backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
             max_seqlen_k, alibi_slopes, options_fn, deterministic):
    """Checks metadata (raising before anything runs), then calls flashcute::bwd: (dq, dk, dv)."""
    _check_types(q, (("dout", dout), ("k", k), ("v", v), ("out", out),
                     ("softmax_lse", softmax_lse), ("cu_seqlens_q", cu_seqlens_q),
                     ("cu_seqlens_k", cu_seqlens_k), ("alibi_slopes", alibi_slopes)))
    problem, _ = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        alibi_slopes, False)
    _check_backward(problem, dout, out, softmax_lse, False)
    options = options_fn(problem)
    return torch.ops.flashcute.bwd(
        dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
        problem.seqlen_q if problem.varlen else 0,
        problem.seqlen_k if problem.varlen else 0,
        alibi_slopes, options.softmax_scale, options.causal, options.causal_alignment,
        options.window_left, options.window_right, options.softcap, deterministic, options.family)


# ---------------------------------------------------------------------------------------------
# Attention over a KV cache.

# The tensors of a flashcute::kvcache call, by the names the user knows them by.
_KVCACHE_TENSORS = ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin",
                    "cache_seqlens", "cache_batch_idx", "cache_leftpad", "block_table",
                    "cu_seqlens_q", "alibi_slopes")


def _check_kvcache(tensors, cache_seqlen, max_seqlen_q, with_ptr):
    """(problem, descs) for a dict name -> tensor or None (names as in _KVCACHE_TENSORS)."""
    descs = {name: describe(t, name, with_ptr) for name, t in tensors.items() if t is not None}
    alibi = descs.pop("alibi_slopes", None)
    problem = _checks.check_kvcache(**descs, cache_seqlen=cache_seqlen, max_seqlen_q=max_seqlen_q,
                                    alibi=alibi)
    if alibi is not None:
        descs["alibi_slopes"] = alibi
    return problem, descs


@torch.library.custom_op("flashcute::kvcache", mutates_args=("k_cache", "v_cache"),
                         device_types="cuda")
def _kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor],
    v: Optional[torch.Tensor],
    rotary_cos: Optional[torch.Tensor],
    rotary_sin: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    cache_seqlen: int,
    cache_batch_idx: Optional[torch.Tensor],
    cache_leftpad: Optional[torch.Tensor],
    block_table: Optional[torch.Tensor],
    cu_seqlens_q: Optional[torch.Tensor],
    max_seqlen_q: int,
    alibi_slopes: Optional[torch.Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
    return_lse: bool,
    debug_checks: bool,
    family: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    # cache_seqlen holds for every sequence when cache_seqlens is None (the wrapper resolved it).
    tensors = dict(zip(_KVCACHE_TENSORS, (
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, cu_seqlens_q, alibi_slopes)))
    problem, descs = _check_kvcache(
        tensors, None if cache_seqlens is not None else cache_seqlen, max_seqlen_q, True)
    _checks.check_pointers(descs.values())
    out = torch.empty(problem.out_shape(), dtype=q.dtype, device=q.device)
    lse = torch.empty(problem.lse_shape() if return_lse else (0,), dtype=torch.float32,
                      device=q.device)
    options = _checks.KvcacheOptions(
        softmax_scale, causal, _library.CAUSAL_BOTTOM_RIGHT, window_left, window_right, softcap,
        family, (0, 0, 0), rotary_interleaved, num_splits, debug_checks)
    named = {name: descs.get(name) for name in _KVCACHE_TENSORS if name != "q"}
    named["alibi"] = named.pop("alibi_slopes")
    args = _checks.build_kvcache_args(
        problem, options, descs["q"], describe(out, "out", True),
        lse=describe(lse, "softmax_lse", True) if return_lse else None,
        stream=torch.cuda.current_stream(q.device).cuda_stream, **named)
    # Scratch for the split keys' partial results, on the stream the kernels run on (see _bwd).
    size = _library.kvcache_workspace_size(args)
    if size:
        workspace = torch.empty((size,), dtype=torch.uint8, device=q.device)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), size
    _library.kvcache(args)
    return out, lse


@_kvcache.register_fake
def _kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
                  cache_batch_idx, cache_leftpad, block_table, cu_seqlens_q, max_seqlen_q,
                  alibi_slopes, softmax_scale, causal, window_left, window_right, softcap,
                  rotary_interleaved, num_splits, return_lse, debug_checks, family):
    if q.dim() == 4:
        batch, seqlen_q, heads, _ = q.shape
        lse_shape = (batch, heads, seqlen_q)
    else:
        total_q, heads, _ = q.shape
        lse_shape = (heads, total_q)
    out = q.new_empty(q.shape)
    lse = q.new_empty(lse_shape if return_lse else (0,), dtype=torch.float32)
    return out, lse


def kvcache(tensors, cache_seqlen, max_seqlen_q, options_fn, return_lse):
    """Checks metadata (raising before anything runs), then calls flashcute::kvcache.

    tensors: name -> tensor or None, the names of _KVCACHE_TENSORS; cache_seqlen: an int for every
    sequence, or None (the capacity) when tensors["cache_seqlens"] is None. Returns (out, lse or
    None).
    """
    _check_types(tensors["q"], [(name, t) for name, t in tensors.items() if name != "q"])
    problem, _ = _check_kvcache(tensors, cache_seqlen, max_seqlen_q, False)
    options = options_fn(problem)
    t = tensors
    out, lse = torch.ops.flashcute.kvcache(
        t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"], t["rotary_cos"], t["rotary_sin"],
        t["cache_seqlens"], problem.cache_seqlen, t["cache_batch_idx"], t["cache_leftpad"],
        t["block_table"], t["cu_seqlens_q"], problem.seqlen_q if problem.varlen else 0,
        t["alibi_slopes"], options.softmax_scale, options.causal, options.window_left,
        options.window_right, options.softcap, options.rotary_interleaved, options.num_splits,
        return_lse, options.debug_checks, options.family)
    return out, (lse if return_lse else None)


# The eager fast path. Everything it does not handle with certainty returns None, and the caller
# takes the checked path above.
_FAST_DTYPES = {torch.float16: _library.FLOAT16, torch.bfloat16: _library.BFLOAT16}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_is_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
_dispatch_mode = torch._C._get_dispatch_mode
_any_dispatch_mode = (torch._C._TorchDispatchModeKey.FAKE, torch._C._TorchDispatchModeKey.PROXY,
                      torch._C._TorchDispatchModeKey.FUNCTIONAL)


def _plain_eager(*tensors):
    """Whether an eager call on these tensors may skip the custom op: plain torch tensors that need
    no gradient, outside torch.compile, fake or functional modes and functorch transforms."""
    if any(type(t) is not torch.Tensor for t in tensors):
        return False
    if _raw_stream is None or torch.compiler.is_compiling():
        return False
    if any(_dispatch_mode(key) is not None for key in _any_dispatch_mode):
        return False
    if torch._C._is_torch_function_mode_enabled():
        return False
    if _is_wrapped is not None and any(_is_wrapped(t) for t in tensors):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def fast_forward(q, k, v, softmax_scale, causal, window_size, softcap, return_lse):
    """(out, lse or None) for an eager dense call with default family and tile, or None."""
    if not _plain_eager(q, k, v):
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


def _fast_tensor(field, t):
    """Fills an FcTensor from a 4-D tensor whose layout fast_layout_ok accepted."""
    stride = t.stride()
    field.data, field.batch_stride, field.seq_stride, field.head_stride = (
        t.data_ptr(), stride[0], stride[1], stride[2])


def _fast_index_ok(t, device, shape):
    """A contiguous int32 torch tensor of this shape on q's device."""
    return (type(t) is torch.Tensor and t.dtype is torch.int32 and t.device == device
            and t.shape == shape and t.is_contiguous())


def fast_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal,
                 window_size, softcap, num_splits, return_lse):
    """(out, lse or None) for an eager decode step (no rotary, cache_batch_idx, leftpad or ALiBi;
    automatic family), or None: then the checked path runs and reports any error. The library
    validates what it is given; this checks what it cannot see (dtypes, devices, shapes that must
    agree)."""
    if (k is None) != (v is None):
        return None
    # With requires_grad the checked path's op raises on backward, as it should.
    if not _plain_eager(q, k_cache, v_cache, *((k, v) if k is not None else ())):
        return None
    tensor = torch.Tensor
    dtype = q.dtype
    code = _FAST_DTYPES.get(dtype)
    if code is None or not q.is_cuda or k_cache.dtype is not dtype or v_cache.dtype is not dtype:
        return None
    device = q.device
    if k_cache.device != device or v_cache.device != device:
        return None
    shape_q, shape_cache = q.shape, k_cache.shape
    if len(shape_q) != 4 or len(shape_cache) != 4 or v_cache.shape != shape_cache:
        return None
    batch, seqlen_q, heads, head_dim = shape_q
    heads_k = shape_cache[2]
    if (shape_cache[3] != head_dim or batch < 1 or seqlen_q < 1 or heads_k < 1
            or heads % heads_k or head_dim % _checks.ALIGN_ELEMENTS
            or head_dim > _checks.MAX_HEAD_DIM):
        return None
    seqlen_new = 0
    if k is not None:
        if (k.dtype is not dtype or v.dtype is not dtype or k.device != device
                or v.device != device or len(k.shape) != 4 or v.shape != k.shape
                or k.shape[0] != batch or k.shape[2] != heads_k or k.shape[3] != head_dim):
            return None
        seqlen_new = k.shape[1]
    layouts = [q, k_cache, v_cache] + ([k, v] if k is not None else [])
    for t in layouts:
        if not _checks.fast_layout_ok(t.stride(), t.data_ptr()):
            return None
    if block_table is not None:
        if (type(block_table) is not tensor or block_table.dtype is not torch.int32
                or block_table.device != device or block_table.dim() != 2
                or block_table.shape[0] != batch or block_table.stride(1) != 1):
            return None
    if type(cache_seqlens) is int:
        if cache_seqlens < 0:
            return None
    elif not _fast_index_ok(cache_seqlens, device, (batch,)):
        return None
    options = _checks.fast_options(head_dim, softmax_scale, causal, window_size, softcap)
    if options is None or type(num_splits) is not int:
        return None
    scale, causal, left, right, softcap = options

    out = torch.empty(shape_q, dtype=dtype, device=device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=device) \
        if return_lse else None
    lib, args, args_ref, size, size_ref = _library.thread_kvcache_args()
    ctypes.memset(args_ref, 0, ctypes.sizeof(args))
    args.abi_version = _library.ABI_VERSION
    _fast_tensor(args.q, q)
    _fast_tensor(args.o, out)
    _fast_tensor(args.k_cache, k_cache)
    _fast_tensor(args.v_cache, v_cache)
    if k is not None:
        _fast_tensor(args.k_new, k)
        _fast_tensor(args.v_new, v)
    args.dtype = code
    args.batch, args.seqlen_q, args.heads, args.heads_k, args.head_dim = (
        batch, seqlen_q, heads, heads_k, head_dim)
    args.seqlen_new = seqlen_new
    args.batch_cache, args.seqlen_cache = shape_cache[0], shape_cache[1]
    if type(cache_seqlens) is int:
        args.cache_seqlen = cache_seqlens
    else:
        args.cache_seqlens = cache_seqlens.data_ptr()
    if block_table is not None:
        args.block_table = block_table.data_ptr()
        args.block_table_stride = block_table.stride(0)
        args.pages_per_sequence = block_table.shape[1]
    args.softmax_lse = lse.data_ptr() if return_lse else None
    args.softmax_scale, args.causal, args.window_left, args.window_right, args.softcap = (
        scale, int(causal), left, right, softcap)
    args.num_splits = num_splits
    args.stream = _raw_stream(q.get_device())
    if lib.fc_kvcache_workspace_size(args_ref, size_ref) != _library.OK:
        return None
    workspace = None
    if size.value:
        workspace = torch.empty((size.value,), dtype=torch.uint8, device=device)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), size.value
    if lib.fc_kvcache(args_ref) != _library.OK:
        return None  # refused before any launch: the checked path reports why
    return out, lse

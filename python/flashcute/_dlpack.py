"""The DLPack front end: CuPy, JAX and any other producer of __dlpack__ / __dlpack_device__.

Inputs are read by parsing the DLPack capsule (a DLManagedTensor, which starts with a DLTensor),
so no framework is imported to read them. Outputs are allocated in the caller's framework where it
can allocate (CuPy); JAX arrays are immutable, so for JAX (and unknown producers) the output is
allocated with torch when it is installed (it has bfloat16), else with CuPy, and JAX inputs get it
back as a JAX array through jax.dlpack.from_dlpack. The backward's gradients and workspace come
from the same allocator.
"""

import ctypes
import math
import struct

from . import _checks, _library

KDL_CPU = 1
KDL_CUDA = 2
_DEVICE_NAMES = {
    1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi",
    10: "rocm", 11: "rocm_host", 13: "cuda_managed", 14: "oneapi",
}
# (DLDataTypeCode, bits) -> our dtype names; kDLInt = 0, kDLFloat = 2, kDLBfloat = 4.
_DTYPES = {(2, 16): "fp16", (4, 16): "bf16", (2, 32): "fp32", (0, 32): "int32"}
_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


# DLTensor's fields as stored (64-bit): data, device (type, id), ndim, dtype (code, bits, lanes),
# shape, strides, byte_offset. DLTensor above names the same layout.
_DL_TENSOR = struct.Struct("=QiiiBBHQQQ")
assert _DL_TENSOR.size == ctypes.sizeof(DLTensor)
_INT64_ARRAYS = {}


def _int64_array(n):
    array = _INT64_ARRAYS.get(n)
    if array is None:
        array = _INT64_ARRAYS[n] = struct.Struct(f"={n}q")
    return array


_CAPSULE_NAME = b"dltensor"
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid.restype = ctypes.c_int
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer.restype = ctypes.c_void_p


def device_name(device_type):
    return _DEVICE_NAMES.get(device_type, f"dlpack_device_type_{device_type}")


def read_capsule(capsule, name):
    """A TensorDesc for a legacy ('dltensor') DLPack capsule, which stays owned by the caller.

    The capsule is not consumed: its destructor still releases the producer's buffer, so the caller
    keeps the capsule alive for as long as the pointer is used.
    """
    if not _capsule_is_valid(capsule, _CAPSULE_NAME):
        raise TypeError(f"{name}: __dlpack__() did not return an unused 'dltensor' capsule")
    # One read of the DLTensor header (DLManagedTensor starts with it) and one of each array:
    # ctypes field by field costs several times as much, which a tiny call would feel.
    (data, device_type, device_id, ndim, code, bits, lanes, shape_ptr, strides_ptr,
     byte_offset) = _DL_TENSOR.unpack(
        ctypes.string_at(_capsule_pointer(capsule, _CAPSULE_NAME), _DL_TENSOR.size))
    array = _int64_array(ndim)
    shape = array.unpack(ctypes.string_at(shape_ptr, array.size)) if ndim else ()
    if strides_ptr:
        strides = array.unpack(ctypes.string_at(strides_ptr, array.size)) if ndim else ()
    else:
        # NULL strides mean a compact row-major layout.
        strides = tuple(math.prod(shape[i + 1:]) for i in range(ndim))
    dtype = _DTYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        dtype = f"{_CODE_NAMES.get(code, f'code{code}')}{bits}"
        dtype += f"x{lanes}" if lanes != 1 else ""
    return _checks.TensorDesc(
        name=name,
        shape=shape,
        strides=strides,
        dtype=dtype,
        device=(device_name(device_type), device_id),
        ptr=(data or 0) + byte_offset,
        itemsize=max(bits // 8, 1) * lanes,
    )


def _dlpack_device(x, name):
    if not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
        raise TypeError(
            f"{name} must be a torch.Tensor or an array with __dlpack__ / __dlpack_device__ "
            f"(CuPy, JAX, ...), got {type(x).__module__}.{type(x).__qualname__}")
    device_type, device_id = x.__dlpack_device__()
    return int(device_type), int(device_id)


def _framework(x):
    return type(x).__module__.split(".")[0]


class _CupyAllocator:
    def __init__(self, device_index):
        import cupy

        self._cupy = cupy
        self._device = cupy.cuda.Device(device_index)

    def stream(self):
        with self._device:
            return self._cupy.cuda.get_current_stream().ptr

    def empty(self, shape, dtype):
        if dtype == "bf16":
            raise TypeError(
                "CuPy has no bfloat16 array type to hold the output; install torch, or use float16")
        with self._device:
            return self._cupy.empty(
                shape, dtype={"fp16": "float16", "fp32": "float32", "uint8": "uint8"}[dtype])

    @staticmethod
    def pointer(array):
        return array.data.ptr


class _TorchAllocator:
    def __init__(self, device_index):
        import torch

        self._torch = torch
        self._device = torch.device("cuda", device_index)

    def stream(self):
        return self._torch.cuda.current_stream(self._device).cuda_stream

    def empty(self, shape, dtype):
        torch = self._torch
        dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
                  "uint8": torch.uint8}
        return torch.empty(shape, dtype=dtypes[dtype], device=self._device)

    @staticmethod
    def pointer(tensor):
        return tensor.data_ptr()


_allocators = {}


def _cached_allocator(framework, device_index):
    """The allocator of (framework, device), made once; ImportError as _allocator_for."""
    key = (framework, device_index)
    allocator = _allocators.get(key)
    if allocator is None:
        allocator = _allocators[key] = _allocator_for(framework, device_index)
    return allocator


def _allocator_for(framework, device_index):
    """CuPy for CuPy inputs; otherwise torch when installed (bfloat16), else CuPy."""
    order = (_CupyAllocator,) if framework == "cupy" else (_TorchAllocator, _CupyAllocator)
    for allocator in order:
        try:
            return allocator(device_index)
        except ImportError:
            continue
    raise ImportError(
        f"flashcute needs torch or cupy to allocate the output for {framework} inputs; "
        "install one of them")


def _out_desc(name, array, shape, dtype, device_index, pointer):
    strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return _checks.TensorDesc(name, tuple(shape), strides, dtype, ("cuda", device_index),
                              ptr=pointer(array), itemsize=4 if dtype == "fp32" else 2)


def _export(inputs):
    """Exports (name, array) pairs, q first, on the stream the library will run on.

    Returns (framework, device index, allocator, stream, capsules, descs). Every device is checked
    before any __dlpack__ call: the stream handed to a producer must belong to the device its array
    lives on. The caller keeps the capsules (and with them the producers' buffers) referenced until
    its launch is queued; from then on the callers' own arrays keep the memory alive.
    """
    devices = {name: _dlpack_device(x, name) for name, x in inputs}
    q_type, q_index = devices["q"]
    for name, (device_type, index) in devices.items():
        if device_type != KDL_CUDA:
            raise ValueError(
                f"{name} must be on a CUDA device, got {device_name(device_type)}:{index}")
        if index != q_index:
            raise ValueError(
                f"{name} is on cuda:{index} but q is on cuda:{q_index}; they must match")

    framework = _framework(inputs[0][1])
    allocator = _cached_allocator(framework, q_index)
    stream = allocator.stream()
    # DLPack reserves 0 for CUDA; 1 names the legacy default stream, which is what 0 means here.
    producer_stream = stream if stream else 1
    capsules = {name: x.__dlpack__(stream=producer_stream) for name, x in inputs}
    descs = {name: read_capsule(capsule, name) for name, capsule in capsules.items()}
    return framework, q_index, allocator, stream, capsules, descs


def _side_inputs(cu_seqlens_q, cu_seqlens_k, alibi_slopes):
    inputs = []
    if cu_seqlens_q is not None:
        inputs += [("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)]
    if alibi_slopes is not None:
        inputs.append(("alibi_slopes", alibi_slopes))
    return inputs


def _check_problem(descs, max_seqlen_q, max_seqlen_k):
    dq, dk, dv = descs["q"], descs["k"], descs["v"]
    if "cu_seqlens_q" not in descs:
        problem = _checks.check_dense(dq, dk, dv)
    else:
        problem = _checks.check_varlen(dq, dk, dv, descs["cu_seqlens_q"], descs["cu_seqlens_k"],
                                       max_seqlen_q, max_seqlen_k)
    _checks.check_alibi(descs.get("alibi_slopes"), problem)
    return problem


def _to_caller(framework, arrays):
    """JAX inputs get JAX arrays back; every other framework its own arrays."""
    if framework not in ("jax", "jaxlib"):
        return arrays
    import jax.dlpack

    return tuple(None if a is None else jax.dlpack.from_dlpack(a) for a in arrays)


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
            options_fn, return_lse):
    """Runs one call for DLPack inputs; options_fn(problem) checks the scalar options."""
    inputs = [("q", q), ("k", k), ("v", v)]
    inputs += _side_inputs(cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    framework, q_index, allocator, stream, capsules, descs = _export(inputs)
    problem = _check_problem(descs, max_seqlen_q, max_seqlen_k)
    options = options_fn(problem)
    _checks.check_pointers(descs.values())

    out = allocator.empty(problem.out_shape(), problem.dtype)
    out_desc = _out_desc("out", out, problem.out_shape(), problem.dtype, q_index, allocator.pointer)
    lse = lse_desc = None
    if return_lse:
        lse = allocator.empty(problem.lse_shape(), "fp32")
        lse_desc = _out_desc("softmax_lse", lse, problem.lse_shape(), "fp32", q_index,
                             allocator.pointer)
    args = _checks.build_args(problem, options, descs["q"], descs["k"], descs["v"], out_desc,
                              lse=lse_desc, cu_seqlens_q=descs.get("cu_seqlens_q"),
                              cu_seqlens_k=descs.get("cu_seqlens_k"),
                              alibi=descs.get("alibi_slopes"), stream=stream)
    _library.forward(args)
    del capsules  # the launch is queued
    return _to_caller(framework, (out, lse))


def backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
             max_seqlen_k, alibi_slopes, options_fn, deterministic):
    """(dq, dk, dv) for DLPack inputs, allocated as forward() allocates its output."""
    inputs = [("q", q), ("k", k), ("v", v), ("dout", dout), ("out", out),
              ("softmax_lse", softmax_lse)]
    inputs += _side_inputs(cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    framework, q_index, allocator, stream, capsules, descs = _export(inputs)
    problem = _check_problem(descs, max_seqlen_q, max_seqlen_k)
    _checks.check_backward(problem, descs["dout"], descs["out"], descs["softmax_lse"])
    options = options_fn(problem)
    _checks.check_pointers(descs.values())

    grads, grad_descs = [], []
    for name in ("q", "k", "v"):
        shape = descs[name].shape
        grads.append(allocator.empty(shape, problem.dtype))
        grad_descs.append(_out_desc(f"d{name}", grads[-1], shape, problem.dtype, q_index,
                                    allocator.pointer))
    args = _checks.build_backward_args(
        problem, options, descs["q"], descs["k"], descs["v"], descs["out"], descs["dout"],
        *grad_descs, descs["softmax_lse"], cu_seqlens_q=descs.get("cu_seqlens_q"),
        cu_seqlens_k=descs.get("cu_seqlens_k"), alibi=descs.get("alibi_slopes"),
        deterministic=deterministic, stream=stream)
    # From the allocator of the stream the kernels run on: torch's and CuPy's pools hand a freed
    # block out again only to work queued after them on that stream. Both align blocks to 512
    # bytes (the library asks 256).
    size = _library.backward_workspace_size(args)
    if size:
        workspace = allocator.empty((size,), "uint8")
        args.workspace, args.workspace_bytes = allocator.pointer(workspace), size
    _library.backward(args)
    del capsules  # the launch is queued
    return _to_caller(framework, tuple(grads))


def kvcache(tensors, cache_seqlen, max_seqlen_q, options_fn, return_lse):
    """Attention over a KV cache for DLPack inputs: (out, lse or None), allocated as forward()
    allocates its output. tensors: name -> array or None (the names of _torch._KVCACHE_TENSORS);
    cache_seqlen as there. New keys and values are written into k_cache and v_cache in place."""
    if tensors.get("k") is not None and _framework(tensors["k_cache"]) in ("jax", "jaxlib"):
        raise ValueError(
            "k and v: JAX arrays are immutable, so the new keys and values cannot be written into "
            "k_cache and v_cache; append them with JAX and pass k=None, v=None")
    inputs = [(name, x) for name, x in tensors.items() if x is not None]
    framework, q_index, allocator, stream, capsules, descs = _export(inputs)
    alibi = descs.pop("alibi_slopes", None)
    problem = _checks.check_kvcache(**descs, cache_seqlen=cache_seqlen,
                                    max_seqlen_q=max_seqlen_q, alibi=alibi)
    options = options_fn(problem)
    _checks.check_pointers(list(descs.values()) + [alibi])

    out = allocator.empty(problem.out_shape(), problem.dtype)
    out_desc = _out_desc("out", out, problem.out_shape(), problem.dtype, q_index, allocator.pointer)
    lse = lse_desc = None
    if return_lse:
        lse = allocator.empty(problem.lse_shape(), "fp32")
        lse_desc = _out_desc("softmax_lse", lse, problem.lse_shape(), "fp32", q_index,
                             allocator.pointer)
    named = {name: descs.get(name) for name in (
        "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
        "cache_batch_idx", "cache_leftpad", "block_table", "cu_seqlens_q")}
    args = _checks.build_kvcache_args(problem, options, descs["q"], out_desc, lse=lse_desc,
                                      alibi=alibi, stream=stream, **named)
    # From the allocator of the stream the kernels run on, as backward()'s workspace.
    size = _library.kvcache_workspace_size(args)
    if size:
        workspace = allocator.empty((size,), "uint8")
        args.workspace, args.workspace_bytes = allocator.pointer(workspace), size
    _library.kvcache(args)
    del capsules  # the launch is queued
    out, lse = _to_caller(framework, (out, lse))
    return out, lse


_FAST_DTYPES = {"fp16": _library.FLOAT16, "bf16": _library.BFLOAT16}


def fast_forward(q, k, v, softmax_scale, causal, window_size, softcap, return_lse):
    """(out, lse or None) for a dense call of CUDA arrays with default family and tile, or None.

    The same exports, stream hand-over and allocation as forward(), without its descriptor
    checks: anything uncommon returns None before a launch, and a call the library refuses also
    returns None, so that forward() reports it with the usual message.
    """
    try:
        device_q, device_k, device_v = (
            x.__dlpack_device__() for x in (q, k, v))
    except AttributeError:
        return None
    if device_q[0] != KDL_CUDA or device_k != device_q or device_v != device_q:
        return None
    framework = _framework(q)
    if framework in ("jax", "jaxlib"):
        return None  # outputs go back through jax.dlpack: the checked path does that
    try:
        allocator = _cached_allocator(framework, int(device_q[1]))
    except ImportError:
        return None
    stream = allocator.stream()
    producer_stream = stream if stream else 1
    capsules = [x.__dlpack__(stream=producer_stream) for x in (q, k, v)]
    descs = [read_capsule(c, name) for c, name in zip(capsules, ("q", "k", "v"))]
    dq, dk, dv = descs
    code = _FAST_DTYPES.get(dq.dtype)
    if code is None or dk.dtype != dq.dtype or dv.dtype != dq.dtype:
        return None
    dims = _checks.fast_dense_dims(dq.shape, dk.shape, dv.shape)
    if dims is None or not all(_checks.fast_layout_ok(d.strides, d.ptr) for d in descs):
        return None
    options = _checks.fast_options(dq.shape[3], softmax_scale, causal, window_size, softcap)
    if options is None:
        return None
    batch, seqlen_q, heads, head_dim = dq.shape
    try:
        out = allocator.empty(dq.shape, dq.dtype)
        lse = allocator.empty((batch, heads, seqlen_q), "fp32") if return_lse else None
    except TypeError:
        return None  # no array type for the output: the checked path says so
    lib, args, args_ref = _library.thread_args()
    _library.pack_dense_args(
        args, (dq.ptr, dq.strides), (dk.ptr, dk.strides), (dv.ptr, dv.strides),
        (allocator.pointer(out), (seqlen_q * heads * head_dim, heads * head_dim, head_dim)),
        code, dq.shape, *dims, allocator.pointer(lse) if return_lse else 0, *options, stream)
    status = lib.fc_forward(args_ref)
    del capsules  # the launch is queued: the callers' arrays keep the memory alive from here on
    return (out, lse) if status == _library.OK else None

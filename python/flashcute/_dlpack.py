"""The DLPack front end: CuPy, JAX and any other producer of __dlpack__ / __dlpack_device__.

Inputs are read by parsing the DLPack capsule (DLManagedTensor) with ctypes, so no framework is
imported to read them. Outputs are allocated in the caller's framework where it can allocate
(CuPy); JAX arrays are immutable, so for JAX (and unknown producers) the output is allocated with
torch when it is installed (it has bfloat16), else with CuPy, and JAX inputs get it back as a JAX
array through jax.dlpack.from_dlpack.
"""

import ctypes
import math

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
    managed = DLManagedTensor.from_address(_capsule_pointer(capsule, _CAPSULE_NAME))
    t = managed.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:
        # NULL strides mean a compact row-major layout.
        strides = tuple(math.prod(shape[i + 1:]) for i in range(t.ndim))
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    dtype = _DTYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        dtype = f"{_CODE_NAMES.get(code, f'code{code}')}{bits}"
        dtype += f"x{lanes}" if lanes != 1 else ""
    return _checks.TensorDesc(
        name=name,
        shape=shape,
        strides=strides,
        dtype=dtype,
        device=(device_name(t.device.device_type), t.device.device_id),
        ptr=(t.data or 0) + t.byte_offset,
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
            return self._cupy.empty(shape, dtype={"fp16": "float16", "fp32": "float32"}[dtype])

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
        dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
        return torch.empty(shape, dtype=dtypes[dtype], device=self._device)

    @staticmethod
    def pointer(tensor):
        return tensor.data_ptr()


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


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
            options_fn, return_lse):
    """Runs one call for DLPack inputs; options_fn(problem) checks the scalar options."""
    inputs = [("q", q), ("k", k), ("v", v)]
    if cu_seqlens_q is not None:
        inputs += [("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)]
    if alibi_slopes is not None:
        inputs.append(("alibi_slopes", alibi_slopes))
    # Every device is checked before any __dlpack__ call: the stream handed to a producer must
    # belong to the device its array lives on.
    devices = {name: _dlpack_device(x, name) for name, x in inputs}
    q_type, q_index = devices["q"]
    for name, (device_type, index) in devices.items():
        if device_type != KDL_CUDA:
            raise ValueError(
                f"{name} must be on a CUDA device, got {device_name(device_type)}:{index}")
        if index != q_index:
            raise ValueError(
                f"{name} is on cuda:{index} but q is on cuda:{q_index}; they must match")

    framework = _framework(q)
    allocator = _allocator_for(framework, q_index)
    stream = allocator.stream()
    # DLPack reserves 0 for CUDA; 1 names the legacy default stream, which is what 0 means here.
    producer_stream = stream if stream else 1
    capsules = {name: x.__dlpack__(stream=producer_stream) for name, x in inputs}
    descs = {name: read_capsule(capsule, name) for name, capsule in capsules.items()}

    dq, dk, dv = descs["q"], descs["k"], descs["v"]
    if cu_seqlens_q is None:
        problem = _checks.check_dense(dq, dk, dv)
    else:
        problem = _checks.check_varlen(dq, dk, dv, descs["cu_seqlens_q"], descs["cu_seqlens_k"],
                                       max_seqlen_q, max_seqlen_k)
    _checks.check_alibi(descs.get("alibi_slopes"), problem)
    options = options_fn(problem)
    _checks.check_pointers(descs.values())

    out = allocator.empty(problem.out_shape(), problem.dtype)
    out_desc = _out_desc("out", out, problem.out_shape(), problem.dtype, q_index, allocator.pointer)
    lse = lse_desc = None
    if return_lse:
        lse = allocator.empty(problem.lse_shape(), "fp32")
        lse_desc = _out_desc("softmax_lse", lse, problem.lse_shape(), "fp32", q_index,
                             allocator.pointer)
    args = _checks.build_args(problem, options, dq, dk, dv, out_desc, lse=lse_desc,
                              cu_seqlens_q=descs.get("cu_seqlens_q"),
                              cu_seqlens_k=descs.get("cu_seqlens_k"),
                              alibi=descs.get("alibi_slopes"), stream=stream)
    _library.forward(args)
    # The capsules (and with them the producers' buffers) stay referenced until the launch is
    # queued; from here on the callers' own arrays keep the memory alive.
    del capsules

    if framework in ("jax", "jaxlib"):
        import jax.dlpack

        out = jax.dlpack.from_dlpack(out)
        lse = jax.dlpack.from_dlpack(lse) if lse is not None else None
    return out, lse

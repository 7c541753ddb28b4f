"""CPU-only tests (no torch, no GPU): argument checks, DLPack parsing, the C structs, the library.

The fake CUDA arrays below are DLPack producers whose capsules describe memory that is never
touched: every check under test runs before the library (or any allocation) is reached.
"""

import ctypes
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import flashcute
from flashcute import _checks, _dlpack, _library, mask

REPO = pathlib.Path(__file__).resolve().parents[2]
HEADER = REPO / "include" / "flashcute" / "flashcute.h"

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_new.restype = ctypes.py_object

FP16, BF16, FP32, INT32 = (2, 16), (4, 16), (2, 32), (0, 32)


class FakeCudaArray:
    """A DLPack producer for a CUDA array that does not exist (only its metadata is read)."""

    def __init__(self, shape, strides=None, dtype=BF16, ptr=0x7F0000000000, device=(2, 0)):
        self.shape = tuple(shape)
        self.device = device
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._strides = None
        if strides is not None:
            self._strides = (ctypes.c_int64 * max(len(shape), 1))(*strides)
        self._managed = _dlpack.DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = ptr
        t.device = _dlpack.DLDevice(*device)
        t.ndim = len(shape)
        t.dtype = _dlpack.DLDataType(dtype[0], dtype[1], 1)
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        if self._strides is not None:
            t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = 0
        self.stream_seen = "not called"

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.stream_seen = stream
        return _capsule_new(ctypes.addressof(self._managed), b"dltensor", None)


def desc(array, name):
    return _dlpack.read_capsule(array.__dlpack__(), name)


def dense(b=2, sq=64, sk=96, h=8, hk=2, d=64, dtype=BF16, **overrides):
    arrays = {
        "q": FakeCudaArray((b, sq, h, d), dtype=dtype),
        "k": FakeCudaArray((b, sk, hk, d), dtype=dtype),
        "v": FakeCudaArray((b, sk, hk, d), dtype=dtype),
    }
    arrays.update(overrides)
    return {name: desc(a, name) for name, a in arrays.items()}


# ---------------------------------------------------------------------------------------------
# DLPack parsing, checked against NumPy's own view of the same memory.

@pytest.mark.parametrize("seed", range(6))
def test_read_capsule_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(x) for x in rng.integers(1, 7, size=rng.integers(1, 5)))
    dtype = [np.float16, np.float32, np.int32, np.float64][seed % 4]
    base = rng.standard_normal(tuple(2 * n + 1 for n in shape)).astype(dtype)
    # A strided, offset view: start, step and (when 2-D or more) transposition vary.
    view = base[tuple(slice(int(rng.integers(0, 2)), None, int(rng.integers(1, 3))) for _ in shape)]
    if view.ndim >= 2 and seed % 2:
        view = view.swapaxes(0, -1)
    t = _dlpack.read_capsule(view.__dlpack__(), "x")
    assert t.shape == view.shape
    assert t.strides == tuple(s // view.itemsize for s in view.strides)
    assert t.ptr == view.ctypes.data
    assert t.device == ("cpu", 0)
    expected = {np.float16: "fp16", np.float32: "fp32", np.int32: "int32", np.float64: "float64"}
    assert t.dtype == expected[dtype]


def test_read_capsule_null_strides_mean_row_major():
    t = desc(FakeCudaArray((3, 5, 7, 8)), "q")
    assert t.strides == (280, 56, 8, 1)
    assert t.device == ("cuda", 0)
    assert t.dtype == "bf16"


def test_read_capsule_refuses_other_objects():
    with pytest.raises(TypeError, match="capsule"):
        _dlpack.read_capsule(object(), "q")


# ---------------------------------------------------------------------------------------------
# Checks before the library: each bad argument gets ValueError/TypeError naming it.

def test_valid_dense_problem():
    t = dense()
    p = _checks.check_dense(t["q"], t["k"], t["v"])
    shape = (p.batch, p.seqlen_q, p.seqlen_k, p.heads, p.heads_k, p.head_dim)
    assert shape == (2, 64, 96, 8, 2, 64)
    assert p.out_shape() == (2, 64, 8, 64)
    assert p.lse_shape() == (2, 8, 64)


BAD_DENSE = [
    # (overrides, exception, words the message must contain)
    ({"q": FakeCudaArray((2, 64, 8, 64), device=(1, 0))}, ValueError, "q must be on a CUDA device"),
    ({"v": FakeCudaArray((2, 96, 2, 64), dtype=FP32)}, TypeError, "v has dtype fp32"),
    ({"q": FakeCudaArray((2, 64, 8, 64), dtype=INT32)}, TypeError, "q has dtype int32"),
    ({"k": FakeCudaArray((2, 96, 2, 64), dtype=FP16)}, TypeError,
     "k has dtype fp16 but q has bf16"),
    ({"q": FakeCudaArray((2, 64, 512))}, ValueError, "q must have 4 dimensions"),
    ({"k": FakeCudaArray((2, 96, 2, 64), device=(2, 1))}, ValueError, "k is on cuda:1"),
    ({"v": FakeCudaArray((2, 95, 2, 64))}, ValueError, "v has shape"),
    ({"k": FakeCudaArray((2, 96, 2, 32)), "v": FakeCudaArray((2, 96, 2, 32))}, ValueError,
     "k has head_dim 32"),
    ({"k": FakeCudaArray((2, 96, 3, 64)), "v": FakeCudaArray((2, 96, 3, 64))}, ValueError,
     "heads of q (8) must be a positive multiple of heads of k/v (3)"),
    ({"k": FakeCudaArray((3, 96, 2, 64)), "v": FakeCudaArray((3, 96, 2, 64))}, ValueError,
     "k has batch 3"),
    # head_dim: not a multiple of 8, and too large.
    ({"q": FakeCudaArray((2, 64, 8, 60)), "k": FakeCudaArray((2, 96, 2, 60)),
      "v": FakeCudaArray((2, 96, 2, 60))}, ValueError, "head_dim 60"),
    ({"q": FakeCudaArray((2, 64, 8, 264)), "k": FakeCudaArray((2, 96, 2, 264)),
      "v": FakeCudaArray((2, 96, 2, 264))}, ValueError, "head_dim 264"),
    # Layout: a strided last dim, and a row stride that breaks 16-byte alignment.
    ({"q": FakeCudaArray((2, 64, 8, 64), strides=(64 * 8 * 128, 8 * 128, 128, 2))}, ValueError,
     "q must have a contiguous last dimension"),
    ({"k": FakeCudaArray((2, 96, 2, 64), strides=(96 * 2 * 68, 2 * 68, 68, 1))}, ValueError,
     "k: stride 68 of dim 2"),
]


@pytest.mark.parametrize("overrides, error, words", BAD_DENSE)
def test_bad_dense_arguments(overrides, error, words):
    t = dense(**overrides)
    with pytest.raises(error) as info:
        _checks.check_dense(t["q"], t["k"], t["v"])
    assert words in str(info.value)


def test_extent_one_dims_ignore_their_strides():
    # A size-1 batch or head dim is never stepped over, so its stride may be anything.
    q = FakeCudaArray((1, 64, 1, 64), strides=(3, 64, 5, 1))
    t = dense(b=1, h=1, hk=1, q=q)
    _checks.check_dense(t["q"], t["k"], t["v"])
    args_q = _checks._fc_tensor(t["q"], varlen=False)
    assert (args_q.batch_stride, args_q.seq_stride, args_q.head_stride) == (0, 64, 0)


@pytest.mark.parametrize("offset_bytes, ok", [(0, True), (16, True), (8, False), (2, False)])
def test_pointer_alignment(offset_bytes, ok):
    q = desc(FakeCudaArray((2, 64, 8, 64), ptr=0x7F0000000000 + offset_bytes), "q")
    if ok:
        _checks.check_pointers([q])
    else:
        with pytest.raises(ValueError, match="q: data pointer .* is not 16-byte aligned"):
            _checks.check_pointers([q])


def varlen_descs(total_q=100, total_k=120, h=4, hk=4, d=128, batch=3, cu_dtype=INT32,
                 cu_device=(2, 0), cu_k_entries=None):
    q = desc(FakeCudaArray((total_q, h, d)), "q")
    k = desc(FakeCudaArray((total_k, hk, d)), "k")
    v = desc(FakeCudaArray((total_k, hk, d)), "v")
    cq = desc(FakeCudaArray((batch + 1,), dtype=cu_dtype, device=cu_device), "cu_seqlens_q")
    ck = desc(FakeCudaArray((cu_k_entries or batch + 1,), dtype=INT32), "cu_seqlens_k")
    return q, k, v, cq, ck


def test_valid_varlen_problem():
    p = _checks.check_varlen(*varlen_descs(), 50, 70)
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.total_q) == (3, 50, 70, 100)
    assert p.out_shape() == (100, 4, 128)
    assert p.lse_shape() == (4, 100)


@pytest.mark.parametrize("kwargs, max_q, error, words", [
    ({"cu_dtype": (0, 64)}, 50, TypeError, "cu_seqlens_q must have dtype int32"),
    ({"cu_device": (1, 0)}, 50, ValueError, "cu_seqlens_q is on cpu:0"),
    ({"cu_k_entries": 3}, 50, ValueError, "cu_seqlens_k has 3 entries"),
    ({}, -1, ValueError, "max_seqlen_q"),
    ({}, 5.0, ValueError, "max_seqlen_q"),
])
def test_bad_varlen_arguments(kwargs, max_q, error, words):
    with pytest.raises(error) as info:
        _checks.check_varlen(*varlen_descs(**kwargs), max_q, 70)
    assert words in str(info.value)


@pytest.mark.parametrize("alibi, error, words", [
    (FakeCudaArray((8,), dtype=FP32), None, None),
    (FakeCudaArray((2, 8), dtype=FP32), None, None),
    (FakeCudaArray((8,), dtype=BF16), TypeError, "alibi_slopes must have dtype float32"),
    (FakeCudaArray((4,), dtype=FP32), ValueError, "alibi_slopes must have shape (8,) or (2, 8)"),
    (FakeCudaArray((8,), dtype=FP32, device=(2, 3)), ValueError, "alibi_slopes is on cuda:3"),
])
def test_alibi_checks(alibi, error, words):
    t = dense()
    p = _checks.check_dense(t["q"], t["k"], t["v"])
    a = desc(alibi, "alibi_slopes")
    if error is None:
        _checks.check_alibi(a, p)
    else:
        with pytest.raises(error) as info:
            _checks.check_alibi(a, p)
        assert words in str(info.value)


def _problem(d=64):
    t = dense(d=d)
    return _checks.check_dense(t["q"], t["k"], t["v"])


@pytest.mark.parametrize("d", [8, 64, 200])
def test_default_softmax_scale(d):
    o = _checks.check_options(_problem(d), None, False, "bottom_right", (-1, -1), 0.0, "auto", None)
    assert o.softmax_scale == pytest.approx(1.0 / math.sqrt(d))
    assert (o.window_left, o.window_right, o.causal_alignment, o.family, o.tile) == (
        -1, -1, _library.CAUSAL_BOTTOM_RIGHT, 0, (0, 0, 0))


def test_options_pass_through():
    o = _checks.check_options(_problem(), -0.3, True, "top_left", (np.int64(5), 0), 2.5, "sm90",
                              (128, 64, 256))
    assert o.softmax_scale == pytest.approx(-0.3)
    assert (o.causal, o.causal_alignment, o.window_left, o.window_right) == (
        True, _library.CAUSAL_TOP_LEFT, 5, 0)
    assert (o.softcap, o.family, o.tile) == (2.5, 90, (128, 64, 256))


@pytest.mark.parametrize("kwargs, words", [
    ({"softmax_scale": float("nan")}, "softmax_scale"),
    ({"window_size": (-2, 0)}, "window_size[0]"),
    ({"window_size": (0, 1.5)}, "window_size[1]"),
    ({"window_size": 4}, "window_size must be a pair"),
    ({"softcap": -1.0}, "softcap"),
    ({"causal_alignment": "centre"}, "causal_alignment"),
    ({"family": "sm100"}, "family"),
    ({"tile": (128, 0, 128)}, "tile"),
])
def test_bad_options(kwargs, words):
    options = dict(softmax_scale=None, causal=False, causal_alignment="bottom_right",
                   window_size=(-1, -1), softcap=0.0, family="auto", tile=None)
    options.update(kwargs)
    with pytest.raises(ValueError) as info:
        _checks.check_options(_problem(), *options.values())
    assert words in str(info.value)


# ---------------------------------------------------------------------------------------------
# The backward's extra inputs (dout, out, softmax_lse), for the problem of dense() / _problem().

def backward_inputs(**overrides):
    arrays = {"dout": FakeCudaArray((2, 64, 8, 64)), "out": FakeCudaArray((2, 64, 8, 64)),
              "softmax_lse": FakeCudaArray((2, 8, 64), dtype=FP32)}
    arrays.update(overrides)
    return [desc(arrays[name], name) for name in ("dout", "out", "softmax_lse")]


def test_valid_backward_inputs():
    _checks.check_backward(_problem(), *backward_inputs())
    # dout as a (batch, heads, seqlen, head_dim) buffer seen through a transpose.
    transposed = FakeCudaArray((2, 64, 8, 64), strides=(64 * 8 * 64, 64, 64 * 64, 1))
    _checks.check_backward(_problem(), *backward_inputs(dout=transposed))


BAD_BACKWARD = [
    # (overrides, exception, words the message must contain)
    ({"dout": FakeCudaArray((2, 63, 8, 64))}, ValueError,
     "dout must have q's shape (2, 64, 8, 64), got (2, 63, 8, 64)"),
    ({"out": FakeCudaArray((2, 64, 8, 32))}, ValueError, "out must have q's shape"),
    ({"dout": FakeCudaArray((2, 64, 8, 64), dtype=FP32)}, TypeError,
     "dout has dtype fp32 but q has bf16"),
    ({"out": FakeCudaArray((2, 64, 8, 64), dtype=FP16)}, TypeError,
     "out has dtype fp16 but q has bf16"),
    ({"dout": FakeCudaArray((2, 64, 8, 64), device=(2, 1))}, ValueError,
     "dout is on cuda:1 but q is on cuda:0"),
    ({"dout": FakeCudaArray((2, 64, 8, 64), strides=(64 * 8 * 128, 8 * 128, 128, 2))},
     ValueError, "dout must have a contiguous last dimension"),
    ({"out": FakeCudaArray((2, 64, 8, 64), strides=(64 * 8 * 68, 8 * 68, 68, 1))}, ValueError,
     "out: stride 68 of dim 2"),
    ({"softmax_lse": FakeCudaArray((2, 8, 64))}, TypeError,
     "softmax_lse must have dtype float32, got bf16"),
    ({"softmax_lse": FakeCudaArray((2, 64, 8), dtype=FP32)}, ValueError,
     "softmax_lse must have shape (batch, heads, seqlen_q) = (2, 8, 64), got (2, 64, 8)"),
    ({"softmax_lse": FakeCudaArray((2, 8, 64), strides=(1024, 128, 1), dtype=FP32)}, ValueError,
     "softmax_lse must be contiguous (strides (512, 64, 1)), got strides (1024, 128, 1)"),
    ({"softmax_lse": FakeCudaArray((2, 8, 64), dtype=FP32, device=(1, 0))}, ValueError,
     "softmax_lse is on cpu:0 but q is on cuda:0"),
]


@pytest.mark.parametrize("overrides, error, words", BAD_BACKWARD)
def test_bad_backward_arguments(overrides, error, words):
    with pytest.raises(error) as info:
        _checks.check_backward(_problem(), *backward_inputs(**overrides))
    assert words in str(info.value)


def test_varlen_backward_lse_is_heads_by_total_q():
    p = _checks.check_varlen(*varlen_descs(), 50, 70)
    dout, out = (desc(FakeCudaArray((100, 4, 128)), name) for name in ("dout", "out"))
    lse = desc(FakeCudaArray((4, 100), dtype=FP32), "softmax_lse")
    _checks.check_backward(p, dout, out, lse)
    with pytest.raises(ValueError, match=re.escape("(heads, total_q) = (4, 100), got (100, 4)")):
        _checks.check_backward(p, dout, out, desc(FakeCudaArray((100, 4), dtype=FP32), "lse"))


def test_backward_args_fill_every_tensor_and_option(library):
    t = dense()
    p = _checks.check_dense(t["q"], t["k"], t["v"])
    o = _checks.check_options(p, 0.5, True, "top_left", (7, 3), 2.0, "sm80", None)
    dout, out, lse = backward_inputs()
    shapes = {"dq": (2, 64, 8, 64), "dk": (2, 96, 2, 64), "dv": (2, 96, 2, 64)}
    grads = [desc(FakeCudaArray(shape, ptr=0x7F0000100000 * (i + 2)), name)
             for i, (name, shape) in enumerate(shapes.items())]
    args = _checks.build_backward_args(p, o, t["q"], t["k"], t["v"], out, dout, *grads, lse,
                                       deterministic=True, stream=0x1234)
    assert args.abi_version == _library.ABI_VERSION and args.dtype == _library.BFLOAT16
    assert (args.batch, args.seqlen_q, args.seqlen_k, args.heads, args.heads_k, args.head_dim) == (
        2, 64, 96, 8, 2, 64)
    assert (args.dq.data, args.dk.data, args.dv.data) == tuple(g.ptr for g in grads)
    assert (args.dk.batch_stride, args.dk.seq_stride, args.dk.head_stride) == (96 * 128, 128, 64)
    assert args.softmax_lse == lse.ptr and args.dout.data == dout.ptr and args.o.data == out.ptr
    assert (args.softmax_scale, args.causal, args.causal_alignment) == (
        0.5, 1, _library.CAUSAL_TOP_LEFT)
    assert (args.window_left, args.window_right, args.softcap) == (7, 3, 2.0)
    assert (args.deterministic, args.family, args.stream) == (1, 80, 0x1234)
    assert not args.workspace and args.workspace_bytes == 0 and not args.cu_seqlens_q


# ---------------------------------------------------------------------------------------------
# The public functions, with inputs that fail before any framework or device is needed.

def test_dropout_is_not_implemented():
    q = np.zeros((1, 8, 2, 64), np.float16)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashcute.flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashcute.flash_attn_varlen_func(q[0], q[0], q[0], None, None, 8, 8, dropout_p=0.5)


def test_numpy_arrays_are_refused_as_not_on_cuda():
    q = np.zeros((1, 8, 2, 64), np.float16)
    with pytest.raises(ValueError, match="q must be on a CUDA device, got cpu:0"):
        flashcute.flash_attn_func(q, q, q)


def test_non_arrays_are_refused():
    q = FakeCudaArray((1, 8, 2, 64))
    with pytest.raises(TypeError, match="k must be a torch.Tensor or an array with __dlpack__"):
        flashcute.flash_attn_func(q, [[1.0]], q)


def test_devices_are_checked_before_any_capsule_is_taken():
    q = FakeCudaArray((1, 8, 2, 64))
    k = FakeCudaArray((1, 8, 2, 64), device=(2, 1))
    with pytest.raises(ValueError, match="k is on cuda:1 but q is on cuda:0"):
        flashcute.flash_attn_func(q, k, q)
    assert q.stream_seen == "not called" and k.stream_seen == "not called"


def test_backward_checks_devices_before_any_capsule_is_taken():
    q = FakeCudaArray((1, 8, 2, 64))
    dout = FakeCudaArray((1, 8, 2, 64), device=(2, 1))
    lse = FakeCudaArray((1, 2, 8), dtype=FP32)
    with pytest.raises(ValueError, match="dout is on cuda:1 but q is on cuda:0"):
        flashcute.backward(dout, q, q, q, q, lse)
    assert q.stream_seen == "not called" and dout.stream_seen == "not called"
    with pytest.raises(ValueError, match="out must be on a CUDA device, got cpu:0"):
        flashcute.backward(q, q, q, q, np.zeros((1, 8, 2, 64), np.float16), lse)
    with pytest.raises(TypeError, match="softmax_lse must be a torch.Tensor or an array"):
        flashcute.backward(q, q, q, q, q, [0.0])
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k must be given together"):
        flashcute.backward(q, q, q, q, q, lse, cu_seqlens_q=lse)


def test_import_does_not_import_torch():
    code = "import sys, flashcute; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO / "python")


def test_signatures_match_flash_attention():
    import inspect

    def params(f):
        return [(p.name, p.default) for p in inspect.signature(f).parameters.values()]

    empty = inspect.Parameter.empty
    common = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
              ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
              ("deterministic", False), ("return_attn_probs", False)]
    assert params(flashcute.flash_attn_func) == [("q", empty), ("k", empty), ("v", empty)] + common
    assert params(flashcute.flash_attn_varlen_func) == (
        [(n, empty) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                              "max_seqlen_k")] + common + [("block_table", None)])
    assert params(flashcute.flash_attn_qkvpacked_func) == [("qkv", empty)] + common
    assert params(flashcute.flash_attn_kvpacked_func) == [("q", empty), ("kv", empty)] + common
    assert params(flashcute.flash_attn_varlen_qkvpacked_func) == (
        [(n, empty) for n in ("qkv", "cu_seqlens", "max_seqlen")] + common)
    assert params(flashcute.flash_attn_varlen_kvpacked_func) == (
        [(n, empty) for n in ("q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                              "max_seqlen_k")] + common)


def test_backward_signature():
    import inspect

    parameters = inspect.signature(flashcute.backward).parameters.values()
    assert [(p.name, p.kind, p.default) for p in parameters] == (
        [(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty)
         for n in ("dout", "q", "k", "v", "out", "softmax_lse")]
        + [(n, inspect.Parameter.KEYWORD_ONLY, d) for n, d in (
            ("cu_seqlens_q", None), ("cu_seqlens_k", None), ("max_seqlen_q", None),
            ("max_seqlen_k", None), ("softmax_scale", None), ("causal", False),
            ("causal_alignment", "bottom_right"), ("window_size", (-1, -1)), ("softcap", 0.0),
            ("alibi_slopes", None), ("deterministic", False), ("family", "auto"))])
    assert inspect.signature(flashcute.forward).parameters["deterministic"].default is False


# ---------------------------------------------------------------------------------------------
# The packed entry points (flashcute.packed): the packed argument's shape is checked first, by
# name; then slices of it (not copies) go to flash_attn_func / flash_attn_varlen_func.

QKV = "qkv must have shape (batch, seqlen, 3, heads, head_dim)"
KV = "kv must have shape (batch, seqlen_k, 2, heads_k, head_dim)"
VARLEN_QKV = "qkv must have shape (total, 3, heads, head_dim)"
VARLEN_KV = "kv must have shape (total_k, 2, heads_k, head_dim)"


def _packed_call(name, packed):
    """Calls packed entry point `name` with `packed` as its qkv or kv and valid other arguments."""
    q, cu = np.zeros((2, 16, 4, 64), np.float16), np.array([0, 16, 32], np.int32)
    f = getattr(flashcute, name)
    if name == "flash_attn_qkvpacked_func":
        return f(packed)
    if name == "flash_attn_kvpacked_func":
        return f(q, packed)
    if name == "flash_attn_varlen_qkvpacked_func":
        return f(packed, cu, 16)
    return f(q.reshape(32, 4, 64), packed, cu, cu, 16, 16)


@pytest.mark.parametrize("name, shape, words", [
    ("flash_attn_qkvpacked_func", (2, 16, 2, 4, 64), f"{QKV}, got (2, 16, 2, 4, 64)"),
    ("flash_attn_qkvpacked_func", (2, 16, 12, 64), f"{QKV}, got (2, 16, 12, 64)"),
    ("flash_attn_qkvpacked_func", (2, 16, 3, 4, 64, 1), QKV),
    ("flash_attn_kvpacked_func", (2, 16, 3, 4, 64), f"{KV}, got (2, 16, 3, 4, 64)"),
    ("flash_attn_kvpacked_func", (2, 16, 2, 4), KV),
    ("flash_attn_varlen_qkvpacked_func", (32, 2, 4, 64), f"{VARLEN_QKV}, got (32, 2, 4, 64)"),
    ("flash_attn_varlen_qkvpacked_func", (2, 16, 3, 4, 64), VARLEN_QKV),
    ("flash_attn_varlen_kvpacked_func", (32, 4, 64), f"{VARLEN_KV}, got (32, 4, 64)"),
    ("flash_attn_varlen_kvpacked_func", (32, 3, 4, 64), VARLEN_KV),
])
def test_packed_shape_errors_name_the_argument(name, shape, words):
    with pytest.raises(ValueError) as info:
        _packed_call(name, np.zeros(shape, np.float16))
    assert words in str(info.value)


@pytest.mark.parametrize("name", ["flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
                                  "flash_attn_varlen_qkvpacked_func",
                                  "flash_attn_varlen_kvpacked_func"])
def test_packed_argument_must_be_an_array(name):
    argument = "qkv" if "qkv" in name else "kv"
    with pytest.raises(TypeError, match=f"{argument} must be a torch.Tensor or an array"):
        _packed_call(name, [[1.0]])


def test_packed_views_reach_the_unpacked_checks():
    # Right shapes on the CPU: the slices go on, and the unpacked function's checks refuse them.
    with pytest.raises(ValueError, match="q must be on a CUDA device, got cpu:0"):
        flashcute.flash_attn_qkvpacked_func(np.zeros((2, 16, 3, 4, 64), np.float16))
    q = FakeCudaArray((2, 16, 4, 64))
    with pytest.raises(ValueError, match="k must be on a CUDA device, got cpu:0"):
        flashcute.flash_attn_kvpacked_func(q, np.zeros((2, 16, 2, 4, 64), np.float16))
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashcute.flash_attn_qkvpacked_func(np.zeros((1, 8, 3, 2, 64), np.float16), 0.1)
    with pytest.raises(ValueError, match="cu_seqlens is required"):
        flashcute.flash_attn_varlen_qkvpacked_func(np.zeros((8, 3, 2, 64), np.float16), None, 8)


def test_packed_functions_pass_slices_and_every_option(monkeypatch):
    import inspect

    from flashcute import packed

    seen = {}

    def recorder(unpacked):
        signature = inspect.signature(unpacked)

        def record(*args, **kwargs):
            seen.update(signature.bind(*args, **kwargs).arguments)
            return "out"
        return record

    monkeypatch.setattr(packed, "flash_attn_func", recorder(flashcute.flash_attn_func))
    monkeypatch.setattr(packed, "flash_attn_varlen_func",
                        recorder(flashcute.flash_attn_varlen_func))
    options = dict(dropout_p=0.0, softmax_scale=0.5, causal=True, window_size=(3, 1), softcap=2.0,
                   alibi_slopes="slopes", deterministic=True, return_attn_probs=True)
    dense = np.arange(2 * 5 * 3 * 4 * 8, dtype=np.float16).reshape(2, 5, 3, 4, 8)
    varlen = dense.reshape(10, 3, 4, 8)
    cu_q, cu_k = np.array([0, 4, 10], np.int32), np.array([0, 6, 10], np.int32)
    calls = [
        (lambda: packed.flash_attn_qkvpacked_func(dense, **options),
         [dense[:, :, i] for i in range(3)], {}),
        (lambda: packed.flash_attn_kvpacked_func(dense[:, :, 0], dense[:, :, 1:], **options),
         [dense[:, :, i] for i in range(3)], {}),
        (lambda: packed.flash_attn_varlen_qkvpacked_func(varlen, cu_q, 6, **options),
         [varlen[:, i] for i in range(3)],
         dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_q, max_seqlen_q=6, max_seqlen_k=6)),
        (lambda: packed.flash_attn_varlen_kvpacked_func(varlen[:, 0], varlen[:, 1:], cu_q, cu_k,
                                                        4, 6, **options),
         [varlen[:, i] for i in range(3)],
         dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=4, max_seqlen_k=6)),
    ]
    for call, expected_qkv, varlen_args in calls:
        seen.clear()
        assert call() == "out"
        for name, expected in zip("qkv", expected_qkv):
            got = seen.pop(name)
            assert np.array_equal(got, expected) and np.shares_memory(got, dense), name
        assert seen == {**options, **varlen_args}


# ---------------------------------------------------------------------------------------------
# The C struct against the header, and the library itself (it validates without a GPU).

@pytest.mark.parametrize("struct, c_name", [(_library.FcForwardArgs, "fc_forward_args"),
                                             (_library.FcBackwardArgs, "fc_backward_args"),
                                             (_library.FcKvcacheArgs, "fc_kvcache_args")])
def test_struct_layout_matches_header(tmp_path, struct, c_name):
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None or not HEADER.is_file():
        pytest.skip("needs a C compiler and the repository's include/flashcute/flashcute.h")
    fields = [name for name, _ in struct._fields_]
    lines = [f'printf("{n} %zu\\n", offsetof({c_name}, {n}));' for n in fields]
    lines.append(f'printf("sizeof %zu\\n", sizeof({c_name}));')
    source = tmp_path / "layout.c"
    source.write_text("#include <stddef.h>\n#include <stdio.h>\n"
                      "#include \"flashcute/flashcute.h\"\n"
                      "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([compiler, f"-I{HEADER.parent.parent}", str(source), "-o", str(exe)], check=True)
    c_layout = dict(line.split() for line in subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.splitlines())
    for name in fields:
        assert int(c_layout[name]) == getattr(struct, name).offset, name
    assert int(c_layout["sizeof"]) == ctypes.sizeof(struct)
    assert f"#define FC_ABI_VERSION {_library.ABI_VERSION}" in HEADER.read_text()


def test_args_init_defaults(library):
    args = _library.new_args()
    assert args.abi_version == _library.ABI_VERSION
    assert (args.window_left, args.window_right) == (-1, -1)
    assert args.causal_alignment == _library.CAUSAL_BOTTOM_RIGHT
    assert args.family == 0 and args.tile.as_tuple() == (0, 0, 0)
    assert not args.softmax_lse and not args.cu_seqlens_q and not args.stream


def _library_args(new=None, **fields):
    """A small bf16 problem's arguments (forward's, or those `new` makes), with fields set."""
    args = (new or _library.new_args)()
    args.dtype = _library.BFLOAT16
    args.batch, args.seqlen_q, args.seqlen_k = 2, 16, 16
    args.heads, args.heads_k, args.head_dim = 4, 4, 64
    args.softmax_scale = 0.125
    for name, value in fields.items():
        setattr(args, name, value)
    return args


@pytest.mark.parametrize("fields, words", [
    ({}, "q"),  # every data pointer is null
    ({"head_dim": 60}, "head_dim"),
    ({"heads_k": 3}, "heads_k"),
    ({"abi_version": 99}, "abi_version"),
    ({"dtype": 7}, "dtype"),
    ({"window_left": -5}, "window_left"),
])
def test_library_rejects_invalid_arguments(library, fields, words):
    with pytest.raises(flashcute.InvalidArgumentError) as info:
        _library.forward(_library_args(**fields))
    assert isinstance(info.value, ValueError)
    assert info.value.status == _library.ERROR_INVALID_ARGUMENT
    assert words in str(info.value)
    assert library.fc_last_error().decode() in str(info.value)


@pytest.mark.parametrize("empty", ["batch", "seqlen_q"])
def test_library_empty_problem_is_a_no_op(library, empty):
    # Nothing to compute: success without a device or any pointer.
    _library.forward(_library_args(**{empty: 0}))


def test_backward_args_init_defaults(library):
    args = _library.new_backward_args()
    assert args.abi_version == _library.ABI_VERSION
    assert (args.window_left, args.window_right) == (-1, -1)
    assert args.causal_alignment == _library.CAUSAL_BOTTOM_RIGHT
    assert args.family == 0 and args.deterministic == 0
    assert not args.workspace and args.workspace_bytes == 0
    assert not args.softmax_lse and not args.cu_seqlens_q and not args.stream


def _library_backward_args(**fields):
    return _library_args(_library.new_backward_args, **fields)


@pytest.mark.parametrize("fields, words", [
    ({}, "q"),  # every data pointer is null
    ({"head_dim": 60}, "head_dim"),
    ({"abi_version": 99}, "abi_version"),
    ({"deterministic": 2}, "deterministic"),
])
def test_library_rejects_invalid_backward_arguments(library, fields, words):
    for call in (_library.backward_workspace_size, _library.backward):
        with pytest.raises(flashcute.InvalidArgumentError) as info:
            call(_library_backward_args(**fields))
        assert info.value.status == _library.ERROR_INVALID_ARGUMENT
        assert words in str(info.value)


@pytest.mark.parametrize("empty", ["batch", "heads"])
def test_library_empty_backward_is_a_no_op(library, empty):
    # Nothing to compute: no workspace, and success without a device or any pointer.
    args = _library_backward_args(**{empty: 0, "heads_k": 0 if empty == "heads" else 4})
    assert _library.backward_workspace_size(args) == 0
    _library.backward(args)


def test_compiled_tile_configs_are_consistent(library):
    found = 0
    for family in ("sm80", "sm90"):
        for dtype in ("fp16", "bf16"):
            for head_dim in (32, 64, 128, 256):
                tiles = flashcute.compiled_tile_configs(family, dtype, head_dim)
                assert all(len(t) == 3 and min(t) > 0 for t in tiles)
                if tiles:
                    found += 1
                    assert flashcute.default_tile_config(family, dtype, head_dim) in tiles
                else:
                    with pytest.raises(flashcute.UnsupportedError):
                        flashcute.default_tile_config(family, dtype, head_dim)
    assert found > 0, "the library has no kernel at all"


# ---------------------------------------------------------------------------------------------
# build_info(): the library's own account of its build.

def test_build_info_reports_the_build(library):
    info = flashcute.build_info()
    assert set(info) == {"version", "cuda_version", "cuda_archs", "tile_set", "git_commit",
                         "library"}
    assert info["version"] == flashcute.__version__
    assert re.fullmatch(r"\d+\.\d+(\.\d+)*", info["cuda_version"]), info
    assert info["cuda_archs"], info
    assert all(re.fullmatch(r"\d{2,3}[af]?", arch) for arch in info["cuda_archs"]), info
    assert info["tile_set"] in ("minimal", "full")
    assert re.fullmatch(r"[0-9a-f]{4,40}|unknown", info["git_commit"]), info
    assert pathlib.Path(info["library"]).resolve() == _library.library_path().resolve()
    # Each call returns a copy: changing one leaves the next alone.
    info["cuda_archs"].append("0")
    assert flashcute.build_info()["cuda_archs"] == info["cuda_archs"][:-1]


def _cuobjdump():
    """cuobjdump from FLASHCUTE_CUOBJDUMP, PATH or the CUDA toolkit; None where there is none."""
    for candidate in (os.environ.get("FLASHCUTE_CUOBJDUMP"), shutil.which("cuobjdump"),
                      "/usr/local/cuda/bin/cuobjdump"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def test_build_info_archs_are_the_library_s(library):
    # FLASHCUTE_EXPECT_ARCHS (CI sets it): the targets the library was configured with.
    archs = flashcute.build_info()["cuda_archs"]
    expected = os.environ.get("FLASHCUTE_EXPECT_ARCHS")
    if expected:
        assert archs == [a for a in re.split(r"[;,]", expected) if a]
    cuobjdump = _cuobjdump()
    if cuobjdump is None:
        if not expected:
            pytest.skip("needs cuobjdump (FLASHCUTE_CUOBJDUMP) or FLASHCUTE_EXPECT_ARCHS")
        return
    # The machine code the library carries is one cubin per target (several per translation
    # unit), and "80" brings compute_80 PTX along.
    path = str(_library.library_path())
    elf = subprocess.run([cuobjdump, "--list-elf", path], check=True, capture_output=True,
                         text=True).stdout
    ptx = subprocess.run([cuobjdump, "--list-ptx", path], capture_output=True, text=True).stdout
    assert set(re.findall(r"\.sm_(\d+[af]?)\.cubin", elf)) == set(archs), elf
    assert set(re.findall(r"\.sm_(\d+[af]?)\.ptx", ptx)) == ({"80"} & set(archs)), ptx


# ---------------------------------------------------------------------------------------------
# The mask rule (flashcute.mask), against a loop over every (query, key) pair.

def brute_force_keep(seqlen_q, seqlen_k, causal, window_size, causal_alignment):
    left, right = window_size
    keep = np.zeros((seqlen_q, seqlen_k), dtype=bool)
    for i in range(seqlen_q):
        # The key query i lines up with: the last query meets the last key (bottom right), or
        # query i meets key i (top left).
        diag = i + seqlen_k - seqlen_q if causal_alignment == "bottom_right" else i
        for j in range(seqlen_k):
            keep[i, j] = ((not causal or j <= diag)
                          and (left < 0 or diag - j <= left)
                          and (right < 0 or j - diag <= right))
    return keep


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 1), (6, 6), (3, 11), (11, 3), (0, 4), (4, 0),
                                                (17, 9)])
@pytest.mark.parametrize("window_size", [(-1, -1), (0, 0), (2, -1), (-1, 3), (3, 1), (0, 5)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("causal_alignment", ["bottom_right", "top_left"])
def test_mask_matches_every_pair(seqlen_q, seqlen_k, window_size, causal, causal_alignment):
    expected = brute_force_keep(seqlen_q, seqlen_k, causal, window_size, causal_alignment)
    keep = mask.keep_matrix(seqlen_q, seqlen_k, causal, window_size, causal_alignment)
    assert keep.shape == (seqlen_q, seqlen_k) and keep.dtype == bool
    assert np.array_equal(keep, expected)
    count = mask.visible_pairs(seqlen_q, seqlen_k, causal, window_size, causal_alignment)
    assert count == int(expected.sum())


def test_mask_causal_is_bottom_right_by_default():
    # FlashAttention's documented causal masks for seqlen_q != seqlen_k (1 = kept).
    assert mask.keep_matrix(2, 5, causal=True).astype(int).tolist() == [[1, 1, 1, 1, 0],
                                                                        [1, 1, 1, 1, 1]]
    assert mask.keep_matrix(5, 2, causal=True).astype(int).tolist() == [[0, 0], [0, 0], [0, 0],
                                                                        [1, 0], [1, 1]]
    assert mask.visible_pairs(5, 2, causal=True) == 3
    with pytest.raises(ValueError, match="causal_alignment"):
        mask.keep_matrix(2, 2, causal_alignment="middle")


# ---------------------------------------------------------------------------------------------
# The GPU suite's case selection: every pair of values of two lists appears in some case.

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairwise_covers_every_pair(seed):
    import itertools
    import random

    from pairwise_cases import pairwise

    rng = random.Random(seed)
    factors = {f"f{i}": list(range(rng.randint(1, 6))) for i in range(rng.randint(2, 7))}
    rows = pairwise(factors, seed=seed)
    for a, b in itertools.combinations(factors, 2):
        seen = {(row[a], row[b]) for row in rows}
        assert seen == set(itertools.product(factors[a], factors[b])), (a, b)
    assert len(rows) <= math.prod(len(v) for v in factors.values())


def test_pack_dense_args_matches_the_struct_fields():
    """The one-call packing of the eager fast paths writes what field-by-field assignment would."""
    from flashcute import _library as lib

    packed = lib.FcForwardArgs()
    lib.pack_dense_args(packed, (0x1000, (8192, 64, 8)), (0x2000, (4096, 32, 8)),
                        (0x3000, (4096, 32, 16)), (0x4000, (8192, 64, 8)), lib.FLOAT16,
                        (2, 3, 5, 8), 7, 1, 0x5000, 0.25, True, 4, -1, 30.0, 0x6000)
    expected = lib.FcForwardArgs()
    expected.abi_version = lib.ABI_VERSION
    expected.causal_alignment = lib.CAUSAL_BOTTOM_RIGHT
    expected.family = lib.FAMILIES["auto"]
    for field, ptr, strides in ((expected.q, 0x1000, (8192, 64, 8)),
                                (expected.k, 0x2000, (4096, 32, 8)),
                                (expected.v, 0x3000, (4096, 32, 16)),
                                (expected.o, 0x4000, (8192, 64, 8))):
        field.data = ptr
        field.batch_stride, field.seq_stride, field.head_stride = strides
    expected.dtype = lib.FLOAT16
    expected.batch, expected.seqlen_q, expected.heads, expected.head_dim = 2, 3, 5, 8
    expected.seqlen_k, expected.heads_k = 7, 1
    expected.softmax_lse = 0x5000
    expected.softmax_scale = 0.25
    expected.causal = 1
    expected.window_left, expected.window_right = 4, -1
    expected.softcap = 30.0
    expected.stream = 0x6000
    assert bytes(packed) == bytes(expected)

"""ctypes mirror of include/flashcute/flashcute.h and the loader of libflashcute.so.

Nothing here touches a GPU: loading the library and filling an fc_forward_args, fc_backward_args or
fc_kvcache_args need no device, so the CPU test suite exercises this module directly.
"""

import ctypes
import os
import pathlib
import struct
import threading

ABI_VERSION = 1

# fc_status
OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_UNSUPPORTED = 2
ERROR_CUDA = 3

# fc_dtype
FLOAT16 = 0
BFLOAT16 = 1
DTYPE_CODES = {"fp16": FLOAT16, "bf16": BFLOAT16}

# fc_causal_alignment
CAUSAL_TOP_LEFT = 0
CAUSAL_BOTTOM_RIGHT = 1
ALIGNMENTS = {"top_left": CAUSAL_TOP_LEFT, "bottom_right": CAUSAL_BOTTOM_RIGHT}

# fc_kernel_family
FAMILIES = {"auto": 0, "sm80": 80, "sm90": 90}

# FC_KVCACHE_MAX_SPLITS: the most parts fc_kvcache may split each sequence's keys into.
KVCACHE_MAX_SPLITS = 128


class FcTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("batch_stride", ctypes.c_int64),
        ("seq_stride", ctypes.c_int64),
        ("head_stride", ctypes.c_int64),
    ]


class FcTileConfig(ctypes.Structure):
    _fields_ = [
        ("m_block", ctypes.c_int32),
        ("n_block", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
    ]

    def as_tuple(self):
        return (self.m_block, self.n_block, self.num_threads)


# The fields fc_forward_args and fc_backward_args share, in their order there: the problem (after
# the tensors) and the options up to the ALiBi slopes.
_PROBLEM_FIELDS = [
    ("dtype", ctypes.c_int32),
    ("batch", ctypes.c_int64),
    ("seqlen_q", ctypes.c_int64),
    ("seqlen_k", ctypes.c_int64),
    ("heads", ctypes.c_int64),
    ("heads_k", ctypes.c_int64),
    ("head_dim", ctypes.c_int64),
    ("cu_seqlens_q", ctypes.c_void_p),
    ("cu_seqlens_k", ctypes.c_void_p),
    ("total_q", ctypes.c_int64),
    ("softmax_lse", ctypes.c_void_p),
    ("softmax_scale", ctypes.c_float),
    ("causal", ctypes.c_int32),
    ("causal_alignment", ctypes.c_int32),
    ("window_left", ctypes.c_int64),
    ("window_right", ctypes.c_int64),
    ("softcap", ctypes.c_float),
    ("alibi_slopes", ctypes.c_void_p),
    ("alibi_batch_stride", ctypes.c_int64),
]


def _tensors(*names):
    return [(name, FcTensor) for name in names]


# Field order and types must follow the C structs exactly; ctypes applies the same natural
# alignment as the C compiler, and python/tests/test_cpu.py (test_struct_layout_matches_header)
# compares every offset and the size with the header when a C compiler is present.
class FcForwardArgs(ctypes.Structure):
    _fields_ = ([("abi_version", ctypes.c_int32)] + _tensors("q", "k", "v", "o") +
                _PROBLEM_FIELDS + [
                    ("tile", FcTileConfig),
                    ("family", ctypes.c_int32),
                    ("stream", ctypes.c_void_p),
                ])


class FcBackwardArgs(ctypes.Structure):
    _fields_ = ([("abi_version", ctypes.c_int32)] +
                _tensors("q", "k", "v", "o", "dout", "dq", "dk", "dv") + _PROBLEM_FIELDS + [
                    ("deterministic", ctypes.c_int32),
                    ("family", ctypes.c_int32),
                    ("workspace", ctypes.c_void_p),
                    ("workspace_bytes", ctypes.c_uint64),
                    ("stream", ctypes.c_void_p),
                ])


class FcKvcacheArgs(ctypes.Structure):
    _fields_ = ([("abi_version", ctypes.c_int32)] +
                _tensors("q", "o", "k_cache", "v_cache", "k_new", "v_new") + [
                    ("dtype", ctypes.c_int32),
                    ("batch", ctypes.c_int64),
                    ("seqlen_q", ctypes.c_int64),
                    ("heads", ctypes.c_int64),
                    ("heads_k", ctypes.c_int64),
                    ("head_dim", ctypes.c_int64),
                    ("cu_seqlens_q", ctypes.c_void_p),
                    ("total_q", ctypes.c_int64),
                    ("seqlen_new", ctypes.c_int64),
                    ("batch_cache", ctypes.c_int64),
                    ("seqlen_cache", ctypes.c_int64),
                    ("cache_seqlens", ctypes.c_void_p),
                    ("cache_seqlen", ctypes.c_int64),
                    ("cache_batch_idx", ctypes.c_void_p),
                    ("cache_leftpad", ctypes.c_void_p),
                    ("block_table", ctypes.c_void_p),
                    ("block_table_stride", ctypes.c_int64),
                    ("pages_per_sequence", ctypes.c_int64),
                    ("rotary_cos", ctypes.c_void_p),
                    ("rotary_sin", ctypes.c_void_p),
                    ("rotary_dim", ctypes.c_int64),
                    ("rotary_seqlen", ctypes.c_int64),
                    ("rotary_interleaved", ctypes.c_int32),
                    ("softmax_lse", ctypes.c_void_p),
                    ("softmax_scale", ctypes.c_float),
                    ("causal", ctypes.c_int32),
                    ("window_left", ctypes.c_int64),
                    ("window_right", ctypes.c_int64),
                    ("softcap", ctypes.c_float),
                    ("alibi_slopes", ctypes.c_void_p),
                    ("alibi_batch_stride", ctypes.c_int64),
                    ("num_splits", ctypes.c_int32),
                    ("debug_checks", ctypes.c_int32),
                    ("family", ctypes.c_int32),
                    ("workspace", ctypes.c_void_p),
                    ("workspace_bytes", ctypes.c_uint64),
                    ("stream", ctypes.c_void_p),
                ])


class FlashCuteError(RuntimeError):
    """A call into libflashcute failed; `status` is the fc_status, the message fc_last_error()."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(FlashCuteError, ValueError):
    """FC_ERROR_INVALID_ARGUMENT: the library rejected an argument (the message names it)."""


class UnsupportedError(FlashCuteError, NotImplementedError):
    """FC_ERROR_UNSUPPORTED: valid, but no compiled kernel (or this device) can run it."""


class CudaError(FlashCuteError):
    """FC_ERROR_CUDA: the CUDA runtime reported an error."""


_ERRORS = {
    ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    ERROR_UNSUPPORTED: UnsupportedError,
    ERROR_CUDA: CudaError,
}

_lib = None
_lock = threading.Lock()


def library_path():
    """FLASHCUTE_LIB if set, else the copy the wheel carries in flashcute/lib/."""
    override = os.environ.get("FLASHCUTE_LIB")
    if override:
        return pathlib.Path(override)
    return pathlib.Path(__file__).resolve().parent / "lib" / "libflashcute.so"


def load():
    """The loaded library (loaded once, on first use, so `import flashcute` never needs it)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not path.is_file():
                raise OSError(
                    f"libflashcute.so not found at {path}: install a wheel that carries it "
                    "(pip install ./python) or set FLASHCUTE_LIB=/path/to/libflashcute.so"
                )
            lib = ctypes.CDLL(str(path))
            lib.fc_forward_args_init.argtypes = [ctypes.POINTER(FcForwardArgs)]
            lib.fc_forward_args_init.restype = None
            lib.fc_forward.argtypes = [ctypes.POINTER(FcForwardArgs)]
            lib.fc_forward.restype = ctypes.c_int
            lib.fc_backward_args_init.argtypes = [ctypes.POINTER(FcBackwardArgs)]
            lib.fc_backward_args_init.restype = None
            lib.fc_backward_workspace_size.argtypes = [
                ctypes.POINTER(FcBackwardArgs), ctypes.POINTER(ctypes.c_uint64),
            ]
            lib.fc_backward_workspace_size.restype = ctypes.c_int
            lib.fc_backward.argtypes = [ctypes.POINTER(FcBackwardArgs)]
            lib.fc_backward.restype = ctypes.c_int
            lib.fc_kvcache_args_init.argtypes = [ctypes.POINTER(FcKvcacheArgs)]
            lib.fc_kvcache_args_init.restype = None
            lib.fc_kvcache_workspace_size.argtypes = [
                ctypes.POINTER(FcKvcacheArgs), ctypes.POINTER(ctypes.c_uint64),
            ]
            lib.fc_kvcache_workspace_size.restype = ctypes.c_int
            lib.fc_kvcache.argtypes = [ctypes.POINTER(FcKvcacheArgs)]
            lib.fc_kvcache.restype = ctypes.c_int
            lib.fc_last_error.argtypes = []
            lib.fc_last_error.restype = ctypes.c_char_p
            lib.fc_compiled_tile_configs.argtypes = [
                ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                ctypes.POINTER(FcTileConfig), ctypes.c_int32,
            ]
            lib.fc_compiled_tile_configs.restype = ctypes.c_int32
            lib.fc_default_tile_config.argtypes = [
                ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(FcTileConfig),
            ]
            lib.fc_default_tile_config.restype = ctypes.c_int
            _lib = lib
    return _lib


def _raise_for(status):
    if status == OK:
        return
    message = load().fc_last_error().decode("utf-8", "replace")
    raise _ERRORS.get(status, FlashCuteError)(status, f"flashcute: {message} (fc_status {status})")


_thread_local = threading.local()


def thread_args():
    """(library, this thread's reusable fc_forward_args, a byref to it), set up once per thread.

    The eager fast paths rewrite the whole struct on each call (pack_dense_args).
    """
    state = getattr(_thread_local, "state", None)
    if state is None:
        args = new_args()
        state = _thread_local.state = (load(), args, ctypes.byref(args))
    return state


def thread_kvcache_args():
    """(library, this thread's reusable fc_kvcache_args, a byref to it, a c_uint64 and a byref to
    it for the workspace size), set up once per thread, for the eager fast path."""
    state = getattr(_thread_local, "kvcache_state", None)
    if state is None:
        args = FcKvcacheArgs()
        size = ctypes.c_uint64(0)
        state = (load(), args, ctypes.byref(args), size, ctypes.byref(size))
        _thread_local.kvcache_state = state
    return state


def _flat_fields(struct_type, base=0):
    """(name, ctypes type, byte offset) of every scalar field, nested structures flattened."""
    for name, ctype in struct_type._fields_:
        offset = base + getattr(struct_type, name).offset
        if issubclass(ctype, ctypes.Structure):
            yield from _flat_fields(ctype, offset)
        else:
            yield name, ctype, offset


def _packer(struct_type):
    """A struct.Struct that writes every scalar field of struct_type in declaration order."""
    codes = {ctypes.c_int32: "i", ctypes.c_int64: "q", ctypes.c_float: "f", ctypes.c_void_p: "Q"}
    fmt, position = "=", 0
    for _, ctype, offset in _flat_fields(struct_type):
        fmt += "x" * (offset - position) + codes[ctype]
        position = offset + ctypes.sizeof(ctype)
    fmt += "x" * (ctypes.sizeof(struct_type) - position)
    return struct.Struct(fmt)


_ARGS_PACKER = _packer(FcForwardArgs)


def pack_dense_args(buffer, q, k, v, o, dtype_code, shape_q, seqlen_k, heads_k, lse_ptr,
                    softmax_scale, causal, window_left, window_right, softcap, stream):
    """Writes a whole dense fc_forward_args in one call: q, k, v, o are (pointer, strides) with
    (batch, seq, head) strides in elements first; FlashAttention's bottom-right alignment, no
    varlen, no ALiBi, automatic tile and family. Field by field through ctypes costs several
    times as much, which a tiny call would feel."""
    batch, seqlen_q, heads, head_dim = shape_q
    _ARGS_PACKER.pack_into(
        buffer, 0, ABI_VERSION,
        q[0], q[1][0], q[1][1], q[1][2], k[0], k[1][0], k[1][1], k[1][2],
        v[0], v[1][0], v[1][1], v[1][2], o[0], o[1][0], o[1][1], o[1][2],
        dtype_code, batch, seqlen_q, seqlen_k, heads, heads_k, head_dim,
        0, 0, 0, lse_ptr or 0, softmax_scale, int(causal), CAUSAL_BOTTOM_RIGHT, window_left,
        window_right, softcap, 0, 0, 0, 0, 0, FAMILIES["auto"], stream)


def new_args():
    """An fc_forward_args filled with the library's defaults."""
    args = FcForwardArgs()
    load().fc_forward_args_init(ctypes.byref(args))
    return args


def forward(args):
    """Calls fc_forward; a non-zero status becomes an exception carrying fc_last_error()."""
    _raise_for(load().fc_forward(ctypes.byref(args)))


def new_backward_args():
    """An fc_backward_args filled with the library's defaults."""
    args = FcBackwardArgs()
    load().fc_backward_args_init(ctypes.byref(args))
    return args


def backward_workspace_size(args):
    """The workspace bytes fc_backward needs for args (the library checks args first)."""
    size = ctypes.c_uint64()
    _raise_for(load().fc_backward_workspace_size(ctypes.byref(args), ctypes.byref(size)))
    return size.value


def backward(args):
    """Calls fc_backward; failures raise as forward()'s do."""
    _raise_for(load().fc_backward(ctypes.byref(args)))


def new_kvcache_args():
    """An fc_kvcache_args filled with the library's defaults."""
    args = FcKvcacheArgs()
    load().fc_kvcache_args_init(ctypes.byref(args))
    return args


def kvcache_workspace_size(args):
    """The workspace bytes fc_kvcache needs for args (the library checks args first)."""
    size = ctypes.c_uint64()
    _raise_for(load().fc_kvcache_workspace_size(ctypes.byref(args), ctypes.byref(size)))
    return size.value


def kvcache(args):
    """Calls fc_kvcache; failures raise as forward()'s do."""
    _raise_for(load().fc_kvcache(ctypes.byref(args)))


def compiled_tile_configs(family, dtype, head_dim):
    """The (m_block, n_block, num_threads) configurations compiled in for a family.

    family: "auto", "sm80" or "sm90"; dtype: "fp16" or "bf16".
    """
    fam, code = FAMILIES[family], DTYPE_CODES[dtype]
    lib = load()
    capacity = 64
    while True:
        out = (FcTileConfig * capacity)()
        count = lib.fc_compiled_tile_configs(fam, code, head_dim, out, capacity)
        if count <= capacity:
            return [out[i].as_tuple() for i in range(max(count, 0))]
        capacity = count


def default_tile_config(family, dtype, head_dim):
    """The configuration the automatic choice takes for (family, dtype, head_dim)."""
    out = FcTileConfig()
    _raise_for(load().fc_default_tile_config(
        FAMILIES[family], DTYPE_CODES[dtype], head_dim, ctypes.byref(out)))
    return out.as_tuple()

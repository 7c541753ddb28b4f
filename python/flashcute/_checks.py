"""Framework-neutral argument checks and the filling of fc_forward_args and fc_backward_args.

Each front end (torch, DLPack) describes its arrays as TensorDesc and calls these checks, so a bad
argument gets the same exception and message whatever framework it came from, before the library
is called. The checks only read metadata; `check_pointers` is separate because under torch.compile
the data pointers exist only when the op really runs.
"""

import math
import operator
from dataclasses import dataclass
from typing import Optional, Tuple

from . import _library as lib

SUPPORTED_DTYPES = ("fp16", "bf16")
MAX_HEAD_DIM = 256
# The kernels move 16 bytes at a time: every tensor start and row stride must keep that alignment.
ALIGN_BYTES = 16
ALIGN_ELEMENTS = 8


@dataclass
class TensorDesc:
    name: str
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # in elements
    dtype: str  # "fp16", "bf16", "fp32", "int32" or the framework's own name for anything else
    device: Tuple[str, int]  # ("cuda", index), ("cpu", 0), ...
    ptr: Optional[int] = None  # None while tracing (torch fake tensors have no storage)
    itemsize: int = 2

    def device_str(self):
        kind, index = self.device
        return f"{kind}:{index}"


class _QueryShapes:
    """The output and LSE shapes of a problem's queries, dense or packed (varlen)."""

    def out_shape(self):
        if self.varlen:
            return (self.total_q, self.heads, self.head_dim)
        return (self.batch, self.seqlen_q, self.heads, self.head_dim)

    def lse_shape(self):
        if self.varlen:
            return (self.heads, self.total_q)
        return (self.batch, self.heads, self.seqlen_q)


@dataclass
class Problem(_QueryShapes):
    dtype: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    heads_k: int
    head_dim: int
    device: Tuple[str, int]
    varlen: bool
    total_q: int = 0


@dataclass
class Options:
    softmax_scale: float
    causal: bool
    causal_alignment: int
    window_left: int
    window_right: int
    softcap: float
    family: int
    tile: Tuple[int, int, int]


def _as_int(name, value, minimum):
    """Python and NumPy integers alike; bools and floats are refused rather than truncated."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_dropout(dropout_p):
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: flashcute has no dropout; pass 0.0")


def _check_cuda(t):
    if t.device[0] != "cuda":
        raise ValueError(f"{t.name} must be on a CUDA device, got {t.device_str()}")


def _check_layout(t):
    """Last dim contiguous; every other stride a multiple of 8 elements (16 bytes)."""
    if t.shape[-1] > 1 and t.strides[-1] != 1:
        raise ValueError(
            f"{t.name} must have a contiguous last dimension (stride 1), got strides {t.strides}")
    for dim, (extent, stride) in enumerate(zip(t.shape[:-1], t.strides[:-1])):
        if extent > 1 and stride % ALIGN_ELEMENTS != 0:
            raise ValueError(
                f"{t.name}: stride {stride} of dim {dim} is not a multiple of {ALIGN_ELEMENTS} "
                f"elements (16 bytes); strides {t.strides}")


def _qkv_common(q, k, v, ndim):
    for t in (q, k, v):
        _check_cuda(t)
    for t in (q, k, v):
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"{t.name} has dtype {t.dtype}; flashcute supports float16 and bfloat16")
    for t in (k, v):
        if t.dtype != q.dtype:
            raise TypeError(f"{t.name} has dtype {t.dtype} but q has {q.dtype}; they must match")
    for t in (q, k, v):
        if len(t.shape) != ndim:
            raise ValueError(f"{t.name} must have {ndim} dimensions, got shape {t.shape}")
    for t in (k, v):
        if t.device != q.device:
            raise ValueError(
                f"{t.name} is on {t.device_str()} but q is on {q.device_str()}; they must match")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v has shape {v.shape} but k has {k.shape}; they must match")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim:
        raise ValueError(f"k has head_dim {k.shape[-1]} but q has {head_dim}; they must match")
    heads, heads_k = q.shape[-2], k.shape[-2]
    if heads < 1 or heads_k < 1 or heads % heads_k != 0:
        raise ValueError(
            f"heads of q ({heads}) must be a positive multiple of heads of k/v ({heads_k})")
    if head_dim % ALIGN_ELEMENTS != 0 or not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"head_dim {head_dim} is not supported: "
            f"it must be a multiple of 8 in 8..{MAX_HEAD_DIM}")
    for t in (q, k, v):
        _check_layout(t)
    return heads, heads_k, head_dim


def check_dense(q, k, v):
    heads, heads_k, head_dim = _qkv_common(q, k, v, 4)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k has batch {k.shape[0]} but q has {q.shape[0]}; they must match")
    return Problem(q.dtype, q.shape[0], q.shape[1], k.shape[1], heads, heads_k, head_dim,
                   q.device, varlen=False)


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    heads, heads_k, head_dim = _qkv_common(q, k, v, 3)
    for cu in (cu_seqlens_q, cu_seqlens_k):
        if cu.dtype != "int32":
            raise TypeError(f"{cu.name} must have dtype int32, got {cu.dtype}")
        if cu.device != q.device:
            raise ValueError(
                f"{cu.name} is on {cu.device_str()} but q is on {q.device_str()}; they must match")
        if len(cu.shape) != 1 or cu.shape[0] < 1:
            raise ValueError(f"{cu.name} must be 1-D with batch + 1 entries, got shape {cu.shape}")
        if cu.shape[0] > 1 and cu.strides[0] != 1:
            raise ValueError(f"{cu.name} must be contiguous, got strides {cu.strides}")
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(
            f"cu_seqlens_k has {cu_seqlens_k.shape[0]} entries but cu_seqlens_q has "
            f"{cu_seqlens_q.shape[0]}; both must be batch + 1")
    max_seqlen_q = _as_int("max_seqlen_q", max_seqlen_q, 0)
    max_seqlen_k = _as_int("max_seqlen_k", max_seqlen_k, 0)
    return Problem(q.dtype, cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k, heads, heads_k,
                   head_dim, q.device, varlen=True, total_q=q.shape[0])


def check_alibi(alibi, problem):
    """alibi_slopes: fp32 (heads,) or (batch, heads) on q's device."""
    if alibi is None:
        return
    if alibi.dtype != "fp32":
        raise TypeError(f"alibi_slopes must have dtype float32, got {alibi.dtype}")
    if alibi.device != problem.device:
        raise ValueError(
            f"alibi_slopes is on {alibi.device_str()} but q is on "
            f"{problem.device[0]}:{problem.device[1]}; they must match")
    shape = tuple(alibi.shape)
    if shape not in ((problem.heads,), (problem.batch, problem.heads)):
        raise ValueError(
            f"alibi_slopes must have shape ({problem.heads},) or ({problem.batch}, "
            f"{problem.heads}), got {shape}")
    if shape[-1] > 1 and alibi.strides[-1] != 1:
        raise ValueError(f"alibi_slopes must have a contiguous last dimension, got {alibi.strides}")


def check_backward(problem, dout, out, lse):
    """The backward's extra inputs: dout and out as q (shape, dtype, device, a layout the kernels
    read in place); softmax_lse as the forward writes it, fp32 and dense, because the library takes
    its pointer alone."""
    for t in (dout, out, lse):
        if t.device != problem.device:
            raise ValueError(
                f"{t.name} is on {t.device_str()} but q is on "
                f"{problem.device[0]}:{problem.device[1]}; they must match")
    for t in (dout, out):
        if t.dtype != problem.dtype:
            raise TypeError(
                f"{t.name} has dtype {t.dtype} but q has {problem.dtype}; they must match")
        if tuple(t.shape) != problem.out_shape():
            raise ValueError(
                f"{t.name} must have q's shape {problem.out_shape()}, got {tuple(t.shape)}")
        _check_layout(t)
    if lse.dtype != "fp32":
        raise TypeError(f"softmax_lse must have dtype float32, got {lse.dtype}")
    shape = problem.lse_shape()
    if tuple(lse.shape) != shape:
        layout = "(heads, total_q)" if problem.varlen else "(batch, heads, seqlen_q)"
        raise ValueError(f"softmax_lse must have shape {layout} = {shape}, got {tuple(lse.shape)}")
    dense = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    if any(n > 1 and s != d for n, s, d in zip(shape, lse.strides, dense)):
        raise ValueError(
            f"softmax_lse must be contiguous (strides {dense}), got strides {lse.strides}")


def default_softmax_scale(head_dim):
    """FlashAttention's softmax_scale=None: 1 / sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)


def check_options(problem, softmax_scale, causal, causal_alignment, window_size, softcap, family,
                  tile):
    if softmax_scale is None:
        # Not checked for finiteness: under torch.compile a dynamic head_dim makes it symbolic.
        softmax_scale = default_softmax_scale(problem.head_dim)
    else:
        softmax_scale = float(softmax_scale)
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    left = _as_int("window_size[0] (-1 = unbounded)", left, -1)
    right = _as_int("window_size[1] (-1 = unbounded)", right, -1)
    softcap = float(softcap)
    if not (softcap >= 0.0 and math.isfinite(softcap)):
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    if causal_alignment not in lib.ALIGNMENTS:
        raise ValueError(
            f"causal_alignment must be one of {sorted(lib.ALIGNMENTS)}, got {causal_alignment!r}")
    if family not in lib.FAMILIES:
        raise ValueError(f"family must be one of {sorted(lib.FAMILIES)}, got {family!r}")
    if tile is None:
        tile = (0, 0, 0)
    else:
        tile = tuple(int(x) for x in tile)
        if len(tile) != 3 or min(tile) <= 0:
            raise ValueError(
                f"tile must be None or (m_block, n_block, num_threads) > 0, got {tile!r}")
    return Options(softmax_scale, bool(causal), lib.ALIGNMENTS[causal_alignment], left, right,
                   softcap, lib.FAMILIES[family], tile)


def check_pointers(tensors):
    """Every start 16-byte aligned (4 bytes for the int32/fp32 side inputs)."""
    for t in tensors:
        if t is None or t.ptr is None:
            continue
        need = ALIGN_BYTES if t.dtype in SUPPORTED_DTYPES else t.itemsize
        if t.ptr % need != 0:
            raise ValueError(
                f"{t.name}: data pointer {t.ptr:#x} is not {need}-byte aligned "
                "(a slice that starts mid-row? take .contiguous() or a copy)")


def _fc_tensor(t, varlen):
    """Strides for the C struct; an extent-1 dim is never stepped over, so its stride is 0."""
    strides = [s if n > 1 else 0 for n, s in zip(t.shape, t.strides)]
    if varlen:
        return lib.FcTensor(t.ptr, 0, strides[0], strides[1])
    return lib.FcTensor(t.ptr, strides[0], strides[1], strides[2])


def _fill_common(args, problem, options, cu_seqlens_q, cu_seqlens_k, alibi, stream):
    """The fields fc_forward_args and fc_backward_args share (same names, same meaning)."""
    args.abi_version = lib.ABI_VERSION
    args.dtype = lib.DTYPE_CODES[problem.dtype]
    args.batch = problem.batch
    args.seqlen_q = problem.seqlen_q
    args.seqlen_k = problem.seqlen_k
    args.heads = problem.heads
    args.heads_k = problem.heads_k
    args.head_dim = problem.head_dim
    if problem.varlen:
        args.cu_seqlens_q = cu_seqlens_q.ptr
        args.cu_seqlens_k = cu_seqlens_k.ptr
        args.total_q = problem.total_q
    args.softmax_scale = options.softmax_scale
    args.causal = int(options.causal)
    args.causal_alignment = options.causal_alignment
    args.window_left = options.window_left
    args.window_right = options.window_right
    args.softcap = options.softcap
    if alibi is not None:
        args.alibi_slopes = alibi.ptr
        per_batch = len(alibi.shape) == 2 and alibi.shape[0] > 1
        args.alibi_batch_stride = alibi.strides[0] if per_batch else 0
    args.family = options.family
    args.stream = stream or None


def build_args(problem, options, q, k, v, o, lse=None, cu_seqlens_q=None, cu_seqlens_k=None,
               alibi=None, stream=0):
    """An fc_forward_args for the checked problem; descs must carry real pointers."""
    args = lib.new_args()
    _fill_common(args, problem, options, cu_seqlens_q, cu_seqlens_k, alibi, stream)
    args.q, args.k, args.v, args.o = (_fc_tensor(t, problem.varlen) for t in (q, k, v, o))
    args.softmax_lse = lse.ptr if lse is not None else None
    args.tile = lib.FcTileConfig(*options.tile)
    return args


def build_backward_args(problem, options, q, k, v, o, dout, dq, dk, dv, lse, cu_seqlens_q=None,
                        cu_seqlens_k=None, alibi=None, deterministic=False, stream=0):
    """An fc_backward_args for the checked problem, without its workspace (the caller sizes it with
    library.backward_workspace_size on these args, then sets workspace and workspace_bytes)."""
    args = lib.new_backward_args()
    _fill_common(args, problem, options, cu_seqlens_q, cu_seqlens_k, alibi, stream)
    (args.q, args.k, args.v, args.o, args.dout, args.dq, args.dk, args.dv) = (
        _fc_tensor(t, problem.varlen) for t in (q, k, v, o, dout, dq, dk, dv))
    args.softmax_lse = lse.ptr
    args.deterministic = int(deterministic)
    return args


# The eager fast paths' screens. Each answers only the common case with certainty and returns None
# for anything else, which then goes through the checks above (and their messages).

def fast_dense_dims(shape_q, shape_k, shape_v):
    """(seqlen_k, heads_k) when q, k, v are dense 4-D and consistent, else None."""
    if len(shape_q) != 4 or len(shape_k) != 4 or tuple(shape_v) != tuple(shape_k):
        return None
    batch, seqlen_q, heads, head_dim = shape_q
    seqlen_k, heads_k = shape_k[1], shape_k[2]
    if (shape_k[0] != batch or shape_k[3] != head_dim or batch < 1 or seqlen_q < 1 or heads < 1
            or heads_k < 1 or heads % heads_k or head_dim % ALIGN_ELEMENTS
            or head_dim > MAX_HEAD_DIM):
        return None
    return seqlen_k, heads_k


def fast_layout_ok(strides, ptr):
    """Last dim contiguous, other strides multiples of 8 elements, a 16-byte aligned start."""
    return strides[3] == 1 and not (strides[0] | strides[1] | strides[2]) & 7 and not ptr & 15


def fast_options(head_dim, softmax_scale, causal, window_size, softcap):
    """(scale, causal, left, right, softcap) for plainly typed valid options, else None."""
    if softmax_scale is None:
        scale = default_softmax_scale(head_dim)
    elif type(softmax_scale) is float and math.isfinite(softmax_scale):
        scale = softmax_scale
    else:
        return None
    if type(causal) is not bool or type(window_size) is not tuple or len(window_size) != 2:
        return None
    left, right = window_size
    if type(left) is not int or type(right) is not int or left < -1 or right < -1:
        return None
    if softcap == 0:
        softcap = 0.0
    elif type(softcap) is not float or not (softcap > 0.0 and math.isfinite(softcap)):
        return None
    return scale, causal, left, right, softcap


# ---------------------------------------------------------------------------------------------
# Attention over a KV cache (fc_kvcache): the checks of what the library cannot see itself (the
# arrays' devices, dtypes and shapes; it takes only pointers, strides and the sizes we give it),
# and the filling of fc_kvcache_args. Values on the device (cache_seqlens, cache_batch_idx,
# cache_leftpad, block_table entries) are the caller's contract; debug_checks asks the library to
# check them on the device.

@dataclass
class KvcacheProblem(_QueryShapes):
    dtype: str
    batch: int
    seqlen_q: int
    heads: int
    heads_k: int
    head_dim: int
    device: Tuple[str, int]
    varlen: bool  # packed queries (cu_seqlens_q): q is (total_q, heads, head_dim)
    total_q: int
    seqlen_new: int  # 0 without k / v
    paged: bool
    batch_cache: int  # dense: cache rows; paged: pages
    seqlen_cache: int  # dense: slots per cache row; paged: page size
    pages_per_sequence: int  # paged only
    cache_seqlen: int  # the key count of every sequence when cache_seqlens is no array
    rotary_dim: int = 0
    rotary_seqlen: int = 0


    def capacity(self):
        """The slots each sequence's cache has."""
        if self.paged:
            return self.pages_per_sequence * self.seqlen_cache
        return self.seqlen_cache


@dataclass
class KvcacheOptions(Options):
    rotary_interleaved: bool = True
    num_splits: int = 0
    debug_checks: bool = False


def _same_device(t, q):
    if t.device != q.device:
        raise ValueError(
            f"{t.name} is on {t.device_str()} but q is on {q.device_str()}; they must match")


def _check_index_array(t, q, shape, layout):
    """An int32 array of the library's (device memory it reads by pointer): dtype, device, shape,
    and a contiguous last dimension (the one stride fc_kvcache_args has is the block table's
    row stride)."""
    if t.dtype != "int32":
        raise TypeError(f"{t.name} must have dtype int32, got {t.dtype}")
    _same_device(t, q)
    if tuple(t.shape) != shape:
        raise ValueError(f"{t.name} must have shape {layout} = {shape}, got {tuple(t.shape)}")
    if t.shape and t.shape[-1] > 1 and t.strides[-1] != 1:
        raise ValueError(f"{t.name} must have a contiguous last dimension, got strides {t.strides}")


def check_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                  cache_seqlens=None, cache_seqlen=None, cache_batch_idx=None, cache_leftpad=None,
                  block_table=None, cu_seqlens_q=None, max_seqlen_q=None, alibi=None):
    """The problem of one fc_kvcache call from its arrays' descriptors (None where not given).

    cache_seqlens is the (batch,) int32 array of key counts, or None: then cache_seqlen (an int,
    or None for the whole capacity) holds for every sequence. cu_seqlens_q (with max_seqlen_q)
    packs the queries as (total_q, heads, head_dim).
    """
    varlen = cu_seqlens_q is not None
    halves = [t for t in (q, k_cache, v_cache, k, v) if t is not None]
    for t in halves:
        _check_cuda(t)
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q has dtype {q.dtype}; flashcute supports float16 and bfloat16")
    for t in halves[1:] + [t for t in (rotary_cos, rotary_sin) if t is not None]:
        if t.dtype != q.dtype:
            raise TypeError(f"{t.name} has dtype {t.dtype} but q has {q.dtype}; they must match")
    for t, ndim in [(q, 3 if varlen else 4)] + [(t, 4) for t in halves[1:]]:
        if len(t.shape) != ndim:
            layout = {"q": "(total_q, heads, head_dim)" if varlen else
                      "(batch, seqlen_q, heads, head_dim)",
                      "k": "(batch, seqlen_new, heads_k, head_dim)",
                      "v": "(batch, seqlen_new, heads_k, head_dim)"}.get(
                t.name, "(batch_cache, seqlen_cache, heads_k, head_dim) or, with block_table, "
                "(num_pages, page_size, heads_k, head_dim)")
            raise ValueError(f"{t.name} must have {ndim} dimensions {layout}, got shape {t.shape}")
    for t in halves[1:]:
        _same_device(t, q)
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(
            f"v_cache has shape {v_cache.shape} but k_cache has {k_cache.shape}; they must match")
    head_dim = q.shape[-1]
    if k_cache.shape[-1] != head_dim:
        raise ValueError(
            f"k_cache has head_dim {k_cache.shape[-1]} but q has {head_dim}; they must match")
    heads, heads_k = q.shape[-2], k_cache.shape[-2]
    if heads < 1 or heads_k < 1 or heads % heads_k != 0:
        raise ValueError(
            f"heads of q ({heads}) must be a positive multiple of heads of k_cache/v_cache "
            f"({heads_k})")
    if head_dim % ALIGN_ELEMENTS != 0 or not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"head_dim {head_dim} is not supported: "
            f"it must be a multiple of 8 in 8..{MAX_HEAD_DIM}")

    if varlen:
        if cu_seqlens_q.dtype != "int32":
            raise TypeError(f"cu_seqlens_q must have dtype int32, got {cu_seqlens_q.dtype}")
        _same_device(cu_seqlens_q, q)
        if len(cu_seqlens_q.shape) != 1 or cu_seqlens_q.shape[0] < 1:
            raise ValueError(
                f"cu_seqlens_q must be 1-D with batch + 1 entries, got shape {cu_seqlens_q.shape}")
        if cu_seqlens_q.shape[0] > 1 and cu_seqlens_q.strides[0] != 1:
            raise ValueError(f"cu_seqlens_q must be contiguous, got strides {cu_seqlens_q.strides}")
        batch, seqlen_q, total_q = (cu_seqlens_q.shape[0] - 1,
                                    _as_int("max_seqlen_q", max_seqlen_q, 0), q.shape[0])
    else:
        batch, seqlen_q, total_q = q.shape[0], q.shape[1], 0

    if (k is None) != (v is None):
        raise ValueError("k and v (the new keys and values) must be given together")
    seqlen_new = 0
    if k is not None:
        if varlen:
            raise ValueError("k and v cannot be appended to the cache with packed queries "
                             "(cu_seqlens_q)")
        expected = (batch, k.shape[1], heads_k, head_dim)
        for t in (k, v):
            if tuple(t.shape) != expected:
                raise ValueError(
                    f"{t.name} must have shape (batch, seqlen_new, heads_k, head_dim) = "
                    f"{expected}, got {tuple(t.shape)}")
        seqlen_new = k.shape[1]

    for t in halves:
        _check_layout(t)

    paged = block_table is not None
    if paged:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx cannot be used with a paged cache (block_table): "
                             "the block table already maps each sequence to its pages")
        if block_table.dtype != "int32":
            raise TypeError(f"block_table must have dtype int32, got {block_table.dtype}")
        _same_device(block_table, q)
        if len(block_table.shape) != 2 or block_table.shape[0] != batch:
            raise ValueError(
                f"block_table must have shape (batch, pages_per_sequence) with batch {batch}, "
                f"got {tuple(block_table.shape)}")
        if block_table.shape[1] > 1 and block_table.strides[1] != 1:
            raise ValueError(
                f"block_table must have a contiguous last dimension, got strides "
                f"{block_table.strides}")
        pages_per_sequence = block_table.shape[1]
    else:
        pages_per_sequence = 0
    for t in (cache_seqlens, cache_batch_idx, cache_leftpad):
        if t is not None:
            _check_index_array(t, q, (batch,), "(batch,)")

    rotary_dim = rotary_seqlen = 0
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos and rotary_sin rotate the new keys (and q): they need k "
                             "and v")
        for t in (rotary_cos, rotary_sin):
            _same_device(t, q)
            if len(t.shape) != 2 or not 0 < 2 * t.shape[1] <= head_dim:
                raise ValueError(
                    f"{t.name} must have shape (seqlen, rotary_dim / 2) with 0 < rotary_dim <= "
                    f"head_dim ({head_dim}), got {tuple(t.shape)}")
            dense = (t.shape[1], 1)
            if any(n > 1 and s != d for n, s, d in zip(t.shape, t.strides, dense)):
                raise ValueError(f"{t.name} must be contiguous, got strides {t.strides}")
        if tuple(rotary_sin.shape) != tuple(rotary_cos.shape):
            raise ValueError(f"rotary_sin has shape {rotary_sin.shape} but rotary_cos has "
                             f"{rotary_cos.shape}; they must match")
        rotary_seqlen, rotary_dim = rotary_cos.shape[0], 2 * rotary_cos.shape[1]

    problem = KvcacheProblem(
        q.dtype, batch, seqlen_q, heads, heads_k, head_dim, q.device, varlen, total_q, seqlen_new,
        paged, k_cache.shape[0], k_cache.shape[1], pages_per_sequence, 0, rotary_dim,
        rotary_seqlen)
    if cache_seqlens is None:
        if cache_seqlen is None:
            if k is not None:
                raise ValueError("cache_seqlens is required when k and v are given: it says "
                                 "where they are written")
            cache_seqlen = problem.capacity()
        problem.cache_seqlen = _as_int("cache_seqlens", cache_seqlen, 0)
    check_alibi(alibi, problem)
    return problem


def check_kvcache_options(problem, softmax_scale, causal, window_size, softcap, rotary_interleaved,
                          num_splits, debug_checks, family):
    """FlashAttention's options (bottom-right causal), the split count and the debug switch."""
    base = check_options(problem, softmax_scale, causal, "bottom_right", window_size, softcap,
                         family, None)
    num_splits = _as_int(f"num_splits (0 = automatic, at most {lib.KVCACHE_MAX_SPLITS})",
                         num_splits, 0)
    if num_splits > lib.KVCACHE_MAX_SPLITS:
        raise ValueError(f"num_splits must be 0 (automatic) or 1..{lib.KVCACHE_MAX_SPLITS}, "
                         f"got {num_splits}")
    fields = {name: getattr(base, name) for name in Options.__dataclass_fields__}
    return KvcacheOptions(**fields, rotary_interleaved=bool(rotary_interleaved),
                          num_splits=num_splits, debug_checks=bool(debug_checks))


def build_kvcache_args(problem, options, q, o, k_cache, v_cache, k=None, v=None, lse=None,
                       rotary_cos=None, rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                       cache_leftpad=None, block_table=None, cu_seqlens_q=None, alibi=None,
                       stream=0):
    """An fc_kvcache_args for the checked problem, without its workspace (the caller sizes it with
    library.kvcache_workspace_size on these args, then sets workspace and workspace_bytes)."""
    args = lib.new_kvcache_args()
    args.abi_version = lib.ABI_VERSION
    args.q, args.o = (_fc_tensor(t, problem.varlen) for t in (q, o))
    args.k_cache, args.v_cache = (_fc_tensor(t, False) for t in (k_cache, v_cache))
    if k is not None:
        args.k_new, args.v_new = (_fc_tensor(t, False) for t in (k, v))
    args.dtype = lib.DTYPE_CODES[problem.dtype]
    args.batch = problem.batch
    args.seqlen_q = problem.seqlen_q
    args.heads = problem.heads
    args.heads_k = problem.heads_k
    args.head_dim = problem.head_dim
    if problem.varlen:
        args.cu_seqlens_q = cu_seqlens_q.ptr
        args.total_q = problem.total_q
    args.seqlen_new = problem.seqlen_new
    args.batch_cache = problem.batch_cache
    args.seqlen_cache = problem.seqlen_cache
    if cache_seqlens is not None:
        args.cache_seqlens = cache_seqlens.ptr
    else:
        args.cache_seqlen = problem.cache_seqlen
    args.cache_batch_idx = cache_batch_idx.ptr if cache_batch_idx is not None else None
    args.cache_leftpad = cache_leftpad.ptr if cache_leftpad is not None else None
    if block_table is not None:
        args.block_table = block_table.ptr
        args.block_table_stride = block_table.strides[0] if block_table.shape[0] > 1 else 0
        args.pages_per_sequence = problem.pages_per_sequence
    if rotary_cos is not None:
        args.rotary_cos, args.rotary_sin = rotary_cos.ptr, rotary_sin.ptr
        args.rotary_dim = problem.rotary_dim
        args.rotary_seqlen = problem.rotary_seqlen
    args.rotary_interleaved = int(options.rotary_interleaved)
    args.softmax_lse = lse.ptr if lse is not None else None
    args.softmax_scale = options.softmax_scale
    args.causal = int(options.causal)
    args.window_left = options.window_left
    args.window_right = options.window_right
    args.softcap = options.softcap
    if alibi is not None:
        args.alibi_slopes = alibi.ptr
        per_batch = len(alibi.shape) == 2 and alibi.shape[0] > 1
        args.alibi_batch_stride = alibi.strides[0] if per_batch else 0
    args.num_splits = options.num_splits
    args.debug_checks = int(options.debug_checks)
    args.family = options.family
    args.stream = stream or None
    return args

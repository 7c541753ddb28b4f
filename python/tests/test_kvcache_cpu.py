"""flash_attn_with_kvcache and the paged flash_attn_varlen_func on the CPU, without a GPU.

Most of it needs neither torch nor the library: the argument checks run on the fake DLPack arrays
of test_cpu.py (metadata only, never touched), the arguments reach fc_kvcache_args through a zeroed
struct, and the public functions are followed to the front end with a recorder in its place. The
tests at the end need torch (skipped without it): on FakeTensorMode's memoryless CUDA tensors they
check the torch front end's checks, what it hands torch.ops.flashcute.kvcache, and the op's fake
implementation and schema. The library's own validation is tested when it is found.
test_kvcache_gpu.py runs the kernels.
"""

import inspect
import re

import pytest

import flashcute
from flashcute import _checks, _library
from test_cpu import FP16, FP32, HEADER, INT32, FakeCudaArray, desc

INT64 = (0, 64)
B, SQ, H, HK, D = 2, 3, 8, 2, 64  # the default problem: batch, seqlen_q, heads, heads_k, head_dim
ROWS, SLOTS = 5, 256  # dense cache rows and slots
PAGES, PAGE, PER_SEQ = 40, 64, 7  # paged: pages, page size, pages per sequence


def arrays(paged=False, new=0, **overrides):
    """Fake arrays of a valid call, name -> FakeCudaArray, with overrides (None removes one)."""
    cache = (PAGES, PAGE, HK, D) if paged else (ROWS, SLOTS, HK, D)
    a = {"q": FakeCudaArray((B, SQ, H, D)),
         "k_cache": FakeCudaArray(cache, ptr=0x7F0000100000),
         "v_cache": FakeCudaArray(cache, ptr=0x7F0000200000)}
    if new:
        a["k"] = FakeCudaArray((B, new, HK, D), ptr=0x7F0000300000)
        a["v"] = FakeCudaArray((B, new, HK, D), ptr=0x7F0000400000)
    if paged:
        a["block_table"] = FakeCudaArray((B, PER_SEQ), dtype=INT32, ptr=0x7F0000500000)
    a.update(overrides)
    return {name: x for name, x in a.items() if x is not None}


def check(a, **kwargs):
    descs = {name: desc(x, name) for name, x in a.items()}
    alibi = descs.pop("alibi_slopes", None)
    return _checks.check_kvcache(**descs, alibi=alibi, **kwargs)


# ---------------------------------------------------------------------------------------------
# The problem a call describes.

def test_dense_problem():
    p = check(arrays(new=1, cache_seqlens=FakeCudaArray((B,), dtype=INT32)))
    assert (p.batch, p.seqlen_q, p.heads, p.heads_k, p.head_dim) == (B, SQ, H, HK, D)
    assert (p.paged, p.batch_cache, p.seqlen_cache, p.capacity()) == (False, ROWS, SLOTS, SLOTS)
    assert (p.seqlen_new, p.varlen, p.rotary_dim) == (1, False, 0)
    assert p.out_shape() == (B, SQ, H, D) and p.lse_shape() == (B, H, SQ)


def test_paged_problem():
    p = check(arrays(paged=True), cache_seqlen=100)
    assert (p.paged, p.batch_cache, p.seqlen_cache, p.pages_per_sequence) == (
        True, PAGES, PAGE, PER_SEQ)
    assert p.capacity() == PER_SEQ * PAGE and p.cache_seqlen == 100


@pytest.mark.parametrize("paged, expected", [(False, SLOTS), (True, PER_SEQ * PAGE)])
def test_no_cache_seqlens_means_the_whole_cache(paged, expected):
    assert check(arrays(paged=paged)).cache_seqlen == expected


def test_packed_queries_problem():
    a = arrays(paged=True, q=FakeCudaArray((30, H, D)),
               cu_seqlens_q=FakeCudaArray((B + 1,), dtype=INT32),
               cache_seqlens=FakeCudaArray((B,), dtype=INT32))
    p = check(a, max_seqlen_q=20)
    assert (p.varlen, p.batch, p.seqlen_q, p.total_q) == (True, B, 20, 30)
    assert p.out_shape() == (30, H, D) and p.lse_shape() == (H, 30)


def test_rotary_problem():
    cos = FakeCudaArray((4096, 16))
    p = check(arrays(new=SQ, rotary_cos=cos, rotary_sin=cos), cache_seqlen=0)
    assert (p.rotary_dim, p.rotary_seqlen) == (32, 4096)


BAD = [
    # (arrays() keyword arguments, check keyword arguments, exception, words of the message)
    ({"q": FakeCudaArray((B, SQ, H, D), device=(1, 0))}, {}, ValueError,
     "q must be on a CUDA device, got cpu:0"),
    ({"k_cache": FakeCudaArray((ROWS, SLOTS, HK, D), device=(1, 0))}, {}, ValueError,
     "k_cache must be on a CUDA device"),
    ({"q": FakeCudaArray((B, SQ, H, D), dtype=FP32)}, {}, TypeError, "q has dtype fp32"),
    ({"v_cache": FakeCudaArray((ROWS, SLOTS, HK, D), dtype=FP16)}, {}, TypeError,
     "v_cache has dtype fp16 but q has bf16"),
    ({"k_cache": FakeCudaArray((ROWS * SLOTS, HK, D))}, {}, ValueError,
     "k_cache must have 4 dimensions"),
    ({"q": FakeCudaArray((B * SQ, H, D))}, {}, ValueError,
     "q must have 4 dimensions (batch, seqlen_q, heads, head_dim)"),
    ({"v_cache": FakeCudaArray((ROWS, SLOTS, HK, D), device=(2, 1))}, {}, ValueError,
     "v_cache is on cuda:1 but q is on cuda:0"),
    ({"v_cache": FakeCudaArray((ROWS, SLOTS - 1, HK, D))}, {}, ValueError, "v_cache has shape"),
    ({"k_cache": FakeCudaArray((ROWS, SLOTS, HK, 32)),
      "v_cache": FakeCudaArray((ROWS, SLOTS, HK, 32))}, {}, ValueError, "k_cache has head_dim 32"),
    ({"k_cache": FakeCudaArray((ROWS, SLOTS, 3, D)), "v_cache": FakeCudaArray((ROWS, SLOTS, 3, D))},
     {}, ValueError, "heads of q (8) must be a positive multiple of heads of k_cache/v_cache (3)"),
    ({"q": FakeCudaArray((B, SQ, H, 60)), "k_cache": FakeCudaArray((ROWS, SLOTS, HK, 60)),
      "v_cache": FakeCudaArray((ROWS, SLOTS, HK, 60))}, {}, ValueError, "head_dim 60"),
    ({"q": FakeCudaArray((B, SQ, H, D), strides=(SQ * H * 128, H * 128, 128, 2))}, {},
     ValueError, "q must have a contiguous last dimension"),
    ({"k_cache": FakeCudaArray((ROWS, SLOTS, HK, D), strides=(SLOTS * HK * 68, HK * 68, 68, 1))},
     {}, ValueError, "k_cache: stride 68 of dim 2"),
    # The new keys and values.
    ({"k": FakeCudaArray((B, 1, HK, D))}, {"cache_seqlen": 0}, ValueError,
     "k and v (the new keys and values) must be given together"),
    ({"k": FakeCudaArray((B + 1, 1, HK, D)), "v": FakeCudaArray((B + 1, 1, HK, D))},
     {"cache_seqlen": 0}, ValueError,
     "k must have shape (batch, seqlen_new, heads_k, head_dim) = (2, 1, 2, 64), got (3, 1, 2, 64)"),
    ({"k": FakeCudaArray((B, 2, HK, D)), "v": FakeCudaArray((B, 1, HK, D))}, {"cache_seqlen": 0},
     ValueError, "v must have shape (batch, seqlen_new, heads_k, head_dim) = (2, 2, 2, 64)"),
    ({"k": FakeCudaArray((B, 1, HK, D), dtype=FP16), "v": FakeCudaArray((B, 1, HK, D))},
     {"cache_seqlen": 0}, TypeError, "k has dtype fp16 but q has bf16"),
    ({"k": FakeCudaArray((B, 1, HK, D)), "v": FakeCudaArray((B, 1, HK, D), device=(2, 1))},
     {"cache_seqlen": 0}, ValueError, "v is on cuda:1 but q is on cuda:0"),
    ({"k": FakeCudaArray((B, 1, HK, D)), "v": FakeCudaArray((B, 1, HK, D))}, {}, ValueError,
     "cache_seqlens is required when k and v are given"),
    # The int32 arrays.
    ({"cache_seqlens": FakeCudaArray((B,), dtype=INT64)}, {}, TypeError,
     "cache_seqlens must have dtype int32, got int64"),
    ({"cache_seqlens": FakeCudaArray((B,), dtype=INT32, device=(1, 0))}, {}, ValueError,
     "cache_seqlens is on cpu:0 but q is on cuda:0"),
    ({"cache_seqlens": FakeCudaArray((B + 1,), dtype=INT32)}, {}, ValueError,
     "cache_seqlens must have shape (batch,) = (2,), got (3,)"),
    ({"cache_seqlens": FakeCudaArray((B,), strides=(2,), dtype=INT32)}, {}, ValueError,
     "cache_seqlens must have a contiguous last dimension"),
    ({"cache_batch_idx": FakeCudaArray((B,), dtype=FP32)}, {}, TypeError,
     "cache_batch_idx must have dtype int32, got fp32"),
    ({"cache_leftpad": FakeCudaArray((B, 1), dtype=INT32)}, {}, ValueError,
     "cache_leftpad must have shape (batch,) = (2,), got (2, 1)"),
    ({"block_table": FakeCudaArray((B, PER_SEQ), dtype=INT64)}, {}, TypeError,
     "block_table must have dtype int32, got int64"),
    ({"block_table": FakeCudaArray((B + 1, PER_SEQ), dtype=INT32)}, {}, ValueError,
     "block_table must have shape (batch, pages_per_sequence) with batch 2, got (3, 7)"),
    ({"block_table": FakeCudaArray((B * PER_SEQ,), dtype=INT32)}, {}, ValueError,
     "block_table must have shape (batch, pages_per_sequence)"),
    ({"block_table": FakeCudaArray((B, PER_SEQ), strides=(1, B), dtype=INT32)}, {}, ValueError,
     "block_table must have a contiguous last dimension"),
    ({"block_table": FakeCudaArray((B, PER_SEQ), dtype=INT32, device=(2, 2))}, {}, ValueError,
     "block_table is on cuda:2 but q is on cuda:0"),
    ({"block_table": FakeCudaArray((B, PER_SEQ), dtype=INT32),
      "cache_batch_idx": FakeCudaArray((B,), dtype=INT32)}, {}, ValueError,
     "cache_batch_idx cannot be used with a paged cache"),
    # Rotary embedding.
    ({"rotary_cos": FakeCudaArray((64, 16))}, {}, ValueError,
     "rotary_cos and rotary_sin must be given together"),
    ({"rotary_cos": FakeCudaArray((64, 16)), "rotary_sin": FakeCudaArray((64, 16))}, {},
     ValueError, "they need k and v"),
    ({"rotary_cos": FakeCudaArray((64, 16), dtype=FP32), "rotary_sin": FakeCudaArray((64, 16))},
     {}, TypeError, "rotary_cos has dtype fp32 but q has bf16"),
    ({"k": FakeCudaArray((B, 1, HK, D)), "v": FakeCudaArray((B, 1, HK, D)),
      "rotary_cos": FakeCudaArray((64, 40)), "rotary_sin": FakeCudaArray((64, 40))},
     {"cache_seqlen": 0}, ValueError,
     "rotary_cos must have shape (seqlen, rotary_dim / 2) with 0 < rotary_dim <= head_dim (64), "
     "got (64, 40)"),
    ({"k": FakeCudaArray((B, 1, HK, D)), "v": FakeCudaArray((B, 1, HK, D)),
      "rotary_cos": FakeCudaArray((64, 16)), "rotary_sin": FakeCudaArray((64, 8))},
     {"cache_seqlen": 0}, ValueError, "rotary_sin has shape (64, 8) but rotary_cos has (64, 16)"),
    ({"k": FakeCudaArray((B, 1, HK, D)), "v": FakeCudaArray((B, 1, HK, D)),
      "rotary_cos": FakeCudaArray((64, 16), strides=(32, 1)),
      "rotary_sin": FakeCudaArray((64, 16))},
     {"cache_seqlen": 0}, ValueError, "rotary_cos must be contiguous, got strides (32, 1)"),
    # The scalar key count, ALiBi.
    ({}, {"cache_seqlen": -1}, ValueError, "cache_seqlens must be an int >= 0, got -1"),
    ({}, {"cache_seqlen": 2.5}, ValueError, "cache_seqlens must be an int >= 0, got 2.5"),
    ({"alibi_slopes": FakeCudaArray((4,), dtype=FP32)}, {}, ValueError,
     "alibi_slopes must have shape (8,) or (2, 8)"),
    ({"alibi_slopes": FakeCudaArray((H,))}, {}, TypeError,
     "alibi_slopes must have dtype float32"),
]


@pytest.mark.parametrize("overrides, kwargs, error, words", BAD)
def test_bad_arguments_are_named(overrides, kwargs, error, words):
    with pytest.raises(error) as info:
        check(arrays(**overrides), **kwargs)
    assert words in str(info.value)


def test_rotary_sin_on_the_cpu_is_named():
    cos = FakeCudaArray((64, 16))
    sin = FakeCudaArray((64, 16), device=(1, 0))
    with pytest.raises(ValueError, match=re.escape("rotary_sin is on cpu:0 but q is on cuda:0")):
        check(arrays(new=1, rotary_cos=cos, rotary_sin=sin), cache_seqlen=0)


@pytest.mark.parametrize("overrides, kwargs, error, words", [
    ({"cu_seqlens_q": FakeCudaArray((B + 1,), dtype=INT64)}, {"max_seqlen_q": 4}, TypeError,
     "cu_seqlens_q must have dtype int32"),
    ({"cu_seqlens_q": FakeCudaArray((B + 1,), dtype=INT32, device=(1, 0))}, {"max_seqlen_q": 4},
     ValueError, "cu_seqlens_q is on cpu:0"),
    ({"cu_seqlens_q": FakeCudaArray((B + 1,), dtype=INT32)}, {"max_seqlen_q": -1}, ValueError,
     "max_seqlen_q"),
    ({"cu_seqlens_q": FakeCudaArray((B + 2,), dtype=INT32)}, {"max_seqlen_q": 4}, ValueError,
     "block_table must have shape (batch, pages_per_sequence) with batch 3"),
    ({"cu_seqlens_q": FakeCudaArray((B + 1,), dtype=INT32), "k": FakeCudaArray((B, 1, HK, D)),
      "v": FakeCudaArray((B, 1, HK, D))}, {"max_seqlen_q": 4, "cache_seqlen": 0}, ValueError,
     "cannot be appended to the cache with packed queries"),
])
def test_bad_packed_query_arguments(overrides, kwargs, error, words):
    a = arrays(paged=True, q=FakeCudaArray((30, H, D)), **overrides)
    with pytest.raises(error) as info:
        check(a, **kwargs)
    assert words in str(info.value)


def test_options():
    p = check(arrays())
    o = _checks.check_kvcache_options(p, None, True, (5, 0), 30.0, False, 64, True, "sm80")
    assert o.softmax_scale == pytest.approx(D ** -0.5)
    assert (o.causal, o.causal_alignment, o.window_left, o.window_right, o.softcap) == (
        True, _library.CAUSAL_BOTTOM_RIGHT, 5, 0, 30.0)
    assert (o.rotary_interleaved, o.num_splits, o.debug_checks, o.family) == (False, 64, True, 80)
    top = _checks.check_kvcache_options(p, 0.5, False, (-1, -1), 0.0, True,
                                        _library.KVCACHE_MAX_SPLITS, False, "auto")
    assert top.num_splits == _library.KVCACHE_MAX_SPLITS


@pytest.mark.parametrize("kwargs, words", [
    ({"num_splits": -1}, "num_splits"),
    ({"num_splits": 129}, "num_splits must be 0 (automatic) or 1..128, got 129"),
    ({"num_splits": 1.5}, "num_splits"),
    ({"num_splits": True}, "num_splits"),
    ({"window_size": (-2, 0)}, "window_size[0]"),
    ({"softcap": -1.0}, "softcap"),
    ({"softmax_scale": float("inf")}, "softmax_scale"),
    ({"family": "sm100"}, "family"),
])
def test_bad_options(kwargs, words):
    options = dict(softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   rotary_interleaved=True, num_splits=0, debug_checks=False, family="auto")
    options.update(kwargs)
    with pytest.raises(ValueError) as info:
        _checks.check_kvcache_options(check(arrays()), *options.values())
    assert words in str(info.value)


def test_max_splits_is_the_header_s():
    if not HEADER.is_file():
        pytest.skip("needs the repository's include/flashcute/flashcute.h")
    assert f"#define FC_KVCACHE_MAX_SPLITS {_library.KVCACHE_MAX_SPLITS}" in HEADER.read_text()


# ---------------------------------------------------------------------------------------------
# fc_kvcache_args, filled from the descriptors (into a zeroed struct: no library needed).

@pytest.fixture
def zeroed_args(monkeypatch):
    monkeypatch.setattr(_library, "new_kvcache_args", _library.FcKvcacheArgs)


def build(a, options=None, **kwargs):
    descs = {name: desc(x, name) for name, x in a.items()}
    alibi = descs.pop("alibi_slopes", None)
    problem = _checks.check_kvcache(**descs, alibi=alibi, **kwargs)
    options = options or _checks.check_kvcache_options(problem, 0.25, True, (9, 3), 5.0, False, 3,
                                                       True, "sm80")
    out = desc(FakeCudaArray(problem.out_shape(), ptr=0x7F0000600000), "out")
    lse = desc(FakeCudaArray(problem.lse_shape(), dtype=FP32, ptr=0x7F0000700000), "softmax_lse")
    q = descs.pop("q")
    args = _checks.build_kvcache_args(problem, options, q, out, lse=lse, alibi=alibi,
                                      stream=0x1234, **descs)
    return args, problem, {**descs, "q": q, "out": out, "lse": lse, "alibi": alibi}


def test_dense_args(zeroed_args):
    cos = FakeCudaArray((512, 24), ptr=0x7F0000800000)
    sin = FakeCudaArray((512, 24), ptr=0x7F0000900000)
    a = arrays(new=SQ, rotary_cos=cos, rotary_sin=sin,
               cache_seqlens=FakeCudaArray((B,), dtype=INT32, ptr=0x7F0000A00000),
               cache_batch_idx=FakeCudaArray((B,), dtype=INT32, ptr=0x7F0000B00000),
               cache_leftpad=FakeCudaArray((B,), dtype=INT32, ptr=0x7F0000C00000),
               alibi_slopes=FakeCudaArray((B, H), dtype=FP32, ptr=0x7F0000D00000))
    args, p, d = build(a)
    assert args.abi_version == _library.ABI_VERSION and args.dtype == _library.BFLOAT16
    assert (args.batch, args.seqlen_q, args.heads, args.heads_k, args.head_dim) == (B, SQ, H, HK, D)
    assert (args.q.data, args.o.data, args.k_cache.data, args.v_cache.data, args.k_new.data,
            args.v_new.data) == tuple(d[n].ptr for n in ("q", "out", "k_cache", "v_cache", "k",
                                                          "v"))
    assert (args.q.batch_stride, args.q.seq_stride, args.q.head_stride) == (SQ * H * D, H * D, D)
    assert (args.k_cache.batch_stride, args.k_cache.seq_stride, args.k_cache.head_stride) == (
        SLOTS * HK * D, HK * D, D)
    assert (args.k_new.batch_stride, args.k_new.seq_stride) == (SQ * HK * D, HK * D)
    assert (args.seqlen_new, args.batch_cache, args.seqlen_cache) == (SQ, ROWS, SLOTS)
    assert not args.cu_seqlens_q and args.total_q == 0
    assert args.cache_seqlens == d["cache_seqlens"].ptr and args.cache_seqlen == 0
    assert args.cache_batch_idx == d["cache_batch_idx"].ptr
    assert args.cache_leftpad == d["cache_leftpad"].ptr
    assert not args.block_table and args.pages_per_sequence == 0
    assert (args.rotary_cos, args.rotary_sin, args.rotary_dim, args.rotary_seqlen) == (
        d["rotary_cos"].ptr, d["rotary_sin"].ptr, 48, 512)
    assert args.rotary_interleaved == 0
    assert args.softmax_lse == d["lse"].ptr
    assert (args.softmax_scale, args.causal, args.window_left, args.window_right,
            args.softcap) == (0.25, 1, 9, 3, 5.0)
    assert args.alibi_slopes == d["alibi"].ptr and args.alibi_batch_stride == H
    assert (args.num_splits, args.debug_checks, args.family, args.stream) == (3, 1, 80, 0x1234)
    assert not args.workspace and args.workspace_bytes == 0


def test_paged_args_with_one_key_count(zeroed_args):
    table = FakeCudaArray((B, PER_SEQ), strides=(16, 1), dtype=INT32, ptr=0x7F0000E00000)
    p_args, p, d = build(arrays(paged=True, block_table=table), cache_seqlen=77)
    assert (p_args.batch_cache, p_args.seqlen_cache) == (PAGES, PAGE)
    assert (p_args.k_cache.batch_stride, p_args.k_cache.seq_stride) == (PAGE * HK * D, HK * D)
    assert p_args.block_table == d["block_table"].ptr
    assert (p_args.block_table_stride, p_args.pages_per_sequence) == (16, PER_SEQ)
    assert not p_args.cache_seqlens and p_args.cache_seqlen == 77
    assert not p_args.k_new.data and not p_args.v_new.data and p_args.seqlen_new == 0
    assert not p_args.rotary_cos and p_args.rotary_dim == 0
    assert not p_args.alibi_slopes and not p_args.cache_batch_idx and not p_args.cache_leftpad


def test_packed_query_args(zeroed_args):
    a = arrays(paged=True, q=FakeCudaArray((30, H, D)),
               cu_seqlens_q=FakeCudaArray((B + 1,), dtype=INT32, ptr=0x7F0000F00000),
               cache_seqlens=FakeCudaArray((B,), dtype=INT32, ptr=0x7F0001000000),
               alibi_slopes=FakeCudaArray((H,), dtype=FP32, ptr=0x7F0001100000))
    args, p, d = build(a, max_seqlen_q=20)
    assert args.cu_seqlens_q == d["cu_seqlens_q"].ptr
    assert (args.batch, args.seqlen_q, args.total_q) == (B, 20, 30)
    assert (args.q.batch_stride, args.q.seq_stride, args.q.head_stride) == (0, H * D, D)
    assert (args.o.batch_stride, args.o.seq_stride, args.o.head_stride) == (0, H * D, D)
    assert args.alibi_batch_stride == 0


# ---------------------------------------------------------------------------------------------
# The public functions: signatures, what reaches the front end, and errors before any framework.

def test_signature_matches_flash_attention():
    empty = inspect.Parameter.empty
    parameters = inspect.signature(flashcute.flash_attn_with_kvcache).parameters.values()
    assert [(p.name, p.default) for p in parameters
            if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD] == [
        ("q", empty), ("k_cache", empty), ("v_cache", empty), ("k", None), ("v", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
        ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
        ("return_softmax_lse", False)]
    # Our extensions come after them, keyword only.
    keyword_only = [(p.name, p.default) for p in parameters
                    if p.kind == inspect.Parameter.KEYWORD_ONLY]
    assert keyword_only == [("family", "auto"), ("debug_checks", False)]
    assert "flash_attn_with_kvcache" in flashcute.__all__


@pytest.fixture
def frontend_calls(monkeypatch):
    """Each call that reaches the DLPack front end's kvcache, which returns ("out", "lse")."""
    from flashcute import _dlpack

    calls = []

    def record(tensors, cache_seqlen, max_seqlen_q, options_fn, return_lse):
        calls.append(dict(tensors=tensors, cache_seqlen=cache_seqlen, max_seqlen_q=max_seqlen_q,
                          options_fn=options_fn, return_lse=return_lse))
        return "out", ("lse" if return_lse else None)

    monkeypatch.setattr(_dlpack, "kvcache", record)
    return calls


def test_int_cache_seqlens_is_passed_as_one_count(frontend_calls):
    a = arrays(new=1)
    assert flashcute.flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], a["k"], a["v"],
                                             cache_seqlens=17) == "out"
    call = frontend_calls[-1]
    assert call["cache_seqlen"] == 17 and call["tensors"]["cache_seqlens"] is None
    assert call["tensors"]["k"] is a["k"] and call["tensors"]["cu_seqlens_q"] is None
    assert call["max_seqlen_q"] is None and call["return_lse"] is False
    seqlens = FakeCudaArray((B,), dtype=INT32)
    out = flashcute.flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"],
                                            cache_seqlens=seqlens, return_softmax_lse=True)
    assert out == ("out", "lse")
    call = frontend_calls[-1]
    assert call["cache_seqlen"] is None and call["tensors"]["cache_seqlens"] is seqlens


def test_options_reach_the_front_end(frontend_calls):
    a = arrays(paged=True)
    flashcute.flash_attn_with_kvcache(
        a["q"], a["k_cache"], a["v_cache"], block_table=a["block_table"], softmax_scale=0.3,
        causal=True, window_size=(7, 0), softcap=12.0, rotary_interleaved=False, num_splits=5,
        family="sm80", debug_checks=True)
    call = frontend_calls[-1]
    assert call["tensors"]["block_table"] is a["block_table"]
    o = call["options_fn"](check(a))
    assert (o.softmax_scale, o.causal, o.window_left, o.window_right, o.softcap) == (
        pytest.approx(0.3), True, 7, 0, 12.0)
    assert (o.rotary_interleaved, o.num_splits, o.debug_checks, o.family) == (False, 5, True, 80)


class FakeOffsets(FakeCudaArray):
    """A CUDA int32 offsets array whose slices and differences are fake arrays too."""

    dtype = "int32"

    def __getitem__(self, index):
        n = len(range(*index.indices(self.shape[0])))
        return FakeOffsets((n,), dtype=INT32)

    def __sub__(self, other):
        assert self.shape == other.shape
        return FakeOffsets(self.shape, dtype=INT32)


def test_paged_varlen_runs_the_kvcache_entry(frontend_calls):
    a = arrays(paged=True, q=FakeCudaArray((30, H, D)))
    cu_q, cu_k = FakeOffsets((B + 1,), dtype=INT32), FakeOffsets((B + 1,), dtype=INT32)
    result = flashcute.flash_attn_varlen_func(
        a["q"], a["k_cache"], a["v_cache"], cu_q, cu_k, 20, 9999, softmax_scale=0.5, causal=True,
        window_size=(4, 0), softcap=3.0, return_attn_probs=True, block_table=a["block_table"])
    assert result == ("out", "lse", None)
    call = frontend_calls[-1]
    t = call["tensors"]
    assert t["q"] is a["q"] and t["k_cache"] is a["k_cache"] and t["v_cache"] is a["v_cache"]
    assert t["cu_seqlens_q"] is cu_q and t["block_table"] is a["block_table"]
    assert t["cache_seqlens"].shape == (B,) and t["k"] is None and t["rotary_cos"] is None
    assert call["cache_seqlen"] is None and call["max_seqlen_q"] == 20
    o = call["options_fn"](check({**a, "cu_seqlens_q": cu_q}, max_seqlen_q=20))
    assert (o.softmax_scale, o.causal, o.window_left, o.window_right, o.softcap) == (
        0.5, True, 4, 0, 3.0)
    assert (o.num_splits, o.debug_checks, o.family) == (0, False, 0)
    assert flashcute.flash_attn_varlen_func(a["q"], a["k_cache"], a["v_cache"], cu_q, cu_k, 20, 0,
                                            block_table=a["block_table"]) == "out"


def test_paged_varlen_checks_cu_seqlens_k_first():
    import numpy as np

    q = FakeCudaArray((30, H, D))
    table = FakeCudaArray((B, PER_SEQ), dtype=INT32)
    cu_q = FakeCudaArray((B + 1,), dtype=INT32)
    with pytest.raises(TypeError, match="cu_seqlens_k must have dtype int32, got int64"):
        flashcute.flash_attn_varlen_func(q, q, q, cu_q, np.zeros(3, np.int64), 8, 8,
                                         block_table=table)
    with pytest.raises(ValueError, match="cu_seqlens_k must be on a CUDA device, got cpu:0"):
        flashcute.flash_attn_varlen_func(q, q, q, cu_q, np.zeros(3, np.int32), 8, 8,
                                         block_table=table)
    with pytest.raises(ValueError, match="cu_seqlens_k must be 1-D"):
        flashcute.flash_attn_varlen_func(q, q, q, cu_q, np.zeros((3, 1), np.int32), 8, 8,
                                         block_table=table)
    with pytest.raises(TypeError, match="cu_seqlens_k must be a torch.Tensor or an array"):
        flashcute.flash_attn_varlen_func(q, q, q, cu_q, [0, 4, 8], 8, 8, block_table=table)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashcute.flash_attn_varlen_func(q, q, q, cu_q, cu_q, 8, 8, dropout_p=0.1,
                                         block_table=table)


@pytest.fixture
def no_allocation(monkeypatch):
    """The DLPack front end's allocator for fake arrays: the legacy stream, and no memory (the
    checks under test refuse the call before anything is allocated)."""
    from flashcute import _dlpack

    class Allocator:
        def stream(self):
            return 0

        def empty(self, shape, dtype):
            raise AssertionError("allocation reached")

    monkeypatch.setattr(_dlpack, "_cached_allocator", lambda framework, index: Allocator())


def test_paged_varlen_reaches_the_checks(no_allocation):
    # Through the real DLPack front end: the key counts are computed from cu_seqlens_k and
    # checked as cache_seqlens; a bad block table is named before any capsule is taken.
    a = arrays(paged=True, q=FakeCudaArray((30, H, D)))
    cu = FakeOffsets((B + 1,), dtype=INT32)
    with pytest.raises(ValueError, match="block_table is on cuda:1 but q is on cuda:0"):
        flashcute.flash_attn_varlen_func(
            a["q"], a["k_cache"], a["v_cache"], cu, cu, 20, 0,
            block_table=FakeCudaArray((B, PER_SEQ), dtype=INT32, device=(2, 1)))
    assert a["q"].stream_seen == "not called"
    with pytest.raises(TypeError, match="block_table must have dtype int32, got int64"):
        flashcute.flash_attn_varlen_func(
            a["q"], a["k_cache"], a["v_cache"], cu, cu, 20, 0,
            block_table=FakeCudaArray((B, PER_SEQ), dtype=INT64))


def test_arrays_off_the_gpu_are_refused_before_any_capsule():
    import numpy as np

    a = arrays(new=1)
    with pytest.raises(ValueError, match="k_cache must be on a CUDA device, got cpu:0"):
        flashcute.flash_attn_with_kvcache(a["q"], np.zeros((ROWS, SLOTS, HK, D), np.float16),
                                          a["v_cache"], cache_seqlens=0)
    with pytest.raises(ValueError, match="cache_seqlens must be on a CUDA device, got cpu:0"):
        flashcute.flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"],
                                          cache_seqlens=np.zeros(B, np.int32))
    with pytest.raises(TypeError, match="v_cache must be a torch.Tensor or an array"):
        flashcute.flash_attn_with_kvcache(a["q"], a["k_cache"], [[0.0]])
    for name in ("q", "k_cache", "v_cache"):
        assert a[name].stream_seen == "not called", name


def test_scalar_cache_seqlens_must_be_an_int(no_allocation):
    a = arrays()
    with pytest.raises(ValueError, match="cache_seqlens must be an int >= 0, got 'all'"):
        flashcute.flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"],
                                          cache_seqlens="all")


def test_jax_caches_are_not_written():
    class JaxLike(FakeCudaArray):
        pass

    JaxLike.__module__ = "jax._src.array"
    a = arrays(new=1, k_cache=JaxLike((ROWS, SLOTS, HK, D)), v_cache=JaxLike((ROWS, SLOTS, HK, D)))
    with pytest.raises(ValueError, match="JAX arrays are immutable"):
        flashcute.flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], a["k"], a["v"],
                                          cache_seqlens=3)
    assert a["k_cache"].stream_seen == "not called"


# ---------------------------------------------------------------------------------------------
# The library's own validation (it needs no GPU to refuse a call).

def test_kvcache_args_init_defaults(library):
    args = _library.new_kvcache_args()
    assert args.abi_version == _library.ABI_VERSION
    assert (args.window_left, args.window_right) == (-1, -1)
    assert args.num_splits == 0 and args.debug_checks == 0 and args.family == 0
    assert not args.k_new.data and args.seqlen_new == 0 and not args.rotary_cos
    assert not args.cache_seqlens and not args.block_table and not args.cu_seqlens_q
    assert not args.workspace and args.workspace_bytes == 0 and not args.stream


def _library_kvcache_args(**fields):
    args = _library.new_kvcache_args()
    args.dtype = _library.BFLOAT16
    args.batch, args.seqlen_q, args.heads, args.heads_k, args.head_dim = 2, 1, 4, 4, 64
    args.batch_cache, args.seqlen_cache, args.cache_seqlen = 2, 64, 10
    args.softmax_scale = 0.125
    for name, value in fields.items():
        setattr(args, name, value)
    return args


@pytest.mark.parametrize("fields, words", [
    ({}, ""),  # every data pointer is null
    ({"abi_version": 99}, "abi_version"),
])
def test_library_rejects_invalid_kvcache_arguments(library, fields, words):
    for call in (_library.kvcache_workspace_size, _library.kvcache):
        with pytest.raises(flashcute.InvalidArgumentError) as info:
            call(_library_kvcache_args(**fields))
        assert info.value.status == _library.ERROR_INVALID_ARGUMENT
        assert words in str(info.value)
        assert library.fc_last_error().decode() in str(info.value)


# ---------------------------------------------------------------------------------------------
# The torch front end on FakeTensorMode's CUDA tensors (shapes and strides, no memory): its checks
# before the op, what it hands the op, and the op's fake implementation (as torch.compile sees it).

@pytest.fixture
def torch_fake():
    torch = pytest.importorskip("torch", reason="the torch front end needs torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        yield torch


def cuda(torch, shape, dtype=None):
    return torch.empty(shape, dtype=dtype or torch.bfloat16, device="cuda")


@pytest.fixture
def kvcache_op_calls(monkeypatch, torch_fake):
    """The arguments of each torch.ops.flashcute.kvcache call."""
    torch = torch_fake
    import flashcute._torch  # noqa: F401  (registers the op)

    calls = []
    real_op = torch.ops.flashcute.kvcache

    class Spy:
        def __call__(self, *args):
            calls.append(args)
            return real_op(*args)

        def __getattr__(self, name):
            return getattr(real_op, name)

    monkeypatch.setattr(torch.ops.flashcute, "kvcache", Spy())
    return calls


# kvcache's arguments by position (see _torch._kvcache).
OP_CACHE_SEQLENS, OP_CACHE_SEQLEN, OP_MAX_SEQLEN_Q = 7, 8, 13
OP_NUM_SPLITS, OP_RETURN_LSE, OP_DEBUG, OP_FAMILY = 21, 22, 23, 24


def test_torch_outputs_and_op_arguments(torch_fake, kvcache_op_calls):
    torch = torch_fake
    q = cuda(torch, (B, SQ, H, D))
    k_cache, v_cache = cuda(torch, (ROWS, SLOTS, HK, D)), cuda(torch, (ROWS, SLOTS, HK, D))
    k, v = cuda(torch, (B, SQ, HK, D)), cuda(torch, (B, SQ, HK, D))
    seqlens = cuda(torch, (B,), torch.int32)
    out, lse = flashcute.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                                 causal=True, num_splits=7,
                                                 return_softmax_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "cuda"
    assert lse.shape == (B, H, SQ) and lse.dtype == torch.float32
    call = kvcache_op_calls[-1]
    assert call[OP_CACHE_SEQLENS] is seqlens and call[OP_NUM_SPLITS] == 7
    assert call[OP_RETURN_LSE] is True and call[OP_DEBUG] is False and call[OP_FAMILY] == 0
    out = flashcute.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=12,
                                            family="sm80", debug_checks=True)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    call = kvcache_op_calls[-1]
    assert call[OP_CACHE_SEQLENS] is None and call[OP_CACHE_SEQLEN] == 12
    assert call[OP_DEBUG] is True and call[OP_FAMILY] == 80 and call[OP_RETURN_LSE] is False
    # No cache_seqlens: the whole cache, dense or paged.
    flashcute.flash_attn_with_kvcache(q, k_cache, v_cache)
    assert kvcache_op_calls[-1][OP_CACHE_SEQLEN] == SLOTS
    pages = cuda(torch, (PAGES, PAGE, HK, D))
    table = cuda(torch, (B, PER_SEQ), torch.int32)
    flashcute.flash_attn_with_kvcache(q, pages, pages, block_table=table)
    assert kvcache_op_calls[-1][OP_CACHE_SEQLEN] == PER_SEQ * PAGE


def test_torch_paged_varlen(torch_fake, kvcache_op_calls):
    torch = torch_fake
    q = cuda(torch, (30, H, D))
    pages = cuda(torch, (PAGES, PAGE, HK, D))
    table = cuda(torch, (B, PER_SEQ), torch.int32)
    cu = cuda(torch, (B + 1,), torch.int32)
    out, lse, probs = flashcute.flash_attn_varlen_func(q, pages, pages, cu, cu, 20, 100,
                                                       causal=True, return_attn_probs=True,
                                                       block_table=table)
    assert out.shape == (30, H, D) and lse.shape == (H, 30) and probs is None
    call = kvcache_op_calls[-1]
    assert call[OP_CACHE_SEQLENS].shape == (B,) and call[OP_CACHE_SEQLENS].dtype == torch.int32
    assert call[OP_MAX_SEQLEN_Q] == 20
    with pytest.raises(TypeError, match="cu_seqlens_k must have dtype int32, got int64"):
        flashcute.flash_attn_varlen_func(q, pages, pages, cu, cu.long(), 20, 100,
                                         block_table=table)
    cpu_cu = torch.zeros((B + 1,), dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k must be on a CUDA device, got cpu:0"):
        flashcute.flash_attn_varlen_func(q, pages, pages, cu, cpu_cu, 20, 100, block_table=table)


@pytest.mark.parametrize("name, make, error, words", [
    ("cache_seqlens", lambda t: cuda(t, (B,), t.int64), TypeError,
     "cache_seqlens must have dtype int32, got int64"),
    ("cache_seqlens", lambda t: t.zeros((B,), dtype=t.int32), ValueError,
     "cache_seqlens is on cpu:0 but q is on cuda:0"),
    ("cache_batch_idx", lambda t: [0, 1], TypeError,
     "q is a torch.Tensor, so cache_batch_idx must be one too"),
    ("k_cache", lambda t: cuda(t, (ROWS, SLOTS, HK, D), t.float16), TypeError,
     "k_cache has dtype fp16 but q has bf16"),
    ("v", lambda t: cuda(t, (B, 2, HK, D)), ValueError, "v must have shape"),
    ("rotary_cos", lambda t: cuda(t, (64, 16), t.float32), TypeError,
     "rotary_cos has dtype fp32 but q has bf16"),
])
def test_torch_bad_arguments_raise_before_the_op(torch_fake, monkeypatch, name, make, error,
                                                 words):
    torch = torch_fake
    monkeypatch.setattr(torch.ops.flashcute, "kvcache", None)  # reaching the op would fail
    inputs = dict(q=cuda(torch, (B, SQ, H, D)), k_cache=cuda(torch, (ROWS, SLOTS, HK, D)),
                  v_cache=cuda(torch, (ROWS, SLOTS, HK, D)), k=cuda(torch, (B, 1, HK, D)),
                  v=cuda(torch, (B, 1, HK, D)), cache_seqlens=cuda(torch, (B,), torch.int32))
    if name == "rotary_cos":
        inputs["rotary_sin"] = cuda(torch, (64, 16))
    inputs[name] = make(torch)
    with pytest.raises(error, match=re.escape(words)):
        flashcute.flash_attn_with_kvcache(**inputs)


def test_torch_op_schema_mutates_the_caches_only():
    torch = pytest.importorskip("torch", reason="the torch front end needs torch")
    import flashcute._torch  # noqa: F401  (registers the op)

    schema = torch.ops.flashcute.kvcache.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and
               a.alias_info.is_write]
    assert written == ["k_cache", "v_cache"]
    assert [r.type.kind() for r in schema.returns] == ["TensorType", "TensorType"]


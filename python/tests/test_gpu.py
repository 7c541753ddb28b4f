"""GPU tests through torch: outputs and LSE against the fp64 reference, torch.compile, CUDA graphs.

Cases are chosen pairwise over the lists below (every pair of values of two lists at least once);
each case's reference is computed once and shared by the kernel families that run it.
"""

import os
import shutil
import zlib

import pytest

torch = pytest.importorskip("torch", reason="the GPU tests need torch")
if not torch.cuda.is_available():
    pytest.skip("the GPU tests need a CUDA device", allow_module_level=True)

import flashcute  # noqa: E402
from attention_reference import (  # noqa: E402
    assert_close,
    assert_lse_close,
    attention,
    default_scale,
)
from pairwise_cases import pairwise  # noqa: E402

SEED = int(os.environ["FLASHCUTE_TEST_SEED"])
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
DEVICE = torch.device("cuda", torch.cuda.current_device())

FACTORS = {
    "dtype": [torch.float16, torch.bfloat16],
    "head_dim": [8, 40, 64, 72, 96, 128, 136, 200, 256],
    "lengths": [(1, 1), (1, 300), (127, 129), (129, 127), (128, 128), (300, 77), (64, 1000),
                (513, 513), (192, 64)],  # (seqlen_q, seqlen_k): tile +- 1, sq > sk and sq < sk
    "batch": [1, 3],
    "heads": [(4, 4), (8, 2), (6, 1)],  # (heads, heads_k): MHA, GQA, MQA
    "causal": [False, True],
    "feature": ["none", "window", "window_left", "window_right", "softcap", "alibi",
                "alibi_batch"],
    "inputs": ["normal", "large", "very_negative", "negative_scale"],
    "layout": ["contiguous", "bhsd", "packed"],
    "align": ["bottom_right", "top_left"],
    "lse": [False, True],
}
CASES = pairwise(FACTORS, seed=1)
FAMILIES = ["auto", "sm80", "sm90"]


def generator(*salt):
    g = torch.Generator(device=DEVICE)
    g.manual_seed(zlib.crc32(repr((SEED,) + salt).encode()))  # stable across processes
    return g


def randn(shape, g, dtype=torch.float32):
    return torch.randn(shape, generator=g, device=DEVICE, dtype=torch.float32).to(dtype)


def poison(*shapes_and_dtypes):
    """Leaves freed blocks of the caching allocator full of NaN, so that outputs of the same sizes
    allocated next start poisoned: an element the kernel fails to write cannot pass."""
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
              for shape, dtype in shapes_and_dtypes]
    del blocks


def make_inputs(case, index):
    g = generator("case", index)
    dtype, d = case["dtype"], case["head_dim"]
    sq, sk = case["lengths"]
    h, hk = case["heads"]
    b = case["batch"]
    q, k, v = randn((b, sq, h, d), g), randn((b, sk, hk, d), g), randn((b, sk, hk, d), g)
    if case["inputs"] == "large":  # scores in the hundreds
        q, k = q * 8, k * 8
    elif case["inputs"] == "very_negative":  # every score of every row far below -87
        q, k = q.abs() * 4 + 4, -(k.abs() * 4 + 4)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def in_layout(t, layout, extra_heads=2):
    """The same values in another memory layout (non-contiguous strides, offset start)."""
    if layout == "bhsd":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "packed":  # a slice of a wider (b, s, heads + 2, d) buffer, like a fused QKV
        b, s, h, d = t.shape
        buf = torch.zeros((b, s, h + extra_heads, d), dtype=t.dtype, device=t.device)
        buf[:, :, 1:h + 1] = t
        return buf[:, :, 1:h + 1]
    return t


def options_for(case, index):
    sq, sk = case["lengths"]
    h, _ = case["heads"]
    g = generator("alibi", index)
    feature = case["feature"]
    window = {"window": (sk // 4 + 3, sk // 8 + 1), "window_left": (sk // 3, -1),
              "window_right": (-1, 5)}.get(feature, (-1, -1))
    alibi = None
    if feature == "alibi":
        alibi = torch.rand((h,), generator=g, device=DEVICE) * 0.5 + 0.01
    elif feature == "alibi_batch":
        alibi = torch.rand((case["batch"], h), generator=g, device=DEVICE) * 0.5 + 0.01
    scale = None
    if case["inputs"] == "negative_scale":
        scale = -1.5 * default_scale(case["head_dim"])
    return dict(softmax_scale=scale, causal=case["causal"], window_size=window,
                softcap=30.0 if feature == "softcap" else 0.0, alibi_slopes=alibi)


_reference_cache = {}


def reference_for(index):
    if index not in _reference_cache:
        _reference_cache.clear()  # one case at a time: families of a case run back to back
        case = CASES[index]
        q, k, v = make_inputs(case, index)
        opts = options_for(case, index)
        scale = opts["softmax_scale"] or default_scale(case["head_dim"])
        out, lse = attention(q, k, v, scale=scale, causal=opts["causal"],
                             window=opts["window_size"], softcap=opts["softcap"],
                             alibi=opts["alibi_slopes"], top_left=case["align"] == "top_left")
        _reference_cache[index] = (q, k, v, opts, out, lse)
    return _reference_cache[index]


def run_ours(q, k, v, family, align, return_lse, **opts):
    """flash_attn_func for FlashAttention's own semantics; forward() for the extensions."""
    try:
        if family == "auto" and align == "bottom_right":
            result = flashcute.flash_attn_func(q, k, v, return_attn_probs=return_lse, **opts)
            return (result[0], result[1]) if return_lse else (result, None)
        result = flashcute.forward(q, k, v, causal_alignment=align, family=family,
                                   return_lse=return_lse, **opts)
        return result if return_lse else (result, None)
    except flashcute.UnsupportedError as error:
        pytest.skip(f"unsupported by the library: {error}")


def case_id(index):
    c = CASES[index]
    return (f"{index}-{DTYPE_NAMES[c['dtype']]}-d{c['head_dim']}-s{c['lengths'][0]}x"
            f"{c['lengths'][1]}-{'causal-' if c['causal'] else ''}{c['feature']}")


@pytest.mark.parametrize(
    "index, family",
    [(i, f) for i in range(len(CASES)) for f in FAMILIES],
    ids=[f"{case_id(i)}-{f}" for i in range(len(CASES)) for f in FAMILIES])
def test_matches_reference(index, family):
    case = CASES[index]
    dtype, d = case["dtype"], case["head_dim"]
    if family != "auto" and not flashcute.compiled_tile_configs(family, DTYPE_NAMES[dtype], d):
        pytest.skip(f"no {family} kernel compiled for {DTYPE_NAMES[dtype]} head_dim {d}")
    q, k, v, opts, ref_out, ref_lse = reference_for(index)
    layout = case["layout"]
    qx, kx, vx = in_layout(q, layout), in_layout(k, layout), in_layout(v, layout)
    b, sq, h, _ = q.shape
    poison((q.shape, dtype), ((b, h, sq), torch.float32))
    out, lse = run_ours(qx, kx, vx, family, case["align"], case["lse"], **opts)
    what = f"{case_id(index)} family={family} seed={SEED} case={case}"
    assert out.shape == q.shape and out.is_contiguous(), what
    assert_close(out, ref_out, v, dtype, softcap=opts["softcap"], what=what)
    if case["lse"]:
        assert_lse_close(lse, ref_lse.float().double(), softcap=opts["softcap"], what=what)


# ---------------------------------------------------------------------------------------------
# Edge cases.

@pytest.mark.parametrize("causal", [False, True])
def test_seqlen_k_zero_gives_zeros_and_inf_lse(causal):
    g = generator("sk0", causal)
    q = randn((2, 33, 4, 64), g, torch.bfloat16)
    k = torch.empty((2, 0, 4, 64), dtype=torch.bfloat16, device=DEVICE)
    poison((q.shape, q.dtype), ((2, 4, 33), torch.float32))
    out, lse, _ = flashcute.flash_attn_func(q, k, k, causal=causal, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert lse.shape == (2, 4, 33) and torch.isposinf(lse).all()


@pytest.mark.parametrize("shape", [(0, 16, 4, 64), (2, 0, 4, 64)])
def test_empty_batch_or_seqlen_q(shape):
    q = torch.empty(shape, dtype=torch.float16, device=DEVICE)
    k = randn((shape[0], 16, 4, 64), generator("empty"), torch.float16)
    out, lse, _ = flashcute.flash_attn_func(q, k, k, return_attn_probs=True)
    assert out.shape == shape and lse.shape == (shape[0], 4, shape[1])


def test_rows_that_see_no_key():
    # sq > sk with bottom-right causal: the first sq - sk rows see no key (output 0, lse +inf).
    g = generator("nokey")
    q, k, v = (randn((1, 100, 2, 64), g, torch.float16), randn((1, 40, 2, 64), g, torch.float16),
               randn((1, 40, 2, 64), g, torch.float16))
    out, lse, _ = flashcute.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    ref_out, ref_lse = attention(q, k, v, scale=default_scale(64), causal=True)
    blind = 100 - 40  # query i sees key j iff j <= i - 60
    assert torch.equal(out[:, :blind], torch.zeros_like(out[:, :blind]))
    assert torch.isposinf(lse[:, :, :blind]).all()
    assert torch.isfinite(lse[:, :, blind:]).all()
    assert_close(out, ref_out, v, torch.float16)
    assert_lse_close(lse, ref_lse)


def test_bitwise_deterministic():
    g = generator("det")
    q, k, v = (randn((2, 700, 8, 128), g, torch.bfloat16) for _ in range(3))
    first = flashcute.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    for _ in range(3):
        again = flashcute.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_runs_on_a_side_stream():
    g = generator("stream")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        q, k, v = (randn((2, 257, 4, 64), g, torch.float16) for _ in range(3))
        out = flashcute.flash_attn_func(q, k, v)
    stream.synchronize()
    ref, _ = attention(q, k, v, scale=default_scale(64))
    assert_close(out, ref, v, torch.float16)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_device():
    other = torch.device("cuda", (torch.cuda.current_device() + 1) % torch.cuda.device_count())
    g = torch.Generator(device=other)
    g.manual_seed(SEED)
    q, k, v = (torch.randn((2, 130, 4, 64), generator=g, device=other).half() for _ in range(3))
    out = flashcute.flash_attn_func(q, k, v, causal=True)
    assert out.device == other
    ref, _ = attention(q, k, v, scale=default_scale(64), causal=True)
    assert_close(out, ref, v, torch.float16)


# ---------------------------------------------------------------------------------------------
# Errors.

def test_no_grad_records_nothing():
    g = generator("grad")
    q, k, v = (randn((1, 64, 2, 64), g, torch.float16) for _ in range(3))
    q.requires_grad_(True)
    with torch.no_grad():
        out = flashcute.flash_attn_func(q, k, v)
    assert out.grad_fn is None and not out.requires_grad
    assert_close(out, attention(q.detach(), k, v, scale=default_scale(64))[0], v, torch.float16)


def test_bad_tensors_raise_before_the_library():
    g = generator("bad")
    q = randn((1, 64, 2, 64), g, torch.float16)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        flashcute.flash_attn_func(q.cpu(), q, q)
    with pytest.raises(TypeError, match="k has dtype bf16 but q has fp16"):
        flashcute.flash_attn_func(q, q.bfloat16(), q)
    with pytest.raises(TypeError, match="q has dtype fp32"):
        flashcute.flash_attn_func(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match="contiguous last dimension"):
        wide = randn((1, 64, 2, 128), g, torch.float16)[..., ::2]
        flashcute.flash_attn_func(wide, wide, wide)
    flat = randn((64 * 2 * 64 + 4,), g, torch.float16)
    misaligned = flat[4:].view(1, 64, 2, 64)  # starts 8 bytes into a 16-byte granule
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        flashcute.flash_attn_func(misaligned, q, q)
    with pytest.raises(NotImplementedError, match="dropout"):
        flashcute.flash_attn_func(q, q, q, dropout_p=0.1)


# ---------------------------------------------------------------------------------------------
# torch integration: the custom op, torch.compile, CUDA graphs.

def test_opcheck():
    g = generator("opcheck")
    q, k, v = (randn((2, 96, 4, 64), g, torch.bfloat16) for _ in range(3))
    args = (q, k, v, None, None, 0, 0, None, 0.125, True, 1, -1, -1, 0.0, True, False, 0, 0, 0,
            0)
    torch.library.opcheck(torch.ops.flashcute.fwd.default, args)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(dynamic, backend):
    if backend == "inductor" and not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("inductor's Triton launcher needs a C compiler, and none is installed")
    torch._dynamo.reset()

    def block(q, k, v):
        out, lse, _ = flashcute.flash_attn_func(q * 0.5, k, v, causal=True,
                                                return_attn_probs=True)
        return out * 2, lse  # exact, so compiled and eager must agree bitwise

    compiled = torch.compile(block, fullgraph=True, dynamic=dynamic, backend=backend)
    for sq in (128, 200):
        g = generator("compile", dynamic, sq)
        q, k, v = (randn((2, sq, 4, 64), g, torch.bfloat16) for _ in range(3))
        eager = block(q, k, v)
        got = compiled(q, k, v)
        torch.testing.assert_close(got[0], eager[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], eager[1], rtol=0, atol=0)
    ref, _ = attention(q * 0.5, k, v, scale=default_scale(64), causal=True)
    assert_close(got[0] / 2, ref, v, torch.bfloat16)


def test_cuda_graph_capture_and_replay():
    g = generator("graph")
    q, k, v = (randn((2, 300, 8, 128), g, torch.float16) for _ in range(3))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture, as CUDA graphs ask
        flashcute.flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashcute.flash_attn_func(q, k, v, causal=True)
    for step in range(2):  # replay on fresh inputs copied into the captured buffers
        for t in (q, k, v):
            t.copy_(randn(t.shape, g, t.dtype))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = attention(q, k, v, scale=default_scale(128), causal=True)
        assert_close(out, ref, v, torch.float16, what=f"replay {step}")


SCHEDULE_CASES = {
    "d128": ((2, 2048, 16, 128), True),
    "d64": ((1, 3000, 12, 64), True),
    "d64_short": ((4, 1800, 16, 64), True),  # ten 192-row blocks: just past the static pairs
    # Packed sequences of 0 to 2000 tokens, causal and not.
    "packed": ([0, 700, 1, 2000, 129, 1000, 64, 1500, 300, 1024], False),
    "packed_causal": ([0, 700, 1, 2000, 129, 1000, 64, 1500, 300, 1024], True),
}


@pytest.mark.parametrize("case", SCHEDULE_CASES)
def test_schedule_on_streams_and_in_graphs(case):
    """Packed calls and causal ones past eight row blocks (shorter ones keep static pairs) on a
    Hopper GPU take their tiles from a per-stream counter that each kernel leaves zeroed; a
    captured call uses the static schedule instead. Every tile's arithmetic is the same either
    way, so repeated calls, calls on several streams at once and a graph's replay all give the
    same bits, which match the reference."""
    shape, causal = SCHEDULE_CASES[case]
    g = generator("schedule", case)
    if case.startswith("packed"):
        h, d = 16, 128
        q, k, v = (randn((sum(shape), h, d), g, torch.bfloat16) for _ in range(3))
        cu = torch.tensor([0] + list(_cumsum(shape)), dtype=torch.int32, device=DEVICE)

        def call():
            return flashcute.flash_attn_varlen_func(q, k, v, cu, cu, max(shape), max(shape),
                                                    causal=causal)

        def check(out):
            for i in range(len(shape)):
                s, e = cu[i].item(), cu[i + 1].item()
                ref, _ = attention(q[None, s:e], k[None, s:e], v[None, s:e],
                                   scale=default_scale(d), causal=causal)
                assert_close(out[None, s:e], ref, v[s:e], torch.bfloat16, what=f"sequence {i}")
    else:
        d = shape[3]
        q, k, v = (randn(shape, g, torch.bfloat16) for _ in range(3))

        def call():
            return flashcute.flash_attn_func(q, k, v, causal=causal)

        def check(out):
            ref, _ = attention(q, k, v, scale=default_scale(d), causal=causal)
            assert_close(out, ref, v, torch.bfloat16)

    poison((q.shape, torch.bfloat16))
    first = call()
    check(first)
    for _ in range(3):  # a counter left non-zero would hand out the wrong tiles
        poison((q.shape, torch.bfloat16))
        assert torch.equal(call(), first)

    streams = [torch.cuda.Stream() for _ in range(4)]
    outs = []
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for _ in range(3):  # the streams' kernels overlap, each with its own counter
        for stream in streams:
            with torch.cuda.stream(stream):
                outs.append(call())
    for stream in streams:
        torch.cuda.current_stream().wait_stream(stream)
    for out in outs:
        assert torch.equal(out, first)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    poison((q.shape, torch.bfloat16))
    with torch.cuda.graph(graph):
        captured = call()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, first)


CLUSTER_CASES = {
    # (batch, seqlen_q, seqlen_k, heads, heads_k). Non-causal d 128 and 256 calls with at least
    # 2048 keys whose query tiles pair up run in clusters of two CTAs sharing each K/V block's
    # load; the others alone.
    "pairs_gqa": (2, 512, 2100, 8, 2),
    "partial_last_tile": (3, 250, 2500, 4, 4),
    "odd_tile_count": (2, 384, 3000, 4, 4),
    "few_keys": (2, 512, 589, 4, 4),
    "long_keys": (1, 256, 8300, 4, 1),
    "more_units_than_clusters": (4, 1024, 2048, 40, 40),
    "no_keys": (2, 256, 0, 4, 4),
}


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("case", CLUSTER_CASES)
def test_unmasked_tiles_in_clusters(case, d):
    """Outputs and LSE of non-causal calls against the fp64 reference, on the tile counts that
    take the cluster kernel and on those that do not; repeated calls give the same bits."""
    b, sq, sk, h, hk = CLUSTER_CASES[case]
    g = generator("cluster", case, d)
    q = randn((b, sq, h, d), g, torch.bfloat16)
    k, v = (randn((b, sk, hk, d), g, torch.bfloat16) for _ in range(2))
    poison((q.shape, torch.bfloat16), ((b, h, sq), torch.float32))
    out, lse, _ = flashcute.flash_attn_func(q, k, v, return_attn_probs=True)
    if sk == 0:
        assert torch.equal(out, torch.zeros_like(out)) and torch.isposinf(lse).all()
    else:
        ref_out, ref_lse = attention(q, k, v, scale=default_scale(d), causal=False)
        assert_close(out, ref_out, v, torch.bfloat16, what=case)
        assert_lse_close(lse, ref_lse, what=case)
    again, again_lse, _ = flashcute.flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.equal(again, out) and torch.equal(again_lse, lse)


def test_eager_calls_take_the_fast_path_and_fall_back_for_errors(monkeypatch):
    """An eager call runs without the custom op (its dispatch costs more than a tiny kernel);
    autograd, an explicit family, and a bad argument go through the op's checked path, whose
    message is unchanged."""
    g = generator("fast path")
    q, k, v = (randn((2, 130, 4, 64), g, torch.bfloat16) for _ in range(3))
    reference = flashcute.forward(q, k, v, causal=True, family="auto", tile=None)
    ops = []
    real_op = torch.ops.flashcute.fwd

    class Spy:
        def __call__(self, *args):
            ops.append(args)
            return real_op(*args)

        def __getattr__(self, name):  # .default and the rest, which autograd's dispatch reads
            return getattr(real_op, name)

    monkeypatch.setattr(torch.ops.flashcute, "fwd", Spy())
    out = flashcute.flash_attn_func(q, k, v, causal=True)
    assert not ops, "the eager call went through the custom op"
    assert torch.equal(out, reference), "the fast path computed something else"
    flashcute.forward(q, k, v, causal=True, family="sm80")
    assert len(ops) == 1, "an explicit family takes the checked path"
    with pytest.raises(ValueError, match="k has head_dim 56 but q has 64"):
        flashcute.flash_attn_func(q, k[..., :56], v[..., :56])
    # Passes the fast path's screen; the library refuses it before any launch (a host pointer),
    # and the checked path reports it as ever.
    with pytest.raises(ValueError, match="k must be on a CUDA device"):
        flashcute.flash_attn_func(q, k.cpu(), v.cpu())
    assert len(ops) == 1  # both raised by the checks that run before the op
    q.requires_grad_(True)
    out = flashcute.flash_attn_func(q, k, v, causal=True)
    assert len(ops) == 2 and out.grad_fn is not None, "autograd takes the op"
    assert torch.equal(out.detach(), reference)


# ---------------------------------------------------------------------------------------------
# Variable length.

VARLEN_CASES = [
    # (dtype, heads, heads_k, head_dim, causal, window, alibi, softcap)
    (torch.bfloat16, 4, 4, 64, False, (-1, -1), False, 0.0),
    (torch.float16, 8, 2, 128, True, (-1, -1), False, 0.0),
    (torch.bfloat16, 6, 1, 96, True, (40, 0), True, 0.0),
    (torch.float16, 4, 2, 256, False, (31, 17), False, 20.0),
    (torch.bfloat16, 4, 4, 40, False, (-1, -1), True, 0.0),
]


@pytest.mark.parametrize("dtype, h, hk, d, causal, window, use_alibi, softcap", VARLEN_CASES)
def test_varlen_matches_per_sequence_reference(dtype, h, hk, d, causal, window, use_alibi,
                                               softcap):
    g = generator("varlen", h, hk, d, causal)
    # Lengths that hit 0, 1 and a tile +- 1, with seqlen_q and seqlen_k differing per sequence.
    lens_q = [1, 129, 0, 127, 64, 300, 5]
    lens_k = [1, 127, 50, 0, 200, 300, 129]
    cu_q = torch.tensor([0] + list(_cumsum(lens_q)), dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0] + list(_cumsum(lens_k)), dtype=torch.int32, device=DEVICE)
    q = randn((sum(lens_q), h, d), g, dtype)
    k = randn((sum(lens_k), hk, d), g, dtype)
    v = randn((sum(lens_k), hk, d), g, dtype)
    alibi = (torch.rand((len(lens_q), h), generator=g, device=DEVICE) * 0.3 + 0.01
             if use_alibi else None)
    poison((q.shape, dtype), ((h, sum(lens_q)), torch.float32))
    out, lse, _ = flashcute.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, window_size=window,
        softcap=softcap, alibi_slopes=alibi, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (h, sum(lens_q))
    for i in range(len(lens_q)):
        qs, qe, ks, ke = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        ref_out, ref_lse = attention(
            q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], scale=default_scale(d), causal=causal,
            window=window, softcap=softcap, alibi=alibi[i] if alibi is not None else None)
        what = f"sequence {i} ({lens_q[i]}x{lens_k[i]}) seed={SEED}"
        assert_close(out[None, qs:qe], ref_out, v[ks:ke], dtype, softcap=softcap, what=what)
        assert_lse_close(lse[None, :, qs:qe], ref_lse, softcap=softcap, what=what)


def _cumsum(values):
    total = 0
    for x in values:
        total += x
        yield total


# ---------------------------------------------------------------------------------------------
# Packed QKV and KV (flashcute.packed): strided views of one buffer. The same kernel runs on the
# same values as the unpacked call on contiguous copies, so the outputs must be bitwise equal.

PACKED_CASES = [
    # (dtype, heads, heads_k, head_dim, causal, window, softcap); qkv-packed calls use heads only
    (torch.bfloat16, 4, 4, 64, False, (-1, -1), 0.0),
    (torch.float16, 8, 2, 128, True, (-1, -1), 0.0),
    (torch.bfloat16, 6, 1, 96, True, (40, 0), 0.0),
    (torch.float16, 4, 2, 256, False, (31, 17), 20.0),
]


def _packed_case_id(case):
    dtype, h, hk, d, causal, window, softcap = case
    return (f"{DTYPE_NAMES[dtype]}-h{h}x{hk}-d{d}{'-causal' if causal else ''}"
            f"{'-window' if window != (-1, -1) else ''}{'-softcap' if softcap else ''}")


def _assert_packed_matches(got, unpacked, q, k, v, opts, what, lengths=None):
    """got/unpacked: (out, lse) of the packed and the unpacked call; then the fp64 reference."""
    assert torch.equal(got[0], unpacked[0]), f"{what}: out differs from the unpacked call"
    assert torch.equal(got[1], unpacked[1]), f"{what}: lse differs from the unpacked call"
    dtype, d = q.dtype, q.shape[-1]
    if lengths is None:
        ref_out, ref_lse = attention(q, k, v, scale=default_scale(d), causal=opts["causal"],
                                     window=opts["window_size"], softcap=opts["softcap"])
        assert_close(got[0], ref_out, v, dtype, softcap=opts["softcap"], what=what)
        assert_lse_close(got[1], ref_lse, softcap=opts["softcap"], what=what)
        return
    (cu_q, cu_k) = lengths
    for i in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        ref_out, ref_lse = attention(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke],
                                     scale=default_scale(d), causal=opts["causal"],
                                     window=opts["window_size"], softcap=opts["softcap"])
        assert_close(got[0][None, qs:qe], ref_out, v[ks:ke], dtype, softcap=opts["softcap"],
                     what=f"{what} sequence {i}")
        assert_lse_close(got[1][None, :, qs:qe], ref_lse, softcap=opts["softcap"],
                         what=f"{what} sequence {i}")


@pytest.mark.parametrize("case", PACKED_CASES, ids=_packed_case_id)
def test_qkvpacked_matches_unpacked_and_reference(case):
    dtype, h, _, d, causal, window, softcap = case
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    qkv = randn((2, 300, 3, h, d), generator("qkvpacked", case), dtype)
    poison(((2, 300, h, d), dtype), ((2, h, 300), torch.float32))
    out, lse, _ = flashcute.flash_attn_qkvpacked_func(qkv, return_attn_probs=True, **opts)
    q, k, v = (qkv[:, :, i].contiguous() for i in range(3))
    unpacked = flashcute.flash_attn_func(q, k, v, return_attn_probs=True, **opts)[:2]
    _assert_packed_matches((out, lse), unpacked, q, k, v, opts, f"qkvpacked seed={SEED}")
    assert torch.equal(flashcute.flash_attn_qkvpacked_func(qkv, **opts), out)


@pytest.mark.parametrize("case", PACKED_CASES, ids=_packed_case_id)
def test_kvpacked_matches_unpacked_and_reference(case):
    dtype, h, hk, d, causal, window, softcap = case
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    g = generator("kvpacked", case)
    q = randn((2, 129, h, d), g, dtype)  # seqlen_q < seqlen_k: bottom-right alignment matters
    kv = randn((2, 300, 2, hk, d), g, dtype)
    poison((q.shape, dtype), ((2, h, 129), torch.float32))
    out, lse, _ = flashcute.flash_attn_kvpacked_func(q, kv, return_attn_probs=True, **opts)
    k, v = kv[:, :, 0].contiguous(), kv[:, :, 1].contiguous()
    unpacked = flashcute.flash_attn_func(q, k, v, return_attn_probs=True, **opts)[:2]
    _assert_packed_matches((out, lse), unpacked, q, k, v, opts, f"kvpacked seed={SEED}")


@pytest.mark.parametrize("case", PACKED_CASES, ids=_packed_case_id)
def test_varlen_qkvpacked_matches_unpacked_and_reference(case):
    dtype, h, _, d, causal, window, softcap = case
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    lens = [1, 129, 0, 300, 64]
    offsets = [0] + list(_cumsum(lens))
    cu = torch.tensor(offsets, dtype=torch.int32, device=DEVICE)
    qkv = randn((sum(lens), 3, h, d), generator("varlen_qkvpacked", case), dtype)
    poison(((sum(lens), h, d), dtype), ((h, sum(lens)), torch.float32))
    out, lse, _ = flashcute.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens),
                                                             return_attn_probs=True, **opts)
    q, k, v = (qkv[:, i].contiguous() for i in range(3))
    unpacked = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens),
                                                return_attn_probs=True, **opts)[:2]
    _assert_packed_matches((out, lse), unpacked, q, k, v, opts, f"varlen qkvpacked seed={SEED}",
                           lengths=(offsets, offsets))


@pytest.mark.parametrize("case", PACKED_CASES, ids=_packed_case_id)
def test_varlen_kvpacked_matches_unpacked_and_reference(case):
    dtype, h, hk, d, causal, window, softcap = case
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    lens_q, lens_k = [1, 129, 0, 127, 300], [1, 127, 50, 0, 300]
    offsets_q, offsets_k = [0] + list(_cumsum(lens_q)), [0] + list(_cumsum(lens_k))
    cu_q = torch.tensor(offsets_q, dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor(offsets_k, dtype=torch.int32, device=DEVICE)
    g = generator("varlen_kvpacked", case)
    q = randn((sum(lens_q), h, d), g, dtype)
    kv = randn((sum(lens_k), 2, hk, d), g, dtype)
    poison((q.shape, dtype), ((h, sum(lens_q)), torch.float32))
    out, lse, _ = flashcute.flash_attn_varlen_kvpacked_func(
        q, kv, cu_q, cu_k, max(lens_q), max(lens_k), return_attn_probs=True, **opts)
    k, v = kv[:, 0].contiguous(), kv[:, 1].contiguous()
    unpacked = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                return_attn_probs=True, **opts)[:2]
    _assert_packed_matches((out, lse), unpacked, q, k, v, opts, f"varlen kvpacked seed={SEED}",
                           lengths=(offsets_q, offsets_k))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sm90_error_within_3_percent_of_sm80(dtype):
    """On random normal inputs the Hopper family's output error against fp64 stays within 3% of
    the SM80 family's (mean over cases of s 1000-2049, d 64/128, causal and not): the two run the
    same softmax and may differ only by the order of their sums."""
    name = DTYPE_NAMES[dtype]
    hopper = torch.cuda.get_device_capability(DEVICE) == (9, 0)
    if not hopper or not all(flashcute.compiled_tile_configs(f, name, d)
                             for f in ("sm80", "sm90") for d in (64, 128)):
        pytest.skip("needs a compute capability 9.0 device and both families at d 64 and 128")
    g = generator("accuracy", name)
    errors = {"sm80": [], "sm90": []}
    for s, d, causal in [(1000, 64, False), (2049, 64, True), (1537, 128, False),
                         (2049, 128, True), (1000, 128, True)]:
        q, k, v = (randn((2, s, 4, d), g, dtype) for _ in range(3))
        ref, _ = attention(q, k, v, scale=default_scale(d), causal=causal)
        for family in errors:
            out = flashcute.forward(q, k, v, causal=causal, family=family)
            errors[family].append(((out.double() - ref).norm() / ref.norm()).item())
    sm80, sm90 = (sum(errors[f]) / len(errors[f]) for f in ("sm80", "sm90"))
    assert sm90 <= 1.03 * sm80, f"{name}: sm90 {sm90:.4g} against sm80 {sm80:.4g} ({errors})"

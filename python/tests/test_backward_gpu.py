"""GPU tests of the backward pass, through torch autograd and flashcute.backward.

dq, dk and dv are compared with autograd through a plain fp32 implementation of the same attention
(attention_reference.attention_grads) by relative L2 error; a NaN never passes, and the blocks the
gradients are allocated from are poisoned with NaN first. Cases are chosen pairwise over the lists
below; the explicit tests after them cover varlen with empty sequences, window edges, determinism,
output-gradient layouts, partial gradients, torch.compile, CUDA graphs, kernel families and opcheck.
"""

import os
import shutil
import zlib

import pytest

torch = pytest.importorskip("torch", reason="the GPU tests need torch")
if not torch.cuda.is_available():
    pytest.skip("the GPU tests need a CUDA device", allow_module_level=True)

import flashcute  # noqa: E402
from attention_reference import assert_grad_close, attention_grads, default_scale  # noqa: E402
from pairwise_cases import pairwise  # noqa: E402

SEED = int(os.environ["FLASHCUTE_TEST_SEED"])
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
DEVICE = torch.device("cuda", torch.cuda.current_device())

FACTORS = {
    "dtype": [torch.float16, torch.bfloat16],
    "head_dim": [8, 40, 64, 96, 128, 136, 200, 256],
    "lengths": [(1, 1), (127, 129), (129, 127), (128, 128), (300, 77), (64, 1000), (513, 513)],
    "batch": [1, 3],
    "heads": [(4, 4), (8, 4), (16, 2)],  # GQA ratios 1, 2 and 8
    "causal": [False, True],
    "feature": ["none", "window", "window_left", "window_right", "softcap", "alibi"],
    "inputs": ["normal", "large"],
    "layout": ["contiguous", "bhsd"],
    "align": ["bottom_right", "top_left"],
}
CASES = pairwise(FACTORS, seed=2)


def generator(*salt):
    g = torch.Generator(device=DEVICE)
    g.manual_seed(zlib.crc32(repr((SEED, "backward") + salt).encode()))
    return g


def randn(shape, g, dtype=torch.float32):
    return torch.randn(shape, generator=g, device=DEVICE, dtype=torch.float32).to(dtype)


def poison(*tensors):
    """Frees NaN-filled blocks of the tensors' sizes, so that gradients of those sizes allocated
    next start poisoned: an element the kernels fail to write cannot pass."""
    blocks = [torch.full_like(t, float("nan")) for t in tensors]
    del blocks


def in_layout(t, layout):
    """The same values as (batch, heads, seqlen, head_dim) memory seen through a transpose."""
    if layout == "bhsd":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return t


def case_inputs(case, index):
    """q, k, v and dout in the case's dtype, and the options as flash_attn_func takes them."""
    g = generator("case", index)
    dtype, d = case["dtype"], case["head_dim"]
    (sq, sk), (h, hk), b = case["lengths"], case["heads"], case["batch"]
    q, k, v = randn((b, sq, h, d), g), randn((b, sk, hk, d), g), randn((b, sk, hk, d), g)
    if case["inputs"] == "large":  # scaled scores of standard deviation 16
        q, k = q * 4, k * 4
    dout = randn((b, sq, h, d), g)
    feature = case["feature"]
    window = {"window": (sk // 4 + 3, sk // 8 + 1), "window_left": (sk // 3, -1),
              "window_right": (-1, 5)}.get(feature, (-1, -1))
    alibi = None
    if feature == "alibi":
        alibi = torch.rand((h,), generator=g, device=DEVICE) * 0.5 + 0.01
    opts = dict(causal=case["causal"], window_size=window,
                softcap=30.0 if feature == "softcap" else 0.0, alibi_slopes=alibi)
    return q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype), opts


def reference(q, k, v, dout, align="bottom_right", causal=False, window_size=(-1, -1),
              softcap=0.0, alibi_slopes=None, softmax_scale=None):
    scale = softmax_scale or default_scale(q.shape[-1])
    return attention_grads(q, k, v, dout, scale=scale, causal=causal, window=window_size,
                           softcap=softcap, alibi=alibi_slopes, top_left=align == "top_left")


def attend(q, k, v, align="bottom_right", **opts):
    """flash_attn_func for FlashAttention's semantics; forward() for top-left alignment."""
    if align == "bottom_right":
        return flashcute.flash_attn_func(q, k, v, **opts)
    return flashcute.forward(q, k, v, causal_alignment=align, **opts)


def leaves(*tensors, layout="contiguous"):
    return [in_layout(t, layout).requires_grad_() for t in tensors]


def ours(q, k, v, dout, **opts):
    """(dq, dk, dv) by autograd through our forward and backward, the gradients poisoned."""
    inputs = leaves(q, k, v)
    out = attend(*inputs, **opts)
    poison(q, k, v)
    return torch.autograd.grad(out, inputs, dout)


def assert_grads_close(grads, refs, dtype, what):
    for name, grad, ref in zip(("dq", "dk", "dv"), grads, refs):
        assert_grad_close(grad, ref, dtype, what=f"{what} {name}")


def case_id(index):
    c = CASES[index]
    return (f"{index}-{DTYPE_NAMES[c['dtype']]}-d{c['head_dim']}-s{c['lengths'][0]}x"
            f"{c['lengths'][1]}-h{c['heads'][0]}x{c['heads'][1]}"
            f"{'-causal' if c['causal'] else ''}-{c['feature']}")


@pytest.mark.parametrize("index", range(len(CASES)), ids=case_id)
def test_gradients_match_reference(index):
    case = CASES[index]
    q, k, v, dout, opts = case_inputs(case, index)
    refs = reference(q, k, v, dout, case["align"], **opts)
    layout = case["layout"]
    inputs = leaves(q, k, v, layout=layout)
    out = attend(*inputs, case["align"], **opts)
    poison(q, k, v)
    grads = torch.autograd.grad(out, inputs, in_layout(dout, layout))
    assert_grads_close(grads, refs, q.dtype, f"{case_id(index)} seed={SEED} case={case}")


# ---------------------------------------------------------------------------------------------
# Variable length, with empty sequences.

VARLEN_CASES = [
    # (dtype, heads, heads_k, head_dim, causal, window, alibi, softcap)
    (torch.bfloat16, 4, 4, 64, False, (-1, -1), False, 0.0),
    (torch.float16, 8, 2, 128, True, (-1, -1), True, 0.0),
    (torch.bfloat16, 6, 1, 96, True, (40, 0), False, 20.0),
]


def _offsets(lengths):
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return offsets


@pytest.mark.parametrize("dtype, h, hk, d, causal, window, use_alibi, softcap", VARLEN_CASES)
def test_varlen_gradients_with_empty_sequences(dtype, h, hk, d, causal, window, use_alibi,
                                               softcap):
    g = generator("varlen", h, hk, d, causal)
    # Sequence 2 is empty on both sides, 3 has keys but no queries, 4 queries but no keys.
    lens_q = [1, 129, 0, 0, 127, 64, 300]
    lens_k = [1, 127, 0, 50, 0, 200, 300]
    starts_q, starts_k = _offsets(lens_q), _offsets(lens_k)
    cu_q = torch.tensor(starts_q, dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor(starts_k, dtype=torch.int32, device=DEVICE)
    q, dout = randn((sum(lens_q), h, d), g, dtype), randn((sum(lens_q), h, d), g, dtype)
    k, v = randn((sum(lens_k), hk, d), g, dtype), randn((sum(lens_k), hk, d), g, dtype)
    alibi = (torch.rand((len(lens_q), h), generator=g, device=DEVICE) * 0.3 + 0.01
             if use_alibi else None)
    inputs = leaves(q, k, v)
    out = flashcute.flash_attn_varlen_func(
        *inputs, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, window_size=window,
        softcap=softcap, alibi_slopes=alibi)
    poison(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, inputs, dout)
    assert not dq[starts_q[4]:starts_q[5]].any(), "queries with no key must get zero dq"
    assert not dk[starts_k[3]:starts_k[4]].any(), "keys with no query must get zero dk"
    assert not dv[starts_k[3]:starts_k[4]].any(), "keys with no query must get zero dv"
    for i in range(len(lens_q)):
        qs, qe, ks, ke = starts_q[i], starts_q[i + 1], starts_k[i], starts_k[i + 1]
        refs = reference(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], dout[None, qs:qe],
                         causal=causal, window_size=window, softcap=softcap,
                         alibi_slopes=alibi[i] if alibi is not None else None)
        got = (dq[None, qs:qe], dk[None, ks:ke], dv[None, ks:ke])
        assert_grads_close(got, refs, dtype, f"sequence {i} ({lens_q[i]}x{lens_k[i]}) seed={SEED}")


# ---------------------------------------------------------------------------------------------
# Window edges: zero-width sides, one-sided windows, and windows wider than the sequences.

@pytest.mark.parametrize("window, causal", [((0, 0), False), ((0, -1), False), ((-1, 0), False),
                                            ((1, 1), False), ((5, 0), True), ((0, 7), True),
                                            ((2000, 2000), False)])
@pytest.mark.parametrize("sq, sk", [(200, 150), (150, 200)])
def test_window_edges(window, causal, sq, sk):
    g = generator("window", window, causal, sq, sk)
    q, dout = randn((2, sq, 4, 64), g, torch.bfloat16), randn((2, sq, 4, 64), g, torch.bfloat16)
    k, v = randn((2, sk, 4, 64), g, torch.bfloat16), randn((2, sk, 4, 64), g, torch.bfloat16)
    opts = dict(causal=causal, window_size=window)
    assert_grads_close(ours(q, k, v, dout, **opts), reference(q, k, v, dout, **opts),
                       torch.bfloat16, f"window={window} causal={causal} seed={SEED}")


# ---------------------------------------------------------------------------------------------
# Determinism, and the layouts autograd may hand the backward.

def test_deterministic_gradients_are_bitwise_identical():
    g = generator("deterministic")
    q, dout = randn((2, 1024, 8, 128), g, torch.bfloat16), randn((2, 1024, 8, 128), g,
                                                                 torch.bfloat16)
    k, v = randn((2, 1024, 2, 128), g, torch.bfloat16), randn((2, 1024, 2, 128), g,
                                                              torch.bfloat16)
    runs = [ours(q, k, v, dout, deterministic=True) for _ in range(3)]
    for run in runs[1:]:
        for name, got, first in zip(("dq", "dk", "dv"), run, runs[0]):
            assert torch.equal(got, first), f"{name} differs between deterministic runs"
    assert_grads_close(runs[0], reference(q, k, v, dout), torch.bfloat16, f"seed={SEED}")


def test_output_gradient_in_any_layout():
    """A transposed view is read in place and a broadcast one (out.sum()) copied; either way the
    gradients are those of the same values in contiguous memory."""
    g = generator("dout layout")
    q, k, v = (randn((2, 200, 4, 64), g, torch.float16) for _ in range(3))
    dout = randn((2, 4, 200, 64), g, torch.float16).transpose(1, 2)
    assert not dout.is_contiguous()
    inputs = leaves(q, k, v)
    out = flashcute.flash_attn_func(*inputs, causal=True, deterministic=True)
    transposed = torch.autograd.grad(out, inputs, dout, retain_graph=True)
    contiguous = torch.autograd.grad(out, inputs, dout.contiguous(), retain_graph=True)
    for a, b in zip(transposed, contiguous):
        assert torch.equal(a, b)
    summed = torch.autograd.grad(out.sum(), inputs, retain_graph=True)
    ones = torch.autograd.grad(out, inputs, torch.ones_like(out))
    for a, b in zip(summed, ones):
        assert torch.equal(a, b)
    assert_grads_close(transposed, reference(q, k, v, dout, causal=True), torch.float16,
                       f"seed={SEED}")


@pytest.mark.parametrize("wanted", ["q", "v", "kv"])
def test_gradients_of_some_inputs(wanted):
    g = generator("some", wanted)
    q, k, v = (randn((2, 130, 8, 64), g, torch.bfloat16) for _ in range(3))
    dout = randn((2, 130, 8, 64), g, torch.bfloat16)
    inputs = dict(q=q.clone(), k=k.clone(), v=v.clone())
    for name in wanted:
        inputs[name].requires_grad_()
    out = flashcute.flash_attn_func(inputs["q"], inputs["k"], inputs["v"], causal=True)
    out.backward(dout)
    refs = dict(zip("qkv", reference(q, k, v, dout, causal=True)))
    for name, t in inputs.items():
        if name in wanted:
            assert_grad_close(t.grad, refs[name], torch.bfloat16, f"d{name} seed={SEED}")
        else:
            assert t.grad is None, f"{name} needs no gradient but got one"


def test_public_backward_matches_autograd():
    """flashcute.backward is what autograd runs: the same bits for the same call."""
    g = generator("public")
    lens = [17, 0, 300, 129]
    cu = torch.tensor(_offsets(lens), dtype=torch.int32, device=DEVICE)
    q, dout = randn((sum(lens), 8, 96), g, torch.float16), randn((sum(lens), 8, 96), g,
                                                                 torch.float16)
    k, v = (randn((sum(lens), 4, 96), g, torch.float16) for _ in range(2))
    alibi = torch.rand((len(lens), 8), generator=g, device=DEVICE) * 0.2
    opts = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=300, max_seqlen_k=300,
                causal=True, causal_alignment="top_left", window_size=(50, 3), softcap=10.0,
                alibi_slopes=alibi, softmax_scale=0.2, deterministic=True)
    inputs = leaves(q, k, v)
    out, lse = flashcute.forward(*inputs, return_lse=True, **opts)
    via_autograd = torch.autograd.grad(out, inputs, dout)
    direct = flashcute.backward(dout, q, k, v, out.detach(), lse, **opts)
    for name, a, b in zip(("dq", "dk", "dv"), direct, via_autograd):
        assert torch.equal(a, b), name
        assert a.is_contiguous()


# ---------------------------------------------------------------------------------------------
# torch integration: torch.compile, CUDA graphs, opcheck.

@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_training_step_matches_eager(backend):
    if backend == "inductor" and not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("inductor's Triton launcher needs a C compiler, and none is installed")
    torch._dynamo.reset()
    g = generator("compile", backend)
    b, s, h, d = 2, 256, 4, 64
    x = randn((b, s, h * d), g, torch.bfloat16)
    weights = [randn((h * d, 3 * h * d), g) * 0.05, randn((h * d, h * d), g) * 0.05]

    def loss_fn(x, w_qkv, w_out):
        q, k, v = (x @ w_qkv).view(b, s, 3, h, d).unbind(2)
        out = flashcute.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return ((out.reshape(b, s, h * d) @ w_out).float() ** 2).mean()

    compiled = torch.compile(loss_fn, backend=backend)
    results = []
    for fn in (loss_fn, compiled):
        params = [w.to(torch.bfloat16).requires_grad_() for w in weights]
        loss = fn(x, *params)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in params]))
    (eager_loss, eager_grads), (compiled_loss, compiled_grads) = results
    if backend == "aot_eager":  # the same operations in the same order: the same bits
        assert torch.equal(compiled_loss, eager_loss)
        for a, b in zip(compiled_grads, eager_grads):
            assert torch.equal(a, b)
    else:  # inductor fuses the surrounding operations, which rounds differently
        torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-2, atol=0)
        for a, b in zip(compiled_grads, eager_grads):
            assert_grad_close(a, b.float(), torch.bfloat16, "compiled vs eager")


def test_cuda_graph_capture_of_forward_and_backward():
    """The workspace and gradients come from torch's allocator, so a captured backward replays."""
    g = generator("graph")
    q, k, v = (randn((2, 300, 8, 128), g, torch.float16).requires_grad_() for _ in range(3))
    dout = randn((2, 300, 8, 128), g, torch.float16)

    def step():
        out = flashcute.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture, as CUDA graphs ask
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    for replay in range(2):  # fresh inputs copied into the captured buffers
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(randn(t.shape, g, t.dtype))
        graph.replay()
        eager = step()
        for name, a, b in zip(("dq", "dk", "dv"), grads, eager):
            assert torch.equal(a, b), f"replay {replay}: {name}"


def test_opcheck():
    g = generator("opcheck")
    q, k, v = (randn((2, 96, 4, 64), g, torch.bfloat16).requires_grad_() for _ in range(3))
    fwd_args = (q, k, v, None, None, 0, 0, None, 0.125, True, 1, -1, -1, 0.0, True, True, 0, 0,
                0, 0)
    torch.library.opcheck(torch.ops.flashcute.fwd.default, fwd_args)  # with autograd
    with torch.no_grad():
        out, lse = torch.ops.flashcute.fwd(*fwd_args)
    dout = randn(out.shape, g, torch.bfloat16)
    bwd_args = (dout, q.detach(), k.detach(), v.detach(), out, lse, None, None, 0, 0, None, 0.125,
                True, 1, -1, -1, 0.0, True, 0)
    torch.library.opcheck(torch.ops.flashcute.bwd.default, bwd_args)


# ---------------------------------------------------------------------------------------------
# Kernel families: the backward runs on the SM80 family.

def test_forced_sm80_family():
    if not flashcute.compiled_tile_configs("sm80", "bf16", 128):
        pytest.skip("no sm80 kernel compiled for bf16 head_dim 128")
    g = generator("sm80")
    q, k, v, dout = (randn((2, 257, 4, 128), g, torch.bfloat16) for _ in range(4))
    inputs = leaves(q, k, v)
    out = flashcute.forward(*inputs, causal=True, family="sm80")
    grads = torch.autograd.grad(out, inputs, dout)
    assert_grads_close(grads, reference(q, k, v, dout, causal=True), torch.bfloat16,
                       f"sm80 seed={SEED}")
    out, lse = flashcute.forward(q, k, v, causal=True, return_lse=True)
    direct = flashcute.backward(dout, q, k, v, out, lse, causal=True, family="sm80")
    assert_grads_close(direct, reference(q, k, v, dout, causal=True), torch.bfloat16,
                       f"sm80 direct seed={SEED}")


def test_forced_sm90_family():
    """On a Hopper GPU the SM90 family runs the plain backward (through flashcute.backward and
    through autograd after a forced-SM90 forward) and refuses softcap clearly; elsewhere forcing
    it raises UnsupportedError naming it."""
    g = generator("sm90")
    q, k, v, dout = (randn((2, 200, 8, 128), g, torch.bfloat16) for _ in range(4))
    k, v = k[:, :, :2].contiguous(), v[:, :, :2].contiguous()  # GQA 4:1
    out, lse = flashcute.forward(q, k, v, causal=True, return_lse=True)
    hopper = torch.cuda.get_device_capability(DEVICE) == (9, 0) and bool(
        flashcute.compiled_tile_configs("sm90", "bf16", 128))
    if not hopper:
        with pytest.raises(flashcute.UnsupportedError, match="sm90"):
            flashcute.backward(dout, q, k, v, out, lse, causal=True, family="sm90")
        return
    expected = reference(q, k, v, dout, causal=True)
    grads = flashcute.backward(dout, q, k, v, out, lse, causal=True, family="sm90")
    assert_grads_close(grads, expected, torch.bfloat16, f"sm90 direct seed={SEED}")
    inputs = leaves(q, k, v)
    out = flashcute.forward(*inputs, causal=True, family="sm90")
    grads = torch.autograd.grad(out, inputs, dout)
    assert_grads_close(grads, expected, torch.bfloat16, f"sm90 autograd seed={SEED}")
    out, lse = flashcute.forward(q, k, v, softcap=5.0, return_lse=True)
    with pytest.raises(flashcute.UnsupportedError, match="sm90"):
        flashcute.backward(dout, q, k, v, out, lse, softcap=5.0, family="sm90")

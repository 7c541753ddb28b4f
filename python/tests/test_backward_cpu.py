"""The torch front end's backward plumbing on the CPU, without the library or a GPU.

FakeTensorMode makes CUDA tensors that have shapes and strides but no memory: the wrappers' checks
and the custom ops' fake implementations run on them, as under torch.compile. Covered: how
autograd is wired to flashcute::fwd (the LSE it asks for, the options it keeps), the checks that
refuse bad backward arguments before the op, and the layout autograd's output gradient is brought
to. test_backward_gpu.py runs the kernels. Needs torch.
"""

import pytest

torch = pytest.importorskip("torch", reason="the torch front end needs torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import flashcute  # noqa: E402
from flashcute import _torch  # noqa: E402


@pytest.fixture
def fake_mode():
    with FakeTensorMode():
        yield


def cuda(shape, dtype=torch.bfloat16, requires_grad=False):
    return torch.empty(shape, dtype=dtype, device="cuda", requires_grad=requires_grad)


@pytest.fixture
def fwd_calls(monkeypatch):
    """The arguments of each torch.ops.flashcute.fwd call."""
    calls = []
    real_op = torch.ops.flashcute.fwd

    class Spy:
        def __call__(self, *args):
            calls.append(args)
            return real_op(*args)

        def __getattr__(self, name):  # .default and the rest, which autograd's dispatch reads
            return getattr(real_op, name)

    monkeypatch.setattr(torch.ops.flashcute, "fwd", Spy())
    return calls


# fwd's arguments by position (see _torch._fwd).
RETURN_LSE, DETERMINISTIC, FAMILY = 14, 15, 16


def test_grad_asks_the_op_for_the_lse_and_returns_what_was_asked(fake_mode, fwd_calls):
    q = cuda((2, 64, 8, 64), requires_grad=True)
    k, v = cuda((2, 80, 2, 64)), cuda((2, 80, 2, 64))
    out = flashcute.flash_attn_func(q, k, v, causal=True, deterministic=True)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    assert out.grad_fn is not None and "flashcute" in type(out.grad_fn).__name__
    assert fwd_calls[-1][RETURN_LSE] is True and fwd_calls[-1][DETERMINISTIC] is True
    out, lse = flashcute.forward(q, k, v, return_lse=True, family="sm80")
    assert lse.shape == (2, 8, 64) and fwd_calls[-1][FAMILY] == 80
    with torch.no_grad():
        flashcute.flash_attn_func(q, k, v)
    assert fwd_calls[-1][RETURN_LSE] is False and fwd_calls[-1][DETERMINISTIC] is False
    flashcute.flash_attn_func(q.detach(), k, v)
    assert fwd_calls[-1][RETURN_LSE] is False


def test_packed_views_stay_differentiable(fake_mode):
    qkv = cuda((2, 64, 3, 4, 64), requires_grad=True)
    out = flashcute.flash_attn_qkvpacked_func(qkv, causal=True)
    assert out.requires_grad and out.shape == (2, 64, 4, 64)
    kv = cuda((40, 2, 2, 64), requires_grad=True)
    cu = torch.zeros(3, dtype=torch.int32, device="cuda")
    out = flashcute.flash_attn_varlen_kvpacked_func(cuda((30, 4, 64)), kv, cu, cu, 20, 30)
    assert out.requires_grad and out.shape == (30, 4, 64)


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_allocates_gradients_like_q_k_v(fake_mode, deterministic):
    q, dout, out = (cuda((2, 64, 8, 64)) for _ in range(3))
    k = v = cuda((2, 96, 2, 64)).transpose(1, 2).contiguous().transpose(1, 2)
    lse = cuda((2, 8, 64), torch.float32)
    grads = flashcute.backward(dout, q, k, v, out, lse, causal=True, deterministic=deterministic)
    for grad, t in zip(grads, (q, k, v)):
        assert grad.shape == t.shape and grad.dtype == t.dtype and grad.is_contiguous()
    cu = torch.zeros(4, dtype=torch.int32, device="cuda")
    q, dout, out = (cuda((100, 8, 64), torch.float16) for _ in range(3))
    k = v = cuda((120, 2, 64), torch.float16)
    grads = flashcute.backward(dout, q, k, v, out, cuda((8, 100), torch.float32), cu_seqlens_q=cu,
                               cu_seqlens_k=cu, max_seqlen_q=50, max_seqlen_k=60)
    assert [tuple(g.shape) for g in grads] == [(100, 8, 64), (120, 2, 64), (120, 2, 64)]


@pytest.mark.parametrize("name, make, error, words", [
    ("dout", lambda: cuda((2, 64, 8, 32)), ValueError, "dout must have q's shape"),
    ("dout", lambda: cuda((2, 64, 8, 64), torch.float16), TypeError,
     "dout has dtype fp16 but q has bf16"),
    ("dout", lambda: [0.0], TypeError, "q is a torch.Tensor, so dout must be one too"),
    ("out", lambda: cuda((2, 64, 8, 128))[..., ::2], ValueError,
     "out must have a contiguous last dimension"),
    ("lse", lambda: cuda((2, 8, 64), torch.float16), TypeError,
     "softmax_lse must have dtype float32"),
    ("lse", lambda: cuda((2, 64, 8), torch.float32).transpose(1, 2), ValueError,
     "softmax_lse must be contiguous"),
    ("lse", lambda: cuda((2, 8, 63), torch.float32), ValueError, "softmax_lse must have shape"),
])
def test_bad_backward_arguments_raise_before_the_op(fake_mode, monkeypatch, name, make, error,
                                                    words):
    monkeypatch.setattr(torch.ops.flashcute, "bwd", None)  # reaching the op would fail otherwise
    inputs = dict(dout=cuda((2, 64, 8, 64)), out=cuda((2, 64, 8, 64)),
                  lse=cuda((2, 8, 64), torch.float32))
    inputs[name] = make()
    q, k = cuda((2, 64, 8, 64)), cuda((2, 96, 2, 64))
    with pytest.raises(error, match=words):
        flashcute.backward(inputs["dout"], q, k, k, inputs["out"], inputs["lse"])


def test_cpu_tensors_that_require_grad_are_refused_as_not_on_cuda():
    q = torch.zeros((1, 8, 2, 64), dtype=torch.float16, requires_grad=True)
    with pytest.raises(ValueError, match="q must be on a CUDA device, got cpu:0"):
        flashcute.flash_attn_func(q, q, q)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashcute.flash_attn_func(q, q, q, dropout_p=0.1)


def test_output_gradient_is_read_in_place_when_the_kernels_can():
    base = torch.zeros((2, 8, 64, 64), dtype=torch.bfloat16)
    for readable in (base, base.transpose(1, 2), base[:, :4]):
        assert _torch._kernel_readable(readable) is readable
    flat = torch.zeros(2 * 64 * 8 * 64 + 4, dtype=torch.bfloat16)
    for copied in (torch.ones(()).expand(2, 64, 8, 64),  # the gradient of out.sum()
                   base.transpose(2, 3),  # a strided last dimension
                   flat[4:].view(2, 64, 8, 64)):  # starts 8 bytes into a 16-byte granule
        got = _torch._kernel_readable(copied)
        assert got.is_contiguous() and got.storage_offset() == 0 and torch.equal(got, copied)

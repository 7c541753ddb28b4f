"""GPU tests for DLPack inputs: CuPy and JAX arrays in, arrays of the same framework out, for the
forward pass and flashcute.backward.

The reference runs in torch on the same memory (torch.from_dlpack), so torch is needed too.
"""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the reference needs torch")
if not torch.cuda.is_available():
    pytest.skip("the GPU tests need a CUDA device", allow_module_level=True)

import flashcute  # noqa: E402
from attention_reference import (  # noqa: E402
    assert_close,
    assert_grad_close,
    assert_lse_close,
    attention,
    attention_grads,
    default_scale,
)

SEED = int(os.environ["FLASHCUTE_TEST_SEED"])


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy", reason="CuPy is not installed")


@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    return jax


@pytest.mark.parametrize("causal, heads_k, sq, sk", [(False, 4, 150, 150), (True, 2, 77, 300)])
def test_cupy_inputs_on_a_cupy_stream(cupy, causal, heads_k, sq, sk):
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # data made and consumed on one non-default stream: no other ordering exists
        rng = cupy.random.default_rng(SEED)
        q = rng.standard_normal((2, sq, 4, 64), dtype=cupy.float32).astype(cupy.float16)
        k = rng.standard_normal((2, sk, heads_k, 64), dtype=cupy.float32).astype(cupy.float16)
        v = rng.standard_normal((2, sk, heads_k, 64), dtype=cupy.float32).astype(cupy.float16)
        out, lse, _ = flashcute.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    stream.synchronize()
    assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    assert out.dtype == cupy.float16 and out.shape == q.shape and out.flags.c_contiguous
    assert lse.dtype == cupy.float32 and lse.shape == (2, 4, sq)
    tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))
    ref_out, ref_lse = attention(tq, tk, tv, scale=default_scale(64), causal=causal)
    assert_close(torch.from_dlpack(out), ref_out, tv, torch.float16)
    assert_lse_close(torch.from_dlpack(lse), ref_lse)


def test_cupy_strided_view(cupy):
    # (b, h, s, d) memory seen as (b, s, h, d): strides that are not row-major.
    rng = cupy.random.default_rng(SEED + 1)
    q, k, v = (rng.standard_normal((1, 3, 200, 128), dtype=cupy.float32)
               .astype(cupy.float16).transpose(0, 2, 1, 3) for _ in range(3))
    out = flashcute.flash_attn_func(q, k, v, window_size=(33, 7))
    tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))
    ref, _ = attention(tq, tk, tv, scale=default_scale(128), window=(33, 7))
    assert_close(torch.from_dlpack(out), ref, tv, torch.float16)


def test_cupy_varlen(cupy):
    rng = cupy.random.default_rng(SEED + 2)
    lens_q, lens_k = [3, 130, 64], [9, 100, 64]
    cu_q = cupy.asarray(np.cumsum([0] + lens_q), dtype=cupy.int32)
    cu_k = cupy.asarray(np.cumsum([0] + lens_k), dtype=cupy.int32)
    q = rng.standard_normal((sum(lens_q), 4, 64), dtype=cupy.float32).astype(cupy.float16)
    k = rng.standard_normal((sum(lens_k), 2, 64), dtype=cupy.float32).astype(cupy.float16)
    v = rng.standard_normal((sum(lens_k), 2, 64), dtype=cupy.float32).astype(cupy.float16)
    out, lse, _ = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                   causal=True, return_attn_probs=True)
    cupy.cuda.get_current_stream().synchronize()
    assert isinstance(out, cupy.ndarray) and lse.shape == (4, sum(lens_q))
    tq, tk, tv, tout, tlse = (torch.from_dlpack(x) for x in (q, k, v, out, lse))
    starts_q, starts_k = np.cumsum([0] + lens_q), np.cumsum([0] + lens_k)
    for i in range(len(lens_q)):
        qs, qe, ks, ke = starts_q[i], starts_q[i + 1], starts_k[i], starts_k[i + 1]
        ref_out, ref_lse = attention(tq[None, qs:qe], tk[None, ks:ke], tv[None, ks:ke],
                                     scale=default_scale(64), causal=True)
        assert_close(tout[None, qs:qe], ref_out, tv[ks:ke], torch.float16, what=f"sequence {i}")
        assert_lse_close(tlse[None, :, qs:qe], ref_lse, what=f"sequence {i}")


def test_cupy_bad_input_is_refused(cupy):
    q = cupy.zeros((1, 8, 2, 64), dtype=cupy.float32)
    with pytest.raises(TypeError, match="q has dtype fp32"):
        flashcute.flash_attn_func(q, q, q)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_jax_inputs(jax, dtype_name):
    import jax.numpy as jnp

    dtype = getattr(jnp, dtype_name)
    keys = jax.random.split(jax.random.PRNGKey(SEED % 2 ** 31), 4)
    q = jax.random.normal(keys[0], (2, 130, 8, 128), dtype=jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (2, 257, 2, 128), dtype=jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (2, 257, 2, 128), dtype=jnp.float32).astype(dtype)
    slopes = jax.random.uniform(keys[3], (8,), dtype=jnp.float32) * 0.2
    out, lse, _ = flashcute.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes,
                                            return_attn_probs=True)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    assert out.dtype == dtype and out.shape == q.shape
    assert lse.dtype == jnp.float32 and lse.shape == (2, 8, 130)
    # Back to torch through host memory, which the JAX arrays reach by their own synchronisation.
    tq, tk, tv = (torch.from_numpy(np.asarray(x.astype(jnp.float32))).cuda()
                  .to(getattr(torch, dtype_name)) for x in (q, k, v))
    ref_out, ref_lse = attention(tq, tk, tv, scale=default_scale(128), causal=True,
                                 alibi=torch.from_numpy(np.asarray(slopes)).cuda())
    got = torch.from_numpy(np.asarray(out.astype(jnp.float32))).cuda().to(tq.dtype)
    assert_close(got, ref_out, tv, tq.dtype)
    assert_lse_close(torch.from_numpy(np.asarray(lse)).cuda(), ref_lse)


@pytest.mark.parametrize("deterministic", [False, True])
def test_cupy_backward_on_a_cupy_stream(cupy, deterministic):
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        rng = cupy.random.default_rng(SEED + 3)
        q, dout = (rng.standard_normal((2, 140, 8, 64), dtype=cupy.float32).astype(cupy.float16)
                   for _ in range(2))
        k, v = (rng.standard_normal((2, 300, 2, 64), dtype=cupy.float32).astype(cupy.float16)
                for _ in range(2))
        out, lse, _ = flashcute.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        grads = flashcute.backward(dout, q, k, v, out, lse, causal=True,
                                   deterministic=deterministic)
    stream.synchronize()
    for grad, x in zip(grads, (q, k, v)):
        assert isinstance(grad, cupy.ndarray) and grad.dtype == cupy.float16
        assert grad.shape == x.shape and grad.flags.c_contiguous
    refs = attention_grads(*(torch.from_dlpack(x) for x in (q, k, v, dout)),
                           scale=default_scale(64), causal=True)
    for name, grad, ref in zip(("dq", "dk", "dv"), grads, refs):
        assert_grad_close(torch.from_dlpack(grad), ref, torch.float16, what=name)


def test_jax_backward(jax):
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(SEED % 2 ** 31 + 1), 4)
    q, dout = (jax.random.normal(key, (2, 130, 4, 128), dtype=jnp.float32).astype(jnp.bfloat16)
               for key in keys[:2])
    k, v = (jax.random.normal(key, (2, 257, 4, 128), dtype=jnp.float32).astype(jnp.bfloat16)
            for key in keys[2:])
    out, lse = flashcute.forward(q, k, v, causal=True, window_size=(64, 0), return_lse=True)
    grads = flashcute.backward(dout, q, k, v, out, lse, causal=True, window_size=(64, 0))
    assert all(isinstance(grad, jax.Array) and grad.dtype == jnp.bfloat16 for grad in grads)
    # Back to torch through host memory, which the JAX arrays reach by their own synchronisation.
    tq, tk, tv, tdout = (torch.from_numpy(np.asarray(x.astype(jnp.float32))).cuda() for x in
                         (q, k, v, dout))
    refs = attention_grads(*(t.bfloat16() for t in (tq, tk, tv, tdout)), scale=default_scale(128),
                           causal=True, window=(64, 0))
    for name, grad, ref in zip(("dq", "dk", "dv"), grads, refs):
        got = torch.from_numpy(np.asarray(grad.astype(jnp.float32))).cuda().bfloat16()
        assert_grad_close(got, ref, torch.bfloat16, what=name)

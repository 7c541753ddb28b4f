"""The GPU tests' references, checked on the CPU: the forward against PyTorch SDPA where their
semantics meet and against a scalar loop written straight from the definitions where they do not;
the gradients against finite differences of that forward."""

import math

import pytest

torch = pytest.importorskip("torch", reason="the reference needs torch")

from attention_reference import attention, attention_grads  # noqa: E402


def _loop_reference(q, k, v, scale, causal, window, softcap, slopes):
    """One query row at a time, in Python floats (slopes: one per head)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    out = torch.zeros(b, sq, h, d, dtype=torch.float64)
    lse = torch.full((b, h, sq), math.inf, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // hk)
            for i in range(sq):
                diag = i + sk - sq
                scores = {}
                for j in range(sk):
                    if causal and j > diag:
                        continue
                    if window[0] >= 0 and j < diag - window[0]:
                        continue
                    if window[1] >= 0 and j > diag + window[1]:
                        continue
                    s = scale * float(q[bi, i, hi].double() @ k[bi, j, kh].double())
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if slopes is not None:
                        s -= float(slopes[hi]) * abs(diag - j)
                    scores[j] = s
                if not scores:
                    continue
                top = max(scores.values())
                total = sum(math.exp(s - top) for s in scores.values())
                lse[bi, hi, i] = top + math.log(total)
                for j, s in scores.items():
                    out[bi, i, hi] += math.exp(s - lse[bi, hi, i]) * v[bi, j, kh].double()
    return out, lse


@pytest.mark.parametrize("sq, sk, causal, window, softcap, alibi", [
    (5, 9, True, (-1, -1), 0.0, False),
    (9, 5, True, (-1, -1), 0.0, False),   # the first rows see no key
    (7, 7, False, (2, 1), 0.0, False),
    (6, 11, True, (3, -1), 0.0, True),
    (8, 4, False, (-1, 0), 5.0, True),
    (4, 6, False, (-1, -1), 2.0, False),
])
def test_reference_matches_scalar_loop(sq, sk, causal, window, softcap, alibi):
    g = torch.Generator().manual_seed(sq * 100 + sk)
    q = torch.randn(2, sq, 4, 8, generator=g) * 2
    k = torch.randn(2, sk, 2, 8, generator=g) * 2
    v = torch.randn(2, sk, 2, 8, generator=g)
    slopes = torch.rand(4, generator=g) if alibi else None
    out, lse = attention(q, k, v, scale=0.3, causal=causal, window=window, softcap=softcap,
                         alibi=slopes)
    want_out, want_lse = _loop_reference(q, k, v, 0.3, causal, window, softcap, slopes)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("sq, sk, causal", [(16, 16, False), (16, 16, True), (10, 24, True),
                                            (24, 10, True)])
def test_reference_top_left_matches_sdpa(sq, sk, causal):
    g = torch.Generator().manual_seed(sq + sk)
    q = torch.randn(2, sq, 6, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, sk, 3, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, sk, 3, 16, generator=g, dtype=torch.float64)
    out, _ = attention(q, k, v, scale=0.25, causal=causal, top_left=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=0.25,
        enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, sdpa, rtol=1e-10, atol=1e-10)


def test_reference_batch_alibi_uses_each_batch_row():
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 5, 3, 8, generator=g) for _ in range(3))
    slopes = torch.rand(2, 3, generator=g)
    both, _ = attention(q, k, v, scale=0.5, alibi=slopes)
    for b in range(2):
        one, _ = attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], scale=0.5, alibi=slopes[b])
        torch.testing.assert_close(both[b:b + 1], one, rtol=0, atol=0)


@pytest.mark.parametrize("sq, sk, causal, window, softcap, alibi, top_left", [
    (5, 9, True, (-1, -1), 0.0, False, False),
    (9, 5, True, (-1, -1), 0.0, False, False),  # rows that see no key
    (7, 7, False, (2, 1), 0.0, True, False),
    (6, 11, True, (3, -1), 5.0, False, True),
    (8, 4, False, (-1, 0), 2.0, True, False),
])
def test_grad_reference_matches_finite_differences(sq, sk, causal, window, softcap, alibi,
                                                  top_left):
    """attention_grads against central differences of the fp64 forward, along random directions."""
    g = torch.Generator().manual_seed(sq * 10 + sk)
    q = torch.randn(2, sq, 4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, sk, 2, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, sk, 2, 8, generator=g, dtype=torch.float64)
    dout = torch.randn(2, sq, 4, 8, generator=g, dtype=torch.float64)
    slopes = torch.rand(4, generator=g, dtype=torch.float64) if alibi else None
    options = dict(scale=0.4, causal=causal, window=window, softcap=softcap, alibi=slopes,
                   top_left=top_left)
    grads = attention_grads(q, k, v, dout, **options)
    assert all(grad.dtype == torch.float32 for grad in grads)
    for trial in range(3):
        directions = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (q, k, v)]
        h = 1e-6
        plus = attention(*(t + h * d for t, d in zip((q, k, v), directions)), **options)[0]
        minus = attention(*(t - h * d for t, d in zip((q, k, v), directions)), **options)[0]
        numeric = ((plus - minus) * dout).sum().item() / (2 * h)
        analytic = sum((grad.double() * d).sum().item() for grad, d in zip(grads, directions))
        assert analytic == pytest.approx(numeric, rel=1e-4, abs=1e-5), trial


@pytest.mark.parametrize("sq, sk", [(0, 5), (5, 0), (0, 0)])
def test_grad_reference_of_empty_sequences_is_zero(sq, sk):
    q, dout = torch.randn(1, sq, 2, 8), torch.randn(1, sq, 2, 8)
    k = v = torch.randn(1, sk, 2, 8)
    for grad in attention_grads(q, k, v, dout, scale=0.3, causal=True):
        assert not grad.any()


def test_grad_reference_rows_without_keys_get_zero_dq():
    g = torch.Generator().manual_seed(3)
    q, dout = torch.randn(1, 9, 2, 8, generator=g), torch.randn(1, 9, 2, 8, generator=g)
    k, v = torch.randn(1, 5, 2, 8, generator=g), torch.randn(1, 5, 2, 8, generator=g)
    # Rows 0..3 see no key; row 4 sees one (a softmax of one key has no gradient); 5..8 several.
    dq, dk, dv = attention_grads(q, k, v, dout, scale=0.3, causal=True)
    assert not dq[:, :5].any() and dq[:, 5:].abs().min() > 0
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()

"""The GPU tests' reference, checked on the CPU: against PyTorch SDPA where their semantics meet,
and against a scalar loop written straight from the definitions where they do not."""

import math

import pytest

torch = pytest.importorskip("torch", reason="the reference needs torch")

from attention_reference import attention  # noqa: E402


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

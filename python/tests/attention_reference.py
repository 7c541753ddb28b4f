"""References with FlashAttention's semantics, and the tolerances the GPU tests apply.

Written from FlashAttention's definitions (python/README.md), independently of the library:
explicit masks, logsumexp from torch. `attention` is the forward in fp64; `attention_grads` gives
the gradients by autograd through a plain fp32 implementation. Inputs are the low-precision
tensors themselves, so the references see exactly the values the kernel sees.
"""

import math

import torch

INF = float("inf")
# Unit roundoff of the output types: the largest relative error of one rounding.
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
# Relative L2 error allowed against the reference, with room above what PyTorch SDPA's kernels
# reach on random normal inputs (about 2.4e-3 bf16, 3e-4 fp16).
REL_L2 = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
# A tanh.approx-style softcap changes a capped score by up to ~1e-3 of the cap.
SOFTCAP_SCORE_ERROR = 1e-3
# Relative L2 error allowed for each of dq, dk, dv against the fp32 autograd reference, plus an
# absolute allowance per element (as RMS) for rounding where the reference cancels to 0: a query
# that sees one key has dq = 0 exactly in fp32, and a kernel gets there from rounded terms.
GRAD_REL_L2 = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
GRAD_ABS_RMS = 1e-5


def _masked_scores(q, k, scale, causal, window, softcap, alibi, top_left):
    """(batch, heads, seqlen_q, seqlen_k) scores in q's dtype for k already expanded to q's heads:
    scaled (or capped), ALiBi's bias added, hidden pairs at -inf."""
    sq, heads, sk = q.shape[1], q.shape[2], k.shape[1]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    diag = i if top_left else i + (sk - sq)  # the key aligned with query row i
    if alibi is not None:
        slopes = alibi.to(q.dtype).reshape(-1, heads)[:, :, None, None]  # (batch or 1, heads, 1, 1)
        s = s - slopes * (diag - j).abs()
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        keep &= j <= diag
    if window[0] >= 0:
        keep &= j >= diag - window[0]
    if window[1] >= 0:
        keep &= j <= diag + window[1]
    return s.masked_fill(~keep, -INF)


def attention(q, k, v, *, scale, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
              top_left=False):
    """(out, lse) in fp64 for dense (batch, seqlen, heads, head_dim) inputs.

    lse is (batch, heads, seqlen_q), +inf for a row that sees no key; such a row's output is 0.
    """
    group = q.shape[2] // k.shape[2]
    qd = q.double()
    kd = k.double().repeat_interleave(group, dim=2)
    vd = v.double().repeat_interleave(group, dim=2)
    s = _masked_scores(qd, kd, scale, causal, window, softcap, alibi, top_left)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(nan=0.0)  # a row with no key: exp(-inf + inf)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vd)
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, INF), lse)
    return out, lse


def assert_close(out, ref, v, dtype, softcap=0.0, what=""):
    """Relative L2 error and a max-error bound derived from where the kernel must round.

    The kernel rounds the unnormalised probabilities to the input type before P @ V (an error of
    at most u * max|v| per output element) and rounds the output (u * |out|); we allow four and
    two times those.
    """
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}"
    o = out.double()
    assert torch.isfinite(o).all(), f"{what}: non-finite output"
    u = UNIT_ROUNDOFF[dtype]
    vmax = v.double().abs().max().item() if v.numel() else 0.0
    rmax = ref.abs().max().item() if ref.numel() else 0.0
    score_error = SOFTCAP_SCORE_ERROR * softcap
    err = (o - ref).abs()
    max_err = err.max().item() if err.numel() else 0.0
    bound = (4 * u + 2 * score_error) * vmax + 2 * u * rmax
    assert max_err <= bound, f"{what}: max error {max_err:.3g} > bound {bound:.3g}"
    ref_norm = ref.norm().item()
    if ref_norm > 0:
        rel = (o - ref).norm().item() / ref_norm
        limit = REL_L2[dtype] + score_error
        assert rel <= limit, f"{what}: relative L2 error {rel:.3g} > {limit:.3g}"


def assert_lse_close(lse, ref, softcap=0.0, what=""):
    assert lse.dtype == torch.float32, f"{what}: lse dtype {lse.dtype}"
    assert lse.shape == ref.shape, f"{what}: lse shape {tuple(lse.shape)} != {tuple(ref.shape)}"
    lse = lse.double()
    no_key = torch.isinf(ref)
    assert torch.equal(torch.isposinf(lse), no_key), f"{what}: +inf rows differ"
    assert not torch.isnan(lse).any(), f"{what}: NaN in lse"
    seen = ~no_key
    if seen.any():
        err = (lse[seen] - ref[seen]).abs()
        tol = (5e-4 + SOFTCAP_SCORE_ERROR * softcap) * (1 + ref[seen].abs())
        worst = (err - tol).max().item()
        assert worst <= 0, f"{what}: lse error exceeds tolerance by {worst:.3g}"


def default_scale(head_dim):
    return 1.0 / math.sqrt(head_dim)


def _differentiable_attention(q, k, v, scale, causal, window, softcap, alibi, top_left):
    """out (batch, seqlen_q, heads, head_dim) in q's dtype, by operations autograd differentiates
    without a NaN: a row that sees no key (or an empty seqlen) gives 0 and zero gradients."""
    group = q.shape[2] // k.shape[2]
    kx = k.repeat_interleave(group, dim=2)
    vx = v.repeat_interleave(group, dim=2)
    s = _masked_scores(q, kx, scale, causal, window, softcap, alibi, top_left)
    # Shifted by the (constant) log-sum-exp, then normalised: exp never sees inf - inf, and a row
    # with no key divides 0 by 1.
    lse = torch.logsumexp(s.detach(), dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)))
    total = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    return torch.einsum("bhqk,bkhd->bqhd", p, vx)


def attention_grads(q, k, v, dout, *, scale, causal=False, window=(-1, -1), softcap=0.0,
                    alibi=None, top_left=False):
    """(dq, dk, dv) in fp32 for dense inputs: autograd through the fp32 computation of out."""
    inputs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    out = _differentiable_attention(*inputs, scale, causal, window, softcap, alibi, top_left)
    return torch.autograd.grad(out, inputs, dout.float())


def assert_grad_close(grad, ref, dtype, what=""):
    """L2 error against the fp32 reference gradient within GRAD_REL_L2 of the reference's norm
    (plus GRAD_ABS_RMS per element); a NaN never passes."""
    assert grad.dtype == dtype, f"{what}: dtype {grad.dtype}"
    assert grad.shape == ref.shape, f"{what}: shape {tuple(grad.shape)} != {tuple(ref.shape)}"
    g = grad.double()
    assert torch.isfinite(g).all(), f"{what}: non-finite gradient"
    ref = ref.double()
    err, ref_norm = (g - ref).norm().item(), ref.norm().item()
    limit = GRAD_REL_L2[dtype] * ref_norm + GRAD_ABS_RMS * math.sqrt(ref.numel())
    assert err <= limit, (f"{what}: L2 error {err:.3g} > {limit:.3g} (relative "
                          f"{err / max(ref_norm, 1e-30):.3g}, reference norm {ref_norm:.3g})")

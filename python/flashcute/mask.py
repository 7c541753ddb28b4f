"""Which (query, key) pairs a causal mask and a local window keep: the package's one mask rule.

Query row i is aligned with key diag(i): i + seqlen_k - seqlen_q with FlashAttention's bottom-right
alignment (the default; the last query sees the last key), or i with "top_left" (PyTorch's
is_causal). Key j (0 <= j < seqlen_k) is kept when every bound that applies holds:

    causal                  j <= diag(i)
    window_size[0] >= 0     j >= diag(i) - window_size[0]
    window_size[1] >= 0     j <= diag(i) + window_size[1]

A negative window side is unbounded (-1 in FlashAttention's API). A row may keep no key at all
(seqlen_q > seqlen_k with a bottom-right causal mask, for instance).
"""

ALIGNMENTS = ("bottom_right", "top_left")


def _diagonal_offset(seqlen_q, seqlen_k, causal_alignment):
    """diag(i) - i."""
    if causal_alignment == "bottom_right":
        return seqlen_k - seqlen_q
    if causal_alignment == "top_left":
        return 0
    raise ValueError(f"causal_alignment must be one of {ALIGNMENTS}, got {causal_alignment!r}")


def keep_matrix(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1),
                causal_alignment="bottom_right", *, xp=None, device=None):
    """The boolean (seqlen_q, seqlen_k) array that is True where query i may attend to key j.

    xp is the array module that builds it: NumPy by default, or torch (with device="cuda", say);
    any module whose arange results broadcast and compare like NumPy's works.
    """
    if xp is None:
        import numpy as xp
    offset = _diagonal_offset(seqlen_q, seqlen_k, causal_alignment)
    left, right = window_size
    placement = {} if device is None else {"device": device}
    i = xp.arange(seqlen_q, **placement)[:, None]
    j = xp.arange(seqlen_k, **placement)[None, :]
    diag = i + offset
    keep = (i >= 0) & (j >= 0)  # every pair, in the array module's boolean type
    if causal:
        keep &= j <= diag
    if left >= 0:
        keep &= j >= diag - left
    if right >= 0:
        keep &= j <= diag + right
    return keep


def visible_pairs(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1),
                  causal_alignment="bottom_right"):
    """How many pairs keep_matrix keeps, counted row by row without building the matrix."""
    offset = _diagonal_offset(seqlen_q, seqlen_k, causal_alignment)
    left, right = window_size
    total = 0
    for i in range(seqlen_q):
        diag = i + offset
        lo = 0 if left < 0 else max(0, diag - left)
        hi = seqlen_k - 1 if right < 0 else min(seqlen_k - 1, diag + right)
        if causal:
            hi = min(hi, diag)
        total += max(0, hi - lo + 1)
    return total

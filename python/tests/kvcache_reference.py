"""The reference for attention over a KV cache (flash_attn_with_kvcache), written from its
definition in python/README.md independently of the library.

Plain torch, one sequence at a time: the new keys and values are rotated (in fp32, rounded to the
cache's dtype, as a cache stores them) and written into a copy of the cache; the keys a sequence
sees are gathered from that copy slot by slot (through the block table for a paged cache); q is
rotated the same way; then attention_reference.attention applies the masks, softcap and ALiBi
(FlashAttention's rules, the one masked-score rule the tests share) in fp64. A row that sees no
key gives 0 and an LSE of +inf.
"""

import torch

from attention_reference import attention


def rotate(x, cos, sin, positions, interleaved):
    """x (n, heads, head_dim) with its first rotary_dim = 2 * cos.shape[1] columns rotated by the
    angles of rows `positions` of cos / sin: pairs (2j, 2j + 1) when interleaved, else
    (j, j + rotary_dim / 2). Computed in fp32, returned in x's dtype."""
    half = cos.shape[1]
    c = cos.float()[positions][:, None, :]  # (n, 1, half)
    s = sin.float()[positions][:, None, :]
    y = x.float().clone()
    if interleaved:
        first, second = slice(0, 2 * half, 2), slice(1, 2 * half, 2)
    else:
        first, second = slice(0, half), slice(half, 2 * half)
    x1, x2 = y[..., first].clone(), y[..., second].clone()
    y[..., first] = x1 * c - x2 * s
    y[..., second] = x1 * s + x2 * c
    return y.to(x.dtype)


def cache_index(cache, b, slots, cache_batch_idx=None, block_table=None):
    """The (row or page, slot or row-in-page) index of sequence b's `slots` in a cache."""
    slots = torch.as_tensor(slots, dtype=torch.long, device=cache.device)
    if block_table is not None:
        page_size = cache.shape[1]
        return block_table[b].long()[slots // page_size], slots % page_size
    row = int(cache_batch_idx[b]) if cache_batch_idx is not None else b
    return torch.full_like(slots, row), slots


def append(k_cache, v_cache, k, v, seqlens, *, cache_batch_idx=None, block_table=None,
           rotary=None):
    """Copies of the caches with k, v (batch, seqlen_new, heads_k, head_dim) written at slots
    [seqlens[b], seqlens[b] + seqlen_new), k rotated at positions seqlens[b] + i (their slots).
    rotary: None or (cos, sin, interleaved). Also returns the boolean (dim 0, dim 1) mask of the
    slots written."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    written = torch.zeros(k_cache.shape[:2], dtype=torch.bool, device=k_cache.device)
    if k is None:
        return k_cache, v_cache, written
    s_new = k.shape[1]
    for b in range(k.shape[0]):
        start = seqlens[b]
        index = cache_index(k_cache, b, range(start, start + s_new), cache_batch_idx, block_table)
        kb = k[b]
        if rotary is not None:
            cos, sin, interleaved = rotary
            offset = start
            positions = torch.arange(offset, offset + s_new, device=k.device)
            kb = rotate(kb, cos, sin, positions, interleaved)
        k_cache[index] = kb
        v_cache[index] = v[b]
        written[index] = True
    return k_cache, v_cache, written


def sequence_keys(k_cache, v_cache, b, start, end, cache_batch_idx=None, block_table=None):
    """Keys and values (1, end - start, heads_k, head_dim) of sequence b's slots [start, end)."""
    index = cache_index(k_cache, b, range(start, end), cache_batch_idx, block_table)
    return k_cache[index][None], v_cache[index][None]


def kvcache_attention(q, k_cache, v_cache, seqlens, *, k=None, v=None, leftpad=None,
                      cache_batch_idx=None, block_table=None, rotary=None, scale, causal=False,
                      window=(-1, -1), softcap=0.0, alibi=None):
    """The reference of one flash_attn_with_kvcache call on dense q (batch, seqlen_q, heads,
    head_dim): (out fp64 like q, lse fp64 (batch, heads, seqlen_q), the expected k_cache and
    v_cache after the call, the mask of the slots written). seqlens, leftpad and cache_batch_idx
    are lists of ints (or None); block_table a tensor (or None); alibi fp32 (heads,) or
    (batch, heads)."""
    k_cache, v_cache, written = append(k_cache, v_cache, k, v, seqlens,
                                       cache_batch_idx=cache_batch_idx, block_table=block_table,
                                       rotary=rotary)
    batch, sq = q.shape[:2]
    s_new = k.shape[1] if k is not None else 0
    windowed = causal or window[0] >= 0 or window[1] >= 0
    outs, lses = [], []
    for b in range(batch):
        start = leftpad[b] if leftpad is not None else 0
        end = seqlens[b] + s_new
        kb, vb = sequence_keys(k_cache, v_cache, b, start, end, cache_batch_idx, block_table)
        qb = q[b]
        if rotary is not None:
            cos, sin, interleaved = rotary
            offset = seqlens[b]
            positions = torch.arange(sq, device=q.device) + offset if windowed else \
                torch.full((sq,), offset, device=q.device)
            qb = rotate(qb, cos, sin, positions, interleaved)
        slopes = None
        if alibi is not None:
            slopes = alibi[b] if alibi.dim() == 2 else alibi
        out, lse = attention(qb[None], kb, vb, scale=scale, causal=causal, window=window,
                             softcap=softcap, alibi=slopes)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses), k_cache, v_cache, written

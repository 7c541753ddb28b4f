"""GPU tests of attention over a KV cache: flash_attn_with_kvcache and the paged
flash_attn_varlen_func, through torch.

Each case is compared with kvcache_reference (rotary in fp32, masked attention in fp64): the output
by relative L2 error and a max-error bound (attention_reference.assert_close; a NaN never passes),
the LSE where asked for, and the whole cache afterwards: the appended keys (rotated) and values in
slots [cache_seqlens, cache_seqlens + seqlen_new), every other slot bitwise untouched. Every slot a
sequence must not read (before its leftpad, past its keys, other rows, unused pages and the page
unused block-table entries point to) holds NaN, so a kernel that reads one fails; the blocks the
outputs are allocated from are NaN-filled first, so an element left unwritten fails too. Cases are
chosen pairwise over the lists below; then paged varlen prefill, CUDA graph replay with changing
cache_seqlens, debug_checks, repeatability, torch.compile, opcheck, gradients, CuPy.
"""

import math
import os
import zlib

import pytest

torch = pytest.importorskip("torch", reason="the GPU tests need torch")
if not torch.cuda.is_available():
    pytest.skip("the GPU tests need a CUDA device", allow_module_level=True)

import flashcute  # noqa: E402
from attention_reference import assert_close, assert_lse_close, default_scale  # noqa: E402
from kvcache_reference import cache_index, kvcache_attention, sequence_keys  # noqa: E402
from pairwise_cases import pairwise  # noqa: E402

SEED = int(os.environ["FLASHCUTE_TEST_SEED"])
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
DEVICE = torch.device("cuda", torch.cuda.current_device())
NAN = float("nan")

FACTORS = {
    "dtype": [torch.float16, torch.bfloat16],
    "head_dim": [64, 128, 256, 80],
    "heads": [(4, 4), (8, 2), (16, 2)],  # (heads, heads_k): GQA ratios 1, 4, 8
    "batch": [1, 4],
    "seqlen_q": [1, 4, 16],
    "layout": ["dense", "dense_batch_idx", "paged16", "paged64", "paged256"],
    # New keys (none, one token, seqlen_q tokens) and rotary embedding of them and of q.
    "update": ["none", "append1", "appendq", "rotary_interleaved", "rotary_plain",
               "rotary_half_interleaved", "rotary_half_plain"],
    # The keys already cached, per sequence; uniform_int passes one int for all.
    "lengths": ["zero", "short", "long", "mixed", "uniform_int"],
    "mask": ["none", "causal", "causal_window", "window"],
    "feature": ["none", "softcap", "alibi", "alibi_batch", "leftpad"],
    "num_splits": [0, 1, 3, 64],
    "lse": [False, True],
}
CASES = pairwise(FACTORS, seed=3)


def generator(*salt):
    g = torch.Generator(device=DEVICE)
    g.manual_seed(zlib.crc32(repr((SEED, "kvcache") + salt).encode()))  # stable across processes
    return g


def randn(shape, g, dtype=torch.float32):
    return torch.randn(shape, generator=g, device=DEVICE, dtype=torch.float32).to(dtype)


def randint(low, high, g):
    return int(torch.randint(low, high, (1,), generator=g, device=DEVICE).item())


def poison(*shapes_and_dtypes):
    """Leaves freed blocks of the caching allocator full of NaN, so that outputs of the same sizes
    allocated next start poisoned: an element the kernel fails to write cannot pass."""
    blocks = [torch.full(shape, NAN, dtype=dtype, device=DEVICE)
              for shape, dtype in shapes_and_dtypes]
    del blocks


def rotary_tables(rotary_seqlen, rotary_dim, g, dtype):
    """cos / sin (rotary_seqlen, rotary_dim / 2) of RoPE-style angles, in the inputs' dtype."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, device=DEVICE) / rotary_dim))
    angles = torch.arange(rotary_seqlen, device=DEVICE)[:, None] * inv_freq[None, :]
    angles = angles + randn(angles.shape, g) * 0.1  # not exactly a textbook table
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


class Cache:
    """A poisoned KV cache holding `seqlens[b]` keys of sequence b from slot leftpad[b] on.

    Dense: rows for the batch (and, with cache_batch_idx, two spare rows, the batch's rows
    shuffled among them); paged: pages of `page_size` slots, shuffled, each sequence given one more
    block-table entry than it uses, pointing at a trap page. Every slot outside the sequences'
    [leftpad, seqlen) is NaN.
    """

    def __init__(self, g, batch, capacity, heads_k, head_dim, dtype, seqlens, leftpad,
                 page_size=None, batch_idx=False):
        self.page_size, self.cache_batch_idx, self.block_table = page_size, None, None
        if page_size is None:
            rows = batch + (2 if batch_idx else 0)
            shape = (rows, capacity, heads_k, head_dim)
            if batch_idx:
                order = torch.randperm(rows, generator=g, device=DEVICE)[:batch]
                self.cache_batch_idx = order.to(torch.int32)
        else:
            pages_per_seq = -(-capacity // page_size) + 1  # one unused entry per sequence
            used = batch * (pages_per_seq - 1)
            pages = used + 3  # spare pages, the last one the trap
            shape = (pages, page_size, heads_k, head_dim)
            order = torch.randperm(pages - 1, generator=g, device=DEVICE)[:used]
            table = torch.full((batch, pages_per_seq), pages - 1, dtype=torch.int32,
                               device=DEVICE)
            table[:, :-1] = order.view(batch, pages_per_seq - 1).to(torch.int32)
            self.block_table = table
        self.k = torch.full(shape, NAN, dtype=dtype, device=DEVICE)
        self.v = torch.full(shape, NAN, dtype=dtype, device=DEVICE)
        for b in range(batch):
            start, end = leftpad[b], seqlens[b]
            k, v = randn((end - start, heads_k, head_dim), g), randn((end - start, heads_k,
                                                                       head_dim), g)
            self.write(b, start, k.to(dtype), v.to(dtype))

    def write(self, b, start, k, v):
        idx = None if self.cache_batch_idx is None else self.cache_batch_idx.tolist()
        index = cache_index(self.k, b, range(start, start + k.shape[0]), idx, self.block_table)
        self.k[index] = k
        self.v[index] = v

    def batch_idx_list(self):
        return None if self.cache_batch_idx is None else self.cache_batch_idx.tolist()


def lengths_for(kind, batch, g):
    if kind == "zero":
        return [0] * batch
    if kind == "short":
        return [randint(1, 100, g) for _ in range(batch)]
    if kind == "long":
        return [randint(2000, 6000, g) for _ in range(batch)]
    if kind == "uniform_int":
        return [1234] * batch
    return [0, 4999, 65, 255, 1][:batch] if batch > 1 else [257]  # mixed: 0 to long, tile +- 1


def case_setup(case, index):
    """Everything one case needs: inputs, the cache, the options and the reference."""
    g = generator("case", index)
    dtype, d, (h, hk) = case["dtype"], case["head_dim"], case["heads"]
    batch, sq = case["batch"], case["seqlen_q"]
    update = case["update"]
    s_new = {"none": 0, "append1": 1}.get(update, sq)
    seqlens = lengths_for(case["lengths"], batch, g)
    leftpad = ([randint(0, s + 1, g) for s in seqlens] if case["feature"] == "leftpad"
               else [0] * batch)
    capacity = max(seqlens) + s_new + 7  # a few NaN slots past every sequence's keys
    layout = case["layout"]
    page_size = int(layout[5:]) if layout.startswith("paged") else None
    cache = Cache(g, batch, capacity, hk, d, dtype, seqlens, leftpad, page_size=page_size,
                  batch_idx=layout == "dense_batch_idx")
    q = randn((batch, sq, h, d), g, dtype)
    k = v = None
    if s_new:
        k, v = randn((batch, s_new, hk, d), g, dtype), randn((batch, s_new, hk, d), g, dtype)
    rotary = None
    if update.startswith("rotary"):
        rotary_dim = d if "half" not in update else (d // 2 if d % 32 == 0 else 32)
        cos, sin = rotary_tables(capacity + 5, rotary_dim, g, dtype)
        rotary = (cos, sin, update.endswith("interleaved"))
    mask = case["mask"]
    causal = mask in ("causal", "causal_window")
    longest = max(seqlens) + s_new
    window = {"causal_window": (max(longest // 3, 2), 0),
              "window": (max(longest // 4, 1), 2)}.get(mask, (-1, -1))
    alibi = None
    if case["feature"] == "alibi":
        alibi = torch.rand((h,), generator=g, device=DEVICE) * 0.3 + 0.01
    elif case["feature"] == "alibi_batch":
        alibi = torch.rand((batch, h), generator=g, device=DEVICE) * 0.3 + 0.01
    softcap = 30.0 if case["feature"] == "softcap" else 0.0
    if case["feature"] == "softcap":
        q = (q.float() * 4).to(dtype)  # scores large enough for the cap to matter
    return dict(q=q, k=k, v=v, cache=cache, seqlens=seqlens, leftpad=leftpad, rotary=rotary,
                causal=causal, window=window, alibi=alibi, softcap=softcap)


def reference(s):
    cache = s["cache"]
    return kvcache_attention(
        s["q"], cache.k, cache.v, s["seqlens"], k=s["k"], v=s["v"],
        leftpad=s["leftpad"] if any(s["leftpad"]) else None,
        cache_batch_idx=cache.batch_idx_list(), block_table=cache.block_table,
        rotary=s["rotary"], scale=default_scale(s["q"].shape[-1]), causal=s["causal"],
        window=s["window"], softcap=s["softcap"], alibi=s["alibi"])


def bits(t):
    return t.view(torch.int16)


def assert_cache(actual, expected, written, rotated, dtype, what):
    """Slots not written: bitwise as before (NaN stays NaN). Written slots: the new values,
    bitwise, or for rotated keys within a rounding of the fp32 rotation."""
    kept = ~written
    assert torch.equal(bits(actual[kept]), bits(expected[kept])), f"{what}: a slot changed"
    if not written.any():
        return
    got, want = actual[written].float(), expected[written].float()
    assert torch.isfinite(got).all(), f"{what}: non-finite appended value"
    if rotated:
        u = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}[dtype]
        torch.testing.assert_close(got, want, rtol=2 * u, atol=2 * u * want.abs().max().item(),
                                   msg=lambda m: f"{what}: appended keys: {m}")
    else:
        assert torch.equal(bits(actual[written]), bits(expected[written])), (
            f"{what}: appended values differ")


def assert_outputs(out, lse, ref_out, ref_lse, values, dtype, softcap, what):
    """Per sequence: output against the reference, rows that see no key exactly 0."""
    for b in range(out.shape[0]):
        w = f"{what} sequence {b}"
        no_key = torch.isinf(ref_lse[b]).transpose(0, 1)  # (seqlen_q, heads)
        if no_key.any():
            assert torch.equal(out[b][no_key], torch.zeros_like(out[b][no_key])), (
                f"{w}: a row that sees no key is not 0")
        assert_close(out[b:b + 1], ref_out[b:b + 1], values[b], dtype, softcap=softcap, what=w)
        if lse is not None:
            assert_lse_close(lse[b:b + 1], ref_lse[b:b + 1], softcap=softcap, what=w)


def case_id(index):
    c = CASES[index]
    return (f"{index}-{DTYPE_NAMES[c['dtype']]}-d{c['head_dim']}-h{c['heads'][0]}/{c['heads'][1]}"
            f"-b{c['batch']}-sq{c['seqlen_q']}-{c['layout']}-{c['update']}-{c['lengths']}-"
            f"{c['mask']}-{c['feature']}-splits{c['num_splits']}")


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case_id(i) for i in range(len(CASES))])
def test_matches_reference(index):
    case = CASES[index]
    s = case_setup(case, index)
    dtype, cache = case["dtype"], s["cache"]
    ref_out, ref_lse, ref_k, ref_v, written = reference(s)
    batch, sq, h, d = s["q"].shape
    seqlens = (s["seqlens"][0] if case["lengths"] == "uniform_int" else
               torch.tensor(s["seqlens"], dtype=torch.int32, device=DEVICE))
    leftpad = (torch.tensor(s["leftpad"], dtype=torch.int32, device=DEVICE)
               if case["feature"] == "leftpad" else None)
    cos, sin, interleaved = s["rotary"] or (None, None, True)
    poison(((batch, sq, h, d), dtype), ((batch, h, sq), torch.float32))
    result = flashcute.flash_attn_with_kvcache(
        s["q"], cache.k, cache.v, s["k"], s["v"], rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=seqlens, cache_batch_idx=cache.cache_batch_idx, cache_leftpad=leftpad,
        block_table=cache.block_table, causal=s["causal"], window_size=s["window"],
        softcap=s["softcap"], rotary_interleaved=interleaved, alibi_slopes=s["alibi"],
        num_splits=case["num_splits"], return_softmax_lse=case["lse"])
    out, lse = result if case["lse"] else (result, None)
    what = f"{case_id(index)} seed={SEED}"
    assert out.shape == s["q"].shape and out.dtype == dtype and out.is_contiguous(), what
    if case["lse"]:
        assert lse.shape == (batch, h, sq) and lse.dtype == torch.float32, what
    # Each sequence's values, for the error bound.
    values = [sequence_keys(ref_k, ref_v, b, s["leftpad"][b], s["seqlens"][b] + (
        s["k"].shape[1] if s["k"] is not None else 0), cache.batch_idx_list(),
        cache.block_table)[1] for b in range(batch)]
    assert_outputs(out, lse, ref_out, ref_lse, values, dtype, s["softcap"], what)
    rotated = s["rotary"] is not None
    assert_cache(cache.k, ref_k, written, rotated, dtype, f"{what} k_cache")
    assert_cache(cache.v, ref_v, written, False, dtype, f"{what} v_cache")


# ---------------------------------------------------------------------------------------------
# Paged prefill through flash_attn_varlen_func(block_table=...): packed queries against each
# sequence's first cu_seqlens_k[i + 1] - cu_seqlens_k[i] cache slots.

@pytest.mark.parametrize("dtype, page_size, h, hk, d, causal, window", [
    (torch.bfloat16, 16, 8, 2, 128, True, (-1, -1)),
    (torch.float16, 64, 4, 4, 64, False, (-1, -1)),
    (torch.bfloat16, 256, 16, 2, 96, True, (100, 0)),
    (torch.float16, 64, 8, 1, 256, False, (50, 7)),
])
def test_paged_varlen_prefill(dtype, page_size, h, hk, d, causal, window):
    g = generator("paged varlen", page_size, d)
    lens_q = [1, 129, 0, 64, 300, 7]
    lens_k = [1, 1000, 50, 20, 300, 3]  # sq > sk for some: rows that see no key when causal
    batch = len(lens_q)
    cache = Cache(g, batch, max(lens_k) + 5, hk, d, dtype, lens_k, [0] * batch,
                  page_size=page_size)
    q = randn((sum(lens_q), h, d), g, dtype)
    cu_q = torch.tensor([0] + list(_cumsum(lens_q)), dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0] + list(_cumsum(lens_k)), dtype=torch.int32, device=DEVICE)
    before_k, before_v = cache.k.clone(), cache.v.clone()
    poison(((sum(lens_q), h, d), dtype), ((h, sum(lens_q)), torch.float32))
    out, lse, probs = flashcute.flash_attn_varlen_func(
        q, cache.k, cache.v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
        window_size=window, return_attn_probs=True, block_table=cache.block_table)
    assert out.shape == q.shape and lse.shape == (h, sum(lens_q)) and probs is None
    for i in range(batch):
        qs, qe = int(cu_q[i]), int(cu_q[i + 1])
        ref_out, ref_lse, _, _, _ = kvcache_attention(
            q[None, qs:qe], cache.k, cache.v, [lens_k[i]], block_table=cache.block_table[i:i + 1],
            scale=default_scale(d), causal=causal, window=window)
        kb, vb = sequence_keys(cache.k, cache.v, i, 0, lens_k[i], None, cache.block_table)
        what = f"sequence {i} ({lens_q[i]}x{lens_k[i]}) page {page_size} seed={SEED}"
        assert_outputs(out[None, qs:qe], lse[None, :, qs:qe], ref_out, ref_lse, [vb], dtype,
                       0.0, what)
    assert torch.equal(bits(cache.k), bits(before_k)) and torch.equal(bits(cache.v),
                                                                      bits(before_v))


def _cumsum(values):
    total = 0
    for x in values:
        total += x
        yield total


# ---------------------------------------------------------------------------------------------
# A decoding step captured once in a CUDA graph, replayed while cache_seqlens changes on the
# device: the automatic split (num_splits=0) depends on host-known shapes only.

def test_cuda_graph_replay_with_changing_cache_seqlens():
    g = generator("graph")
    dtype, batch, h, hk, d, page_size = torch.bfloat16, 3, 8, 2, 128, 64
    capacity = 6000
    steps = [[5, 700, 3000], [5990, 0, 64], [1, 2, 4096]]
    q = torch.empty((batch, 1, h, d), dtype=dtype, device=DEVICE)
    k = torch.empty((batch, 1, hk, d), dtype=dtype, device=DEVICE)
    v = torch.empty_like(k)
    seqlens = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    cos, sin = rotary_tables(capacity + 1, d // 2, g, dtype)
    cache = Cache(g, batch, capacity + 1, hk, d, dtype, [0] * batch, [0] * batch,
                  page_size=page_size)

    def step():
        return flashcute.flash_attn_with_kvcache(
            q, cache.k, cache.v, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
            block_table=cache.block_table, causal=True, rotary_interleaved=False,
            return_softmax_lse=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture, as CUDA graphs ask
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for n, lengths in enumerate(steps):
        # Fresh contents in the captured buffers: the cache refilled through the captured block
        # table, new q, k and v, new lengths.
        cache.k.fill_(NAN)
        cache.v.fill_(NAN)
        for b, length in enumerate(lengths):
            cache.write(b, 0, randn((length, hk, d), g, dtype), randn((length, hk, d), g, dtype))
        for t in (q, k, v):
            t.copy_(randn(t.shape, g, dtype))
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(NAN)
        lse.fill_(NAN)
        before_k, before_v = cache.k.clone(), cache.v.clone()
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse, ref_k, ref_v, written = kvcache_attention(
            q, before_k, before_v, lengths, k=k, v=v, block_table=cache.block_table,
            rotary=(cos, sin, False), scale=default_scale(d), causal=True)
        values = [sequence_keys(ref_k, ref_v, b, 0, lengths[b] + 1, None, cache.block_table)[1]
                  for b in range(batch)]
        what = f"replay {n} cache_seqlens {lengths} seed={SEED}"
        assert_outputs(out, lse, ref_out, ref_lse, values, dtype, 0.0, what)
        assert_cache(cache.k, ref_k, written, True, dtype, f"{what} k_cache")
        assert_cache(cache.v, ref_v, written, False, dtype, f"{what} v_cache")


# ---------------------------------------------------------------------------------------------
# The device-memory contract under debug_checks, and repeatability.

@pytest.mark.parametrize("broken", ["cache_seqlens", "cache_leftpad", "block_table",
                                    "cache_batch_idx"])
def test_debug_checks_name_the_array_and_write_nothing(broken):
    g = generator("debug", broken)
    dtype, batch, h, hk, d = torch.float16, 2, 4, 2, 64
    paged = broken == "block_table"
    cache = Cache(g, batch, 200, hk, d, dtype, [10, 20], [0, 0], page_size=64 if paged else None,
                  batch_idx=broken == "cache_batch_idx")
    seqlens = torch.tensor([10, 20], dtype=torch.int32, device=DEVICE)
    leftpad = None
    if broken == "cache_seqlens":
        seqlens[1] = 10_000  # past the capacity
    elif broken == "cache_leftpad":
        leftpad = torch.tensor([0, 25], dtype=torch.int32, device=DEVICE)  # past the keys
    elif broken == "block_table":
        cache.block_table[1, 0] = cache.k.shape[0] + 5  # no such page
    else:
        cache.cache_batch_idx[0] = cache.k.shape[0]  # no such row
    q = randn((batch, 1, h, d), g, dtype)
    k, v = randn((batch, 1, hk, d), g, dtype), randn((batch, 1, hk, d), g, dtype)
    before_k, before_v = cache.k.clone(), cache.v.clone()
    with pytest.raises(flashcute.InvalidArgumentError, match=broken):
        flashcute.flash_attn_with_kvcache(
            q, cache.k, cache.v, k, v, cache_seqlens=seqlens,
            cache_batch_idx=cache.cache_batch_idx, cache_leftpad=leftpad,
            block_table=cache.block_table, debug_checks=True)
    assert torch.equal(bits(cache.k), bits(before_k)) and torch.equal(bits(cache.v),
                                                                      bits(before_v))


@pytest.mark.parametrize("num_splits", [0, 1, 5])
def test_repeated_calls_are_bitwise_identical(num_splits):
    g = generator("repeat", num_splits)
    dtype, batch, h, hk, d = torch.bfloat16, 3, 16, 2, 128
    cache = Cache(g, batch, 5000, hk, d, dtype, [4000, 17, 2500], [0] * batch, page_size=16)
    q = randn((batch, 4, h, d), g, dtype)
    seqlens = torch.tensor([4000, 17, 2500], dtype=torch.int32, device=DEVICE)
    first = None
    for _ in range(3):
        out, lse = flashcute.flash_attn_with_kvcache(
            q, cache.k, cache.v, cache_seqlens=seqlens, block_table=cache.block_table,
            causal=True, num_splits=num_splits, return_softmax_lse=True)
        if first is None:
            first = (out, lse)
        else:
            assert torch.equal(bits(out), bits(first[0])) and torch.equal(lse, first[1])


def test_runs_on_a_side_stream():
    q, cache, k, v, seqlens = _small_decode(generator("stream"))
    first_k, first_v = cache.k.clone(), cache.v.clone()
    expected = flashcute.flash_attn_with_kvcache(q, first_k, first_v, k, v, cache_seqlens=seqlens,
                                                 causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = flashcute.flash_attn_with_kvcache(q, cache.k, cache.v, k, v, cache_seqlens=seqlens,
                                                causal=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(expected))
    assert torch.equal(bits(cache.k), bits(first_k)) and torch.equal(bits(cache.v), bits(first_v))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_device():
    q, cache, k, v, seqlens = _small_decode(generator("device"))
    expected = flashcute.flash_attn_with_kvcache(q, cache.k.clone(), cache.v.clone(), k, v,
                                                 cache_seqlens=seqlens)
    other = torch.device("cuda", (DEVICE.index + 1) % torch.cuda.device_count())
    moved = [t.to(other) for t in (q, cache.k, cache.v, k, v, seqlens)]
    out = flashcute.flash_attn_with_kvcache(*moved[:5], cache_seqlens=moved[5])
    torch.cuda.synchronize(other)
    assert out.device == other and torch.equal(bits(out.to(DEVICE)), bits(expected))


def test_empty_batch_launches_nothing():
    q = torch.empty((0, 1, 8, 64), dtype=torch.float16, device=DEVICE)
    cache = torch.zeros((2, 32, 2, 64), dtype=torch.float16, device=DEVICE)
    seqlens = torch.empty((0,), dtype=torch.int32, device=DEVICE)
    out, lse = flashcute.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=seqlens,
                                                 return_softmax_lse=True)
    assert out.shape == (0, 1, 8, 64) and lse.shape == (0, 8, 1)


# ---------------------------------------------------------------------------------------------
# torch integration: the custom op, torch.compile, autograd; and CuPy arrays.

def _small_decode(g, dtype=torch.bfloat16):
    cache = Cache(g, 2, 300, 2, 64, dtype, [100, 250], [0, 0])
    q = randn((2, 1, 8, 64), g, dtype)
    k, v = randn((2, 1, 2, 64), g, dtype), randn((2, 1, 2, 64), g, dtype)
    seqlens = torch.tensor([100, 250], dtype=torch.int32, device=DEVICE)
    return q, cache, k, v, seqlens


def test_opcheck():
    q, cache, k, v, seqlens = _small_decode(generator("opcheck"))
    cache.k.nan_to_num_(0.0)  # opcheck compares runs of the op, whose NaN slots it cannot equate
    cache.v.nan_to_num_(0.0)
    args = (q, cache.k, cache.v, k, v, None, None, seqlens, 0, None, None, None, None, 0, None,
            0.125, True, -1, -1, 0.0, True, 0, True, False, 0)
    torch.library.opcheck(torch.ops.flashcute.kvcache.default, args)


def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def decode(q, k_cache, v_cache, k, v, seqlens):
        out, lse = flashcute.flash_attn_with_kvcache(q * 1.0, k_cache, v_cache, k, v,
                                                     cache_seqlens=seqlens, causal=True,
                                                     return_softmax_lse=True)
        return out * 2, lse  # exact, so compiled and eager must agree bitwise

    compiled = torch.compile(decode, fullgraph=True, backend="aot_eager")
    q, cache, k, v, seqlens = _small_decode(generator("compile"))
    eager_k, eager_v = cache.k.clone(), cache.v.clone()
    eager = decode(q, eager_k, eager_v, k, v, seqlens)
    got = compiled(q, cache.k, cache.v, k, v, seqlens)
    torch.testing.assert_close(got[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], eager[1], rtol=0, atol=0)
    # The compiled call wrote the new keys into the caches it was given, as eager does.
    assert torch.equal(bits(cache.k), bits(eager_k)) and torch.equal(bits(cache.v), bits(eager_v))


def test_no_gradient():
    q, cache, k, v, seqlens = _small_decode(generator("grad"))
    q.requires_grad_()
    out = flashcute.flash_attn_with_kvcache(q, cache.k, cache.v, k, v, cache_seqlens=seqlens)
    with pytest.raises(RuntimeError, match="autograd"):
        out.float().sum().backward()


def test_cupy_arrays_append_in_place():
    cupy = pytest.importorskip("cupy")
    g = generator("cupy")
    q, cache, k, v, seqlens = _small_decode(g, torch.float16)
    expected_k, expected_v = cache.k.clone(), cache.v.clone()
    ref = flashcute.flash_attn_with_kvcache(q, expected_k, expected_v, k, v,
                                            cache_seqlens=seqlens, causal=True)
    torch.cuda.synchronize()
    as_cupy = [cupy.from_dlpack(t) for t in (q, cache.k, cache.v, k, v, seqlens)]
    out = flashcute.flash_attn_with_kvcache(*as_cupy[:5], cache_seqlens=as_cupy[5], causal=True)
    assert isinstance(out, cupy.ndarray)
    cupy.cuda.get_current_stream().synchronize()
    assert torch.equal(bits(torch.from_dlpack(out)), bits(ref))
    # The CuPy arrays share the torch caches' memory: the keys were written there.
    assert torch.equal(bits(cache.k), bits(expected_k)) and torch.equal(bits(cache.v),
                                                                        bits(expected_v))


def test_case_list_covers_every_value():
    # Sanity of the selection above (cheap): every value of every list appears.
    for name, values in FACTORS.items():
        assert {repr(c[name]) for c in CASES} == {repr(x) for x in values}, name
    assert math.prod(len(v) for v in FACTORS.values()) > len(CASES)

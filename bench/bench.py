#!/usr/bin/env python3
"""Times flashcute against PyTorch SDPA's backends and writes bench/results/<gpu>.json.

Every implementation is timed the same way, in this one process: the same input buffers each call
(warm L2), `--warmup` calls, then the median of at least `--iters` calls, each between two CUDA
events. A GPU sleep queued before the timed calls lets the CPU enqueue them all ahead of the GPU,
so host overhead (Python checks, dispatch) never shows as GPU time, for us or for PyTorch; warm-up
calls queued behind the sleep keep the GPU busy for at least SETTLE_MS before the first timed call,
and the timed calls span at least SPAN_MS of GPU time, so that their median is a call in the state
sustained work puts the GPU in, whose clock swings over about a second under the power limit. Each
row times every implementation `--rounds` times in rotating order and keeps the median, and a few
seconds of GEMMs before the first row bring the clock up from idle, so that no implementation is
measured in a moment the others do not share.

bench/README.md describes the JSON. Implementations: "ours" (the library's own choice of kernel),
"ours_sm80" / "ours_sm90" (a forced family, when it has kernels for the row), "torch_flash",
"torch_cudnn", "torch_efficient" (SDPA with that backend forced), and "fa3" (FlashAttention-3's
forward, bench/fa3_peer.py) when FLASHCUTE_FA3_LIB names its library. One that cannot run a row is
left out of it. Feature rows carry "kind": gqa, varlen, varlen_short, window, lse, softcap and alibi
(ours with the score modifier, beside "ours_plain": the same call without it), bwd (the backward:
ours and SDPA's flash and cuDNN backends through autograd) and decode (one query against a KV
cache: flash_attn_with_kvcache, contiguous and paged, against SDPA; GB/s of cache read); bwd and
decode are measured only when asked for (--kinds).

Usage: python3 bench/bench.py [--kinds KIND,...] [--quick] [--rows REGEX] [--out DIR_OR_FILE.json]
The library comes from the installed flashcute wheel, or FLASHCUTE_LIB=/path/libflashcute.so with
the package taken from this repository's python/ folder.
"""

import argparse
import contextlib
import datetime
import json
import math
import os
import pathlib
import random
import re
import statistics
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent

try:
    import flashcute
    from flashcute import mask
except ImportError:
    sys.path.insert(0, str(REPO / "python"))
    import flashcute
    from flashcute import mask

sys.path.insert(0, str(HERE))
import fa3_peer  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# FlashAttention-3's forward (bench/fa3_peer.py), when FLASHCUTE_FA3_LIB names its library: the
# "fa3" column of these kinds' rows.
FA3 = fa3_peer.load()
FA3_KINDS = ("plain", "gqa", "varlen", "varlen_short")
PEERS = {
    "torch_flash": SDPBackend.FLASH_ATTENTION,
    "torch_cudnn": SDPBackend.CUDNN_ATTENTION,
    "torch_efficient": SDPBackend.EFFICIENT_ATTENTION,
}
# Ours is checked against a peer's output before its time counts: a wrong kernel posts no number.
CHECK_REL_L2 = 3e-2
# (name, family) of our implementations; "ours" is the library's own choice.
OUR_FAMILIES = (("ours", "auto"), ("ours_sm80", "sm80"), ("ours_sm90", "sm90"))
# The backward's peers: SDPA's backward through autograd on these backends.
BWD_PEERS = ("torch_flash", "torch_cudnn")
# The backward does about 2.5 times the forward's matrix-multiply work (5 GEMMs against 2).
BWD_FLOPS_FACTOR = 2.5
# Decode rows: (batch, cached keys) for h 32, d 128, bf16, with hk 8 and 32; the paged cache's page.
DECODE_SHAPES = ((1, 32768), (1, 131072), (32, 4096), (32, 32768), (128, 8192))
DECODE_HEADS_K = (8, 32)
DECODE_PAGE_SIZE = 64
# Score-modifier rows: softcap (Gemma-2's value) or ALiBi with the standard geometric slopes.
MODIFIER_KINDS = ("softcap", "alibi")
SOFTCAP = 30.0


# ---------------------------------------------------------------------------------------------
# Rows

def row(b, s, h, d, causal, dtype="bf16", hk=None, **extra):
    return dict(b=b, sq=s, sk=s, h=h, hk=hk or h, d=d, causal=causal, dtype=dtype, **extra)


def plain_rows():
    rows = [row(4, 8192, 16, 128, causal, dtype) for dtype in ("bf16", "fp16")
            for causal in (False, True)]
    for d in (64, 128, 256):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            for causal in (False, True):
                rows.append(row(16384 // s, s, 2048 // d, d, causal))
    return rows


VARLEN_LENGTHS = [8192, 512, 3000, 6100, 128, 4096, 7777, 1024, 2500, 5000, 300, 8000]
# Many short sequences (where a tile's start and end weigh most): 64 drawn, seeded, from these.
VARLEN_SHORT_LENGTHS = random.Random(0).choices([64, 100, 200, 333, 512, 700, 1024], k=64)
VARLEN_KINDS = ("varlen", "varlen_short")
WINDOWS = [(256, 0, True), (1024, 0, True), (4096, 0, True), (1024, 1024, False)]


def feature_rows():
    rows = []
    for causal in (False, True):
        # 8:1 grouped-query attention; the MHA row with the same b, s, h, d is in the sweep.
        rows.append(row(2, 8192, 16, 128, causal, hk=2, kind="gqa"))
    for causal in (False, True):
        rows.append(row(len(VARLEN_LENGTHS), max(VARLEN_LENGTHS), 16, 128, causal, kind="varlen",
                        seqlens=VARLEN_LENGTHS))
    for causal in (False, True):
        rows.append(row(len(VARLEN_SHORT_LENGTHS), max(VARLEN_SHORT_LENGTHS), 16, 128, causal,
                        kind="varlen_short", seqlens=VARLEN_SHORT_LENGTHS))
    for left, right, causal in WINDOWS:
        rows.append(row(1, 16384, 16, 128, causal, kind="window", window=[left, right]))
    for causal in (False, True):
        rows.append(row(4, 8192, 16, 128, causal, kind="lse"))
    for kind in MODIFIER_KINDS:
        for causal in (False, True):
            rows.append(row(2, 8192, 16, 128, causal, kind=kind))
    return rows


def bwd_rows():
    """The backward, bf16: the seed default, the 36 sweep shapes and a 4:1 GQA shape."""
    shapes = [(4, 8192, 16, 128, None)]
    for d in (64, 128, 256):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            shapes.append((16384 // s, s, 2048 // d, d, None))
    shapes.append((2, 8192, 32, 128, 8))
    return [row(b, s, h, d, causal, hk=hk, kind="bwd") for b, s, h, d, hk in shapes
            for causal in (False, True)]


def decode_rows():
    """One query token per sequence against a KV cache of sk keys (sq 1, h 32, d 128, bf16)."""
    return [dict(b=b, sq=1, sk=sk, h=32, hk=hk, d=128, causal=False, dtype="bf16", kind="decode")
            for b, sk in DECODE_SHAPES for hk in DECODE_HEADS_K]


def kind_of(r):
    return r.get("kind", "plain")


# Every kind bench.py measures, and those a run measures unless --kinds names others: the backward
# (40 rows, some 3 to 5 minutes on an H200) and decode only when asked for.
KINDS = ("plain", "gqa", "varlen", "varlen_short", "window", "lse", "softcap", "alibi", "bwd",
         "decode")
DEFAULT_KINDS = tuple(k for k in KINDS if k not in ("bwd", "decode"))


def all_rows():
    return plain_rows() + feature_rows() + bwd_rows() + decode_rows()


def is_quick(r):
    """Whether --quick keeps the row: the seed default, one short row, one causal row per kind."""
    kind = kind_of(r)
    if kind == "bwd":
        return (r["b"], r["sq"], r["h"]) == (4, 8192, 16)
    if kind == "decode":
        return (r["b"], r["sk"]) == (32, 4096)
    seed = (r["b"], r["sq"], r["h"]) == (4, 8192, 16) and r["dtype"] == "bf16" and kind == "plain"
    small = r["d"] == 64 and r["sq"] == 1024 and not r["causal"] and kind == "plain"
    feature = kind != "plain" and (kind != "window" or r["window"] == [1024, 0])
    return seed or small or (feature and r["causal"])


def quick_rows():
    return [r for r in plain_rows() + feature_rows() if is_quick(r)]


def label(r):
    extra = ""
    if r.get("kind") == "window":
        extra = f" w{r['window'][0]},{r['window'][1]}"
    name = r.get("kind", "plain")
    lengths = f"s{r['sq']}" if r["sq"] == r["sk"] else f"s{r['sq']}x{r['sk']}"
    return (f"{name} b{r['b']} {lengths} h{r['h']}/{r['hk']} d{r['d']} {r['dtype']} "
            f"{'causal' if r['causal'] else 'full'}{extra}")


def flops(r):
    """4 b h sq sk d, halved for causal when sq == sk; windows count the pairs
    they keep and varlen rows sum over their sequences (padding does no useful work); the backward
    is rated at 2.5 times its forward."""
    kind = r.get("kind")
    if kind == "bwd":
        return BWD_FLOPS_FACTOR * dense_flops(r)
    if kind == "window":
        pairs = mask.visible_pairs(r["sq"], r["sk"], r["causal"], tuple(r["window"]))
        return 4 * r["b"] * r["h"] * r["d"] * pairs
    if kind in VARLEN_KINDS:
        total = sum(4 * r["h"] * n * n * r["d"] for n in r["seqlens"])
        return total / 2 if r["causal"] else total
    return dense_flops(r)


def dense_flops(r):
    total = 4 * r["b"] * r["h"] * r["sq"] * r["sk"] * r["d"]
    return total / 2 if r["causal"] and r["sq"] == r["sk"] else total


def decode_bytes(r):
    """The bytes of K and V cache a decode row reads: each cached element once, whatever the
    layout (2 bytes each, bf16 or fp16)."""
    return 2 * r["b"] * r["sk"] * r["hk"] * r["d"] * 2


# ---------------------------------------------------------------------------------------------
# Timing

# Under sustained work the GPU's power limit sets its clock, and the clock does not hold still:
# after an idle spell a call runs up to 10% faster for its first ~0.1 s, and then, call after call
# of the same kernel, the time a call takes swings by 5-15% over periods of about a second (H100
# at its 700 W limit, bench/clock_probe.py --trace; bench/NOTES.md). Twenty calls in a row sample
# one moment of that swing. The timed calls therefore follow SETTLE_MS of untimed ones and span
# SPAN_MS of GPU time, and their median is the sustained state's typical call.
SETTLE_MS = 300.0
SPAN_MS = 1000.0
# Calls the host queues more slowly than the GPU runs them (a decode call of some microseconds)
# need a GPU sleep as long as the host's lag over every queued call; fewer of them are queued, so
# that the sleep stays under this.
MAX_SLEEP_S = 0.5


def queued_call_ms(fn, warmup, iters, span_ms=SPAN_MS):
    """GPU milliseconds of the timed calls of fn, in call order, each between two CUDA events:
    at least `iters` calls and `span_ms` of GPU time. They queue behind a GPU sleep together with
    the warm-up calls that precede them: at least `warmup` calls and SETTLE_MS of GPU time. The
    sleep (at least 0.1 s) gives the host twice the lead it needs so that the GPU never waits for
    it; where that would pass MAX_SLEEP_S, both kinds of calls are cut in proportion."""
    for _ in range(warmup):  # the first calls may allocate or initialise
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host_start = time.perf_counter()
    start.record()
    for _ in range(warmup):
        fn()
    end.record()
    host_s = (time.perf_counter() - host_start) / warmup
    torch.cuda.synchronize()
    gpu_ms = max(start.elapsed_time(end) / warmup, 1e-3)
    settle = max(warmup, math.ceil(SETTLE_MS / gpu_ms))
    timed = max(iters, math.ceil(span_ms / gpu_ms))
    # Events around each timed call cost the host some 20 us more than the warm-up calls.
    lag_s = max(0.0, host_s + 2e-5 - gpu_ms / 1e3)
    room = max(warmup + iters, int(MAX_SLEEP_S / (2 * lag_s))) if lag_s > 0 else settle + timed
    if settle + timed > room:
        settle = max(warmup, room * settle // (settle + timed))
        timed = max(iters, room - settle)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(timed)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(timed)]
    sleep_s = max(0.1, 2 * lag_s * (settle + timed))
    torch.cuda._sleep(int(sleep_s * 2e9))  # cycles, at about 2 GHz
    for _ in range(settle):
        fn()
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def median_ms(fn, warmup, iters):
    return statistics.median(queued_call_ms(fn, warmup, iters))


def warm_up_gpu(seconds=3.0):
    """Runs bf16 GEMMs for about `seconds`, so that the first row does not meet an idle clock."""
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    elapsed_ms = 0.0
    while elapsed_ms < seconds * 1e3:
        start.record()
        for _ in range(20):
            x @ x
        end.record()
        end.synchronize()
        elapsed_ms += start.elapsed_time(end)


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ---------------------------------------------------------------------------------------------
# One row

def make_inputs(r, gen):
    dtype = DTYPES[r["dtype"]]
    shape_q = (r["b"], r["sq"], r["h"], r["d"])
    shape_k = (r["b"], r["sk"], r["hk"], r["d"])
    q = torch.randn(shape_q, generator=gen, device="cuda", dtype=dtype)
    k = torch.randn(shape_k, generator=gen, device="cuda", dtype=dtype)
    v = torch.randn(shape_k, generator=gen, device="cuda", dtype=dtype)
    return q, k, v


def our_callables(r, q, k, v):
    """name -> zero-argument callable returning the output, for each family that has kernels."""
    kind = r.get("kind")
    window = tuple(r["window"]) if kind == "window" else (-1, -1)
    options = dict(causal=r["causal"], window_size=window, return_lse=kind == "lse")
    calls = {}
    for name, family in OUR_FAMILIES:
        if family != "auto" and not flashcute.compiled_tile_configs(family, r["dtype"], r["d"]):
            continue
        calls[name] = (
            lambda fam: lambda: flashcute.forward(q, k, v, family=fam, **options))(family)
    return calls


def packed(r, q, k, v):
    """Each sequence's first n tokens of the padded buffers, packed: (q, k, v, int32 cu_seqlens,
    longest sequence)."""
    lengths = r["seqlens"]
    cu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    qp, kp, vp = (torch.cat([x[i, :n] for i, n in enumerate(lengths)]) for x in (q, k, v))
    return qp, kp, vp, cu, max(lengths)


def varlen_callables(r, q, k, v, packing):
    """Ours over the packed sequences (`packing`, from packed()); ours_padded runs the padded batch
    q, k, v as a dense call."""
    qp, kp, vp, cu, longest = packing
    calls = {}
    for name, family in OUR_FAMILIES:
        if family != "auto" and not flashcute.compiled_tile_configs(family, r["dtype"], r["d"]):
            continue
        calls[name] = (lambda fam: lambda: flashcute.forward(
            qp, kp, vp, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
            max_seqlen_k=longest, causal=r["causal"], family=fam))(family)
    calls["ours_padded"] = lambda: flashcute.forward(q, k, v, causal=r["causal"])
    return calls


def fa3_callable(r, q, k, v, packing=None):
    """FlashAttention-3 on the row (on `packing`, from packed(), for the varlen kinds), or None
    where it has no kernel."""
    if FA3 is None or kind_of(r) not in FA3_KINDS or not FA3.supports(q.dtype, r["d"]):
        return None
    if packing is not None:
        qp, kp, vp, cu, longest = packing
        return lambda: FA3.forward(qp, kp, vp, r["causal"], cu_seqlens=cu, max_seqlen=longest)
    return lambda: FA3.forward(q, k, v, r["causal"])


def peer_callable(r, q, k, v):
    """SDPA on (B, H, S, D) views of the same buffers; windows become an explicit mask."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    kwargs = dict(is_causal=r["causal"])
    if r["h"] != r["hk"]:
        kwargs["enable_gqa"] = True
    if r.get("kind") == "window":
        keep = mask.keep_matrix(r["sq"], r["sk"], r["causal"], tuple(r["window"]), xp=torch,
                                device="cuda")
        kwargs = dict(attn_mask=keep)
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, **kwargs).transpose(1, 2)


def alibi_slopes(heads):
    """ALiBi's slopes for `heads` heads: 2^(-8 (i + 1) / heads), fp32 on the GPU."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)],
                        dtype=torch.float32, device="cuda")


def modifier_options(r):
    if r["kind"] == "softcap":
        return dict(softcap=SOFTCAP)
    return dict(alibi_slopes=alibi_slopes(r["h"]))


def modifier_reference(r, q, k, v, options):
    """fp32 attention with the row's softcap or ALiBi (bottom-right aligned, as flashcute's
    default), one (sequence, head) at a time: (b, sq, h, d)."""
    sq, sk = r["sq"], r["sk"]
    scale = r["d"] ** -0.5
    distance = (torch.arange(sq, device="cuda")[:, None] + (sk - sq)
                - torch.arange(sk, device="cuda")[None, :])
    out = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    for b in range(r["b"]):
        for h in range(r["h"]):
            hk = h * r["hk"] // r["h"]
            s = (q[b, :, h].float() @ k[b, :, hk].float().T) * scale
            if "softcap" in options:
                s = options["softcap"] * torch.tanh(s / options["softcap"])
            if "alibi_slopes" in options:
                s -= options["alibi_slopes"][h] * distance.abs()
            if r["causal"]:
                s.masked_fill_(distance < 0, float("-inf"))
            out[b, :, h] = torch.softmax(s, dim=-1) @ v[b, :, hk].float()
    return out


def run_modifier_row(r, args, log):
    """Softcap or ALiBi: ours per family against an fp32 reference (no SDPA backend takes either
    modifier), and ours_plain, the automatic choice without the modifier on the same inputs."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, k, v = make_inputs(r, gen)
    options = modifier_options(r)
    reference = modifier_reference(r, q, k, v, options)
    work = flops(r)
    timed = {}
    for name, family in OUR_FAMILIES:
        if family != "auto" and not flashcute.compiled_tile_configs(family, r["dtype"], r["d"]):
            continue
        fn = (lambda fam: lambda: flashcute.forward(q, k, v, causal=r["causal"], family=fam,
                                                     **options))(family)
        try:
            err = rel_l2(fn(), reference)
        except (flashcute.FlashCuteError, ValueError) as error:
            log(f"  {name}: left out ({error})")
            continue
        if not err <= CHECK_REL_L2:
            log(f"  {name}: WRONG (relative L2 {err:.3g} against fp32): not timed")
            continue
        timed[name] = (fn, contextlib.nullcontext, work)
    del reference
    timed["ours_plain"] = (lambda: flashcute.forward(q, k, v, causal=r["causal"]),
                           contextlib.nullcontext, work)
    return time_row(r, timed, args, log)


def run_row(r, args, log):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, k, v = make_inputs(r, gen)
    work = flops(r)
    # name -> (callable, context manager factory, FLOPs it is rated by)
    timed, peer_out = peer_timings(r, q, k, v, PEERS, work, log)
    peer_out = None if r.get("kind") in VARLEN_KINDS else peer_out  # the padded batch differs

    varlen = r.get("kind") in VARLEN_KINDS
    packing = packed(r, q, k, v) if varlen else None
    ours = varlen_callables(r, q, k, v, packing) if varlen else our_callables(r, q, k, v)
    fa3 = fa3_callable(r, q, k, v, packing)
    if fa3 is not None:
        ours["fa3"] = fa3
    reference, reference_name = peer_out, "SDPA"
    for name, fn in ours.items():
        try:
            out = fn()
            torch.cuda.synchronize()
        except (flashcute.FlashCuteError, ValueError, RuntimeError) as error:
            log(f"  {name}: left out ({error})")
            continue
        out = out[0] if isinstance(out, tuple) else out
        if reference is not None and name != "ours_padded":
            err = rel_l2(out, reference)
            if not err <= CHECK_REL_L2:
                log(f"  {name}: WRONG (relative L2 {err:.3g} against {reference_name}): "
                    "not timed")
                continue
        if reference is None and name == "ours":
            # Packed rows have no SDPA output: the columns after ours (FlashAttention-3 among
            # them) are checked against ours, which the test suite checks against fp32.
            reference, reference_name = out, "ours"
        del out
        # The padded varlen batch is rated by the work it does (padding included), so that
        # ours / ours_padded compares per-FLOP rates; every other column counts useful work.
        rated = dense_flops(r) if name == "ours_padded" else work
        timed[name] = (fn, contextlib.nullcontext, rated)
    return time_row(r, timed, args, log)


def peer_timings(r, q, k, v, peers, work, log):
    """SDPA with each backend of `peers` (name -> SDPBackend) that runs the row: name ->
    (callable, backend context factory, work), and the first backend's output (None if none)."""
    timed, peer_out = {}, None
    for name, backend in peers.items():
        fn = peer_callable(r, q, k, v)
        context = (lambda b: lambda: sdpa_kernel(b))(backend)
        # SDPA explains a refusal in warnings and then raises "No available kernel".
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with context():
                    out = fn()
                    torch.cuda.synchronize()
            except RuntimeError as error:
                reasons = [str(w.message).splitlines()[0] for w in caught] + [str(error)]
                log(f"  {name}: left out ({'; '.join(reasons)[:200]})")
                continue
        timed[name] = (fn, context, work)
        if peer_out is None:
            peer_out = out
        else:
            del out
    return timed, peer_out


# Decode: SDPA's backends that the decode rows compare with.
DECODE_PEERS = {name: PEERS[name] for name in ("torch_cudnn", "torch_flash")}


def paged_copy(k, v, page_size, gen):
    """k and v (b, sk, hk, d) copied into pages of page_size slots, in shuffled order: (k pages,
    v pages, block table (b, sk / page_size) int32)."""
    b, sk, hk, d = k.shape
    per_seq = sk // page_size
    table = torch.randperm(b * per_seq, generator=gen, device=k.device).to(torch.int32)
    table = table.view(b, per_seq)
    pages = []
    for t in (k, v):
        paged = torch.empty((b * per_seq, page_size, hk, d), dtype=t.dtype, device=t.device)
        paged[table.flatten().long()] = t.view(b * per_seq, page_size, hk, d)
        pages.append(paged)
    return pages[0], pages[1], table


def decode_callables(r, q, k, v, gen):
    """ours (the contiguous cache), ours_paged (pages of DECODE_PAGE_SIZE, shuffled block table)
    and ours_sm80 (the family forced), each cache_seqlens = sk as a device tensor."""
    seqlens = torch.full((r["b"],), r["sk"], dtype=torch.int32, device=q.device)
    pk, pv, table = paged_copy(k, v, DECODE_PAGE_SIZE, gen)
    options = dict(cache_seqlens=seqlens, causal=r["causal"])
    return {
        "ours": lambda: flashcute.flash_attn_with_kvcache(q, k, v, **options),
        "ours_paged": lambda: flashcute.flash_attn_with_kvcache(q, pk, pv, block_table=table,
                                                                **options),
        "ours_sm80": lambda: flashcute.flash_attn_with_kvcache(q, k, v, family="sm80",
                                                               **options),
    }


def run_decode_row(r, args, log):
    """One query per sequence against a (b, sk, hk, d) cache: SDPA on (b, h, 1, d) against the
    cache's (b, hk, sk, d) view (enable_gqa when hk < h), ours through flash_attn_with_kvcache.
    Rated in GB/s of cache read (decode_bytes)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, k, v = make_inputs(r, gen)
    work = decode_bytes(r)
    timed, peer_out = peer_timings(r, q, k, v, DECODE_PEERS, work, log)
    for name, fn in decode_callables(r, q, k, v, gen).items():
        try:
            out = fn()
            torch.cuda.synchronize()
        except (flashcute.FlashCuteError, ValueError, TypeError, NotImplementedError) as error:
            log(f"  {name}: left out ({error})")
            continue
        if peer_out is not None:
            err = rel_l2(out, peer_out)
            if not err <= CHECK_REL_L2:
                log(f"  {name}: WRONG (relative L2 {err:.3g} against SDPA): not timed")
                continue
        del out
        timed[name] = (fn, contextlib.nullcontext, work)
    return time_row(r, timed, args, log, figure="gbps", unit=1e9)


def bwd_peer_callables(r, q, k, v, dout, log):
    """SDPA's backward through autograd, per backend that runs the row: (B, H, S, D) leaf copies of
    q, k, v with requires_grad, a forward once under that backend, then the timed call
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True). Returns name -> callable and the
    first backend's (dq, dk, dv) as (B, S, H, D) views, or None when no backend runs the row."""
    leaves = [t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
    dout_t = dout.transpose(1, 2).contiguous()
    kwargs = dict(is_causal=r["causal"])  # top-left; the same as bottom-right here (sq == sk)
    if r["h"] != r["hk"]:
        kwargs["enable_gqa"] = True
    calls, reference = {}, None
    for name in BWD_PEERS:
        # SDPA explains a refusal in warnings and then raises "No available kernel".
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(PEERS[name]):
                    out = F.scaled_dot_product_attention(*leaves, **kwargs)
                # The backward runs the kernel the forward chose; no backend context is needed.
                grads = torch.autograd.grad(out, leaves, dout_t, retain_graph=True)
                torch.cuda.synchronize()
            except RuntimeError as error:
                reasons = [str(w.message).splitlines()[0] for w in caught] + [str(error)]
                log(f"  {name}: left out ({'; '.join(reasons)[:200]})")
                continue
        calls[name] = (lambda o: lambda: torch.autograd.grad(o, leaves, dout_t,
                                                             retain_graph=True))(out)
        if reference is None:
            reference = [g.transpose(1, 2) for g in grads]
        del grads
    return calls, reference


def bwd_our_callable(backward, q, k, v, dout, causal, family):
    """Our forward once (with the LSE), then a callable that runs the backward alone."""
    out, lse = flashcute.forward(q, k, v, causal=causal, return_lse=True, family=family)
    return lambda: backward(dout, q, k, v, out, lse, causal=causal, family=family)


def run_bwd_row(r, args, log):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, k, v = make_inputs(r, gen)
    dout = torch.randn(q.shape, generator=gen, device=q.device, dtype=q.dtype)
    work = flops(r)
    # name -> (callable, context manager factory, FLOPs it is rated by)
    timed = {}
    peers, reference = bwd_peer_callables(r, q, k, v, dout, log)
    for name, fn in peers.items():
        timed[name] = (fn, contextlib.nullcontext, work)

    backward = getattr(flashcute, "backward", None)
    families = OUR_FAMILIES
    if backward is None:
        log("  ours: left out (this flashcute has no backward)")
        families = ()
    for name, family in families:
        if family != "auto" and not flashcute.compiled_tile_configs(family, r["dtype"], r["d"]):
            continue
        try:
            fn = bwd_our_callable(backward, q, k, v, dout, r["causal"], family)
            grads = fn()
            torch.cuda.synchronize()
        except (flashcute.FlashCuteError, ValueError, NotImplementedError) as error:
            log(f"  {name}: left out ({error})")
            continue
        if reference is not None:
            errors = [rel_l2(g, ref) for g, ref in zip(grads, reference)]
            if not max(errors) <= CHECK_REL_L2:
                log(f"  {name}: WRONG (relative L2 of dq, dk, dv against SDPA "
                    f"{', '.join(f'{e:.3g}' for e in errors)}): not timed")
                continue
        del grads
        timed[name] = (fn, contextlib.nullcontext, work)
    return time_row(r, timed, args, log)


def time_row(r, timed, args, log, figure="tflops", unit=1e12):
    """Times `timed` (name -> (callable, context factory, work)) and returns the row's entry, with
    `figure` = work / seconds / unit per implementation (FLOPs and TFLOP/s unless told)."""
    # The clock and power state drift while a row runs, so no implementation may own one moment:
    # each round times every implementation once, the order rotating between rounds, and a
    # figure is the median of its rounds.
    names = list(timed)
    samples = {name: [] for name in names}
    for round_index in range(args.rounds):
        shift = round_index % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            fn, context, _ = timed[name]
            with context():
                samples[name].append(median_ms(fn, args.warmup, args.iters))
    rates = {name: [timed[name][2] / (ms * 1e-3) / unit for ms in samples[name]] for name in names}
    log("  rounds: " + "; ".join(f"{name} " + " ".join(f"{v:.0f}" for v in rates[name])
                                 for name in names))
    entry = {key: value for key, value in r.items()}
    entry[figure] = {name: round(statistics.median(rates[name]), 1) for name in names}
    return entry


# ---------------------------------------------------------------------------------------------
# Output

def commit_sha():
    if os.environ.get("FLASHCUTE_COMMIT"):
        return os.environ["FLASHCUTE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def gpu_slug(name):
    slug = re.sub(r"^nvidia\s+", "", name.strip().lower())
    return re.sub(r"[^a-z0-9]+", "_", slug).strip("_") or "gpu"


def results_document(header, results, base=None):
    """The results file's content: the header's fields and these rows; with base (the document
    of --merge) its rows instead, those of the labels measured now replaced. Each merged row names
    the commit and date it was measured at, since the file's own fields stay those of the earlier
    run."""
    if base is None:
        return dict(header, rows=list(results))
    measured = {label(r) for r in results}
    merged = [dict(r, commit=header["commit"], date=header["date"]) for r in results]
    return dict(base, rows=[r for r in base["rows"] if label(r) not in measured] + merged)


def output_path(out, gpu_name):
    if out is None:
        return HERE / "results" / f"{gpu_slug(gpu_name)}.json"
    out = pathlib.Path(out)
    if out.suffix == ".json":
        return out
    return out / f"{gpu_slug(gpu_name)}.json"


def summary(rows):
    """One line a row: each implementation's TFLOP/s and ours / cuDNN (and, for the backward,
    ours_sm80 / SDPA flash, FlashAttention-2's backward); decode rows (GB/s) in a table of their
    own."""
    names = ["ours", "ours_sm80", "ours_sm90", "torch_flash", "torch_cudnn", "torch_efficient",
             "fa3"]
    short = ["ours", "sm80", "sm90", "flash", "cudnn", "effic", "fa3"]
    mha = {(r["b"], r["sq"], r["h"], r["d"], r["causal"], r["dtype"]): r["tflops"].get("ours")
           for r in rows if "kind" not in r}
    decode = [r for r in rows if "gbps" in r]
    rows = [r for r in rows if "tflops" in r]
    lines = [f"{'row':<50}" + "".join(f"{s:>8}" for s in short) + f"{'ours/cudnn':>12}"] if rows \
        else []
    for r in rows:
        t = r["tflops"]
        cells = "".join(f"{t[n]:>8.1f}" if n in t else f"{'-':>8}" for n in names)
        ratio = (f"{t['ours'] / t['torch_cudnn']:>12.2f}"
                 if t.get("ours") and t.get("torch_cudnn") else f"{'-':>12}")
        note = ""
        if r.get("kind") == "gqa":
            base = mha.get((r["b"], r["sq"], r["h"], r["d"], r["causal"], r["dtype"]))
            if base and t.get("ours"):
                note = f"  vs MHA row {t['ours'] / base:.2f}"
        elif r.get("kind") in VARLEN_KINDS and t.get("ours") and t.get("ours_padded"):
            note = f"  vs padded per FLOP {t['ours'] / t['ours_padded']:.2f}"
        elif r.get("kind") == "bwd" and t.get("ours_sm80") and t.get("torch_flash"):
            note = f"  sm80/flash {t['ours_sm80'] / t['torch_flash']:.2f}"
        elif r.get("kind") in MODIFIER_KINDS and t.get("ours") and t.get("ours_plain"):
            note = f"  vs plain {t['ours'] / t['ours_plain']:.2f}"
        elif r.get("kind") == "window" and t.get("ours"):
            note = f"  ours {flops(r) / (t['ours'] * 1e12) * 1e3:.3f} ms"
        if t.get("ours") and t.get("fa3"):
            note += f"  ours/fa3 {t['ours'] / t['fa3']:.2f}"
        lines.append(f"{label(r):<50}{cells}{ratio}{note}")
    if decode:
        names = ["ours", "ours_paged", "ours_sm80", "torch_flash", "torch_cudnn"]
        short = ["ours", "paged", "sm80", "flash", "cudnn"]
        lines.append(f"{'decode row (GB/s of KV cache read)':<50}"
                     + "".join(f"{s:>8}" for s in short) + f"{'ours/cudnn':>12}")
        for r in decode:
            t = r["gbps"]
            cells = "".join(f"{t[n]:>8.0f}" if n in t else f"{'-':>8}" for n in names)
            ratio = (f"{t['ours'] / t['torch_cudnn']:>12.2f}"
                     if t.get("ours") and t.get("torch_cudnn") else f"{'-':>12}")
            lines.append(f"{label(r):<50}{cells}{ratio}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                        help=f"comma-separated kinds of rows to measure, among {', '.join(KINDS)}, "
                        "or 'all' (default: all but bwd and decode)")
    parser.add_argument("--quick", action="store_true",
                        help="a few rows of the chosen kinds, for smoke tests")
    parser.add_argument("--rows", help="regular expression over row labels, e.g. 'plain.*d128' "
                        "or 'bwd.*d128' (the backward's d 128 sweep, seed and GQA rows)")
    parser.add_argument("--out", help="output folder, or a .json path (default bench/results/)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=1,
                        help="times each implementation this many times per row, in rotating order")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--merge", help="results file whose rows of the labels measured now this "
                        "run replaces, keeping the others (written to --out, or back)")
    args = parser.parse_args()
    if args.warmup < 5 or args.iters < 20:
        parser.error("GPU time takes at least 5 warm-up calls and 20 timed calls")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    kinds = list(KINDS) if kinds == ["all"] else kinds
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        parser.error(f"--kinds: {', '.join(unknown) or 'none given'}; known: {', '.join(KINDS)}")
    if not torch.cuda.is_available():
        sys.exit("bench.py needs a CUDA device")

    rows = [r for r in all_rows() if kind_of(r) in kinds]
    if args.quick:
        rows = [r for r in rows if is_quick(r)]
    if args.rows:
        rows = [r for r in rows if re.search(args.rows, label(r))]
    if not rows:
        parser.error(f"no row of the kinds {', '.join(kinds)} matches (bwd and decode rows need "
                     "--kinds bwd or --kinds decode)")
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"library {flashcute.library_path()}", flush=True)

    # The file is written after every row, so a run cut short (a device call's time limit) keeps
    # the rows it finished.
    path = output_path(args.out or args.merge, gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = json.loads(pathlib.Path(args.merge).read_text()) if args.merge else None
    header = {
        "gpu": gpu,
        "date": datetime.date.today().isoformat(),
        "commit": commit_sha(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
    }
    results = []
    with torch.inference_mode():
        warm_up_gpu()
    for r in rows:
        print(label(r), flush=True)
        # The forward rows run without autograd; the backward rows need it.
        backward = kind_of(r) == "bwd"
        with torch.inference_mode(not backward), torch.set_grad_enabled(backward):
            measure = {"bwd": run_bwd_row, "decode": run_decode_row, "softcap": run_modifier_row,
                       "alibi": run_modifier_row}.get(kind_of(r), run_row)
            entry = measure(r, args, lambda line: print(line, flush=True))
        figures = entry.get("tflops", entry.get("gbps", {}))
        print("  " + ", ".join(f"{n} {v}" for n, v in figures.items()), flush=True)
        results.append(entry)
        document = results_document(header, results, base)
        path.write_text(json.dumps(document, indent=1) + "\n")
        torch.cuda.empty_cache()
    print(f"wrote {path}")
    if not args.no_plot:
        sys.path.insert(0, str(HERE))
        import plot

        png = plot.plot(document, path.with_suffix(".png"))
        print(f"wrote {png}" if png else "no sweep rows to plot")
    print(summary(results))


if __name__ == "__main__":
    main()

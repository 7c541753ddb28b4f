#!/usr/bin/env python3
"""The SM clock and board power each implementation runs one row at, under sustained load.

Why: Nsight Compute times one launch; bench.py times calls after SETTLE_MS of back-to-back work,
where the power limit sets the clock. Two kernels with the same cycle count can then take
different times if one draws more power per cycle. This probe runs each implementation back to
back for --seconds, and over the second half of that window reads nvidia-smi (SM clock, power,
temperature, clock event reasons; one sample every --sample-ms) while CUDA events time each
chunk of calls. It prints, per implementation and round, the GPU time per call, the median clock
and power, and time x clock: the cycles a call takes, which do not depend on the clock.

With --trace it instead shows how the time a call takes moves after the GPU idles: after a host
sleep of --idle seconds, calls run back to back for --seconds in chunks of about 5 ms, and the
GPU time per call is averaged over spans of the time since the first call (0-50 ms, 50-100,
100-200, 200-400, then 200 ms spans up to 1.2 s, then longer): how much queued work a timed call
needs before it meets the sustained state.

Usage: python3 bench/clock_probe.py --b 2 --s 8192 --h 16 --d 128 [--causal]
       [--impls ours,fa3,torch_cudnn] [--seconds 4] [--rounds 2] [--trace [--idle 0.5]]
"fa3" needs FLASHCUTE_FA3_LIB (see bench.py); the library is found as bench.py finds it.
"""

import argparse
import contextlib
import importlib
import pathlib
import statistics
import subprocess
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
bench = importlib.import_module("bench")

QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def callables(r, q, k, v):
    """name -> (zero-argument callable, context manager factory)."""
    calls = {name: (fn, contextlib.nullcontext)
             for name, fn in bench.our_callables(r, q, k, v).items()}
    fa3 = bench.fa3_callable(r, q, k, v)
    if fa3 is not None:
        calls["fa3"] = (fa3, contextlib.nullcontext)
    timed, _ = bench.peer_timings(r, q, k, v, bench.PEERS, bench.flops(r), print)
    calls.update({name: (fn, context) for name, (fn, context, _) in timed.items()})
    return calls


def sustained(fn, seconds, sample_ms, chunk):
    """Runs fn back to back for `seconds`; returns the GPU ms per call of each chunk timed in the
    second half and the nvidia-smi rows sampled over that half."""
    start_wall = time.perf_counter()
    chunks, sampler, pending = [], None, []
    while True:
        elapsed = time.perf_counter() - start_wall
        if sampler is None and elapsed > seconds / 2:
            sampler = subprocess.Popen(
                ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                 f"-lms={sample_ms}"], stdout=subprocess.PIPE, text=True)
        if elapsed > seconds:
            break
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(chunk):
            fn()
        end.record()
        pending.append((begin, end, sampler is not None))
        if len(pending) > 2:  # two chunks in flight keep the GPU fed without a deep queue
            b, e, timed = pending.pop(0)
            e.synchronize()
            if timed:
                chunks.append(b.elapsed_time(e) / chunk)
    torch.cuda.synchronize()
    for b, e, timed in pending:
        if timed:
            chunks.append(b.elapsed_time(e) / chunk)
    sampler.terminate()
    rows = [line.split(", ") for line in sampler.communicate()[0].splitlines() if line]
    return chunks, rows


def trace(fn, seconds, idle, chunk):
    """(ms since the first call at the chunk's start, GPU ms per call) of each chunk, calls run
    back to back for `seconds` after the GPU idled for `idle` seconds."""
    torch.cuda.synchronize()
    time.sleep(idle)
    origin = torch.cuda.Event(enable_timing=True)
    origin.record()
    events, start_wall = [], time.perf_counter()
    while time.perf_counter() - start_wall < seconds:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(chunk):
            fn()
        end.record()
        events.append((begin, end))
        if len(events) > 4:
            events[-4][1].synchronize()
    torch.cuda.synchronize()
    return [(origin.elapsed_time(b), b.elapsed_time(e) / chunk) for b, e in events]


def print_trace(name, points):
    edges = [0, 50, 100, 200, 400, 600, 800, 1000, 1200, 1600, 2400, 3200, 6400]
    spans = []
    for lo, hi in zip(edges, edges[1:]):
        inside = [ms for at, ms in points if lo <= at < hi]
        if inside:
            spans.append(f"{lo}-{hi}: {statistics.mean(inside):.4f}")
    print(f"{name:12} " + "  ".join(spans), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--b", type=int, default=2)
    p.add_argument("--s", type=int, default=8192)
    p.add_argument("--h", type=int, default=16)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--impls", default="ours,fa3,torch_cudnn")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--sample-ms", type=int, default=50)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--trace", action="store_true")
    p.add_argument("--idle", type=float, default=0.5)
    args = p.parse_args()

    r = bench.row(args.b, args.s, args.h, args.d, args.causal)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, k, v = bench.make_inputs(r, gen)
    calls = callables(r, q, k, v)
    names = [n for n in args.impls.split(",") if n in calls]
    print(f"row {bench.label(r)}; implementations {names}; {torch.cuda.get_device_name()}")
    bench.warm_up_gpu()
    if args.trace:
        print("GPU ms per call over spans of ms since the first call")
    else:
        print(f"{'impl':12} {'ms/call':>8} {'MHz':>6} {'W':>6} {'C':>4} {'Mcycles':>8}  reasons")
    for rnd in range(args.rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            fn, context = calls[name]
            with context():
                fn()
                torch.cuda.synchronize()
                call_ms = max(statistics.median(bench.queued_call_ms(fn, 3, 5, span_ms=0)), 1e-3)
                if args.trace:
                    print_trace(name, trace(fn, args.seconds, args.idle,
                                            max(1, int(5.0 / call_ms))))
                    continue
                ms, rows = sustained(fn, args.seconds, args.sample_ms,
                                     max(1, int(20.0 / call_ms)))
            rows = [x for x in rows if len(x) == 4]
            if not rows:
                sys.exit(f"nvidia-smi gave no samples for --query-gpu={QUERY}")
            mhz = statistics.median(float(x[0]) for x in rows)
            watts = statistics.median(float(x[1]) for x in rows)
            temp = statistics.median(float(x[2]) for x in rows)
            reasons = sorted({x[3] for x in rows})
            call_ms = statistics.median(ms)
            print(f"{name:12} {call_ms:8.4f} {mhz:6.0f} {watts:6.1f} {temp:4.0f} "
                  f"{call_ms * mhz / 1e3:8.4f}  {' '.join(reasons)}  ({len(rows)} samples, "
                  f"{len(ms)} chunks)", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where a backward call's GPU time goes: each kernel's mean duration (torch.profiler) for our
backward beside cuDNN's and FlashAttention-2's (SDPA), per row, for tuning the backward.

Beside the kernels' sum, each call's own GPU time by CUDA events (the median of queued calls, timed
as bench/bench.py times them): what exceeds the sum is the gaps between the kernels.

Usage: python3 bench/bwd_kernels.py [--rows B:S:H:D[:HK][:causal],...] [--family auto|sm80|sm90]
       [--deterministic] [--peers | --no-peers] [--timeline] [--queued N] [--energy]
(bf16; the rows default to the d 128 sweep's s 2k and s 8k shapes, both masks; --deterministic adds
our deterministic call as a row of its own; --energy adds each call's energy in the GPU's
sustained state, where its power limit sets the clock)
"""

import argparse
import collections
import ctypes
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from bench import SETTLE_MS, queued_call_ms

try:
    import flashcute
except ImportError:
    sys.path.insert(0, "python")
    import flashcute

DEFAULT_ROWS = "8:2048:16:128,8:2048:16:128::causal,2:8192:16:128,2:8192:16:128::causal"


def parse_row(text):
    parts = text.split(":") + [""] * 6
    b, s, h, d = (int(x) for x in parts[:4])
    hk = int(parts[4]) if parts[4] else h
    return b, s, h, d, hk, parts[5] == "causal"


def kernel_times(fn, calls=10):
    """Mean GPU microseconds per kernel name over `calls` calls of fn, per call in all, and the
    last call's kernels as (name, start, end) in microseconds from its first kernel's start."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per_kernel = collections.defaultdict(list)
    spans = []
    for e in prof.events():
        if e.device_type.name == "CUDA":
            name = e.name.split("<")[0].split("(")[0].split("::")[-1][:48]
            per_kernel[name].append(e.time_range.elapsed_us())
            spans.append((e.time_range.start, e.time_range.end, name))
    times = {k: sum(v) / calls for k, v in per_kernel.items()}
    last = sorted(spans)[-(len(spans) // calls):] if spans else []
    timeline = [(name, start - last[0][0], end - last[0][0]) for start, end, name in last]
    return times, sum(times.values()), timeline


class Nvml:
    """The GPU's total energy counter (NVML, millijoules since the driver loaded)."""

    def __init__(self, index=0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlInit_v2() or self.lib.nvmlDeviceGetHandleByIndex_v2(
                index, ctypes.byref(self.handle)):
            raise RuntimeError("NVML: no handle for the GPU")

    def energy_mj(self):
        value = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value)):
            raise RuntimeError("NVML: no energy counter")
        return value.value


def sustained_energy(fn, call_ms, nvml, seconds=0.5):
    """Joules per call of fn and the GPU's mean watts over `seconds` of queued calls that follow
    SETTLE_MS of them (the counter read as the GPU reaches the first and the last timed call)."""
    settle, timed = math.ceil(SETTLE_MS / call_ms), math.ceil(seconds * 1e3 / call_ms)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2e9))  # about a second: the host queues every call behind it
    for _ in range(settle):
        fn()
    begin.record()
    for _ in range(timed):
        fn()
    end.record()
    begin.synchronize()
    first = nvml.energy_mj()
    end.synchronize()
    joules = (nvml.energy_mj() - first) * 1e-3
    return joules / timed, joules / (begin.elapsed_time(end) * 1e-3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS)
    parser.add_argument("--family", default="auto")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--timeline", action="store_true",
                        help="print one call's kernels by start and end (overlaps, gaps) and "
                        "the queued calls' times in order")
    parser.add_argument("--queued", type=int, default=20, help="timed queued calls per row")
    parser.add_argument("--energy", action="store_true",
                        help="joules per call and mean watts in the GPU's sustained state")
    parser.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                        help="time cuDNN's and FlashAttention-2's backward too")
    args = parser.parse_args()
    nvml = Nvml() if args.energy else None
    for text in args.rows.split(","):
        b, s, h, d, hk, causal = parse_row(text)
        gen = torch.Generator(device="cuda")
        gen.manual_seed(0)
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn_like(k)
        dout = torch.randn_like(q)
        flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
        out, lse = flashcute.forward(q, k, v, causal=causal, return_lse=True, family=args.family)
        impls = {"ours": lambda: flashcute.backward(dout, q, k, v, out, lse, causal=causal,
                                                    family=args.family)}
        if args.deterministic:
            impls["ours deterministic"] = lambda: flashcute.backward(
                dout, q, k, v, out, lse, causal=causal, family=args.family, deterministic=True)
        leaves = [t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
        peers = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))
        for name, backend in peers if args.peers else ():
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(*leaves, is_causal=causal,
                                                   enable_gqa=h != hk)
            g = dout.transpose(1, 2).contiguous()
            impls[name] = (lambda o, g: lambda: torch.autograd.grad(o, leaves, g,
                                                                    retain_graph=True))(o, g)
        print(f"b{b} s{s} h{h}/{hk} d{d}{' causal' if causal else ''}")
        for name, fn in impls.items():
            times, total, timeline = kernel_times(fn)
            if total == 0:  # no CUDA events: another profiler (Nsight Compute) holds CUPTI
                print(f"  {name}: no kernel times")
                continue
            parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(times.items(),
                                                                 key=lambda kv: -kv[1]))
            calls = [ms * 1e3 for ms in queued_call_ms(fn, 5, args.queued, span_ms=0)]
            call = statistics.median(calls)
            print(f"  {name}: {total:.0f} us ({flops / total / 1e6:.0f} TFLOP/s), a call "
                  f"{call:.0f} us by events: {parts}")
            if args.timeline:
                print("    one call: " + ", ".join(f"{k} {s:.0f}-{e:.0f}" for k, s, e in timeline))
                print("    queued calls in order: " + " ".join(f"{t:.0f}" for t in calls))
            if nvml:
                joules, watts = sustained_energy(fn, call * 1e-3, nvml)
                print(f"    sustained: {joules:.3f} J a call, {watts:.0f} W")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where a decode call's GPU time goes, per split count: each kernel's duration and the span from
the first kernel's start to the last one's end (torch.profiler), for tuning the split heuristic.

Usage: python3 bench/decode_splits.py [--rows B:SK:HK,...] [--splits 0,1,2,...] [--paged]
(split 0 = the library's automatic choice; the bench's decode shapes by default)
"""

import argparse
import collections
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

try:
    import flashcute
except ImportError:
    sys.path.insert(0, "python")
    import flashcute

HEADS, HEAD_DIM = 32, 128


def make_inputs(b, sk, hk, paged):
    q = torch.randn(b, 1, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
    if not paged:
        k = torch.randn(b, sk, hk, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        return dict(q=q, k_cache=k, v_cache=torch.randn_like(k), cache_seqlens=seqlens)
    page = 64
    pages = b * sk // page
    k = torch.randn(pages, page, hk, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(pages, device="cuda", dtype=torch.int32).view(b, sk // page)
    return dict(q=q, k_cache=k, v_cache=torch.randn_like(k), cache_seqlens=seqlens,
                block_table=table)


def profile_calls(inputs, splits, calls=20):
    for _ in range(5):
        flashcute.flash_attn_with_kvcache(**inputs, num_splits=splits)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flashcute.flash_attn_with_kvcache(**inputs, num_splits=splits)
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    per_kernel = collections.defaultdict(list)
    for e in kernels:
        name = e.name.split("<")[0].split("(")[0].split("::")[-1]
        per_kernel[name].append(e.time_range.elapsed_us())
    per_call = len(kernels) // calls
    spans = [kernels[i + per_call - 1].time_range.end - kernels[i].time_range.start
             for i in range(0, per_call * calls, per_call)]
    return {k: statistics.median(v) for k, v in per_kernel.items()}, statistics.median(spans)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1:32768:8,1:32768:32,1:131072:8,1:131072:32,"
                        "32:4096:8,32:4096:32,32:32768:8,128:8192:8,128:8192:32")
    parser.add_argument("--splits", default="0,1,4,8,16,32,64")
    parser.add_argument("--paged", action="store_true")
    args = parser.parse_args()
    for spec in args.rows.split(","):
        b, sk, hk = (int(x) for x in spec.split(":"))
        inputs = make_inputs(b, sk, hk, args.paged)
        gbytes = 2 * b * sk * hk * HEAD_DIM * 2 / 1e9
        for splits in (int(s) for s in args.splits.split(",")):
            kernels, span = profile_calls(inputs, splits)
            detail = ", ".join(f"{k} {v:.1f}" for k, v in kernels.items())
            print(f"b {b} sk {sk} hk {hk} splits {splits or 'auto'}: span {span:.1f} us "
                  f"({gbytes / span * 1e6:.0f} GB/s); {detail}", flush=True)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

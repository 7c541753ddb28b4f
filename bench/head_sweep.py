#!/usr/bin/env python3
"""Per-FLOP rate against the head count, ours beside cuDNN in one process: how much a problem
loses to a partial last round of the persistent grid's schedule (GPU time, bf16, b 1).

A static schedule of equal units runs ceil(units / CTAs) rounds, so the rate steps with the head
count where a dynamic one stays flat. Each row is timed as bench.py times (bench.median_ms); ours
twice, around cuDNN, keeping the faster.

Usage: python3 bench/head_sweep.py [--rows D:S:MASK:H1/H2/...,...]
(MASK is causal or full; default: d 128 and d 64 at s 8192 around h 32)
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import bench

try:
    import flashcute
except ImportError:
    sys.path.insert(0, "python")
    import flashcute

DEFAULT_ROWS = "128:8192:causal:29/31/32/33,128:8192:full:31/32/33,64:8192:causal:29/32/33"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("head_sweep.py needs a CUDA device")
    bench.warm_up_gpu()
    for text in args.rows.split(","):
        d, s, mask, heads = text.split(":")
        d, s, causal = int(d), int(s), mask == "causal"
        for h in (int(x) for x in heads.split("/")):
            q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            flops = 4 * h * s * s * d / (2 if causal else 1)

            def ours():
                return flashcute.forward(q, k, v, causal=causal)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            ours_ms = bench.median_ms(ours, 10, 30)
            cudnn_ms = bench.median_ms(cudnn, 10, 30)
            ours_ms = min(ours_ms, bench.median_ms(ours, 10, 30))
            print(f"d {d} s {s} h {h} {mask}: ours {flops / ours_ms / 1e9:.1f}, "
                  f"cuDNN {flops / cudnn_ms / 1e9:.1f} TFLOP/s, ours / cuDNN "
                  f"{cudnn_ms / ours_ms:.3f}", flush=True)


if __name__ == "__main__":
    main()

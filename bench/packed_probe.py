#!/usr/bin/env python3
"""What a packed batch costs beyond a dense one of the same tiles (issue 15 item 4): ours on
packed sequences beside ours on the dense batch of the same lengths where one exists, and a
fit of GPU time against the 128 x 128 tiles and key blocks each call computes (GPU time, bf16,
d 128, h 16, one process).

Patterns: equal lengths (packed and dense run the same tiles: the difference is the packed
path's own cost), the benchmark's varlen_short draw, and that draw sorted longest first.
--graph also times each call replayed from a CUDA graph, where the kernel takes the static
schedule instead of the dynamic one (a captured call cannot use the stream's counters): the
two schedules on the same tiles.

Usage: python3 bench/packed_probe.py [--heads 16] [--iters 30] [--graph]
"""

import argparse
import random
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

BLOCK = 128  # the d 128 tile's rows and keys


def work(lengths, causal):
    """(tiles, key blocks) of 128 x 128 a call computes: tile m of a causal sequence visits
    blocks 0..m, of a non-causal one every block."""
    tiles = blocks = 0
    for n in lengths:
        m = -(-n // BLOCK)
        tiles += m
        blocks += m * (m + 1) // 2 if causal else m * m
    return tiles, blocks


def graphed(fn):
    """fn captured into a CUDA graph (after one eager call), as a callable that replays it."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--graph", action="store_true",
                        help="also time each call replayed from a CUDA graph (static schedule)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("packed_probe.py needs a CUDA device")
    h, d = args.heads, 128
    short = list(bench.VARLEN_SHORT_LENGTHS)
    patterns = [("equal 128 x 64", [128] * 64), ("equal 256 x 64", [256] * 64),
                ("equal 512 x 64", [512] * 64), ("equal 500 x 64", [500] * 64),
                ("equal 1024 x 32", [1024] * 32), ("varlen_short", short),
                ("varlen_short longest first", sorted(short, reverse=True)),
                ("varlen_short shuffled", random.Random(1).sample(short, len(short)))]
    bench.warm_up_gpu()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    fits = {False: [], True: []}
    for causal in (False, True):
        for name, lengths in patterns:
            total = sum(lengths)
            cu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
            q, k, v = (torch.randn(total, h, d, generator=gen, device="cuda",
                                   dtype=torch.bfloat16) for _ in range(3))
            longest = max(lengths)

            def packed():
                return flashcute.forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                         max_seqlen_q=longest, max_seqlen_k=longest,
                                         causal=causal)

            packed_ms = bench.median_ms(packed, 10, args.iters)
            flops = bench.flops(bench.row(len(lengths), longest, h, d, causal,
                                          kind="varlen", seqlens=lengths))
            tiles, blocks = work(lengths, causal)
            fits[causal].append((tiles * h, blocks * h, packed_ms * 1e3))
            line = (f"{'causal' if causal else 'full'} {name}: packed {packed_ms * 1e3:.1f} us "
                    f"{flops / packed_ms / 1e9:.1f} TFLOP/s ({tiles * h} tiles, "
                    f"{blocks * h} blocks)")
            if args.graph:
                graph_ms = bench.median_ms(graphed(packed), 10, args.iters)
                line += (f"; packed static {graph_ms * 1e3:.1f} us (static / dynamic "
                         f"{graph_ms / packed_ms:.3f})")
            if len(set(lengths)) == 1:
                dq, dk, dv = (t.view(len(lengths), lengths[0], h, d) for t in (q, k, v))

                def dense():
                    return flashcute.forward(dq, dk, dv, causal=causal)

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(
                            dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2),
                            is_causal=causal)

                dense_ms = bench.median_ms(dense, 10, args.iters)
                cudnn_ms = bench.median_ms(cudnn, 10, args.iters)
                same = torch.equal(packed(), dense().view(total, h, d))
                verdict = "bitwise equal" if same else "differ"
                line += (f"; dense {dense_ms * 1e3:.1f} us (packed / dense "
                         f"{packed_ms / dense_ms:.3f}, outputs {verdict}); cuDNN dense "
                         f"{cudnn_ms * 1e3:.1f} us")
                if args.graph:
                    dense_graph_ms = bench.median_ms(graphed(dense), 10, args.iters)
                    line += f"; dense graphed {dense_graph_ms * 1e3:.1f} us"
            print(line, flush=True)
    # Least squares: time = a * blocks / 132 + b * tiles / 132 + c, per mask.
    for causal, points in fits.items():
        a = torch.tensor([[bl / 132, t / 132, 1.0] for t, bl, _ in points], dtype=torch.float64)
        y = torch.tensor([us for _, _, us in points], dtype=torch.float64)
        coef = torch.linalg.lstsq(a, y.unsqueeze(1)).solution.squeeze(1).tolist()
        print(f"fit ({'causal' if causal else 'full'}): {coef[0]:.2f} us per block per SM, "
              f"{coef[1]:.2f} us per tile per SM, {coef[2]:.1f} us per call")


if __name__ == "__main__":
    main()

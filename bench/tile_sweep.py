"""Times every compiled tile configuration of a family per head_dim, to choose the automatic tile.

Runs in one process on the GPU machine, the same way bench.py times (warm L2, median of CUDA-event
timings). Rows: b = 16384 / s, h = 2048 / d (the FlashAttention sweep's shape), causal and not.
    python3 bench/tile_sweep.py --head-dims 64 128 --seqlens 2048 8192 [--dtype bf16]
        [--family sm80|sm90] [--out DIR]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import median_ms  # noqa: E402

# isort: split
# After bench, which puts the repository's python/ on sys.path when no package is installed.
import flashcute  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--family", default="sm80", choices=["sm80", "sm90"])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    results = []
    for d in args.head_dims:
        tiles = flashcute.compiled_tile_configs(args.family, args.dtype, d)
        for s in args.seqlens:
            b, h = max(1, 16384 // s), max(1, 2048 // d)
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
            for causal in (False, True):
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                line = []
                for tile in tiles:
                    def call():
                        return flashcute.forward(q, k, v, causal=causal, family=args.family,
                                                 tile=tile)
                    ms = median_ms(call, args.warmup, args.iters)
                    tflops = flops / ms / 1e9
                    results.append({"d": d, "s": s, "causal": causal, "tile": list(tile),
                                    "tflops": round(tflops, 1)})
                    line.append(f"{tile[0]}x{tile[1]}x{tile[2]}:{tflops:.0f}")
                best = max((r for r in results if r["d"] == d and r["s"] == s and
                            r["causal"] == causal), key=lambda r: r["tflops"])
                print(f"d{d} s{s} {'causal' if causal else 'full  '} best {best['tile']} "
                      f"{best['tflops']}  | " + " ".join(line), flush=True)
    if args.out:
        with open(os.path.join(args.out, f"tile_sweep_{args.family}.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

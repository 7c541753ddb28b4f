#!/usr/bin/env python3
"""Runs one benchmark row's implementations once each inside NVTX ranges named after them, so
that Nsight Compute can profile exactly those calls, ours and the peers side by side:

  ncu --clock-control none --nvtx --nvtx-include "torch_cudnn/" --nvtx-include "ours/" \
      --section LaunchStats --section SpeedOfLight ... python3 bench/profile_row.py --b 32 ...

Each implementation is warmed up first (outside any range), so handle creation and module loads
stay out of the profiled call. The row is given as bench.py builds it (b, s, h, d, causal,
dtype); --kind varlen or varlen_short takes bench.py's packed sequences instead of b and s.
"""

import argparse
import contextlib

import torch

import bench


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="plain", choices=("plain",) + bench.VARLEN_KINDS)
    parser.add_argument("--b", type=int, help="batch (plain rows)")
    parser.add_argument("--s", type=int, help="sequence length (plain rows)")
    parser.add_argument("--h", type=int, required=True)
    parser.add_argument("--d", type=int, required=True)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", default="bf16", choices=sorted(bench.DTYPES))
    parser.add_argument("--impls", nargs="+", default=["torch_cudnn", "ours"],
                        help="among ours, ours_sm80, ours_sm90, bench.PEERS and fa3 "
                        "(FlashAttention-3, when FLASHCUTE_FA3_LIB names its library)")
    args = parser.parse_args()

    if args.kind == "plain":
        if args.b is None or args.s is None:
            parser.error("--b and --s are required for a plain row")
        r = bench.row(args.b, args.s, args.h, args.d, args.causal, args.dtype)
    else:
        lengths = bench.VARLEN_LENGTHS if args.kind == "varlen" else bench.VARLEN_SHORT_LENGTHS
        r = bench.row(len(lengths), max(lengths), args.h, args.d, args.causal, args.dtype,
                      kind=args.kind, seqlens=lengths)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, k, v = bench.make_inputs(r, gen)
    if args.kind == "plain":
        packing = None
        ours = bench.our_callables(r, q, k, v)
    else:
        packing = bench.packed(r, q, k, v)
        ours = bench.varlen_callables(r, q, k, v, packing)
    fa3 = bench.fa3_callable(r, q, k, v, packing)
    if fa3 is not None:
        ours["fa3"] = fa3
    for name in args.impls:
        if name in bench.PEERS:
            fn = bench.peer_callable(r, q, k, v)
            context = bench.sdpa_kernel(bench.PEERS[name])
        elif name in ours:
            fn = ours[name]
            context = contextlib.nullcontext()
        else:
            parser.error(f"--impls: no implementation {name!r} for this row")
        with context:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(name)
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        print(f"{name}: profiled one call of {bench.label(r)}")


if __name__ == "__main__":
    main()

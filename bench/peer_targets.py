#!/usr/bin/env python3
"""Each plain row of a results file against a peer's lead in an anchor run.

The forward's speed target is relative: on every plain row, ours / cuDNN must reach a share
(default 0.98) of FlashAttention-3's lead over cuDNN on the same row of an anchor run (a file
whose plain rows carry `tflops_gpu` for fa3 and torch_cudnn). Both sides are GPU-time rates: the
results file's `tflops` (GUIDE section 5) and the anchor's `tflops_gpu`.
Prints one line a row: the anchor's lead, ours / cuDNN in the results file, their quotient against
the share, and, where the results file has FA3 too, FA3 / cuDNN in the same run (whether the
anchor's lead holds on this card); then how many rows meet the target.

Usage: python3 bench/peer_targets.py RESULTS --anchor FILE [--share 0.98] [--dtype bf16]
       [--peer fa3] [--base torch_cudnn]
Exit status 0 when every row with an anchor meets the target, 1 otherwise.
"""

import argparse
import json
import pathlib
import sys


def shape(row):
    return (
        row["b"],
        row["sq"],
        row["sk"],
        row["h"],
        row.get("hk", row["h"]),
        row["d"],
        row["causal"],
    )


def is_plain(row, dtype):
    # The results file leaves a plain row's kind unset; the anchor names it.
    return row.get("kind") in (None, "plain") and row.get("dtype", "bf16") == dtype


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--anchor", required=True)
    parser.add_argument("--share", type=float, default=0.98)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--peer", default="fa3")
    parser.add_argument("--base", default="torch_cudnn")
    args = parser.parse_args()

    anchor = {
        shape(r): r["tflops_gpu"]
        for r in json.loads(pathlib.Path(args.anchor).read_text())["rows"]
        if is_plain(r, args.dtype) and "tflops_gpu" in r
    }
    results = json.loads(pathlib.Path(args.results).read_text())["rows"]
    met = total = 0
    print(f"{'row':<34}{'lead':>7}{'ours':>7}{'ours/target':>13}{'peer now':>10}")
    for row in results:
        if not is_plain(row, args.dtype) or shape(row) not in anchor:
            continue
        rates, ref = row.get("tflops", {}), anchor[shape(row)]
        if not all(
            k in d
            for d, k in ((rates, "ours"), (rates, args.base), (ref, args.peer), (ref, args.base))
        ):
            continue
        lead = ref[args.peer] / ref[args.base]
        ours = rates["ours"] / rates[args.base]
        quotient = ours / (args.share * lead)
        now = f"{rates[args.peer] / rates[args.base]:.3f}" if args.peer in rates else "-"
        b, sq, sk, h, hk, d, causal = shape(row)
        label = f"b{b} s{sq} h{h}/{hk} d{d} {'causal' if causal else 'full'}"
        verdict = "ok" if quotient >= 1 else "short"
        print(f"{label:<34}{lead:7.3f}{ours:7.3f}{quotient:13.3f}{now:>10}  {verdict}")
        total += 1
        met += quotient >= 1
    print(f"{met} of {total} rows at {args.share} x the anchor's {args.peer} / {args.base}")
    return 0 if total and met == total else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Cycles per call of two builds of libflashcute.so (and of FlashAttention-3) on the same rows.

Why: at the power limit the SM clock falls as the tensor pipe gets busier, so the GPU time of two
kernels weighs their energy as much as their cycles. A card that runs with more headroom turns
cycles into time more directly; an A/B by bench/ab.py on a card at its limit can then read a
change in cycles as no change at all. This script counts the cycles.

How: it runs itself under Nsight Compute (--clock-control none: the card's clocks stay as they
are; --cache-control none: L2 keeps what the warm-up calls left). Inside, for every plain row of
bench.py that --match selects, each build's fc_forward (family auto, through ab.py's Library) is
checked against the other's output as ab.py checks it, warmed up, and then called once per round
inside an NVTX range, the order alternating between rounds; with --fa3 FlashAttention-3's forward
(FLASHCUTE_FA3_LIB) joins each round. Nsight Compute records each profiled kernel's elapsed
cycles (sm__cycles_elapsed.max), duration and SM clock, and any --metrics named. Per row and
implementation the median over rounds is kept; new / old (and fa3 / old) compare cycles.

Writes DIR/<gpu>-cycles.json and prints a table.

Usage: python3 bench/cycles_ab.py --old OLD.so --new NEW.so --out DIR [--match REGEX]
       [--rounds 5] [--fa3] [--metrics M1,M2] [--ncu PATH]
"""

import argparse
import csv
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
RANGE = "cycles"
METRICS = ("sm__cycles_elapsed.max", "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second")
# Our forward kernel and FlashAttention-3's (CUTLASS's device_kernel wrapper), by function name.
KERNELS = "regex:^(forward_kernel|device_kernel)$"


def inner(args):
    """Runs under Nsight Compute: the profiled calls, their tags written to args.tags in order."""
    import torch

    sys.path.insert(0, str(HERE))
    import ab
    import bench

    temporary = []
    old, new = ab.open_libraries(args.old, args.new, temporary)
    libs = {"old": old, "new": new}
    tags = []
    try:
        with torch.inference_mode():
            for r in ab.select_rows("plain", "plain", args.match):
                q, k, v, _ = ab.make_inputs(r)
                outs, fc_args, calls = ab.forward_calls(r, libs, "auto", q, k, v, None)
                if ab.check(r, "ours", calls, outs) is None:
                    continue  # neither build has a kernel for the row
                if args.fa3:
                    fa3 = bench.fa3_callable(r, q, k, v)
                    if fa3 is not None:
                        calls["fa3"] = fa3
                names = list(calls)
                for name in names:
                    for _ in range(3):
                        calls[name]()
                torch.cuda.synchronize()
                for round_index in range(args.rounds):
                    order = names if round_index % 2 == 0 else names[::-1]
                    for name in order:
                        torch.cuda.nvtx.range_push(RANGE)
                        calls[name]()
                        torch.cuda.nvtx.range_pop()
                        torch.cuda.synchronize()
                        tags.append({"row": ab.label(r), "impl": name})
                del outs, fc_args, calls, q, k, v
                torch.cuda.empty_cache()
    finally:
        for folder in temporary:
            shutil.rmtree(folder, ignore_errors=True)
        pathlib.Path(args.tags).write_text(json.dumps(tags))
    gpu = torch.cuda.get_device_name()
    pathlib.Path(args.tags).with_suffix(".gpu").write_text(gpu)


def read_metrics(path, metrics):
    """The profiled kernels' metric values, in launch order, from ncu's raw CSV page."""
    lines = pathlib.Path(path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    reader = csv.DictReader(lines[start:])
    kernels = []
    for row in reader:
        if not row["ID"].strip().isdigit():  # the units line
            continue
        kernels.append({m: float(row[m].replace(",", "")) for m in metrics})
    return kernels


def outer(args):
    ncu = args.ncu or shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    work = pathlib.Path(tempfile.mkdtemp(prefix="flashcute-cycles-"))
    tags_path, csv_path = work / "tags.json", work / "ncu.csv"
    named = dict.fromkeys(m.strip() for m in (args.metrics or "").split(","))  # in order, once
    extra = [m for m in named if m and m not in METRICS]
    metrics = list(METRICS) + extra
    command = [ncu, "--clock-control", "none", "--cache-control", "none", "--nvtx",
               "--nvtx-include", f"{RANGE}/", "-k", KERNELS, "--metrics", ",".join(metrics),
               "--csv", "--page", "raw", "--print-units", "base", "--log-file", str(csv_path),
               sys.executable, str(pathlib.Path(__file__).resolve()), "--inner", "--tags",
               str(tags_path), "--old", args.old, "--new", args.new, "--rounds", str(args.rounds)]
    if args.match:
        command += ["--match", args.match]
    if args.fa3:
        command.append("--fa3")
    subprocess.run(command, check=True)
    tags = json.loads(tags_path.read_text())
    gpu = tags_path.with_suffix(".gpu").read_text()
    kernels = read_metrics(csv_path, metrics)
    if len(kernels) != len(tags):
        sys.exit(f"cycles_ab.py: {len(kernels)} kernels profiled for {len(tags)} calls "
                 f"(log in {work})")
    shutil.rmtree(work, ignore_errors=True)

    samples = {}
    for tag, kernel in zip(tags, kernels):
        samples.setdefault(tag["row"], {}).setdefault(tag["impl"], []).append(kernel)
    results = []
    print(f"{'row':<34}{'impl':<6}{'M cycles':>10}{'us':>9}{'GHz':>7}{'/ old':>8}")
    for row, impls in samples.items():
        medians = {}
        for impl, runs in impls.items():
            median = {m: statistics.median(k[m] for k in runs) for m in metrics}
            medians[impl] = {"cycles": median["sm__cycles_elapsed.max"],
                             "us": median["gpu__time_duration.sum"] / 1e3,
                             "ghz": median["sm__cycles_elapsed.avg.per_second"] / 1e9,
                             "rounds": len(runs)}
            if extra:
                medians[impl]["metrics"] = {m: median[m] for m in extra}
        base = medians["old"]["cycles"]
        for impl, m in medians.items():
            m["cycles_vs_old"] = m["cycles"] / base
            print(f"{row:<34}{impl:<6}{m['cycles'] / 1e6:>10.4f}{m['us']:>9.1f}{m['ghz']:>7.3f}"
                  f"{m['cycles_vs_old']:>8.3f}")
            for name, value in m.get("metrics", {}).items():
                print(f"{'':<40}{name} {value:.4g}")
        results.append({"row": row, "impls": medians})
    ratios = [r["impls"]["new"]["cycles_vs_old"] for r in results]
    if ratios:
        print(f"new / old cycles: median {statistics.median(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} rows")
    document = {"gpu": gpu, "date": datetime.date.today().isoformat(),
                "old": args.old, "new": args.new, "commit": os.environ.get("FLASHCUTE_COMMIT"),
                "old_commit": os.environ.get("FLASHCUTE_OLD_COMMIT"), "rounds": args.rounds,
                "rows": results}
    sys.path.insert(0, str(HERE))
    import bench

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{bench.gpu_slug(gpu)}-cycles.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the baseline libflashcute.so")
    parser.add_argument("--new", required=True, help="the candidate libflashcute.so")
    parser.add_argument("--out", help="output folder")
    parser.add_argument("--match", help="regular expression over ab.py's row labels")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fa3", action="store_true",
                        help="FlashAttention-3 too (FLASHCUTE_FA3_LIB names its library)")
    parser.add_argument("--metrics", help="more Nsight Compute metrics to record, comma-separated")
    parser.add_argument("--ncu", help="the Nsight Compute command (default: ncu on PATH)")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tags", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.inner:
        inner(args)
    else:
        if not args.out:
            parser.error("--out is required")
        outer(args)


if __name__ == "__main__":
    main()

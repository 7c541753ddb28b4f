#!/usr/bin/env python3
"""Where a kernel's warps stall, per SASS instruction, from Nsight Compute's source page:

  ncu --import R.ncu-rep --page source --print-source sass --csv > R-sass.csv
  python3 scripts/sass_stalls.py R-sass.csv [--top N] [--kernel I]

The CSV holds one table per profiled kernel (each starts at its "Address" header). For the kernel
picked by --kernel (its index among the tables, default every one), prints the total stall
samples, the top instructions by samples with their share and the instruction before them (a
stall is charged to the instruction that waits, so its producer is usually just above), and the
samples by opcode.

--by-exec adds the samples grouped by how many times each instruction ran: instructions that run
equally often are mostly one region of the kernel (a key block's loop body, a tile's prologue,
the producer's loop), so two kernels doing the same work can be compared region by region.
"""

import argparse
import collections
import csv
import re


def tables(path):
    """The kernels' tables: each a (header, rows) pair."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    out = []
    for row in rows:
        if row and row[0] == "Address":
            out.append((row, []))
        elif out and row and re.match(r"^(0x)?[0-9a-fA-F]+$", row[0]):
            out[-1][1].append(row)
    return out


def column(header, *patterns):
    for p in patterns:
        for i, h in enumerate(header):
            if re.search(p, h):
                return i
    return None


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(sass):
    return re.sub(r"^@!?U?P\w+\s+", "", sass.strip()).split(" ", 1)[0].split(".", 1)[0]


def report(header, rows, top):
    src = column(header, r"^Source$")
    samples = column(header, r"Warp Stall Sampling \(All")
    executed = column(header, r"^Instructions Executed$")
    if src is None or samples is None:
        print("  no Source / stall sampling columns:", header[:8])
        return
    total = sum(number(r[samples]) for r in rows)
    print(f"  {len(rows)} instructions, {total:.0f} stall samples")
    order = sorted(range(len(rows)), key=lambda i: -number(rows[i][samples]))
    for i in order[:top]:
        r = rows[i]
        share = number(r[samples]) / total if total else 0.0
        runs = f" exec {number(r[executed]):.0f}" if executed is not None else ""
        before = rows[i - 1][src].strip() if i > 0 else ""
        print(f"  {share:6.2%} {r[0]} {r[src].strip()[:70]}{runs}")
        print(f"         after: {before[:70]}")
    by_op = collections.Counter()
    for r in rows:
        by_op[opcode(r[src])] += number(r[samples])
    print("  by opcode:", ", ".join(f"{op} {n / total:.1%}" for op, n in by_op.most_common(12)))


def report_by_exec(header, rows, top):
    samples = column(header, r"Warp Stall Sampling \(All")
    executed = column(header, r"^Instructions Executed$")
    if samples is None or executed is None:
        print("  no stall sampling / execution count columns")
        return
    by_exec = collections.Counter()
    count = collections.Counter()
    for r in rows:
        runs = int(number(r[executed]))
        by_exec[runs] += number(r[samples])
        count[runs] += 1
    total = sum(by_exec.values())
    print("  samples by execution count (runs: samples, share, instructions):")
    for runs, n in by_exec.most_common(top):
        print(f"  {runs:9d}: {n:8.0f} {n / total:6.1%} {count[runs]:5d}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--kernel", type=int, help="index of the kernel's table (default: all)")
    parser.add_argument(
        "--by-exec",
        action="store_true",
        help="also group the samples by each instruction's execution count",
    )
    args = parser.parse_args()
    found = tables(args.csv)
    for index, (header, rows) in enumerate(found):
        if args.kernel is not None and index != args.kernel:
            continue
        print(f"== kernel table {index}")
        report(header, rows, args.top)
        if args.by_exec:
            report_by_exec(header, rows, args.top)


if __name__ == "__main__":
    main()

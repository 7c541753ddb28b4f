#!/usr/bin/env python3
"""Compares the SASS of two builds of the library, kernel by kernel, to show that a change of
structure left the machine code alone:

  python3 scripts/compare_sass.py OLD.so NEW.so [--cuobjdump PATH] [--show N]

Kernels are paired by their tile (the traits in the mangled name), so a renamed wrapper still
pairs. For each pair it prints whether the instruction streams match once registers, constant-bank
offsets and addresses are blanked out, else the instruction count of each side and the first
differences. Exits non-zero if a kernel has no partner or any pair differs.
"""

import argparse
import difflib
import re
import shutil
import subprocess
import sys

from check_sm90_sass import functions

KEY = re.compile(r"(?:Kernel)?TraitsI.*")


def kernels(path, cuobjdump):
    sass = subprocess.run([cuobjdump, "-sass", path], check=True, capture_output=True,
                          text=True).stdout
    out = {}
    for name, instructions in functions(sass):
        family = "sm90" if "sm90" in name else "sm80"
        plain = "Lb1EEEv" in name if family == "sm80" else False
        traits = KEY.search(name)
        tile = traits.group(0).split("EEEv")[0].rstrip("E") if traits else name
        key = (family, tile, plain)
        out[key] = [normalise(i) for i in instructions]
    return out


def normalise(ins):
    ins = re.sub(r"c\[0x[0-9a-f]+\]\[0x[0-9a-f]+\]", "c[]", ins)
    ins = re.sub(r"\bU?R\d+\b", "R", ins)
    ins = re.sub(r"\bU?P\d\b", "P", ins)
    ins = re.sub(r"0x[0-9a-f]+", "#", ins)
    return ins.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--cuobjdump",
                        default=shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump")
    parser.add_argument("--show", type=int, default=6, help="differing lines shown per kernel")
    args = parser.parse_args()
    old, new = kernels(args.old, args.cuobjdump), kernels(args.new, args.cuobjdump)
    bad = 0
    for key in sorted(set(old) | set(new)):
        label = f"{key[0]} {key[1][:90]}{' plain' if key[2] else ''}"
        if key not in old or key not in new:
            print(f"UNPAIRED {label} (only in {'new' if key in new else 'old'})")
            bad += 1
            continue
        a, b = old[key], new[key]
        if a == b:
            print(f"same     {label} ({len(a)} instructions)")
            continue
        bad += 1
        ops_a = [i.split()[0] for i in a if i]
        ops_b = [i.split()[0] for i in b if i]
        print(f"DIFFERS  {label}: {len(a)} -> {len(b)} instructions, opcode sequence "
              f"{'same' if ops_a == ops_b else 'differs'}")
        diff = [d for d in difflib.unified_diff(a, b, lineterm="", n=0)
                if d[:1] in "+-" and d[:3] not in ("+++", "---")]
        for line in diff[:args.show]:
            print(f"    {line}")
    print(f"{len(set(old) | set(new))} kernels, {bad} differ or are unpaired")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Instruction mix of each loop of a kernel's SASS, to read a main loop before spending device time:

  python3 scripts/sass_loops.py FILE [--kernel REGEX] [--min N] [--cuobjdump PATH]

FILE is a library, an executable or an object file; --kernel picks functions by a regular
expression over their mangled names (default: every function). A loop is the range from a
backward branch's target to the branch. Nested or rotated loops show as overlapping ranges: the
innermost range that holds the MMAs is usually the main loop. For each function the total
instruction count, then for each loop of at least --min instructions (default 100) its range, its
length and its opcodes by count (modifiers dropped: HMMA.16816.F32.BF16 counts as HMMA), local
memory (LDL, STL: spills) first.
"""

import argparse
import collections
import re
import shutil
import subprocess
import sys

from check_sm90_sass import functions

BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def opcode(instruction):
    """The instruction's operation without its guard predicate or modifiers."""
    return PREDICATE.sub("", instruction).split(" ", 1)[0].split(".", 1)[0]


def loops(instructions):
    """(first, last) instruction indices of every backward branch's range; SASS instructions are
    16 bytes, so index i lies at address 16 i."""
    ranges = []
    for index, instruction in enumerate(instructions):
        match = BRANCH_TARGET.search(instruction)
        if match:
            target = int(match.group(1), 16) // 16
            if target <= index:
                ranges.append((target, index))
    return ranges


def describe(instructions, first, last):
    counts = collections.Counter(opcode(i) for i in instructions[first:last + 1])
    local = counts.pop("LDL", 0), counts.pop("STL", 0)
    mix = ", ".join(f"{op} {n}" for op, n in counts.most_common())
    return (f"  loop {16 * first:#x}-{16 * last:#x}: {last - first + 1} instructions, "
            f"LDL {local[0]} / STL {local[1]}; {mix}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="library, executable or object file")
    parser.add_argument("--kernel", default="", help="regular expression over mangled names")
    parser.add_argument("--min", type=int, default=100, help="shortest loop shown (instructions)")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = parser.parse_args()
    sass = subprocess.run([args.cuobjdump, "-sass", args.file], check=True, capture_output=True,
                          text=True).stdout
    found = False
    for name, instructions in functions(sass):
        if not re.search(args.kernel, name):
            continue
        found = True
        print(f"{name}: {len(instructions)} instructions")
        for first, last in sorted(loops(instructions)):
            if last - first + 1 >= args.min:
                print(describe(instructions, first, last))
    if not found:
        sys.exit(f"no function matches {args.kernel!r} in {args.file}")


if __name__ == "__main__":
    main()

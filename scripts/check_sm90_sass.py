#!/usr/bin/env python3
"""Reads the SASS of the Hopper forward kernels and fails where ptxas undid the design:

  python3 scripts/check_sm90_sass.py build/lib/libflashcute.so [--cuobjdump PATH]

For each sm90 forward kernel (one line each: its traits, registers at entry, local memory):
- HGMMA instructions are present (wgmma was not lowered to something else);
- no local memory (LDL/STL: spills);
- in every main-loop iteration some exponentials (MUFU.EX2) lie between the wait for S
  (WARPGROUP.DEPBAR.LE gsb0, 0x1) and the wait for the PV GEMM (... 0x0): the softmax overlaps the
  PV GEMM. A register-starved kernel once had ptxas move the second wait before the softmax,
  which cost 10% with no warning.
ptxas's wgmma-serialization messages (C7511, C7517, C7518) are in the build log, not the SASS:
grep the log for them as well.
"""

import argparse
import re
import shutil
import subprocess
import sys

TRAITS = re.compile(
    r"TraitsIN7cutlass\d+(\w+?)_tELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb(\d)E(?:Li(\d+)E)?")
# ForwardKernel<Traits, true>: the kernel of calls with softcap or ALiBi.
MODIFIERS = re.compile(r"EELb1EEEEEvNT_")


def functions(sass):
    """(mangled name, instruction list) of every function in a cuobjdump -sass listing."""
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        yield name, [i.strip() for i in re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", chunk)]


def kernels(sass):
    """(mangled name, instruction list) of every sm90 forward kernel in a cuobjdump listing."""
    for name, instructions in functions(sass):
        if "sm9014forward_kernel" in name:
            yield name, instructions


def softmax_overlaps(instructions):
    """Exponentials between each wait for S and the following wait for PV."""
    counts, current = [], None
    for ins in instructions:
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ins:
            current = 0
        elif "MUFU.EX2" in ins and current is not None:
            current += 1
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ins and current is not None:
            counts.append(current)
            current = None
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="library, executable or object files")
    parser.add_argument("--cuobjdump",
                        default=shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump")
    args = parser.parse_args()

    failures = 0
    seen = 0
    for path in args.files:
        sass = subprocess.run([args.cuobjdump, "-sass", path], check=True, capture_output=True,
                              text=True).stdout
        usage = subprocess.run([args.cuobjdump, "-res-usage", path], check=True,
                               capture_output=True, text=True).stdout
        resources = dict(re.findall(
            r"Function (\S+):\s*\n\s*(REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+)", usage))
        for name, instructions in kernels(sass):
            seen += 1
            m = TRAITS.search(name)
            label = (f"{m.group(1)} d{m.group(2)} {m.group(3)}x{m.group(4)} stages {m.group(5)} "
                     f"ping-pong {m.group(6)} ctas/SM {m.group(7) or 1}") if m else name[:60]
            if MODIFIERS.search(name):
                label += " softcap/ALiBi"
            hgmma = sum("HGMMA" in i for i in instructions)
            local = sum(i.split()[0].startswith(("LDL", "STL")) for i in instructions if i.split())
            overlaps = softmax_overlaps(instructions)
            problems = []
            if hgmma == 0:
                problems.append("no HGMMA")
            if local:
                problems.append(f"{local} local-memory instructions")
            if not overlaps or min(overlaps) == 0:
                problems.append(f"softmax does not overlap PV (exponentials per window {overlaps})")
            failures += bool(problems)
            note = f"  <- {'; '.join(problems)}" if problems else ""
            print(f"{'FAIL' if problems else 'ok  '} {label:55s} {resources.get(name, '?')} "
                  f"HGMMA {hgmma} overlap {overlaps}{note}")
    if seen == 0:
        print("no sm90 forward kernel found", file=sys.stderr)
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Reads the SASS of the Hopper kernels and fails where ptxas undid the design:

  python3 scripts/check_sm90_sass.py build/lib/libflashcute.so [--cuobjdump PATH]

For each sm90 kernel (one line each: its traits, registers at entry, local memory):
- HGMMA instructions are present (wgmma was not lowered to something else);
- no GEMM is serialized: every run of HGMMA between two warpgroup arrives or waits holds at least
  two (a GEMM issues its k-steps back to back, at least four in every kernel here; ptxas's
  serialization waits after each one, and its messages C7511, C7517 and C7518 are in the build
  log only).
Forward kernels:
- no local memory (LDL/STL: spills);
- without ping-pong, in every main-loop iteration some exponentials (MUFU.EX2) lie between the
  wait for S (WARPGROUP.DEPBAR.LE gsb0, 0x1) and the wait for the PV GEMM (... 0x0): the softmax
  overlaps the PV GEMM. A register-starved kernel once had ptxas move the second wait before the
  softmax, which cost 10% with no warning.
- with ping-pong (the other warpgroup's GEMMs cover the softmax), ptxas may move the wait for
  the PV GEMM into the exponentials; then P's conversions (F2FP) must lie among them, in every
  iteration without a branch between the softmax and the conversion (the mainloop's unmasked
  step at least).
Backward kernels:
- at most LOCAL_BUDGET local-memory instructions for their head dim.
"""

import argparse
import re
import shutil
import subprocess
import sys

TRAITS = re.compile(
    r"TraitsIN7cutlass\d+(\w+?)_tELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb(\d)E(?:Li(\d+)E)?"
    r"(?:Li(\d+)E)?")
# ForwardKernel<Traits, true>: the kernel of calls with softcap or ALiBi.
MODIFIERS = re.compile(r"EELb1EEEEEvNT_")
BACKWARD_TRAITS = re.compile(
    r"BackwardTraitsIN7cutlass\d+(\w+?)_tELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELNS0_13BackwardSplitE(\d)E")
# Local-memory instructions (LDL and STL) a backward kernel may hold, by head dim: the d 64 and
# d 128 kernels keep a few values in local memory (64 / 64 and 28 / 28 bytes, 32 and 14
# instructions; two of d 64's lie in its consumers' step loop, the rest outside it, where they
# measured free). More fails here so that it is measured before it lands: d 64's allocation has
# gone to 124-304 bytes with changes outside its step, at a cost of 3-6% (bench/NOTES.md).
LOCAL_BUDGET = {64: 32, 128: 14, 256: 0}


def functions(sass):
    """(mangled name, instruction list) of every function in a cuobjdump -sass listing."""
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        yield name, [i.strip() for i in re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", chunk)]


def kernels(sass, kind):
    """(mangled name, instruction list) of every sm90 kernel of a kind (forward, backward)."""
    marker = {"forward": "sm9014forward_kernel", "backward": "sm9015backward_kernel"}[kind]
    for name, instructions in functions(sass):
        if marker in name:
            yield name, instructions


def is_empty_group(ins):
    """The placeholder ptxas issues for a wgmma commit group without a GEMM: an HGMMA into RZ."""
    return re.match(r"HGMMA\.\S+ RZ,", ins) is not None


def hgmma_runs(instructions):
    """Lengths of the runs of HGMMA between warpgroup arrives and waits (empty groups left out)."""
    runs, current = [], 0
    for ins in instructions:
        if "HGMMA" in ins and not is_empty_group(ins):
            current += 1
        elif ins.startswith(("WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR")) and current:
            runs.append(current)
            current = 0
    return runs + [current] if current else runs


def local_instructions(instructions):
    return sum(i.split()[0].startswith(("LDL", "STL")) for i in instructions if i.split())


def gemm_problems(instructions):
    """What every kernel is checked for: HGMMA present, no GEMM serialized."""
    problems = []
    if not any("HGMMA" in i for i in instructions):
        problems.append("no HGMMA")
    runs = hgmma_runs(instructions)
    if runs and min(runs) < 2:
        problems.append(f"serialized wgmma (HGMMA runs {runs})")
    return problems


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


def conversions_among_exponentials(instructions):
    """Per wait for S: the conversions (F2FP) between its first and its last exponential."""
    counts, window = [], None
    for ins in instructions + ["WARPGROUP.DEPBAR.LE gsb0, 0x1"]:
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ins or "HGMMA" in ins:
            if window is not None:
                mufu = [i for i, op in enumerate(window) if op == "MUFU"]
                counts.append(sum(op == "F2FP" for op in window[mufu[0]:mufu[-1]]) if mufu else 0)
            window = [] if "DEPBAR" in ins else None
        elif window is not None:
            window.append("MUFU" if "MUFU.EX2" in ins else "F2FP" if "F2FP" in ins else "")
    return counts


def report(label, resources, instructions, problems, detail):
    """Prints one kernel's line; 1 when it failed."""
    hgmma = sum("HGMMA" in i for i in instructions)
    note = f"  <- {'; '.join(problems)}" if problems else ""
    print(f"{'FAIL' if problems else 'ok  '} {label:55s} {resources} HGMMA {hgmma} {detail}{note}")
    return int(bool(problems))


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
        for name, instructions in kernels(sass, "forward"):
            seen += 1
            m = TRAITS.search(name)
            label = (f"{m.group(1)} d{m.group(2)} {m.group(3)}x{m.group(4)} stages {m.group(5)} "
                     f"ping-pong {m.group(6)} ctas/SM {m.group(7) or 1}") if m else name[:60]
            if m and int(m.group(8) or 1) > 1:
                label += f" cluster {m.group(8)}"
            if MODIFIERS.search(name):
                label += " softcap/ALiBi"
            local = local_instructions(instructions)
            problems = gemm_problems(instructions)
            if local:
                problems.append(f"{local} local-memory instructions")
            # traits.hpp's rule: Traits::kPingPong is the template flag and kBlockM == 128.
            ping_pong = m is not None and m.group(6) == "1" and m.group(3) == "128"
            if ping_pong:
                overlaps = conversions_among_exponentials(instructions)
                detail = f"conversions among exponentials {overlaps}"
                if not overlaps or max(overlaps) == 0:
                    problems.append("P is not converted amid the softmax")
            else:
                overlaps = softmax_overlaps(instructions)
                detail = f"overlap {overlaps}"
                if not overlaps or min(overlaps) == 0:
                    problems.append(f"softmax does not overlap PV (exponentials per window "
                                    f"{overlaps})")
            failures += report(label, resources.get(name, "?"), instructions, problems, detail)
        for name, instructions in kernels(sass, "backward"):
            seen += 1
            m = BACKWARD_TRAITS.search(name)
            head_dim = int(m.group(2)) if m else 0
            label = (f"backward {m.group(1)} d{head_dim} {m.group(3)}x{m.group(4)} "
                     f"split {'head dim' if m.group(6) == '1' else 'keys'}") if m else name[:60]
            local = local_instructions(instructions)
            budget = LOCAL_BUDGET.get(head_dim, 0)
            problems = gemm_problems(instructions)
            if local > budget:
                problems.append(f"{local} local-memory instructions (budget {budget})")
            failures += report(label, resources.get(name, "?"), instructions, problems,
                               f"local {local}/{budget}")
    if seen == 0:
        print("no sm90 kernel found", file=sys.stderr)
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

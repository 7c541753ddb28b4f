#!/usr/bin/env python3
"""A/B of two builds of libflashcute.so, loaded side by side in one process: GPU time per row.

What it measures: for every plain row of bench.py (the seed's default problem in bf16 and fp16,
causal and not, and the 36-row sweep over head_dim 64/128/256 and seqlen 512..16k) and each of
"ours" (family auto) and "ours_sm80" (family sm80 forced), the TFLOP/s of the OLD and the NEW
library on the same input buffers, and new / old. With --kind bwd the rows are bench.py's bwd
rows and the timed call is fc_backward (dq, dk and dv from one forward's output and LSE, run once
by the old library; each build with its own workspace), rated by bench.flops. With --kind varlen
they are bench.py's varlen and varlen_short rows, one forward over the packed sequences (rated by
their useful FLOPs, as bench.py rates them). With --kind modifiers they are bench.py's softcap and
alibi rows (softcap 30; ALiBi with bench.py's slopes), rated as the plain call of the same shape.

How: both .so files are opened with ctypes.CDLL (RTLD_LOCAL, two handles, each with its own
statically linked CUDA runtime) and called through their C ABI directly, each with an
fc_forward_args filled by its own fc_forward_args_init. Before a row is timed, the two outputs
are compared (relative L2 must stay below 1e-2, for the backward each of dq, dk and dv; whether
they are bitwise equal is reported).
Timing is bench.py's: GEMMs first bring the clock up from idle (bench.warm_up_gpu), then
bench.median_ms (warm-up calls, then a GPU sleep, more warm-up calls filling bench.SETTLE_MS of GPU
time and the median of CUDA-event-timed calls spanning bench.SPAN_MS of GPU time, all queued behind
the sleep, so host overhead never shows and the timed calls sample the GPU's sustained state, whose
clock swings over about a second). To cancel clock and power drift, each (row, impl) alternates the
two builds over --rounds rounds (old new, new old, old new, ...; default 2, each timing spanning a
second) and keeps each build's median over the rounds. FLOPs are bench.dense_flops (4 b h sq sk d,
halved for causal; the backward 2.5 times that).

Writes DIR/<gpu>-ab.json (h200-ab.json on an H200) and prints a table, per impl the median and the
minimum of new / old, and PASS/FAIL for median >= 0.99 and minimum >= 0.97. Exit status: 0 when
every impl passes, 1 when one fails the criteria; a correctness failure raises before any timing
of that row.

Usage: python3 bench/ab.py --old OLD.so --new NEW.so --out DIR [--old-commit SHA] [--commit SHA]
       [--kind plain|bwd|varlen|modifiers] [--rows quick|plain] [--match REGEX]
       [--impls ours,ours_sm80] [--rounds 2] [--warmup 10] [--iters 30]
--match keeps the rows whose label (as printed, e.g. "b4 s8192 h16 d128 bf16 full") it matches,
so two libraries built with only some head dims can be compared on those.
The commit defaults to $FLASHCUTE_COMMIT or `git rev-parse HEAD`, the old commit to
$FLASHCUTE_OLD_COMMIT or "unknown". Passing the same file twice (an A/A run, to see the noise)
works: the second copy is loaded from a temporary file so that the two handles stay separate.
"""

import argparse
import ctypes
import datetime
import importlib
import json
import math
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import torch

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
# bench/bench.py, imported as a module; it puts the repository's python/ on sys.path when no
# flashcute package is installed, so flashcute._library is imported after it.
sys.path.insert(0, str(HERE))
bench = importlib.import_module("bench")
fclib = importlib.import_module("flashcute._library")

IMPLS = (("ours", "auto"), ("ours_sm80", "sm80"))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
MAX_REL_L2 = 1e-2
MEDIAN_BAR = 0.99
MIN_BAR = 0.97


class CallError(RuntimeError):
    """fc_forward or fc_backward returned a non-zero fc_status (kept in `status`)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------
# The two libraries

class Library:
    """One build of libflashcute.so behind its own dlopen handle."""

    def __init__(self, name, path):
        self.name = name
        self.path = pathlib.Path(path)
        lib = ctypes.CDLL(str(self.path), mode=os.RTLD_LOCAL)
        lib.fc_forward_args_init.argtypes = [ctypes.POINTER(fclib.FcForwardArgs)]
        lib.fc_forward_args_init.restype = None
        lib.fc_forward.argtypes = [ctypes.POINTER(fclib.FcForwardArgs)]
        lib.fc_forward.restype = ctypes.c_int
        lib.fc_backward_args_init.argtypes = [ctypes.POINTER(fclib.FcBackwardArgs)]
        lib.fc_backward_args_init.restype = None
        lib.fc_backward_workspace_size.argtypes = [ctypes.POINTER(fclib.FcBackwardArgs),
                                                   ctypes.POINTER(ctypes.c_uint64)]
        lib.fc_backward_workspace_size.restype = ctypes.c_int
        lib.fc_backward.argtypes = [ctypes.POINTER(fclib.FcBackwardArgs)]
        lib.fc_backward.restype = ctypes.c_int
        lib.fc_last_error.argtypes = []
        lib.fc_last_error.restype = ctypes.c_char_p
        self.lib = lib

    def entry_address(self):
        return ctypes.cast(self.lib.fc_forward, ctypes.c_void_p).value

    def error(self, status):
        message = self.lib.fc_last_error().decode("utf-8", "replace")
        return f"{self.name} library ({self.path}): {message} (fc_status {status})"

    @staticmethod
    def _fill_problem(a, r, family):
        a.abi_version = fclib.ABI_VERSION
        a.dtype = fclib.DTYPE_CODES[r["dtype"]]
        a.batch = r["b"]
        a.seqlen_q = r["sq"]
        a.seqlen_k = r["sk"]
        a.heads = r["h"]
        a.heads_k = r["hk"]
        a.head_dim = r["d"]
        a.softmax_scale = 1.0 / math.sqrt(r["d"])
        a.causal = int(r["causal"])
        a.causal_alignment = fclib.CAUSAL_BOTTOM_RIGHT
        a.window_left = -1
        a.window_right = -1
        a.family = fclib.FAMILIES[family]
        a.stream = torch.cuda.current_stream().cuda_stream or None

    def args(self, r, family, q, k, v, o, lse=None, cu_seqlens=None, modifiers=None):
        """An fc_forward_args for dense (b, s, h, d) tensors, or packed (tokens, h, d) ones with
        cu_seqlens (the same for queries and keys), filled as flashcute.forward does; modifiers:
        bench.modifier_options of a softcap or alibi row (the slopes tensor kept alive by the
        caller)."""
        a = fclib.FcForwardArgs()
        self.lib.fc_forward_args_init(ctypes.byref(a))
        self._fill_problem(a, r, family)
        if modifiers:
            a.softcap = modifiers.get("softcap", 0.0)
            slopes = modifiers.get("alibi_slopes")
            a.alibi_slopes = slopes.data_ptr() if slopes is not None else None
        if cu_seqlens is None:
            a.q, a.k, a.v, a.o = (fclib.FcTensor(t.data_ptr(), *t.stride()[:3])
                                  for t in (q, k, v, o))
        else:
            a.q, a.k, a.v, a.o = (fclib.FcTensor(t.data_ptr(), 0, *t.stride()[:2])
                                  for t in (q, k, v, o))
            a.cu_seqlens_q = a.cu_seqlens_k = cu_seqlens.data_ptr()
            a.total_q = q.shape[0]
        a.softmax_lse = lse.data_ptr() if lse is not None else None
        return a

    def backward_args(self, r, family, tensors, lse):
        """An fc_backward_args for dense tensors (q, k, v, o, dout, dq, dk, dv) and a workspace of
        the size the library asks for (returned beside the args, which hold its address)."""
        a = fclib.FcBackwardArgs()
        self.lib.fc_backward_args_init(ctypes.byref(a))
        self._fill_problem(a, r, family)
        for name, t in zip(("q", "k", "v", "o", "dout", "dq", "dk", "dv"), tensors):
            setattr(a, name, fclib.FcTensor(t.data_ptr(), *t.stride()[:3]))
        a.softmax_lse = lse.data_ptr()
        size = ctypes.c_uint64()
        status = self.lib.fc_backward_workspace_size(ctypes.byref(a), ctypes.byref(size))
        if status != fclib.OK:
            raise CallError(status, self.error(status))
        workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device="cuda")
        a.workspace = workspace.data_ptr() if size.value else None
        a.workspace_bytes = size.value
        return a, workspace

    def caller(self, args, entry="fc_forward"):
        """A zero-argument callable running `entry` (fc_forward or fc_backward) on args; raises on
        a non-zero status."""
        function, ref = getattr(self.lib, entry), ctypes.byref(args)

        def call():
            status = function(ref)
            if status != fclib.OK:
                raise CallError(status, self.error(status))

        return call


def open_libraries(old_path, new_path, keep):
    """The two Library objects. dlopen hands back the handle it already has for a file it has
    loaded (matched by device and inode), so a file given twice is copied first."""
    old_path, new_path = pathlib.Path(old_path), pathlib.Path(new_path)
    for path in (old_path, new_path):
        if not path.is_file():
            sys.exit(f"ab.py: no such library: {path}")
    s_old, s_new = old_path.stat(), new_path.stat()
    if (s_old.st_dev, s_old.st_ino) == (s_new.st_dev, s_new.st_ino):
        folder = tempfile.mkdtemp(prefix="flashcute-ab-")
        keep.append(folder)
        new_path = pathlib.Path(shutil.copy2(new_path, pathlib.Path(folder) / "libflashcute.so"))
        print(f"--old and --new are the same file (an A/A run): new loaded from {new_path}")
    old, new = Library("old", old_path), Library("new", new_path)
    if old.entry_address() == new.entry_address():
        sys.exit("ab.py: both libraries resolved to one handle; nothing would be compared")
    return old, new


# ---------------------------------------------------------------------------------------------
# Rows

def select_rows(kind, which, match=None):
    if kind == "varlen":
        rows = [r for r in bench.feature_rows() if r["kind"] in bench.VARLEN_KINDS]
    elif kind == "modifiers":
        rows = [r for r in bench.feature_rows() if r["kind"] in bench.MODIFIER_KINDS]
    else:
        rows = bench.bwd_rows() if kind == "bwd" else bench.plain_rows()
    if match is not None:
        rows = [r for r in rows if re.search(match, label(r))]
    if which == "plain":
        return rows

    def quick(r):
        if kind == "bwd":  # issue 12's bar: d 128 with s >= 2k
            return r["d"] == 128 and r["sq"] >= 2048
        seed = (r["b"], r["sq"], r["h"], r["d"], r["dtype"]) == (4, 8192, 16, 128, "bf16")
        small = (r["d"], r["sq"]) == (64, 512)
        wide = (r["d"], r["sq"]) == (256, 2048)
        return r["dtype"] == "bf16" and (seed or small or wide)

    return [r for r in rows if quick(r)]


def label(r):
    heads = f"h{r['h']}" if r["h"] == r["hk"] else f"h{r['h']}/{r['hk']}"
    shown = bench.VARLEN_KINDS + bench.MODIFIER_KINDS
    kind = f"{r['kind']} " if r.get("kind") in shown else ""
    return (f"{kind}b{r['b']} s{r['sq']} {heads} d{r['d']} {r['dtype']} "
            f"{'causal' if r['causal'] else 'full'}")


def make_inputs(r):
    """q, k, v: (b, s, h, d), or for a varlen row the packed (tokens, h, d) of its sequences; and
    the rows' cu_seqlens (int32) or None."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    dtype = DTYPES[r["dtype"]]
    if r.get("kind") in bench.VARLEN_KINDS:
        tokens = sum(r["seqlens"])
        q_shape, kv_shape = (tokens, r["h"], r["d"]), (tokens, r["hk"], r["d"])
        cu = torch.tensor([0] + r["seqlens"], dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    else:
        q_shape, kv_shape = (r["b"], r["sq"], r["h"], r["d"]), (r["b"], r["sk"], r["hk"], r["d"])
        cu = None
    q = torch.randn(q_shape, generator=gen, device="cuda", dtype=dtype)
    k = torch.randn(kv_shape, generator=gen, device="cuda", dtype=dtype)
    v = torch.randn(kv_shape, generator=gen, device="cuda", dtype=dtype)
    return q, k, v, cu


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ---------------------------------------------------------------------------------------------
# One (row, impl)

def check(r, impl, calls, outs):
    """Runs each build once into NaN-filled outputs (outs: name -> list of tensors); fails loudly
    on an error, an output that was not (fully) written or is not finite, or old and new apart by
    rel L2 >= MAX_REL_L2 in any output. Returns (bitwise equal, the largest rel L2), or None when
    neither build has a kernel for the row."""
    statuses = {}
    for name, call in calls.items():
        for out in outs[name]:
            out.fill_(float("nan"))
        try:
            call()
            torch.cuda.synchronize()
            statuses[name] = None
        except CallError as error:
            statuses[name] = error
    failed = {name: e for name, e in statuses.items() if e is not None}
    if len(failed) == 2 and all(e.status == fclib.ERROR_UNSUPPORTED for e in failed.values()):
        return None
    if failed:
        raise RuntimeError(f"{label(r)} {impl}: " + "; ".join(str(e) for e in failed.values()))
    for name, tensors in outs.items():
        if not all(torch.isfinite(out).all() for out in tensors):
            raise RuntimeError(f"{label(r)} {impl}: the {name} library's output has NaN or inf")
    err = max(rel_l2(new, old) for old, new in zip(outs["old"], outs["new"]))
    if not err < MAX_REL_L2:
        raise RuntimeError(f"{label(r)} {impl}: old and new outputs differ, rel L2 {err:.3g} "
                           f"(limit {MAX_REL_L2})")
    return all(torch.equal(old, new) for old, new in zip(outs["old"], outs["new"])), err


def time_pair(r, calls, args):
    """TFLOP/s of each build: median over rounds, the order alternating between rounds."""
    work = bench.flops(r)
    rates = {"old": [], "new": []}
    for round_index in range(args.rounds):
        order = ("old", "new") if round_index % 2 == 0 else ("new", "old")
        for name in order:
            ms = bench.median_ms(calls[name], args.warmup, args.iters)
            rates[name].append(work / (ms * 1e-3) / 1e12)
    return rates


def forward_calls(r, libs, family, q, k, v, cu_seqlens, modifiers=None):
    """Each build's fc_forward into its own output: (outs, args, calls), outs as lists."""
    outs = {name: [torch.empty_like(q)] for name in libs}
    fc_args = {name: lib.args(r, family, q, k, v, outs[name][0], cu_seqlens=cu_seqlens,
                              modifiers=modifiers)
               for name, lib in libs.items()}
    return outs, fc_args, {name: lib.caller(fc_args[name]) for name, lib in libs.items()}


def backward_calls(r, libs, family, q, k, v, dout):
    """Each build's fc_backward from one forward (the old build's, family auto) into its own dq,
    dk, dv and workspace: (outs, kept, calls), where kept holds what the calls point at (each
    build's args and workspace, the forward's output and LSE), or None when the forward has no
    kernel."""
    o = torch.empty_like(q)
    lse = torch.empty((r["b"], r["h"], r["sq"]), device="cuda", dtype=torch.float32)
    forward_args = libs["old"].args(r, "auto", q, k, v, o, lse)
    try:
        libs["old"].caller(forward_args)()
    except CallError as error:
        if error.status == fclib.ERROR_UNSUPPORTED:
            return None
        raise
    outs, kept, calls = {}, {}, {}
    for name, lib in libs.items():
        outs[name] = [torch.empty_like(t) for t in (q, k, v)]
        kept[name] = lib.backward_args(r, family, (q, k, v, o, dout, *outs[name]), lse)
        calls[name] = lib.caller(kept[name][0], "fc_backward")
    return outs, (kept, o, lse), calls


def run_row(r, libs, args, log):
    q, k, v, cu_seqlens = make_inputs(r)
    dout = torch.randn_like(q) if args.kind == "bwd" else None
    modifiers = bench.modifier_options(r) if r.get("kind") in bench.MODIFIER_KINDS else None
    entries = []
    for impl, family in args.impls:
        if args.kind == "bwd":
            made = backward_calls(r, libs, family, q, k, v, dout)
            if made is None:
                log(f"  {impl}: left out (the old build has no forward kernel for it)")
                continue
            outs, fc_args, calls = made
        else:
            outs, fc_args, calls = forward_calls(r, libs, family, q, k, v, cu_seqlens, modifiers)
        verdict = check(r, impl, calls, outs)
        if verdict is None:
            log(f"  {impl}: left out (neither build has a kernel for it)")
            continue
        bitwise, err = verdict
        rates = time_pair(r, calls, args)
        old, new = (statistics.median(rates[n]) for n in ("old", "new"))
        log(f"  {impl}: old {old:.1f} new {new:.1f} new/old {new / old:.3f} "
            f"({'bitwise equal' if bitwise else f'rel L2 {err:.2g}'}; rounds old "
            + " ".join(f"{x:.0f}" for x in rates["old"]) + ", new "
            + " ".join(f"{x:.0f}" for x in rates["new"]) + ")")
        entry = {key: r[key] for key in ("b", "sq", "sk", "h", "hk", "d", "causal", "dtype")}
        entry.update(kind=r.get("kind", args.kind), impl=impl, old=round(old, 2), new=round(new, 2),
                     bitwise_equal=bitwise, rel_l2=err)
        entries.append(entry)
        del outs, fc_args, calls
    del q, k, v, cu_seqlens, dout, modifiers
    torch.cuda.empty_cache()
    return entries


# ---------------------------------------------------------------------------------------------
# Output

def git_head():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def result_path(out, gpu):
    if hasattr(bench, "gpu_slug"):
        slug = bench.gpu_slug(gpu)
    elif "H200" in gpu.upper():
        slug = "h200"
    else:
        slug = re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_") or "gpu"
    return pathlib.Path(out) / f"{slug}-ab.json"


def report(rows, impls):
    """The table and the verdict lines; returns (text, every impl passed)."""
    lines = [f"{'row':<32}{'impl':<11}{'old':>9}{'new':>9}{'new/old':>9}  bitwise"]
    for e in rows:
        lines.append(f"{label(e):<32}{e['impl']:<11}{e['old']:>9.1f}{e['new']:>9.1f}"
                     f"{e['new'] / e['old']:>9.3f}  {'yes' if e['bitwise_equal'] else 'no'}")
    passed = True
    lines.append("")
    for impl, _ in impls:
        ratios = [e["new"] / e["old"] for e in rows if e["impl"] == impl]
        if not ratios:
            lines.append(f"{impl}: no rows")
            continue
        med, low = statistics.median(ratios), min(ratios)
        ok = med >= MEDIAN_BAR and low >= MIN_BAR
        passed &= ok
        worst = min((e for e in rows if e["impl"] == impl), key=lambda e: e["new"] / e["old"])
        equal = sum(e["bitwise_equal"] for e in rows if e["impl"] == impl)
        lines.append(f"{impl}: new/old median {med:.3f}, min {low:.3f} ({label(worst)}); "
                     f"{equal}/{len(ratios)} rows bitwise equal")
        lines.append(f"{'PASS' if ok else 'FAIL'} {impl}: median >= {MEDIAN_BAR} and "
                     f"min >= {MIN_BAR}")
    return "\n".join(lines), passed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the baseline libflashcute.so")
    parser.add_argument("--new", required=True, help="the candidate libflashcute.so")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--old-commit", default=os.environ.get("FLASHCUTE_OLD_COMMIT", "unknown"))
    parser.add_argument("--commit", default=os.environ.get("FLASHCUTE_COMMIT") or None)
    parser.add_argument("--kind", choices=("plain", "bwd", "varlen", "modifiers"),
                        default="plain",
                        help="the forward's plain rows, the backward's bwd rows, the forward's "
                             "varlen and varlen_short rows, or its softcap and alibi rows")
    parser.add_argument("--rows", choices=("quick", "plain"), default="plain",
                        help="quick: a few rows (bwd: d 128 with s >= 2k); plain: every row")
    parser.add_argument("--match", help="regular expression over the row labels")
    parser.add_argument("--impls", default=",".join(name for name, _ in IMPLS),
                        help="comma-separated implementations to compare (ours, ours_sm80)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    if args.warmup < 5 or args.iters < 20:
        parser.error("at least 5 warm-up calls and 20 timed calls")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    known = dict(IMPLS)
    names = [n.strip() for n in args.impls.split(",") if n.strip()]
    if not names or any(n not in known for n in names):
        parser.error(f"--impls: choose among {', '.join(known)}")
    args.impls = [(n, known[n]) for n in names]
    if not torch.cuda.is_available():
        sys.exit("ab.py needs a CUDA device")
    commit = args.commit or git_head()

    temporary = []
    old, new = open_libraries(args.old, args.new, temporary)
    libs = {"old": old, "new": new}
    gpu = torch.cuda.get_device_name()
    rows = select_rows(args.kind, args.rows, args.match)
    if not rows:
        parser.error(f"--match {args.match!r}: no row matches")
    print(f"{gpu}, torch {torch.__version__}; old {old.path} ({args.old_commit}), "
          f"new {new.path} ({commit}); {len(rows)} rows x {len(args.impls)} impls, "
          f"{args.rounds} rounds", flush=True)

    results = []
    try:
        with torch.inference_mode():
            bench.warm_up_gpu()
            for r in rows:
                print(label(r), flush=True)
                results += run_row(r, libs, args, lambda line: print(line, flush=True))
    finally:
        for folder in temporary:
            shutil.rmtree(folder, ignore_errors=True)

    document = {
        "gpu": gpu,
        "date": datetime.date.today().isoformat(),
        "old_commit": args.old_commit,
        "commit": commit,
        "rows": results,
    }
    path = result_path(args.out, gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {path}\n")
    text, passed = report(results, args.impls)
    print(text)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

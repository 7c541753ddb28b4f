#!/usr/bin/env python3
"""Host cost of one call: how many tiny attention calls a millisecond of wall time holds.

  python3 bench/host_cost.py [--merge RESULTS.json] [--out DIR] [--profile]

The rows (kind "host": b 1, s 128, h 8, d 64, bf16, inputs without requires_grad; non-causal and
causal) are small enough that every implementation is bound by its host work: calls run back to
back for about a second, synchronised once at the end, and `calls_per_ms` is calls per
millisecond of wall time. Columns:
ours (torch tensors), ours_dlpack (CuPy arrays through DLPack; fp16, as CuPy has no bf16),
torch_sdpa (SDPA on its default backend). Each is measured in three rounds in rotating order;
the figure is the median. The causal row is the one whose call finds its stream's tile counters
(the Hopper forward's dynamic schedule), a lookup the non-causal call skips.
--merge reads a results file and replaces its "host" rows with this one (bench/README.md: a run
replaces the kinds it measured and keeps the rest). --profile prints where our call spends its
time: the library's own entry (fc_forward on prepared arguments), the custom op, the Python
wrapper, and cProfile's heaviest functions.
"""

import argparse
import cProfile
import ctypes
import datetime
import json
import pathlib
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402  (puts the package on the path when no wheel is installed)

flashcute = bench.flashcute

ROWS = [dict(b=1, sq=128, sk=128, h=8, hk=8, d=64, causal=causal, dtype="bf16", kind="host")
        for causal in (False, True)]


def calls_per_ms(fn, seconds):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    calls = 0
    start = time.perf_counter()
    while True:
        for _ in range(100):
            fn()
        calls += 100
        if time.perf_counter() - start >= seconds:
            break
    torch.cuda.synchronize()
    return calls / ((time.perf_counter() - start) * 1e3)


def callables(row):
    shape = (row["b"], row["sq"], row["h"], row["d"])
    causal = row["causal"]
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    calls = {
        "ours": lambda: flashcute.flash_attn_func(q, k, v, causal=causal),
        "torch_sdpa": lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal),
    }
    try:
        import cupy

        # CuPy has no bfloat16: the DLPack column runs the same shape in fp16.
        cq, ck, cv = (cupy.from_dlpack(t.to(torch.float16)) for t in (q, k, v))
        calls["ours_dlpack"] = lambda: flashcute.flash_attn_func(cq, ck, cv, causal=causal)
    except ImportError:
        print("ours_dlpack: left out (no CuPy)")
    return calls, (q, k, v)


def profile(calls, tensors, n=2000):
    """Per-call microseconds of each layer of our call, then cProfile's view."""
    q, k, v = tensors

    def per_call_us(fn):
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n * 1e6

    from flashcute import _library, _torch

    out = torch.empty_like(q)
    captured = {}
    original = _library.forward

    def capture(args):
        captured["args"] = args
        return original(args)

    # The checked path builds the arguments (the eager fast path does not go through here).
    fast = _torch.fast_forward
    _torch.fast_forward = lambda *args: None
    _library.forward = capture
    flashcute.flash_attn_func(q, k, v)
    _library.forward = original
    layers_checked = {"flash_attn_func (torch, checked path)": calls["ours"]}
    for name, fn in layers_checked.items():
        print(f"  {name:<36} {per_call_us(fn):8.1f} us per call")
    _torch.fast_forward = fast
    args = captured["args"]
    args.o.data = out.data_ptr()
    lib = _library.load()
    layers = {
        "fc_forward (C ABI, prepared args)": lambda: lib.fc_forward(ctypes.byref(args)),
        "torch.ops.flashcute.fwd": lambda: torch.ops.flashcute.fwd(
            q, k, v, None, None, 0, 0, None, 0.125, False, 1, -1, -1, 0.0, False, False,
            family=0, m_block=0, n_block=0, num_threads=0),
        "flash_attn_func (torch)": calls["ours"],
        "sdpa": calls["torch_sdpa"],
    }
    if "ours_dlpack" in calls:
        layers["flash_attn_func (CuPy)"] = calls["ours_dlpack"]
    for name, fn in layers.items():
        print(f"  {name:<36} {per_call_us(fn):8.1f} us per call")
    for name in ("ours", "ours_dlpack"):
        if name not in calls:
            continue
        print(f"cProfile of {name}:")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(n):
            calls[name]()
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merge", help="results file whose host rows this run replaces")
    parser.add_argument("--out", help="output folder or .json path (default: --merge's path)")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("host_cost.py needs a CUDA device")

    entries = []
    for row in ROWS:
        calls, tensors = callables(row)
        names = list(calls)
        samples = {name: [] for name in names}
        print("causal" if row["causal"] else "non-causal")
        with torch.inference_mode():
            for round_index in range(args.rounds):
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    samples[name].append(calls_per_ms(calls[name], args.seconds))
            for name in names:
                print(f"  {name:<12} calls/ms " + " ".join(f"{x:.2f}" for x in samples[name]) +
                      f"  ({1e3 / statistics.median(samples[name]):.1f} us per call)")
            if args.profile and not row["causal"]:
                profile(calls, tensors)

        entry = dict(row)
        entry["calls_per_ms"] = {n: round(statistics.median(s), 2) for n, s in samples.items()}
        entry["commit"] = bench.commit_sha()
        entry["date"] = datetime.date.today().isoformat()
        rates = entry["calls_per_ms"]
        for name in ("ours", "ours_dlpack"):
            if name in rates:
                ratio = rates['torch_sdpa'] / rates[name]
                print(f"  {name} costs {ratio:.2f} x SDPA's host time per call")
        entries.append(entry)

    if args.merge:
        document = json.loads(pathlib.Path(args.merge).read_text())
        document["rows"] = [r for r in document["rows"] if r.get("kind") != "host"] + entries
        gpu = document.get("gpu", torch.cuda.get_device_name())
    else:
        gpu = torch.cuda.get_device_name()
        document = {"gpu": gpu, "date": entries[0]["date"], "commit": entries[0]["commit"],
                    "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                    "rows": entries}
    target = args.out or args.merge
    if target:
        path = bench.output_path(target, gpu)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

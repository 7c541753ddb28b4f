#!/usr/bin/env python3
"""Forward accuracy on random normal inputs: relative L2 error of each implementation's output
against an fp64 reference computed from the same (rounded) inputs.

Implementations: ours_sm80 and ours_sm90 (each family forced, when it has kernels for the case),
torch_flash, torch_cudnn and torch_efficient (SDPA with that backend forced). Cases: b 2, h 8,
seqlen 1000 / 1537 / 2049 (not multiples of any tile), head_dim 64 and 128, causal and not, bf16
and fp16, fresh N(0, 1) data per case from a fixed seed. The figure per (implementation, dtype) is
the mean error over the cases; the table also gives each mean over ours_sm80's.

Writes DIR/<gpu>-accuracy.json (--out, default bench/results/) and prints the table.
Usage: python3 bench/accuracy.py [--out DIR]
"""

import argparse
import datetime
import importlib
import json
import pathlib
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
bench = importlib.import_module("bench")  # puts python/ on sys.path when no package is installed
flashcute = bench.flashcute

SEQLENS = (1000, 1537, 2049)
HEAD_DIMS = (64, 128)
BATCH, HEADS = 2, 8
FAMILIES = (("ours_sm80", "sm80"), ("ours_sm90", "sm90"))


def cases():
    return [dict(dtype=dtype, s=s, d=d, causal=causal) for dtype in ("bf16", "fp16")
            for d in HEAD_DIMS for s in SEQLENS for causal in (False, True)]


def reference(q, k, v, causal):
    """fp64 attention of (b, s, h, d) inputs, top-left causal mask (sq == sk)."""
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    scores = qd @ kd.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = q.shape[1]
        hidden = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores.masked_fill_(hidden, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vd).transpose(1, 2)


def implementations(c, q, k, v):
    """name -> zero-argument callable returning the (b, s, h, d) output."""
    calls = {}
    for name, family in FAMILIES:
        if flashcute.compiled_tile_configs(family, c["dtype"], c["d"]):
            calls[name] = (lambda fam: lambda: flashcute.forward(q, k, v, causal=c["causal"],
                                                                 family=fam))(family)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    for name, backend in bench.PEERS.items():
        calls[name] = (lambda b: lambda: _sdpa(b, qt, kt, vt, c["causal"]))(backend)
    return calls


def _sdpa(backend, qt, kt, vt, causal):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def measure():
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    errors = {}  # (name, dtype) -> [error per case]
    per_case = []
    for c in cases():
        shape = (BATCH, c["s"], HEADS, c["d"])
        q, k, v = (torch.randn(shape, generator=gen, device="cuda", dtype=bench.DTYPES[c["dtype"]])
                   for _ in range(3))
        ref = reference(q, k, v, c["causal"])
        row = dict(c)
        for name, fn in implementations(c, q, k, v).items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    out = fn()
                except (RuntimeError, flashcute.FlashCuteError):
                    continue  # SDPA backends refuse some cases; a family may lack a head_dim
            err = ((out.double() - ref).norm() / ref.norm()).item()
            row[name] = err
            errors.setdefault((name, c["dtype"]), []).append(err)
        per_case.append(row)
    return errors, per_case


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="output folder (default bench/results/)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("accuracy.py needs a CUDA device")
    with torch.inference_mode():
        errors, per_case = measure()
    names = [n for n, _ in FAMILIES] + list(bench.PEERS)
    means = {f"{name} {dtype}": statistics.mean(errors[(name, dtype)])
             for name in names for dtype in ("bf16", "fp16") if (name, dtype) in errors}
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}: relative L2 error against fp64, mean over {len(per_case) // 2} cases per dtype")
    print(f"{'implementation':<26}{'error':>12}{'/ ours_sm80':>13}")
    for key, mean in means.items():
        base = means.get(f"ours_sm80 {key.split()[1]}")
        ratio = f"{mean / base:>13.3f}" if base else f"{'-':>13}"
        print(f"{key:<26}{mean:>12.4g}{ratio}")
    document = {"gpu": gpu, "date": datetime.date.today().isoformat(),
                "commit": bench.commit_sha(), "torch": torch.__version__,
                "mean_rel_l2": means, "cases": per_case}
    out = pathlib.Path(args.out) if args.out else HERE / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{bench.gpu_slug(gpu)}-accuracy.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

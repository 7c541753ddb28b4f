#!/usr/bin/env python3
"""The seed's own kernel beside our SM80 family and SDPA's flash backend in one process (issue 15
item 2: the SM80 family at the seed kernel's lead over FlashAttention-2, measured in the same
process as the peers).

The seed (CUTLASS's CuTe DSL FlashAttention-2 example for Ampere) compiles without a GPU: its
cubin for sm_90a, built by the DSL from fake tensors of dynamic shape, is loaded here through
the CUDA driver and launched as the DSL launches it: grid (ceil(s / 128), b, h), 128 threads,
64 KB of dynamic shared memory; each tensor a 48-byte parameter (pointer; b, s, h as int32;
their int64 strides at offsets 24, 32, 40; the head dim 128 and its unit stride static), then
softmax_scale * log2(e) as a float. Its output is checked against an fp32 reference before any
timing. Timing is bench.py's (bench.median_ms, the sustained state), the three calls alternated
over --rounds rounds, each call's median over the rounds kept.

Usage: python3 bench/seed_probe.py --cubin SEED.cubin --kernel NAME [--causal] [--dtype bf16|fp16]
       [--rounds 3]
  scripts/compile_seed_cubin.py writes the cubin and, beside it, --kernel's entry name.
"""

import argparse
import ctypes
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import bench

try:
    import flashcute
except ImportError:
    sys.path.insert(0, "python")
    import flashcute

BLOCK_M = 128
THREADS = 128
SMEM_BYTES = 65536
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class SeedTensor(ctypes.Structure):
    """One tensor parameter of the DSL kernel: (b, s, h, 128) with dynamic b, s, h and strides."""

    _fields_ = [("ptr", ctypes.c_void_p), ("shape", ctypes.c_int32 * 3),
                ("pad", ctypes.c_int32), ("stride", ctypes.c_int64 * 3)]


def seed_tensor(t):
    assert t.dim() == 4 and t.shape[3] == 128 and t.stride(3) == 1
    return SeedTensor(t.data_ptr(), (ctypes.c_int32 * 3)(*t.shape[:3]), 0,
                      (ctypes.c_int64 * 3)(*t.stride()[:3]))


class SeedKernel:
    def __init__(self, cubin, name):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        torch.cuda.init()  # the primary context, current on this thread
        self.module = ctypes.c_void_p()
        self.function = ctypes.c_void_p()
        with open(cubin, "rb") as f:
            self.image = f.read()
        self.check(self.cuda.cuModuleLoadData(ctypes.byref(self.module), self.image))
        self.check(self.cuda.cuModuleGetFunction(ctypes.byref(self.function), self.module,
                                                 name.encode()))
        self.check(self.cuda.cuFuncSetAttribute(
            self.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM_BYTES))

    @staticmethod
    def check(status):
        if status != 0:
            raise RuntimeError(f"CUDA driver call failed with status {status}")

    def __call__(self, q, k, v, o, scale_log2):
        args = [seed_tensor(q), seed_tensor(k), seed_tensor(v), seed_tensor(o),
                ctypes.c_float(scale_log2)]
        pointers = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        b, s, h, _ = q.shape
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.check(self.cuda.cuLaunchKernel(self.function, math.ceil(s / BLOCK_M), b, h,
                                            THREADS, 1, 1, SMEM_BYTES, stream, pointers, None))
        return o


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cubin", required=True)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--causal", action="store_true",
                        help="the cubin is the seed's causal kernel (top-left aligned)")
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                        help="the element type the cubin was compiled for")
    parser.add_argument("--b", type=int, default=4)
    parser.add_argument("--s", type=int, default=8192)
    parser.add_argument("--h", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("seed_probe.py needs a CUDA device")
    b, s, h, d = args.b, args.s, args.h, 128
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    q, k, v = (torch.randn(b, s, h, d, generator=gen, device="cuda", dtype=dtype)
               for _ in range(3))
    scale = 1 / math.sqrt(d)
    seed = SeedKernel(args.cubin, args.kernel)
    o_seed = torch.full_like(q, float("nan"))
    seed(q, k, v, o_seed, scale * math.log2(math.e))
    torch.cuda.synchronize()
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    # The reference for the first sequence's first two heads (the whole problem's score matrix in
    # fp32 would take 17 GB); every output is compared on those.
    with sdpa_kernel(SDPBackend.MATH):
        reference = F.scaled_dot_product_attention(
            qt[:1, :2].float(), kt[:1, :2].float(), vt[:1, :2].float(),
            is_causal=args.causal).transpose(1, 2)
    errors = {}
    calls = {
        "seed": lambda: seed(q, k, v, o_seed, scale * math.log2(math.e)),
        "ours_sm80": lambda: flashcute.forward(q, k, v, causal=args.causal, family="sm80"),
        "torch_flash": lambda: _flash(qt, kt, vt, args.causal),
    }
    for name, fn in calls.items():
        out = fn()
        out = out.transpose(1, 2) if name == "torch_flash" else out
        errors[name] = bench.rel_l2(out[:1, :, :2], reference)
        if not errors[name] < 1e-2:
            sys.exit(f"{name}: relative L2 error {errors[name]:.3g} against fp32: not timed")
    flops = bench.dense_flops(bench.row(b, s, h, d, args.causal, args.dtype))
    bench.warm_up_gpu()
    times = {name: [] for name in calls}
    for r in range(args.rounds):
        order = list(calls) if r % 2 == 0 else list(reversed(list(calls)))
        for name in order:
            times[name].append(bench.median_ms(calls[name], args.warmup, args.iters))
    rate = {name: flops / statistics.median(t) / 1e9 for name, t in times.items()}
    mask = "causal" if args.causal else "full"
    for name in calls:
        print(f"b{b} s{s} h{h} d{d} {args.dtype} {mask} {name}: {rate[name]:.1f} TFLOP/s "
              f"(rounds {' '.join(f'{flops / t / 1e9:.0f}' for t in times[name])}; "
              f"rel L2 {errors[name]:.2e})")
    print(f"seed / torch_flash {rate['seed'] / rate['torch_flash']:.3f}, ours_sm80 / torch_flash "
          f"{rate['ours_sm80'] / rate['torch_flash']:.3f}, ours_sm80 / seed "
          f"{rate['ours_sm80'] / rate['seed']:.3f}")


def _flash(qt, kt, vt, causal):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compiles the seed (CUTLASS's CuTe DSL FlashAttention-2 example for Ampere) for sm_90a without a
GPU, for bench/seed_probe.py: writes OUT/<mask>[-fp16].cubin and OUT/<mask>[-fp16].name (the
kernel's entry); bf16 unless --dtype fp16.

The example's source is not in this repository: pass the file (examples/python/CuTeDSL/ampere/
flash_attention_v2.py of CUTLASS v4.1, whose text is shared/seed's). It needs the CuTe DSL
(`pip install nvidia-cutlass-dsl==4.8.1`, in a virtual environment of its own). The tensors are
fakes of dynamic shape: b, s, h as int32, their strides int64 and divisible by 8 elements, the head
dim 128 static, as the example's runner marks its torch tensors.

Usage: python3 scripts/compile_seed_cubin.py --example flash_attention_v2.py --out DIR [--causal]
       [--dtype bf16|fp16]
"""

import argparse
import glob
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import types

HEAD_DIM = 128
BLOCK_M, BLOCK_N, THREADS = 128, 64, 128  # the example's defaults


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", required=True, help="the example's .py file")
    parser.add_argument("--out", required=True)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    args = parser.parse_args()

    # The example imports torch at module level for its runner only.
    sys.modules.setdefault("torch", types.ModuleType("torch"))
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    sys.modules.setdefault("cutlass.torch", types.ModuleType("cutlass.torch"))
    if not hasattr(cute, "make_fragment"):  # renamed between the example's DSL and 4.8
        cute.make_fragment = cute.make_rmem_tensor
    spec = importlib.util.spec_from_file_location("seed_example", args.example)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    element = cutlass.BFloat16 if args.dtype == "bf16" else cutlass.Float16

    def fake():
        shape = (cute.sym_int32(), cute.sym_int32(), cute.sym_int32(), HEAD_DIM)
        strides = tuple(cute.sym_int64(divisibility=8) for _ in range(3)) + (1,)
        return make_fake_tensor(element, shape, strides, assumed_align=16)

    kernel = example.FlashAttentionForwardAmpere(HEAD_DIM, BLOCK_M, BLOCK_N, THREADS, args.causal)
    mask = ("causal" if args.causal else "noncausal") + ("-fp16" if args.dtype == "fp16" else "")
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as dump:
        cute.compile(kernel, fake(), fake(), fake(), fake(), cutlass.Float32(0.5),
                     cuda.CUstream(0),
                     options=f"--keep-cubin --keep-ptx --gpu-arch=sm_90a --dump-dir={dump}")
        cubin, = glob.glob(os.path.join(dump, "*.cubin"))
        ptx, = glob.glob(os.path.join(dump, "*.ptx"))
        shutil.copy(cubin, os.path.join(args.out, f"{mask}.cubin"))
        with open(ptx) as f:
            name = re.search(r"\.entry\s+(\w+)", f.read()).group(1)
    with open(os.path.join(args.out, f"{mask}.name"), "w") as f:
        f.write(name + "\n")
    print(f"wrote {args.out}/{mask}.cubin ({name})")


if __name__ == "__main__":
    main()

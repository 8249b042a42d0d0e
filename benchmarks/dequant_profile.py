"""One call of each fused dequant-matmul kernel at one shape, for a profiler (run on a GPU):

    ncu -k regex:fma_kernel --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        python benchmarks/dequant_profile.py --size 8192 --batch 1

Each kernel runs twice (the first call compiles it); profile the second launch with
`--launch-skip 1`, or count both."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=8192, help="N = K")
    ap.add_argument("--batch", type=int, default=1, help="M")
    ap.add_argument("--group", type=int, default=128)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 0
    from benchmarks.dequant_matmul import make_layer
    from kernels import w4a16_matmul, w8a16_matmul
    layer = make_layer(args.size, args.size, args.group, torch.Generator().manual_seed(0))
    q8, s8 = layer["w8"]
    q4, s4, z4 = layer["w4"]
    x = torch.randn(args.batch, args.size, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        w8a16_matmul(x, q8, s8)
        w4a16_matmul(x, q4, s4, z4, args.group)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

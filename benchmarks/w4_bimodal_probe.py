"""Probe for benchmarks/RESULTS.md: is the bimodal w4a16 time at 4096^2, M = 1 in the kernel or in
the timer? Times one call with benchmarks.common.Timer and with triton.testing.do_bench in the
same process, and prints the weight's address (run several processes)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import Timer  # noqa: E402
from benchmarks.dequant_matmul import make_layer  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("benchmarks/w4_bimodal_probe.py times a GPU kernel and needs a CUDA GPU; none here")
        return 0
    import triton.testing

    from kernels import w4a16_matmul
    g = torch.Generator().manual_seed(0)
    q, s, z = make_layer(4096, 4096, 128, g)["w4"]
    x = torch.randn(1, 4096, generator=g).to("cuda", torch.bfloat16)

    def fn():
        return w4a16_matmul(x, q, s, z, 128)
    t = Timer(torch.device("cuda")).run({"w4": fn}, 5, 50)["w4"]
    db = triton.testing.do_bench(fn, warmup=100, rep=300, return_mode="median")
    print(f"q at {q.data_ptr() % 2**32:#x}  Timer {t * 1e6:.1f} us  do_bench {db * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())

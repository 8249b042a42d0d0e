"""What the batch-1 GEMV kernels (and the int4 M = 2..16 tensor-core kernel, `w4dot`) compile
to on an NVIDIA GPU, without one: registers, the main loop's machine instructions per weight,
its barriers and loads.

    python benchmarks/kernel_sass.py                       # every kernel, a few tiles, sm_90
    python benchmarks/kernel_sass.py --kinds w4 --arch 90 --prefetch both --json

Triton compiles for a named target on any machine (its wheel carries ptxas and nvdisasm), so a
kernel's SASS can be read on a laptop. For each kernel of kernels/gemv.py and each tile this
prints:

  regs      registers per thread (cuobjdump): with 4 warps per program, 128 or fewer let four
            programs share an SM's 64K registers
  loop      SASS instructions in the loop over K (the longest backward branch), and per weight:
            each thread converts and multiply-adds BLOCK_N * BLOCK_K / threads weights per step
  BAR       barriers per step: a layout conversion through shared memory (x broadcast to the
            tile's layout), each one stalling all the program's warps
  LDG       global loads per step (128-bit where the tile allows)

--split-k N compiles the split-K finish too (`--json` counts its atomics: the count and the
reset of the counter).

The figures in benchmarks/RESULTS.md, "Decode on the bandwidth scale on a GPU" ("Third run",
"Fourth run", "Fifth run"), came from this script. The same kernels
run in Triton's interpreter for the tests; this script needs the compiler, so it turns the
interpreter off before importing them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"            # before kernels/ decorates its functions
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

# (block_n, block_k, warps): the tiles pick_config uses and their neighbours in the sweeps
TILES = {"w8": [(8, 1024, 4), (8, 512, 4), (16, 512, 8)],
         "w4": [(8, 1024, 4), (32, 256, 4), (16, 512, 4)],
         "float": [(4, 2048, 4), (8, 512, 4)],
         "w4dot": [(64, 128, 4)]}     # kernels/dequant_matmul.py's M = 2..16 int4 kernel
GROUP = 128
POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*bf16",
            "z_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
            "cnt_ptr": "*i32"}
ALIGNED = ["N", "K", "swn", "sqn", "ssn", "szn", "sxm", "sym"]   # a contiguous 4096 x 4096 call


def _tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def compile_for(kind: str, block_n: int, block_k: int, warps: int, prefetch: bool, arch: int,
                split_k: int = 1):
    from kernels import dequant_matmul, gemv
    if kind == "w4dot":         # 16 rows of bf16 x, one group of GROUP = block_k per step
        import triton.language as tl
        fn, pointers = dequant_matmul._w4a16_dot_kernel, {}
        consts = dict(HAS_BIAS=False, GROUP=block_k, BLOCK_M=16, BLOCK_N=block_n,
                      DOT_DTYPE=tl.bfloat16, DOT_IEEE=False, FAST_CVT=True, sxk=1, ssg=1,
                      szg=1, syn=1)
    elif kind == "float":
        fn, pointers = gemv._gemv_float_kernel, {}
        consts = dict(HAS_BIAS=False, BLOCK_N=block_n, BLOCK_K=block_k, sxk=1, swk=1)
    elif kind == "w8":
        fn, pointers = gemv._gemv_w8_kernel, {"w_ptr": "*i8", "s_ptr": "*fp32"}
        consts = dict(HAS_BIAS=False, BLOCK_N=block_n, BLOCK_K=block_k, FAST_CVT=True, sxk=1,
                      ss=1)
    else:
        fn, pointers = gemv._gemv_w4_kernel, {}
        consts = dict(HAS_BIAS=False, GROUP=GROUP, BLOCK_N=block_n,
                      GROUPS_PER_STEP=block_k // GROUP, FAST_CVT=True, sxk=1, ssg=1, szg=1)
    consts.update(SPLIT_K=split_k)
    if prefetch is not None:
        consts.update(PREFETCH=prefetch)
    names = list(fn.arg_names)
    types = {**POINTERS, **pointers}
    signature = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]]
             for n in list(POINTERS) + ALIGNED if n in names}
    src = ASTSource(fn, signature=signature, attrs=attrs,
                    constexprs={(names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps, "num_stages": 3})


def sass_figures(compiled, tmp: Path) -> dict:
    """Registers and the main loop's instruction counts of a compiled kernel."""
    cubin = tmp / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    usage = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True,
                           text=True, check=True).stdout
    text = subprocess.run([_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    code, labels = [], {}
    pending = []
    for line in text.splitlines():
        if m := re.match(r"(\.L_x_\d+):", line):
            pending.append(m.group(1))
        elif m := re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line):
            address = int(m.group(1), 16)
            for label in pending:
                labels[label] = address
            pending = []
            code.append((address, m.group(2)))
    loops = [(labels[m.group(1)], address) for address, ins in code
             if (m := re.search(r"BRA\s+`\((\.L_x_\d+)\)", ins)) and labels.get(m.group(1), 1 << 62)
             < address]
    if not loops:
        raise RuntimeError("no loop found in the SASS")
    lo, hi = max(loops, key=lambda span: span[1] - span[0])
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]
                  for address, ins in code if lo <= address <= hi)
    atomics = sum(1 for _, ins in code if re.search(r"\bATOMG?\b|\bATOMG\.|\bATOM\.|\bRED\b", ins))
    return {"regs": int(re.search(r"REG:(\d+)", usage).group(1)), "atomics": atomics,
            "loop": sum(ops.values()), "BAR": ops["BAR"], "LDG": ops["LDG"], "ops": dict(ops)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="w8,w4,float,w4dot")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, 90 = H100/H200")
    ap.add_argument("--prefetch", choices=("off", "on", "both"), default="both")
    ap.add_argument("--tiles", help="only these tiles, e.g. 8x512x4,32x256x4 (N x K x warps)")
    ap.add_argument("--split-k", type=int, default=1, help="SPLIT_K (> 1: the atomic finish)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    want = None
    if args.tiles:
        want = {tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            if kind not in TILES:
                raise SystemExit(f"unknown kind {kind!r}: w8, w4, float or w4dot")
            for bn, bk, warps in TILES[kind]:
                if want and (bn, bk, warps) not in want:
                    continue
                for prefetch in [None] if kind == "w4dot" else {
                        "off": [False], "on": [True], "both": [False, True]}[args.prefetch]:
                    fig = sass_figures(compile_for(kind, bn, bk, warps, prefetch, args.arch,
                                                   args.split_k), Path(tmp))
                    per_thread = bn * bk / (32 * warps)
                    rows.append({"kind": kind, "block_n": bn, "block_k": bk, "warps": warps,
                                 "prefetch": prefetch, "weights_per_thread": per_thread,
                                 "loop_per_weight": round(fig["loop"] / per_thread, 2), **fig})
    if args.json:
        print(json.dumps({"triton": triton.__version__, "arch": args.arch, "rows": rows},
                         indent=1))
        return 0
    print(f"Triton {triton.__version__}, sm_{args.arch}; int4 groups of {GROUP}")
    print(f"{'kernel':>6} {'tile':>12} {'prefetch':>8} {'regs':>5} {'loop':>5} {'per weight':>10} "
          f"{'BAR':>4} {'LDG':>4}")
    for r in rows:
        tile = f"{r['block_n']}x{r['block_k']}/{r['warps']}w"
        print(f"{r['kind']:>6} {tile:>12} {str(r['prefetch']):>8} {r['regs']:>5} {r['loop']:>5} "
              f"{r['loop_per_weight']:>10.2f} {r['BAR']:>4} {r['LDG']:>4}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

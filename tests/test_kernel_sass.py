"""The batch-1 kernels compile for an H100/H200 (sm_90) on this machine, with the byte-permute
conversions (inline PTX) that the CPU interpreter never runs: benchmarks/kernel_sass.py drives
Triton's compiler, ptxas and nvdisasm, all in the Triton wheel, and reads the main loop."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def sass(*args: str) -> list[dict]:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "kernel_sass.py"), "--json",
                          *args], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)["rows"]


def test_the_gemv_kernels_compile_for_sm90_and_their_loop_is_read():
    rows = sass("--prefetch", "on", "--tiles", "8x512x4,32x256x4,8x1024x4")
    assert {(r["kind"], r["block_n"], r["block_k"]) for r in rows} == {
        ("w8", 8, 512), ("w8", 8, 1024), ("w4", 8, 1024), ("w4", 32, 256), ("float", 8, 512)}
    for r in rows:
        # a step loads its tile (128-bit loads, so a handful per thread) and spends a few
        # instructions per weight: convert, multiply-add, some address arithmetic
        assert 1 <= r["LDG"] <= 16, r
        assert 2 <= r["loop_per_weight"] <= 12, r
        assert 16 <= r["regs"] <= 255, r
    w8 = {r["block_k"]: r for r in rows if r["kind"] == "w8"}
    assert w8[1024]["ops"].get("PRMT", 0) >= 64      # one byte permute per int8 code at least


@pytest.mark.slow       # make test only: two more SASS builds (12 s on a 2-core AVX2 CPU)
def test_the_split_k_finish_compiles_with_its_two_atomics():
    """SPLIT_K > 1: each program counts itself in (atomic add), the last resets the counter
    (atomic exchange); without split-K there is no atomic at all."""
    for split, atomics in (("4", 2), ("1", 0)):
        rows = sass("--kinds", "w8,w4", "--prefetch", "on", "--tiles", "8x512x4,32x256x4",
                    "--split-k", split)
        assert len(rows) == 2 and all(r["atomics"] == atomics for r in rows), (split, rows)


@pytest.mark.slow       # make test only: one more SASS build (5 s on a 2-core AVX2 CPU)
def test_the_int4_tensor_core_kernel_compiles_for_sm90():
    """kernels/dequant_matmul.py's int4 kernel for M = 2..16: the weight tile feeds the H100's
    warp-group tensor-core instruction (HGMMA), its codes become bfloat16 by the inline PTX (one
    LOP3 per two codes at least), and split-K adds its two atomics."""
    (r,) = sass("--kinds", "w4dot", "--split-k", "4")
    assert r["ops"].get("HGMMA", 0) >= 1, r
    assert r["ops"].get("LOP3", 0) >= r["weights_per_thread"] / 2, r
    assert 1 <= r["loop_per_weight"] <= 12 and r["atomics"] == 2, r

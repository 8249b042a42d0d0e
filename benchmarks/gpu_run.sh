#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one command (run from the repository root):
#   1. the kernel tests and the engine's Triton backends, compiled for the GPU instead of the
#      CPU interpreter;
#   2. benchmarks/dequant_matmul.py, benchmarks/paged_attention.py, benchmarks/gpu_decode.py
#      (the issues' settings) and benchmarks/gemv_sweep.py (every batch-1 GEMV configuration);
#   3. their block-size sweeps (dequant: M = 1 only, the FMA path).
# PAGED_SWEEP=0 / DEQUANT_SWEEP=0 skip a sweep. Logs and JSON go to $OUT (default benchmarks/out/,
# git-ignored). Figures go to benchmarks/RESULTS.md by hand, with the device, date and command
# ("Paged attention kernels" and "What the kernels tried" cite this script).
set -uo pipefail
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv \
    | tee "$OUT/gpu.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$OUT/gpu.txt"
$PY -m pytest -q -p no:cacheprovider tests/test_kernels_dequant.py tests/test_kernels_gemv.py tests/test_kernels_paged.py \
    tests/test_serving.py::test_attention_backends_agree tests/test_graph_decode.py 2>&1 | tee "$OUT/pytest_gpu.log" \
    || status=1
$PY benchmarks/dequant_matmul.py --json-out "$OUT/dequant_matmul.json" || status=1
$PY benchmarks/paged_attention.py --json-out "$OUT/paged_attention.json" || status=1
$PY benchmarks/gpu_decode.py --json-out "$OUT/gpu_decode.json" || status=1
$PY benchmarks/gemv_sweep.py --json-out "$OUT/gemv_sweep.json" || status=1
if [ "${PAGED_SWEEP:-1}" = 1 ]; then
    timeout 240 $PY benchmarks/paged_attention.py --sweep --repeats 20 \
        --json-out "$OUT/paged_attention_sweep.json" > "$OUT/paged_sweep.log" 2>&1 || status=1
    grep sweep "$OUT/paged_sweep.log"
fi
if [ "${DEQUANT_SWEEP:-1}" = 1 ]; then
    timeout 300 $PY benchmarks/dequant_matmul.py --sizes 4096,8192 --batch 1 --sweep \
        --repeats 20 --json-out "$OUT/dequant_matmul_sweep.json" > "$OUT/dequant_sweep.log" \
        2>&1 || status=1
    grep sweep "$OUT/dequant_sweep.log"
fi
exit $status

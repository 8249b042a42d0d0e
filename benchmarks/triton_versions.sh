#!/usr/bin/env bash
# The Triton kernel tests under another Triton's CPU interpreter (RESULTS.md, "Triton's
# interpreter across versions"):
#   benchmarks/triton_versions.sh 3.6.0            # this checkout
#   benchmarks/triton_versions.sh 3.6.0 /tmp/old   # another checkout (git worktree add /tmp/old REV)
# The wheel (--no-deps) goes to build/triton-VERSION once, from the package index; it is put
# before the venv's triton on PYTHONPATH, so torch stays the pinned one. Prints pytest's summary
# for each test file.
set -uo pipefail
VERSION=${1:?usage: benchmarks/triton_versions.sh VERSION [TREE]}
REPO=$(cd "$(dirname "$0")/.." && pwd)
TREE=$(cd "${2:-$REPO}" && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
SITE=$REPO/build/triton-$VERSION
if [ ! -d "$SITE/triton" ]; then
    "$PY" -m pip install -q --no-deps --target "$SITE" "triton==$VERSION" || exit 1
fi
cd "$TREE"
PYTHONPATH=$SITE TRITON_INTERPRET=1 "$PY" -c \
    "import numpy, torch, triton; print('triton', triton.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
status=0
for t in tests/test_student_kernels.py tests/test_student_kernels_paged.py tests/test_kernels_gemv.py \
         tests/test_kernels_dequant.py tests/test_kernels_paged.py; do
    printf '%-40s ' "$t"
    PYTHONPATH=$SITE TRITON_INTERPRET=1 "$PY" -m pytest -q -p no:cacheprovider -n 2 "$t" 2>&1 \
        | tail -1 || status=1
done
exit $status

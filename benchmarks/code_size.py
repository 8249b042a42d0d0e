"""Lines of Python per package, at a commit or in the working tree: benchmarks/RESULTS.md,
"Code size per package".

    .venv/bin/python benchmarks/code_size.py              # the working tree's tracked files
    .venv/bin/python benchmarks/code_size.py 0c4b8f8      # a commit, for the "before" column

`minillm` is split into its top-level modules and each subpackage; `autograder` into its core and
its lab modules. Lines are counted as `wc -l` counts them, from `git grep -c ''`.
"""
from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def line_counts(rev: str | None = None) -> dict[str, int]:
    """path -> lines of every tracked .py file (at `rev`, or in the working tree)."""
    cmd = ["git", "-C", str(REPO), "grep", "-c", "", *([rev] if rev else []), "--", "*.py"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    counts = {}
    for line in out.splitlines():
        path, n = line.rsplit(":", 1)
        counts[path.split(":", 1)[1] if rev else path] = int(n)
    return counts


def group(path: str) -> str | None:
    parts = path.split("/")
    if parts[0] == "minillm":
        return "minillm/ (top-level modules)" if len(parts) == 2 else f"minillm/{parts[1]}/"
    if parts[0] == "autograder":
        return "autograder/labs/" if parts[1] == "labs" else "autograder/ (core)"
    if parts[0] in ("kernels", "benchmarks", "tests", "slides"):
        return f"{parts[0]}/"
    return None


def main(argv: list[str]) -> int:
    rev = argv[0] if argv else None
    sizes = Counter()
    for path, n in line_counts(rev).items():
        if (g := group(path)) is not None:
            sizes[g] += n
    print(f"lines of Python at {rev or 'the working tree'}")
    for name in sorted(sizes):
        print(f"  {name:32} {sizes[name]:6,}")
    mini = sum(n for g, n in sizes.items() if g.startswith("minillm/"))
    auto = sum(n for g, n in sizes.items() if g.startswith("autograder/"))
    print(f"  {'minillm/ in all':32} {mini:6,}\n  {'autograder/ in all':32} {auto:6,}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

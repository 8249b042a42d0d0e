"""Expected hours per lab, estimated from what each source notebook asks of a student: README.md,
"The labs, in order".

    .venv/bin/python benchmarks/lab_effort.py            # the table README.md quotes
    .venv/bin/python benchmarks/lab_effort.py --json

What is counted (exactly, from labs/NN_x/NN_x.ipynb):
- prose: words in the markdown cells the student reads (not the written answers' model answers);
- code: non-blank, non-comment lines between `### BEGIN SOLUTION` and `### END SOLUTION`, i.e. the
  lines the released notebook leaves for the student to write;
- written answers: the manually graded markdown cells.

What is assumed (the rates below; no class has been timed yet): technical prose with formulas read
at 100 words a minute, a working line of code (read the API, write, debug, re-run) in 2 minutes, a
written answer in 12 minutes, and the notebook's own run time (under 3 minutes, tested) ignored.
Replace the rates with a class's reported times once there are some.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS_PER_MINUTE = 100
MINUTES_PER_CODE_LINE = 2
MINUTES_PER_WRITTEN_ANSWER = 12


def lab_counts(notebook: Path) -> dict[str, int]:
    """prose words, solution code lines and written answers of one source notebook."""
    words = code = written = 0
    for cell in json.loads(notebook.read_text())["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            if meta.get("solution") and meta.get("grade"):
                written += 1
            elif not meta.get("solution"):
                words += len(re.findall(r"\w+", source))
            continue
        inside = False
        for line in source.splitlines():
            if "### BEGIN SOLUTION" in line:
                inside = True
            elif "### END SOLUTION" in line:
                inside = False
            elif inside and line.strip() and not line.strip().startswith("#"):
                code += 1
    return {"prose_words": words, "code_lines": code, "written_answers": written}


def expected_hours(counts: dict[str, int]) -> float:
    minutes = (counts["prose_words"] / WORDS_PER_MINUTE
               + counts["code_lines"] * MINUTES_PER_CODE_LINE
               + counts["written_answers"] * MINUTES_PER_WRITTEN_ANSWER)
    return round(minutes / 60 * 2) / 2          # to the half hour


def all_labs() -> dict[str, dict]:
    rows = {}
    for notebook in sorted(REPO.glob("labs/*/*.ipynb")):
        counts = lab_counts(notebook)
        rows[notebook.stem] = {**counts, "expected_hours": expected_hours(counts)}
    return rows


def table(rows: dict[str, dict]) -> str:
    lines = ["| lab | prose (words) | code to write (lines) | written answers | expected hours |",
             "|---|---|---|---|---|"]
    lines += [f"| `{lab}` | {r['prose_words']:,} | {r['code_lines']} | {r['written_answers']} | "
              f"{r['expected_hours']:g} |" for lab, r in rows.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    rows = all_labs()
    print(json.dumps(rows, indent=1) if "--json" in argv else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

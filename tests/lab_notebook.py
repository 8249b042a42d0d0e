"""What the claims tests (tests/test_labNN_claims.py) share: a lab's source notebook read by grade id
or by how a code cell starts, a cell run in a namespace with its printed output returned, and
text with its whitespace flattened for matching sentences."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class LabNotebook:
    def __init__(self, lab: str):
        self.path = REPO / "labs" / lab / f"{lab}.ipynb"

    def cells(self) -> list[dict]:
        return json.loads(self.path.read_text())["cells"]

    def by_id(self, gid: str) -> str:
        found = ["".join(c["source"]) for c in self.cells()
                 if c["metadata"].get("nbgrader", {}).get("grade_id") == gid]
        assert len(found) == 1, f"{len(found)} cells with grade_id {gid}"
        return found[0]

    def starting(self, start: str) -> str:
        found = ["".join(c["source"]) for c in self.cells()
                 if c["cell_type"] == "code" and "".join(c["source"]).startswith(start)]
        assert len(found) == 1, f"{len(found)} code cells start with {start!r}"
        return found[0]


def run(ns: dict, source: str, name: str) -> str:
    """exec `source` in `ns`; what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, name, "exec"), ns)
    return out.getvalue()


def flat(text: str) -> str:
    return " ".join(text.split())

"""An honest submission for tests/test_fairness.py: the lab's own solution with some answer cells
written another way, and cells of the student's own."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell


@dataclass
class Honest:
    lab: str
    name: str                          # the student id
    style: str                         # one line for the report
    answers: dict = field(default_factory=dict)   # solution cell grade id -> its code
    extra: list = field(default_factory=list)     # (after grade id, "code" | "markdown", text)
    skip: tuple = ()                   # free code cells (by how they start) left as a comment

    def notebook(self, source: nbformat.NotebookNode,
                 released: nbformat.NotebookNode) -> nbformat.NotebookNode:
        """The released notebook with the source's answers, then this student's own."""
        own = {gid: textwrap.dedent(code).strip("\n") for gid, code in self.answers.items()}
        given = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
        nb = nbformat.reads(nbformat.writes(released), as_version=4)
        missing = set(own) - set(given)
        assert not missing, f"{self.name}: no solution cells {missing} in {self.lab}"
        cells = []
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in given:
                cell.source = own.get(gid) or _without_markers(given[gid])
            elif cell.cell_type == "code" and not gid and cell.source.startswith(self.skip):
                cell.source = "# skipped: " + cell.source.splitlines()[0]
            cells.append(cell)
            for after, kind, text in self.extra:
                if after == gid:
                    text = textwrap.dedent(text).strip("\n")
                    cells.append(new_code_cell(text) if kind == "code" else new_markdown_cell(text))
        nb.cells = cells
        return nb


def _without_markers(source: str) -> str:
    return "\n".join(line for line in source.splitlines()
                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)

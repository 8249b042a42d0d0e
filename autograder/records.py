"""What grading one submission produced: a score per graded cell and the submission's status."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CellScore:
    grade_id: str
    notebook: str
    score: float | None             # None = needs manual grading
    max_score: float
    autograded: bool                # a test cell (grade, not solution)
    errors: list[str] = field(default_factory=list)    # from the autograded notebook


@dataclass
class GradeRecord:
    student: str
    lab: str
    status: str                     # autograder/README.md, "Statuses"
    seconds: float                  # the whole `nbgrader autograde` subprocess
    exec_seconds: float | None      # executing the notebook(s), from GuardedExecute's report
    cells: list[CellScore] = field(default_factory=list)
    log: Path | None = None

    @property
    def score(self) -> float:
        return sum(c.score or 0.0 for c in self.cells)

    @property
    def max_score(self) -> float:
        return sum(c.max_score for c in self.cells)

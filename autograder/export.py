"""build/grades.csv with automatic and written points apart: `nbgrader export`'s plugin
(ExportApp.plugin_class in nbgrader_config.py; columns in autograder/README.md, "Instructors").
Loaded by path: imports nbgrader only, not torch.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from nbgrader.api import MissingEntry
from nbgrader.plugins import CsvExportPlugin

COLUMNS = ["assignment", "duedate", "timestamp", "seconds_late", "student_id", "last_name",
           "first_name", "email", "raw_score", "late_submission_penalty", "score", "max_score",
           "auto_score", "auto_max_score", "written_score", "written_max_score",
           "to_grade_by_hand", "similarity", "similar_to"]


def split_scores(submission) -> dict:
    auto = auto_max = written = written_max = 0.0
    waiting = 0
    for nb in submission.notebooks:
        for g in nb.grades:
            got = g.score or 0.0
            if g.cell.cell_type == "markdown":
                written, written_max = written + got, written_max + g.max_score
                waiting += g.auto_score is None and g.manual_score is None   # no grader yet
            else:
                auto, auto_max = auto + got, auto_max + g.max_score
    return {"auto_score": auto, "auto_max_score": auto_max, "written_score": written,
            "written_max_score": written_max, "to_grade_by_hand": waiting}


class SplitScoreCsv(CsvExportPlugin):
    def export(self, gradebook) -> None:
        students = {str(s) for s in self.student}
        assignments = {str(a) for a in self.assignment}
        path = Path(self.to or "grades.csv")
        found = path.parent / "similarity" / "similarity.json"
        matches = json.loads(found.read_text()) if found.is_file() else {}
        with open(path, "w", newline="") as fh:
            out = csv.DictWriter(fh, COLUMNS)
            out.writeheader()
            for assignment in gradebook.assignments:
                if assignments and assignment.name not in assignments:
                    continue
                for student in gradebook.students:
                    if students and student.id not in students:
                        continue
                    row = {"assignment": assignment.name, "duedate": assignment.duedate or "",
                           "student_id": student.id, "last_name": student.last_name or "",
                           "first_name": student.first_name or "", "email": student.email or "",
                           "max_score": assignment.max_score}
                    try:
                        sub = gradebook.find_submission(assignment.name, student.id)
                    except MissingEntry:
                        row.update(timestamp="", seconds_late=0, raw_score=0.0,
                                   late_submission_penalty=0.0,
                                   score=0.0, auto_score=0.0, written_score=0.0,
                                   to_grade_by_hand=0, auto_max_score=assignment.max_code_score,
                                   written_max_score=assignment.max_written_score)
                    else:
                        penalty = sub.late_submission_penalty or 0.0
                        row.update(timestamp=sub.timestamp or "", duedate=sub.duedate or "",
                                   seconds_late=round(sub.total_seconds_late),
                                   raw_score=sub.score,
                                   late_submission_penalty=penalty,
                                   score=max(0.0, sub.score - penalty), **split_scores(sub))
                    if match := matches.get(assignment.name, {}).get(student.id):
                        row.update(similarity=match["score"], similar_to=match["with"])
                    out.writerow(row)

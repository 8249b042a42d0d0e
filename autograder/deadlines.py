"""Due dates, extensions and the late penalty, kept where nbgrader keeps them: the assignment's
`duedate` and each submission's `extension` in the gradebook; `nbgrader autograde` reads the
submission's timestamp.txt and asks the `AssignLatePenalties` plugin, `PerDayPenalty` here (set
in nbgrader_config.py), for each notebook's penalty (autograder/README.md, "Running a class").

    python -m autograder deadline 04_quantization "2026-12-04 17:00 UTC"
    python -m autograder extend 04_quantization alice --days 2
"""
from __future__ import annotations

import math
from datetime import datetime, timedelta

from nbgrader.plugins import LateSubmissionPlugin
from traitlets import Float

from .course import STUDENT_RE, Course


class PerDayPenalty(LateSubmissionPlugin):
    """A share of the notebook's score per started day late, up to a cap."""

    per_day = Float(0.10, help="share of the score taken per started day late").tag(config=True)
    cap = Float(0.50, help="the most that lateness can take (1.0: everything)").tag(config=True)

    def late_submission_penalty(self, student_id, score, total_seconds_late):
        days = math.ceil(total_seconds_late / 86400)
        share = min(self.cap, self.per_day * days)
        self.log.info("%s is %d started day(s) late: %.0f%% of %s", student_id, days,
                      100 * share, score)
        return round(score * share, 6)


def parse_when(text: str) -> datetime:
    """'2026-12-04 17:00 UTC' (or any form nbgrader accepts) -> naive UTC, as nbgrader stores."""
    from nbgrader.utils import parse_utc
    try:
        return parse_utc(text)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"cannot read the date {text!r}: give e.g. '2026-12-04 17:00 UTC'") \
            from e


def set_due(course: Course, lab: str, when: str) -> datetime:
    """The lab's due date in the gradebook (the lab is released first if it is not yet)."""
    lab = course.check_lab(lab)
    due = parse_when(when)
    course.release([lab], missing_only=True)
    with course.gradebook() as gb:
        gb.update_or_create_assignment(lab, duedate=due)
    return due


def extend(course: Course, lab: str, student: str, *, days: float = 0, hours: float = 0) -> None:
    """Give `student` this much more time for `lab` (replacing an earlier extension; 0: none).
    Before grading it holds for the coming grade; after grading, grade the lab again."""
    lab = course.check_lab(lab)
    if not STUDENT_RE.match(student):
        raise ValueError(f"student ids may only use letters, digits and _ . @ -: {student!r}")
    if days < 0 or hours < 0:
        raise ValueError(f"an extension cannot be negative: {days} days, {hours} hours")
    course.release([lab], missing_only=True)
    with course.gradebook() as gb:
        gb.update_or_create_student(student)
        gb.update_or_create_submission(lab, student,
                                       extension=timedelta(days=days, hours=hours) or None)


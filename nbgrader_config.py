"""nbgrader course configuration: the course root is the directory holding this file.

    labs/NN_topic/NN_topic.ipynb    source notebooks (+ small assets); assignment id = NN_topic
    build/release/NN_topic/         student versions            (nbgrader generate_assignment)
    build/submitted/STUDENT/NN_topic/                           (python -m autograder grade DIR)
    build/autograded/STUDENT/NN_topic/                          (nbgrader autograde)
    build/feedback/STUDENT/NN_topic/NN_topic.html               (nbgrader generate_feedback)
    build/gradebook.db                                          the gradebook

Run nbgrader from this directory (or through `python -m autograder ...`, which does). Every path
below is derived from this file's location, so a copy of this file next to a copy of labs/ (the
tests' temporary course, selfgrade's) is a complete course of its own.
"""
import importlib
import os
import sys

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(ROOT, "build")
os.makedirs(BUILD, exist_ok=True)          # sqlite does not create the gradebook's directory

c.CourseDirectory.root = ROOT
c.CourseDirectory.course_id = "minillm"
c.CourseDirectory.source_directory = "labs"
c.CourseDirectory.release_directory = os.path.join("build", "release")
c.CourseDirectory.submitted_directory = os.path.join("build", "submitted")
c.CourseDirectory.autograded_directory = os.path.join("build", "autograded")
c.CourseDirectory.feedback_directory = os.path.join("build", "feedback")
c.CourseDirectory.solution_directory = os.path.join("build", "solution")
c.CourseDirectory.source_with_tests_directory = os.path.join("build", "source_with_tests")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(BUILD, "gradebook.db")

# Everything else in a lab folder (small assets: json, csv, images, .py helpers) is released with
# the notebook and copied next to each submission when it is graded. Not released: the
# instructor-only description of a wrong submission used by tests/test_pipeline.py, and clutter.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback",
                            "wrong_submission.json", ".DS_Store"]
c.CourseDirectory.max_file_size = 10_000          # KB; labs hold small assets only

# Execution limits while autograding (the notebooks run top to bottom in < 3 min on 2 CPU cores).
# `python -m autograder grade` also kills the whole `nbgrader autograde` process after
# notebook_timeout + a margin, and bounds the kernel's memory (see autograder/course.py).
c.Execute.timeout = 180                           # seconds per cell
c.Execute.startup_timeout = 120                   # kernel start on a loaded machine
c.Execute.interrupt_on_timeout = True
c.GuardedExecute.notebook_timeout = 900           # seconds per notebook
c.LimitOutput.max_lines = 1000


def _load(name):
    """autograder/<name>.py (cheap: the package loads torch only with a test-cell helper)."""
    return importlib.import_module(f"autograder.{name}")


try:
    execute = _load("execute")
except Exception as e:                             # nbgrader without our package: plain Execute
    print(f"nbgrader_config.py: autograder/execute.py not loaded ({e!r}); using nbgrader's "
          f"Execute (no per-notebook timeout)", file=sys.stderr)
    execute = None

if execute is not None:
    # Late work (autograder/deadlines.py): each lab's due date and each student's extension are
    # in the gradebook (`python -m autograder deadline LAB WHEN`, `extend LAB STUDENT --days N`);
    # a submission whose timestamp.txt is past its due date loses `per_day` of each notebook's
    # score per started day, at most `cap`. The CSV shows the penalty and the seconds late.
    c.AssignLatePenalties.plugin_class = "autograder.deadlines.PerDayPenalty"
    c.PerDayPenalty.per_day = 0.10
    c.PerDayPenalty.cap = 0.50

    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        IgnorePattern,
        LimitOutput,
        SaveAutoGrades,
    )

    # nbgrader 0.9.6's default list with Execute replaced: `python -m autograder grade`
    # executes each submission in a sandboxed job and sets AUTOGRADER_REPLAY, so nbgrader only
    # replays the outputs (ReplayExecute). A plain `nbgrader autograde` runs the notebook here,
    # without the sandbox (GuardedExecute): use `python -m autograder grade` for submissions.
    # Defang (autograder/defang.py): no HTML or script from a submission reaches a grader's
    # browser in formgrader, or the feedback.
    runner = execute.ReplayExecute if os.environ.get("AUTOGRADER_REPLAY") else \
        execute.GuardedExecute
    c.Autograde.autograde_preprocessors = [runner, IgnorePattern,
                                           ClearMetadataPreprocessor, LimitOutput,
                                           _load("defang").Defang, SaveAutoGrades,
                                           AssignLatePenalties, CheckCellMetadata]

# build/grades.csv keeps automatic (tests) and written (hand-graded) points apart, and counts the
# written answers still waiting for a grader (autograder/export.py).
try:
    _load("export")
    c.ExportApp.plugin_class = "autograder.export.SplitScoreCsv"
except Exception as e:
    print(f"nbgrader_config.py: autograder/export.py not loaded ({e!r}); nbgrader's plain CSV",
          file=sys.stderr)

# Feedback shows each graded cell's visible part, score and failure message, never the hidden
# tests (autograder/feedback.py); AUTOGRADER_FEEDBACK_HIDDEN=1 (grade
# --feedback-with-hidden-tests) keeps them.
if not os.environ.get("AUTOGRADER_FEEDBACK_HIDDEN"):
    try:
        from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
        from nbgrader.preprocessors import GetGrades
        feedback = _load("feedback")
        c.GenerateFeedback.preprocessors = [GetGrades, feedback.HideHiddenTests,
                                            CSSHTMLHeaderPreprocessor]
    except Exception as e:
        raise RuntimeError(f"nbgrader_config.py: autograder/feedback.py not loaded ({e!r}); "
                           "refusing to write feedback that would show the hidden tests")

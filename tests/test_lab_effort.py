"""README's expected hours per lab are what benchmarks/lab_effort.py computes from the notebooks."""
from pathlib import Path

from benchmarks import lab_effort

REPO = Path(__file__).resolve().parents[1]


def test_readme_quotes_the_current_counts_and_hours():
    table = lab_effort.table(lab_effort.all_labs())
    assert table in (REPO / "README.md").read_text(), \
        "a lab changed: put `.venv/bin/python benchmarks/lab_effort.py`'s table in README.md:\n" + table


def test_counts_follow_the_notebook(tmp_path):
    cell = {"cell_type": "code", "metadata": {}, "source": [
        "def f(x):\n", "    ### BEGIN SOLUTION\n", "    # a comment\n", "\n", "    y = x + 1\n",
        "    return y\n", "    ### END SOLUTION\n"]}
    prose = {"cell_type": "markdown", "metadata": {}, "source": ["Two words."]}
    answer = {"cell_type": "markdown", "source": ["model answer here"],
              "metadata": {"nbgrader": {"solution": True, "grade": True}}}
    nb = tmp_path / "x.ipynb"
    nb.write_text(__import__("json").dumps({"cells": [cell, prose, answer]}))
    counts = lab_effort.lab_counts(nb)
    assert counts == {"prose_words": 2, "code_lines": 2, "written_answers": 1}
    assert lab_effort.expected_hours({**counts, "prose_words": 6000}) == 1.5   # 60 + 4 + 12 min

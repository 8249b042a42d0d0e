"""Every lab question is a manually graded answer cell with a model answer and a rubric (issue 21).

The contract, per lab notebook:
  * each question is a markdown cell holding one `**Q<k>. ...**` prompt, followed at once by
    its answer cell: markdown, nbgrader `grade` + `solution`, unlocked, grade id `NN_q<k>`,
    points > 0;
  * the answer cell of the source is one solution region: `### BEGIN SOLUTION`, a
    `**Model answer.**`, a `**Rubric (P points).**` whose bullets `- N point(s): ...` add up to
    the cell's points, `### END SOLUTION`;
  * releasing (nbgrader's ClearSolutions) leaves only the answer stub: no model answer and no
    rubric ever reaches a student.
"""
import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
LABS = sorted(p for p in (REPO / "labs").glob("[0-9][0-9]_*/[0-9][0-9]_*.ipynb"))
Q_RE = re.compile(r"\*\*Q(\d+)\.")
RUBRIC_RE = re.compile(r"\*\*Rubric \((\d+) points?\)\.\*\*")
BULLET_RE = re.compile(r"^- (\d+) points?: \S", re.M)


def questions(nb):
    """(index, k) of every question cell."""
    out = []
    for i, c in enumerate(nb.cells):
        if c.cell_type == "markdown":
            ks = Q_RE.findall(c.source)
            assert len(ks) <= 1, f"cell {i} holds several questions {ks}: one per cell"
            if ks:
                out.append((i, int(ks[0])))
    return out


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.parent.name)
def test_every_question_has_a_graded_answer_cell_with_a_rubric(path):
    nb = nbformat.read(str(path), as_version=4)
    lab = path.parent.name[:2]
    qs = questions(nb)
    assert len(qs) >= 4, f"{path.name}: only {len(qs)} questions"
    assert [k for _, k in qs] == list(range(1, len(qs) + 1)), "questions numbered 1, 2, ..."
    for i, k in qs:
        a = nb.cells[i + 1]
        meta = a.metadata.get("nbgrader", {})
        where = f"{path.name} Q{k}"
        assert a.cell_type == "markdown", f"{where}: the answer cell must be markdown"
        assert meta.get("grade") is True and meta.get("solution") is True, where
        assert meta.get("locked") is False and meta.get("schema_version") == 3, where
        assert meta.get("grade_id") == f"{lab}_q{k}", where
        points = meta.get("points")
        assert isinstance(points, (int, float)) and points > 0, where
        src = a.source.strip()
        assert src.startswith("### BEGIN SOLUTION") and src.endswith("### END SOLUTION"), where
        assert "**Model answer.**" in src, f"{where}: no model answer"
        m = RUBRIC_RE.search(src)
        assert m and int(m.group(1)) == points, f"{where}: rubric must say its {points} points"
        bullets = [int(x) for x in BULLET_RE.findall(src[m.end():])]
        assert bullets and sum(bullets) == points, \
            f"{where}: rubric bullets give {bullets}, the cell is worth {points}"
    leftovers = [i for i, c in enumerate(nb.cells)
                 if c.cell_type == "markdown" and "your answer here" in c.source.lower()
                 and not c.metadata.get("nbgrader", {}).get("grade")]
    assert not leftovers, f"{path.name}: ungraded answer cells at {leftovers}"


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.parent.name)
def test_the_release_holds_no_model_answer(path):
    from nbgrader.preprocessors import ClearSolutions
    nb = nbformat.read(str(path), as_version=4)
    released, _ = ClearSolutions().preprocess(nb, {"language": "python"})
    answers = [c for c in released.cells if c.metadata.get("nbgrader", {}).get("grade")
               and c.metadata["nbgrader"].get("solution") and c.cell_type == "markdown"]
    assert answers
    for c in answers:
        assert "Model answer" not in c.source and "Rubric" not in c.source, c.source[:200]
        assert "YOUR ANSWER HERE" in c.source

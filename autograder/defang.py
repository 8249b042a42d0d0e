"""No active content from a submission reaches a grader's browser: an nbgrader preprocessor.

Written answers are graded by hand in formgrader, a page of the instructor's Jupyter server that
renders each autograded notebook: its markdown cells and its outputs. Both come from the student.
Raw HTML in a markdown answer (`<script>`, `<img onerror=...>`), or an output with an HTML,
JavaScript, SVG or markdown representation (`display(HTML(...))`), would run in the instructor's
Jupyter origin, which can call the server's API (grades, files, terminals). So before the
autograded notebook is written (Autograde.autograde_preprocessors, see nbgrader_config.py):

  * every unlocked markdown cell (the student's own text) has `<` written as `&lt;`: it still
    reads the same (`a < b` renders as a < b), but it is no tag;
  * every output keeps only inert representations: text/plain, image/png, image/jpeg (an output
    with none of them keeps a note saying what was dropped).

The student's feedback is generated from the same notebook, so it is inert too.
"""
from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

INERT = ("text/plain", "image/png", "image/jpeg")


def defang_markdown(source: str) -> str:
    return source.replace("<", "&lt;")


def defang_output(out: dict) -> dict:
    data = out.get("data")
    if not isinstance(data, dict):
        return out
    kept = {k: v for k, v in data.items() if k in INERT}
    dropped = sorted(set(data) - set(kept))
    if dropped and not kept:
        kept["text/plain"] = f"[output not shown to graders: {', '.join(dropped)}]"
    out["data"] = kept
    if isinstance(out.get("metadata"), dict):
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k in INERT}
    return out


class Defang(Preprocessor):
    enabled = Bool(True)

    def preprocess(self, nb, resources):
        for cell in nb.cells:
            locked = cell.get("metadata", {}).get("nbgrader", {}).get("locked", False)
            if cell.cell_type == "markdown" and not locked:
                cell.source = defang_markdown(cell.source)
                cell.pop("attachments", None)
            if cell.cell_type == "code":
                cell.outputs = [defang_output(o) for o in cell.get("outputs", [])]
        return nb, resources

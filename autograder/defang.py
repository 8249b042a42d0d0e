"""An nbgrader preprocessor: no active content from a submission reaches a grader's browser
(formgrader renders it in the instructor's Jupyter origin). Unlocked markdown gets `<` escaped;
outputs keep only text/plain, PNG and JPEG.
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

"""The source notebook's own answer to a speed check, for the instructor's measurements."""
from __future__ import annotations

import json
from pathlib import Path

LABS = Path(__file__).resolve().parents[2] / "labs"


def lab_notebook(lab: str, labs: Path = LABS) -> Path:
    """labs/NN_topic/NN_topic.ipynb for lab "labNN"."""
    number = lab.removeprefix("lab")
    found = sorted(labs.glob(f"{number}_*/{number}_*.ipynb"))
    found = [p for p in found if p.parent.name == p.stem]
    if len(found) != 1:
        raise FileNotFoundError(f"no single source notebook for {lab} under {labs} "
                                f"(found {[str(p) for p in found]})")
    return found[0]


def notebook_solution(check, lab: str, labs: Path = LABS):
    """`check.solution[0]` from the notebook's first code cell and cells `check.solution[1:]`."""
    if len(check.solution) < 2:
        raise ValueError(f"{check.grade_id}: the SpeedCheck names no notebook solution "
                         f"(solution=(function name, cell grade ids...))")
    name, cell_ids = check.solution[0], set(check.solution[1:])
    path = lab_notebook(lab, labs)
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    chosen = [cells[0]] + [c for c in cells[1:] if
                           c["metadata"].get("nbgrader", {}).get("grade_id") in cell_ids]
    missing = cell_ids - {c["metadata"].get("nbgrader", {}).get("grade_id") for c in chosen}
    if missing:
        raise ValueError(f"{path} has no code cell with grade id {sorted(missing)}")
    namespace: dict = {"__name__": f"{lab}_notebook"}
    for cell in chosen:
        source = "".join(line for line in "".join(cell["source"]).splitlines(keepends=True)
                         if not line.lstrip().startswith(("%", "!")))     # IPython magics
        exec(compile(source, str(path), "exec"), namespace)
    if not callable(namespace.get(name)):
        raise ValueError(f"the solution cells {sorted(cell_ids)} of {path} define no function "
                         f"{name!r}")
    return namespace[name]

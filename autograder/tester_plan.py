"""What the grader reads from a lab's source notebook (no torch): the names the tests read from
the kernel, the locked cells that run in the kernel only, the withheld references.
"""
from __future__ import annotations

import ast

__all__ = ["tester_plan", "withheld_of", "bound_names", "free_names", "hidden_lines",
           "to_python", "HIDDEN_BEGIN", "HIDDEN_END"]

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def tester_plan(source_nb) -> dict:
    """{"names": what unlocked and kernel-only cells bind (not imports), "kernel_only": locked
    non-test cells that read a name an unlocked cell binds and do more than define}."""
    names: set[str] = set()
    kernel_only: list[str] = []
    for c in source_nb.cells:
        m = c.metadata.get("nbgrader", {})
        if c.cell_type != "code" or (m.get("locked") and m.get("grade")):
            continue
        bound = bound_names(c.source, imports=False)
        if not m.get("locked"):
            names |= bound
        elif (free_names(c.source) or set()) & names and not defines_only(c.source):
            kernel_only.append(m.get("grade_id", "?"))
            names |= bound
    return {"names": sorted(names), "kernel_only": kernel_only}


def withheld_of(source_nb) -> dict[str, str]:
    """The lab's declaration: "module:qualname" -> what the student writes instead."""
    found = source_nb.metadata.get("autograder", {}).get("withheld", {})
    if not isinstance(found, dict) or not all(
            isinstance(k, str) and ":" in k and isinstance(v, str) for k, v in found.items()):
        raise ValueError("the notebook's autograder.withheld must map \"module:qualname\" to "
                         "the name the student writes")
    return dict(found)


def to_python(source: str) -> str:
    """IPython syntax (%magics, !shell) as plain Python."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


def _parse(source: str):
    try:
        return ast.parse(to_python(source))
    except SyntaxError:
        return None


def free_names(source: str) -> set[str] | None:
    """The names a cell reads that it binds nowhere itself; None when it does not parse."""
    if (tree := _parse(source)) is None:
        return None
    read, bound = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (read if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
    return read - bound


def defines_only(source: str) -> bool:
    """Whether a cell only defines (functions, classes, imports): running it calls nothing."""
    tree = _parse(source)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    return tree is not None and all(
        isinstance(n, kinds) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        for n in tree.body)


def bound_names(source: str, imports: bool = True) -> set[str]:
    """Top-level names a cell binds: assignments, defs, classes, for/with targets and imports
    (not top-level ones unless `imports`: a test's modules never come from the kernel)."""
    tree = _parse(source)
    names: set[str] = set()
    for node in tree.body if tree is not None else []:
        if not imports and isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in sub.names
                             if a.name != "*")
    return names


def hidden_lines(source: str) -> set[int]:
    """1-based numbers of the lines inside ### BEGIN/END HIDDEN TESTS (markers included)."""
    hidden, inside = set(), False
    for i, line in enumerate(source.splitlines(), 1):
        if HIDDEN_BEGIN in line:
            inside = True
        if inside:
            hidden.add(i)
        if HIDDEN_END in line:
            inside = False
    return hidden

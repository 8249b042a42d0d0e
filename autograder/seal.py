"""The grader's side of sealed cells (the kernel's side is autograder/sealed.py): the stub that
stands in for a locked cell, the names a cell binds, the hidden-test lines, and the check of the
verdicts the kernel signs. Runs in the trusted grader, never trusts the notebook's text."""
from __future__ import annotations

import ast
import hashlib
import hmac

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def stub(key: str) -> str:
    """The source that stands in for a locked cell while the notebook runs."""
    return f"__import__('autograder.sealed').sealed.run({key!r})"


def to_python(source: str) -> str:
    """IPython syntax (%magics, !shell) as plain Python."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


def free_names(source: str) -> set[str] | None:
    """The names a cell reads that it does not bind anywhere itself (assignments, loop and
    comprehension variables, parameters, defs, imports): what it needs from earlier cells. None
    when it does not parse."""
    try:
        tree = ast.parse(to_python(source))
    except SyntaxError:
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
    """Whether a cell only defines (functions, classes, imports): running it calls nothing
    else."""
    try:
        tree = ast.parse(to_python(source))
    except SyntaxError:
        return False
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    return all(isinstance(n, kinds) or (isinstance(n, ast.Expr) and
                                        isinstance(n.value, ast.Constant)) for n in tree.body)


def imported_names(source: str) -> set[str]:
    """Top-level names a cell binds by importing: a test must get its modules from the lab's
    own locked cells, never from the student's kernel."""
    try:
        tree = ast.parse(to_python(source))
    except SyntaxError:
        return set()
    return {(a.asname or a.name).split(".")[0] for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}


def bound_names(source: str) -> set[str]:
    """Top-level names a cell binds: assignments, imports, defs, classes, for/with targets."""
    try:
        tree = ast.parse(to_python(source))
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
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


def verify(text: str, key: bytes) -> dict | None:
    """The verdicts in a report from the kernel, or None unless it is signed with `key`."""
    if not isinstance(text, str) or "\n" not in text:
        return None
    body, mac = text.rsplit("\n", 1)
    want = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, mac.strip()):
        return None
    try:
        records = ast.literal_eval(body)
    except (ValueError, SyntaxError):
        return None
    return records if isinstance(records, dict) else None

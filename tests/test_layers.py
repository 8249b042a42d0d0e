"""The shape of the code, checked: imports run one way (`autograder -> minillm -> kernels`,
`slides -> minillm, kernels`, `benchmarks -> autograder, minillm, kernels`, `tests` -> any, and
nothing imports `tests`), no two project modules import each other (directly or around a loop,
counting imports inside functions too), no source file grows past 600 lines and no test file
past 800.

Read from the source with `ast`, so nothing is imported and the check takes well under a second.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "minillm", "autograder", "slides", "benchmarks", "tests")
MAX_LINES = 600
MAX_TEST_LINES = 800

# Which project packages each package may import. Everything not listed is refused.
ALLOWED = {
    "kernels": set(),                                   # a leaf: torch and triton only
    "minillm": {"kernels"},
    "autograder": {"minillm", "kernels"},
    "slides": {"minillm", "kernels"},
    "benchmarks": {"autograder", "minillm", "kernels"},
    "tests": {"autograder", "minillm", "kernels", "slides", "benchmarks"},
}


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file in the project's packages."""
    found = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, anywhere in the file (a function-level import is
    still an arrow between two modules). `from pkg import sub` counts `pkg.sub` when it is a
    module, else `pkg`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                       for a in node.names]
        else:
            continue
        for t in targets:
            if name.startswith("tests.") and f"tests.{t}".split(".")[1] in _TEST_STEMS:
                t = f"tests.{t}"                        # a test module imports a sibling by name
            while t and t not in known:                 # a name inside a module -> the module
                t = t.rpartition(".")[0]
            if t and t.split(".")[0] in PACKAGES:
                out.add(t)
    out.discard(name)
    return out


_TEST_STEMS = {p.stem for p in (REPO / "tests").glob("*.py")}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_imports_run_one_way(graph):
    wrong = [f"{a} imports {b}" for a, deps in sorted(graph.items()) for b in sorted(deps)
             if b.split(".")[0] != a.split(".")[0]
             and b.split(".")[0] not in ALLOWED[a.split(".")[0]]]
    assert not wrong, "imports against the layers (autograder -> minillm -> kernels; " \
                      "slides -> minillm, kernels; benchmarks -> autograder, minillm, kernels; " \
                      "tests -> any):\n" + "\n".join(wrong)


def _is_parent_package(a: str, b: str) -> bool:
    """`minillm` importing `minillm.model` (a package re-exporting its modules) while
    `minillm.model` imports `minillm.config` is not a loop: importing a submodule runs its
    parent package first, so a module naming its own parent package is not an arrow back."""
    return a.startswith(b + ".")


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other around a loop (strongly connected
    components of more than one module, Tarjan's algorithm), each sorted."""
    edges = {a: sorted(b for b in deps if not _is_parent_package(a, b))
             for a, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycle(graph):
    found = loops(graph)
    assert not found, "modules that import each other around a loop:\n" + \
        "\n".join(" <-> ".join(group) for group in found)


def test_the_loop_finder_finds_loops():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []
    assert loops({"p": {"p.m"}, "p.m": {"p"}}) == []            # a module naming its package


def test_the_layer_rules_refuse_an_arrow_back(tmp_path):
    fake = tmp_path / "kernels" / "leaf.py"
    fake.parent.mkdir()
    fake.write_text("import torch\nfrom minillm.quant import QuantLinear\n")
    deps = imports_of("kernels.leaf", fake, {"kernels.leaf", "minillm.quant", "minillm"})
    assert deps == {"minillm.quant"}
    assert "minillm" not in ALLOWED["kernels"]


def test_test_modules_are_in_the_graph_and_nothing_may_import_them(graph):
    assert "tests.test_pipeline" in graph["tests.test_fairness"]      # a sibling, by bare name
    assert "benchmarks.speed_checks" in graph["tests.test_speed_checks"]
    assert not any("tests" in allowed for allowed in ALLOWED.values())


def test_no_source_file_over_600_lines_and_no_test_file_over_800():
    long = [f"{name}: {n} lines" for name, p in modules().items()
            if (n := len(p.read_text().splitlines())) >
            (MAX_TEST_LINES if name.startswith("tests.") else MAX_LINES)]
    assert not long, f"files over {MAX_LINES} lines, test files over {MAX_TEST_LINES} " \
                     "(split them by concept):\n" + "\n".join(long)

"""The graded lab's own references, withheld from the kernel (autograder/README.md): `build`
writes a copy of the course packages in which each declared definition (every method of a
class) raises NotImplementedError; non-Python files are links to the installed ones.
"""
from __future__ import annotations

import ast
import compileall
import importlib.util
import os
from pathlib import Path

__all__ = ["build", "PACKAGES", "package_dir"]

PACKAGES = ("minillm", "kernels")


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)           # locates, does not import
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the course package {name} is not installed")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def build(withheld: dict[str, str], lab: str, dest: Path) -> tuple[Path, list[Path]]:
    """Write the stubbed packages; returns (`dest`, the installed folders its links reach)."""
    by_module: dict[str, dict[str, str]] = {}
    for target, student_name in withheld.items():
        module, _, qualname = target.partition(":")
        if module.split(".")[0] not in PACKAGES or not qualname:
            raise ValueError(f"withheld {target!r}: give module:qualname inside "
                             f"{' or '.join(PACKAGES)}")
        by_module.setdefault(module, {})[qualname] = (
            f"{module}.{qualname} is the course's answer to lab {lab}, so it is withheld while "
            f"that lab is graded: the grader runs your own {student_name} (write it in your "
            f"notebook, and call yours)")
    links: list[Path] = []
    seen: set[str] = set()
    for pkg in PACKAGES:
        _copy(package_dir(pkg), Path(dest) / pkg, pkg, by_module, links, seen)
    corpus = package_dir("minillm").parent / "data"        # minillm.data reads ../data
    if corpus.is_dir():
        os.symlink(corpus, Path(dest) / "data")
        links.append(corpus)
    if missing := set(by_module) - seen:
        raise ValueError(f"withheld from modules that do not exist: {sorted(missing)}")
    compileall.compile_dir(str(dest), quiet=2, workers=1)
    return Path(dest), links


def _copy(src: Path, dst: Path, module: str, by_module: dict, links: list[Path],
          seen: set[str]) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        if entry.name == "__pycache__":
            continue
        if entry.is_dir() and any(entry.glob("*.py")):
            _copy(entry, dst / entry.name, f"{module}.{entry.name}", by_module, links, seen)
        elif entry.suffix == ".py":
            name = module if entry.stem == "__init__" else f"{module}.{entry.stem}"
            text = entry.read_text()
            if name in by_module:
                seen.add(name)
                text = stub_source(text, by_module[name], name)
            (dst / entry.name).write_text(text)
        else:
            os.symlink(entry.resolve(), dst / entry.name)
            links.append(entry.resolve())


def stub_source(text: str, stubs: dict[str, str], module: str) -> str:
    """`text` with each definition named in `stubs` (qualname -> message) stubbed."""
    tree = ast.parse(text)
    targets: list[tuple[ast.AST, str]] = []
    for qualname, msg in stubs.items():
        if (node := _find(tree, qualname.split("."))) is None:
            raise ValueError(f"withheld {module}:{qualname}: no such definition")
        if isinstance(node, ast.ClassDef):
            targets += [(f, msg) for f in node.body
                        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        else:
            targets.append((node, msg))
    lines = text.splitlines(keepends=True)
    for node, msg in sorted(targets, key=lambda t: -t[0].lineno):
        body = node.body[1:] if ast.get_docstring(node, clean=False) is not None else node.body
        if not body:
            continue
        first = body[0]
        if first.lineno == node.lineno:
            raise ValueError(f"{module}:{node.name} is written on one line; it cannot be stubbed")
        indent = " " * first.col_offset
        lines[first.lineno - 1:node.end_lineno] = [f"{indent}raise NotImplementedError({msg!r})\n"]
    return "".join(lines)


def _find(tree: ast.AST, parts: list[str]):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                node.name == parts[0]:
            return node if len(parts) == 1 else _find(node, parts[1:])
    return None

"""The README's public API table is the packages' `__all__`, and every name in it imports."""
import importlib
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def table() -> dict[str, set[str]]:
    section = README.split("### The public API", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| (.+) \|$", section, flags=re.M)
    assert rows, "the README has no public API table"
    return {mod: set(re.findall(r"`(\w+)`", names)) for mod, names in rows}


@pytest.mark.parametrize("package", ["minillm", "minillm.decode", "minillm.serving",
                                     "minillm.attention"])
def test_the_table_lists_exactly_what_the_package_exports(package):
    mod = importlib.import_module(package)
    assert table()[package] == set(mod.__all__), f"README's row for {package} != its __all__"


def test_the_explorers_and_the_bench_modules_exist():
    rows = table()
    explorers = importlib.import_module("minillm.explorers")
    assert rows["minillm.explorers"] <= set(explorers.__all__)
    bench = Path(importlib.import_module("minillm.bench").__file__).parent
    assert rows["minillm.bench"] == {p.stem for p in bench.glob("*.py")} - {"__init__"}
    for name in rows["minillm.bench"]:
        importlib.import_module(f"minillm.bench.{name}")

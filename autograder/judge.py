"""The judge: the values a hidden test checked (its evidence), compared by the grader, outside
the kernel, with the values the lab's own notebook produced.

A graded kernel runs student code and the course's tests in one process, and its verdicts are
signed with a secret that lives in that process (autograder/sealed.py). Code that reads its
own process's memory through a primitive that raises no audit event (`ctypes.cast`, loaded by
torch) can find the secret and sign "every test passed" (tests/test_tamper.py, `memory_read`).
No check inside that process can stop it. So a test also hands the grader the values it
checked, and the grader compares them with the values the instructor's own notebook produced:

* in a hidden test, `ag.evidence(value, "name", atol=..., rtol=...)` shows the value as a
  display output of type MIME, in a graded kernel only (`autograder.sealed.install` turns it
  on; the released notebook has no hidden tests anyway). Tensors, numbers, strings, None,
  lists, tuples and dicts of these;
* the job process (trusted, outside the sandbox) takes these outputs out of the executed
  notebook (`take`), so that no feedback shows them and the report carries them;
* the reference run (autograder/reference_run.py) runs the lab's source notebook, solutions
  included, as a job like any submission, and keeps each test's evidence;
* `judge` (in `jobs.record`, in the grader) compares each test cell that the kernel says passed
  with the reference run's evidence for that cell, item by item, with the reference's tolerance
  (`tolerance.within_tolerance`, the rule of `assert_close`). A cell whose evidence is
  missing or differs scores zero, with status `tampered: <cell>: ...`.

What it proves: a cell whose evidence matches produced the reference's values on the test's
inputs. A kernel that forges its verdicts must also produce those values, which takes the
computation itself (or a copy of the reference, which the README lists as not prevented).
What it does not prove: anything the kernel measures about the student's code rather than
computes with it. A time ratio, a count of forward passes or "the input was left unmodified"
can be forged by such a kernel, shown or not: the right count is a number it can show.
A test's evidence tolerance should be at least twice the tolerance its own assertion uses, so
that every submission that passes the assertion also matches the reference.
"""
from __future__ import annotations

import json
import math
import sys

__all__ = ["evidence", "MIME", "take", "compare", "judge"]

MIME = "application/vnd.minillm.evidence+json"
MAX_VALUES = 200_000                 # numbers in one item
MAX_NOTEBOOK_BYTES = 16 << 20        # all the evidence of one notebook, as JSON


# --- in the kernel ------------------------------------------------------------------------------
def _number(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def encode(value, _count: list | None = None):
    """A JSON tree for `value` (see the module docstring for what is accepted)."""
    count = _count if _count is not None else [0]
    torch = sys.modules.get("torch")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return {"float": _number(float(value))}
    if torch is not None and isinstance(value, torch.Tensor):
        t = torch.Tensor.detach(value).cpu()
        return _array(list(t.shape), t.reshape(-1).tolist(), count)
    if type(value).__module__ == "numpy":
        if type(value).__name__ == "ndarray":
            return _array(list(value.shape), value.reshape(-1).tolist(), count)
        return encode(value.item(), count)
    if isinstance(value, (list, tuple)):
        return {"list": [encode(v, count) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in value):
            raise TypeError("evidence: dict keys must be strings or ints")
        return {"dict": [[k, encode(v, count)] for k, v in value.items()]}
    raise TypeError(f"evidence: cannot record a {type(value).__name__} (tensors, numbers, "
                    "strings, None, lists, tuples and dicts of these)")


def _array(shape: list, flat: list, count: list) -> dict:
    count[0] += len(flat)
    if count[0] > MAX_VALUES:
        raise ValueError(f"evidence: more than {MAX_VALUES} numbers in one item")
    return {"shape": shape, "data": [_number(float(x)) if isinstance(x, float) else
                                     int(x) for x in flat]}


SHOWING = False      # set by autograder.sealed.install: only a graded kernel shows evidence


def evidence(value, name: str, *, atol: float = 0.0, rtol: float = 0.0) -> None:
    """Show the grader `value`, a value this test checked; see the module docstring. The
    arguments are checked everywhere; the value is shown only in a graded kernel (SHOWING)."""
    if not isinstance(name, str) or not name:
        raise TypeError("evidence: name must be a non-empty string")
    if atol < 0 or rtol < 0:
        raise ValueError(f"evidence {name!r}: atol and rtol must be >= 0")
    item = {"name": name, "value": encode(value), "atol": float(atol), "rtol": float(rtol)}
    if not SHOWING:
        return
    from IPython.display import display
    display({MIME: item, "text/plain": ""}, raw=True)


# --- in the job process (trusted) -----------------------------------------------------------------
def take(nb, test_ids: set[str]) -> dict[str, list]:
    """Remove every evidence output from the executed notebook; return those of the test cells
    in `test_ids`, grade_id -> items in order ({"error": why} instead of the items when they
    are malformed or over MAX_NOTEBOOK_BYTES in all)."""
    found: dict[str, list] = {}
    total = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        kept = []
        for o in cell.get("outputs", []):
            data = o.get("data") if o.get("output_type") == "display_data" else None
            if not isinstance(data, dict) or MIME not in data:
                kept.append(o)
                continue
            if gid not in test_ids:
                continue
            item = data[MIME]
            total += len(json.dumps(item))
            items = found.setdefault(gid, [])
            if isinstance(items, dict):
                continue
            if total > MAX_NOTEBOOK_BYTES:
                found[gid] = {"error": f"over {MAX_NOTEBOOK_BYTES >> 20} MB of evidence"}
            elif not _well_formed(item):
                found[gid] = {"error": "a malformed evidence item"}
            else:
                items.append(item)
        cell.outputs = kept
    return found


def _well_formed(item) -> bool:
    return isinstance(item, dict) and isinstance(item.get("name"), str) and "value" in item \
        and all(isinstance(item.get(k), (int, float)) and not isinstance(item.get(k), bool)
                for k in ("atol", "rtol"))


# --- in the grader (trusted) ----------------------------------------------------------------------
def _as_float(x):
    if isinstance(x, str) and x in ("nan", "inf", "-inf"):
        return float(x)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        try:
            return float(x)
        except OverflowError:               # an int past any float: JSON allows it
            return None
    return None


def _mismatches(got: list, want: list, atol: float, rtol: float) -> list[int]:
    """The indices at which the numbers `got` and `want` (JSON numbers or "nan", "inf", "-inf",
    as `encode` writes them) break `tolerance.within_tolerance`, the rule `assert_close` applies
    in the kernel; anything that is not a number matches nothing."""
    import torch

    from .tolerance import within_tolerance
    g, w = [_as_float(x) for x in got], [_as_float(x) for x in want]
    ok = within_tolerance(torch.tensor([0.0 if x is None else x for x in g], dtype=torch.float64),
                          torch.tensor([0.0 if x is None else x for x in w], dtype=torch.float64),
                          atol=atol, rtol=rtol)
    return [i for i, (fine, a, b) in enumerate(zip(ok.tolist(), g, w))
            if not fine or a is None or b is None]


def _close(got, want, atol: float, rtol: float) -> bool:
    return not _mismatches([got], [want], atol, rtol)


def _scalar(x):
    """The number a scalar-like tree holds (an int, a float, a 0-d array), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, dict) and "float" in x:
        return x["float"]
    if isinstance(x, dict) and x.get("shape") == [] and isinstance(x.get("data"), list) and \
            len(x["data"]) == 1:
        return x["data"][0]
    return None


def _as_array(tree):
    """A tensor tree as is; a rectangular nested list of numbers as {"shape", "data"} (what
    `assert_close` also accepts in place of a tensor); anything else None."""
    if isinstance(tree, dict) and "shape" in tree:
        return tree
    if not (isinstance(tree, dict) and isinstance(tree.get("list"), list)):
        return None
    items = tree["list"]
    if all(_scalar(x) is not None or isinstance(x, bool) for x in items):
        return {"shape": [len(items)], "data": [int(x) if isinstance(x, bool) else _scalar(x)
                                                for x in items]}
    rows = [_as_array(x) for x in items]
    if not rows or any(r is None or r["shape"] != rows[0]["shape"] for r in rows):
        return None
    return {"shape": [len(rows)] + rows[0]["shape"], "data": [v for r in rows for v in r["data"]]}


def _differs(got, want, atol: float, rtol: float, where: str) -> str | None:
    """Why `got` does not match `want` (both JSON trees from `encode`), or None. A 0-d tensor
    and a number compare as numbers; an int must be equal, a float within the tolerance; a
    nested list of numbers compares with a tensor like a tensor of its shape."""
    w, g = _scalar(want), _scalar(got)
    if w is not None:
        if isinstance(want, int):
            ok = g is not None and (g == w if isinstance(g, int) else _close(g, w, 0.0, 0.0))
        else:
            ok = g is not None and _close(g, w, atol, rtol)
        return None if ok else f"{where}: {_show(got)} against {_show(want)}"
    if isinstance(want, dict) and "shape" in want:
        got = _as_array(got) or got
    elif isinstance(got, dict) and "shape" in got and _as_array(want) is not None:
        want = _as_array(want)
    if isinstance(want, dict) and "shape" in want:
        if not isinstance(got, dict) or got.get("shape") != want["shape"] or \
                not isinstance(got.get("data"), list) or len(got["data"]) != len(want["data"]):
            shape = got.get("shape") if isinstance(got, dict) else type(got).__name__
            return f"{where}: shape {shape}, the reference's {want['shape']}"
        bad = _mismatches(got["data"], want["data"], atol, rtol)
        if bad:
            i = bad[0]
            return (f"{where}: {len(bad)} of {len(want['data'])} values differ (e.g. "
                    f"{_short(got['data'][i])} against {_short(want['data'][i])})")
        return None
    if isinstance(want, dict) and "list" in want:
        if not isinstance(got, dict) or not isinstance(got.get("list"), list) or \
                len(got["list"]) != len(want["list"]):
            return f"{where}: not a list of {len(want['list'])}"
        for i, (g, w) in enumerate(zip(got["list"], want["list"])):
            why = _differs(g, w, atol, rtol, f"{where}[{i}]")
            if why:
                return why
        return None
    if isinstance(want, dict) and "dict" in want:
        if not isinstance(got, dict) or not isinstance(got.get("dict"), list) or \
                [k for k, _ in _pairs(got["dict"])] != [k for k, _ in want["dict"]]:
            return f"{where}: not a dict with the keys {[k for k, _ in want['dict']]}"
        for (k, g), (_, w) in zip(_pairs(got["dict"]), want["dict"]):
            why = _differs(g, w, atol, rtol, f"{where}[{k!r}]")
            if why:
                return why
        return None
    if type(got) is type(want) and got == want:         # None, bool, str
        return None
    return f"{where}: {_show(got)} against {_show(want)}"


def _show(tree) -> str:
    s = _scalar(tree)
    return _short(s if s is not None else tree, 200)


def _short(x, most: int = 40) -> str:
    """repr(x) cut to `most` characters, saying how long it was (a shown number may have
    hundreds of digits)."""
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 10 ** most:
        try:
            return f"an int of {len(str(abs(x)))} digits"
        except ValueError:                  # past Python's int-to-text limit
            return f"an int of {abs(x).bit_length()} bits"
    text = repr(x)
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


def _pairs(items) -> list:
    return [p for p in items if isinstance(p, list) and len(p) == 2]


def compare(reference_items: list, items) -> str | None:
    """Why a test cell's evidence does not match the reference run's, or None."""
    try:
        return _compare(reference_items, items)
    except (RecursionError, TypeError, ValueError, AttributeError, KeyError, ArithmeticError) as e:
        return f"malformed evidence ({type(e).__name__})"


def _compare(reference_items: list, items) -> str | None:
    if isinstance(items, dict):
        return str(items.get("error", "malformed evidence"))
    items = items or []
    if len(items) != len(reference_items):
        return (f"{len(items)} evidence item(s) where the reference run showed "
                f"{len(reference_items)}")
    for got, want in zip(items, reference_items):
        if got.get("name") != want["name"]:
            return f"evidence {got.get('name')!r} where the reference showed {want['name']!r}"
        why = _differs(got.get("value"), want["value"], float(want["atol"]),
                       float(want["rtol"]), want["name"])
        if why:
            return why
    return None


def judge(result: dict, reference: dict) -> list[str]:
    """Compare a job's evidence with the reference run's (`reference`: notebook -> grade_id ->
    items). A test cell that passed in the kernel and does not match gets an error output in
    the result's notebook (so nbgrader scores it zero); returns "<grade_id>: why" for each."""
    import nbformat
    problems = []
    for name, text in list(result.get("notebooks", {}).items()):
        wanted = reference.get(name) or {}
        report = result.get("reports", {}).get(name, {})
        got = report.get("evidence") or {}
        nb = nbformat.reads(text, as_version=4)
        changed = []
        for cell in nb.cells:
            m = cell.metadata.get("nbgrader", {})
            gid = m.get("grade_id")
            if cell.cell_type != "code" or not m.get("grade") or not wanted.get(gid):
                continue
            if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
                continue                    # failed in the kernel: zero already
            why = compare(wanted[gid], got.get(gid))
            if why:
                message = f"the values this test checked differ from the reference run's: {why}"
                cell.outputs = list(cell.get("outputs", [])) + [nbformat.NotebookNode(
                    output_type="error", ename="EvidenceMismatch", evalue=message,
                    traceback=[f"EvidenceMismatch: {message}"])]
                changed.append(f"{gid}: {message}")
        if changed:
            result["notebooks"][name] = nbformat.writes(nb)
            report.setdefault("tampered", []).extend(changed)
            problems += changed
    return problems

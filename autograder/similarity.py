"""Copying detected, never scored (`grade --similarity`, autograder/README.md): answer cells
compared with copydetect; build/similarity/<lab>.html and similarity.json.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

__all__ = ["compare", "load", "answer_code", "DISPLAY_T"]

DISPLAY_T = 0.5          # pairs in the HTML report: over half of one answer found in the other
RESULTS = "similarity.json"


def answer_code(nb) -> str:
    """The student's code answer cells of a notebook (nbgrader solution cells), joined."""
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "code" and
                       c.metadata.get("nbgrader", {}).get("solution"))


def _write(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(text + "\n")


def _archive(src: Path, dest: Path) -> None:
    import nbformat
    for p in sorted(src.rglob("*")):
        if not p.is_file() or p.is_symlink():
            continue
        label = "__".join(p.relative_to(src).parts)
        if p.suffix == ".ipynb":
            try:
                _write(dest, label, answer_code(nbformat.read(str(p), as_version=4)))
            except Exception as e:          # noqa: BLE001 - one unreadable file, not the batch
                print(f"similarity: skipped {p}: {type(e).__name__}: {e}")
        elif p.suffix == ".py":
            _write(dest, label, p.read_text(errors="replace"))


def compare(course, labs: list[str], archive: Path | None = None, log=print) -> dict:
    """Returns and stores {lab: {student: {"score": float, "with": str}}}."""
    import nbformat
    from copydetect import CopyDetector

    from .withheld import PACKAGES, package_dir
    out_dir = course.build / "similarity"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = load(course)
    work = Path(tempfile.mkdtemp(prefix="similarity_"))
    try:
        course_ref = work / "course"
        for pkg in PACKAGES:
            for p in sorted(package_dir(pkg).rglob("*.py")):
                name = ".".join((pkg, *p.relative_to(package_dir(pkg)).with_suffix("").parts))
                _write(course_ref, f"course:{name}", p.read_text())
        archived = work / "archive"
        if archive is not None:
            _archive(Path(archive), archived)
        for lab in labs:
            students = work / lab / "students"
            for folder in sorted(course.build.glob(f"submitted/*/{lab}")):
                nb_path = folder / f"{lab}.ipynb"
                if nb_path.is_file() and not nb_path.is_symlink():
                    try:
                        nb = nbformat.read(str(nb_path), as_version=4)
                    except Exception:       # noqa: BLE001 - graded as rejected elsewhere
                        continue
                    _write(students, folder.parent.name, answer_code(nb))
            if not students.is_dir():
                continue
            given = nbformat.read(str(course.release_dir(lab) / f"{lab}.ipynb"), as_version=4)
            _write(work / lab / "given", "given", answer_code(given))
            refs = [students, course_ref] + ([archived] if archived.is_dir() else [])
            report = out_dir / f"{lab}.html"
            detector = CopyDetector(test_dirs=[str(students)], ref_dirs=[str(r) for r in refs],
                                    boilerplate_dirs=[str(work / lab / "given")],
                                    extensions=["py"], display_t=DISPLAY_T, autoopen=False,
                                    silent=True, out_file=str(report))
            detector.run()
            results[lab] = _best_matches(detector)
            if len(detector.similarity_matrix):
                detector.generate_html_report()
            log(f"similarity {lab}: {report} ({len(results[lab])} submissions)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out_dir / RESULTS).write_text(json.dumps(results, indent=1, sort_keys=True))
    return results


def _best_matches(detector) -> dict:
    """{student: {"score", "with"}}: the source holding the largest share of their answer."""
    best: dict = {}
    matrix = detector.similarity_matrix
    for i, test in enumerate(detector.test_files):
        student = Path(test).stem
        found = [(0.0, "")]
        for j, ref in enumerate(detector.ref_files):
            ref_path = Path(ref)
            if ref != test and len(matrix):
                found.append((round(float(matrix[i, j, 0]), 3), ref_path.stem if
                              ref_path.parent.name != "archive" else f"archive:{ref_path.stem}"))
        score, whom = max(found, key=lambda f: (f[0], f[1]))     # ties: the same one each run
        best[student] = {"score": score, "with": whom if score > 0 else ""}
    return best


def load(course) -> dict:
    """What the last `compare` stored ({} if never run)."""
    path = course.build / "similarity" / RESULTS
    return json.loads(path.read_text()) if path.is_file() else {}

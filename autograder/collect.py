"""Submissions in, the way a class hands them in (autograder/README.md, "Running a class"):

* nbgrader's exchange on a shared JupyterHub: `release --exchange DIR` publishes the labs
  (`nbgrader release_assignment`), students fetch and submit them (JupyterLab's Assignments tab, or
  `nbgrader fetch_assignment` / `submit`), and `collect --exchange DIR` gathers the newest
  submission of each student (`nbgrader collect --update`);
* a learning-management system's zip download (Canvas names: `<name>_[LATE_]<id>_<id>_<file>`):
  `collect --zip FILE LAB`, through `nbgrader zip_collect`.

Both write build/submitted/<student>/<lab>/ with nbgrader's timestamp.txt, which `grade` reads
(`python -m autograder grade build/submitted`). Nothing is dropped in silence: a file of the zip
that becomes no submission is named in the report.
"""
from __future__ import annotations

import re
import shutil
import zipfile
from datetime import datetime
from pathlib import Path

from nbgrader.plugins import FileNameCollectorPlugin
from traitlets import Bool

from .course import STUDENT_RE, Course

# Canvas's "Download Submissions": <name>_[LATE_]<user id>_<submission id>_<file>[-<n>].ipynb
# (-<n>: a re-upload). nbgrader matches it against the file's whole path.
CANVAS = (r".*/(?P<student_id>[^_/]+)_(?P<late>LATE_)?\d+_\d+_"
          r"(?P<file_id>[^/]+?)(?:-\d+)?\.ipynb$")


class LmsCollector(FileNameCollectorPlugin):
    """nbgrader's file-name collector, plus, with `zip_dates`, the submission time taken from the
    date of the file's entry in the zip (for an LMS whose entry dates are submission times)."""

    zip_dates = Bool(False, help="timestamp.txt from each file's date in the zip").tag(config=True)

    def collect(self, submitted_file):
        info = super().collect(submitted_file)
        if info is None or not self.zip_dates:
            return info
        app = self.parent
        archive = Path(app._format_collect_path(app.archive_directory))
        name = Path(submitted_file).name
        for path in sorted(archive.glob("*.zip")):
            with zipfile.ZipFile(path) as z:
                for entry in z.infolist():
                    if Path(entry.filename).name == name:
                        info["timestamp"] = datetime(*entry.date_time).isoformat(" ")
        return info


def release(course: Course, labs: list[str] | None, exchange: Path) -> list[str]:
    """Generate the labs, then publish them to the exchange (`nbgrader release_assignment`)."""
    done = course.release(labs)
    for lab in done:
        course.step("release_assignment", lab, f"--Exchange.root={exchange}", "--force")
    return done


def collect_exchange(course: Course, labs: list[str] | None, exchange: Path,
                     log=print) -> list[tuple[str, str]]:
    """The newest submission of each student of each lab -> build/submitted/; (student, lab)."""
    if not (Path(exchange) / "minillm").is_dir():
        raise FileNotFoundError(f"no course 'minillm' in the exchange {exchange} (release to it "
                                "first: make release EXCHANGE=...)")
    labs = [course.check_lab(lab) for lab in labs] if labs else course.labs()
    for lab in labs:
        course.step("collect", lab, f"--Exchange.root={exchange}", "--update")
    return _submitted(course, labs, log)


def collect_zip(course: Course, lab: str, zip_path: Path, *, pattern: str = CANVAS,
                zip_dates: bool = False, log=print) -> list[tuple[str, str]]:
    """An LMS download of `lab`'s submissions -> build/submitted/<student>/<lab>/."""
    lab, zip_path = course.check_lab(lab), Path(zip_path)
    if not zipfile.is_zipfile(zip_path):
        raise ValueError(f"{zip_path} is not a zip file")
    rx = re.compile(pattern)
    if "student_id" not in rx.groupindex or "file_id" not in rx.groupindex:
        raise ValueError("the file-name pattern needs the groups (?P<student_id>...) and "
                         "(?P<file_id>...)")
    course.release([lab], missing_only=True)
    expected = {p.name for p in course.source(lab).glob("*.ipynb")}
    mine: dict[str, list] = {}             # student -> [(entry, its name's match)] in the zip
    with zipfile.ZipFile(zip_path) as z:
        for entry in (e for e in z.infolist() if not e.is_dir()):
            m = rx.match("/" + entry.filename)
            if not m or not STUDENT_RE.match(m["student_id"]) or \
                    Path(m["file_id"]).stem + ".ipynb" not in expected:
                log(f"not collected: {entry.filename} (its name is not <student>_..._<notebook "
                    f"of {lab}> in the pattern {pattern})")
            else:
                mine.setdefault(m["student_id"], []).append((entry, m))
        archive = course.build / "downloaded" / lab / "archive"
        if archive.exists():
            shutil.rmtree(archive)
        archive.mkdir(parents=True)
        with zipfile.ZipFile(archive / zip_path.name, "w") as out:   # one file per student
            for student, files in sorted(mine.items()):
                files.sort(key=lambda f: (f[0].date_time, f[0].filename))
                if len(files) > 1:
                    log(f"{student}: {len(files)} files; collected the newest in the zip, "
                        f"{files[-1][0].filename} (not: "
                        f"{', '.join(f[0].filename for f in files[:-1])})")
                out.writestr(files[-1][0], z.read(files[-1][0]))
    course.step("zip_collect", lab, "--force", "--strict",
         "--ZipCollectApp.downloaded_directory=build/downloaded",
         "--collector=autograder.collect.LmsCollector",
         f"--FileNameCollectorPlugin.named_regexp={pattern}",
         f"--LmsCollector.zip_dates={zip_dates}")
    late = [s for s, files in sorted(mine.items()) if files[-1][1].groupdict().get("late")]
    if late and not zip_dates:
        log(f"marked late by the LMS: {', '.join(late)} (no penalty here: the zip's dates are "
            "not read without --zip-dates; see autograder/README.md)")
    return _submitted(course, [lab], log)


def _submitted(course: Course, labs: list[str], log) -> list[tuple[str, str]]:
    found = sorted((d.parent.name, d.name) for lab in labs
                   for d in (course.build / "submitted").glob(f"*/{lab}") if d.is_dir())
    for lab in labs:
        who = [s for s, x in found if x == lab]
        log(f"{lab}: {len(who)} submission(s) in {course.build / 'submitted'}"
            + (f" ({', '.join(who)})" if who else ""))
    return found


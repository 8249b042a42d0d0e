"""Feedback without hidden tests: an nbgrader preprocessor for `generate_feedback`.

nbgrader's feedback is the autograded notebook rendered to HTML, and the autograded notebook
holds every test cell whole, hidden part included, so out of the box each student's feedback
shows the hidden tests. `HideHiddenTests` (in GenerateFeedback.preprocessors, see
nbgrader_config.py) replaces each hidden region by one comment line, and removes any line of
hidden test code that an output repeats (a student can print `In`, or raise an exception whose
message is a test's source). Each graded cell keeps its visible part, its score and its failure
message. `grade --feedback-with-hidden-tests` (AUTOGRADER_FEEDBACK_HIDDEN=1) leaves them in.

Not guaranteed: a student who encodes the hidden code (base64, reversed, ...) in their own
outputs can still read that encoding in their own feedback.
"""
from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from .tester_plan import HIDDEN_BEGIN, HIDDEN_END, hidden_lines

PLACEHOLDER = "# (hidden tests: not shown)"
REDACTED = "[hidden test code]"
MIN_LINE = 12          # shorter lines ("else:", "pass") are not worth hiding and hide too much


def strip_hidden(source: str) -> str:
    lines = source.splitlines()
    hidden = hidden_lines(source)
    out, placed = [], False
    for i, line in enumerate(lines, 1):
        if i in hidden:
            if not placed:
                out.append(PLACEHOLDER)
                placed = True
            continue
        placed = False
        out.append(line)
    return "\n".join(out)


def secret_lines(nb) -> list[str]:
    """The hidden test lines worth redacting, longest first."""
    found = set()
    for cell in nb.cells:
        if cell.cell_type != "code" or HIDDEN_BEGIN not in cell.source:
            continue
        lines = cell.source.splitlines()
        for i in hidden_lines(cell.source):
            text = lines[i - 1].strip()
            if len(text) >= MIN_LINE and HIDDEN_BEGIN not in text and HIDDEN_END not in text:
                found.add(text)
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        if s in text:
            text = text.replace(s, REDACTED)
    return text


class HideHiddenTests(Preprocessor):
    enabled = Bool(True)                # nbconvert's Preprocessor skips itself by default

    def preprocess(self, nb, resources):
        secrets = secret_lines(nb)
        for cell in nb.cells:
            if cell.cell_type == "code" and HIDDEN_BEGIN in cell.source:
                cell.source = strip_hidden(cell.source)
            for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
                if "text" in out:
                    out["text"] = redact("".join(out["text"]), secrets)
                if out.get("output_type") == "error":
                    out["evalue"] = redact(str(out.get("evalue", "")), secrets)
                    out["traceback"] = [redact(t, secrets) for t in out.get("traceback", [])]
                for mime, value in list(out.get("data", {}).items()):
                    if mime.startswith("text/") or mime.endswith("json"):
                        out["data"][mime] = redact(value if isinstance(value, str)
                                                   else "".join(value), secrets) \
                            if not isinstance(value, dict) else value
        return nb, resources

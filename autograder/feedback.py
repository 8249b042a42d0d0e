"""An nbgrader preprocessor for `generate_feedback`: each hidden region becomes one comment line
and hidden lines an output repeats are redacted (AUTOGRADER_FEEDBACK_HIDDEN=1 keeps them).
An encoded copy in the student's own outputs still shows.
"""
from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from .tester_plan import HIDDEN_BEGIN, HIDDEN_END, hidden_lines

PLACEHOLDER = "# (hidden tests: not shown)"
REDACTED = "[hidden test code]"
MIN_LINE = 12          # shorter lines ("else:", "pass") are not worth hiding and hide too much


def strip_hidden(source: str) -> str:
    hidden, out = hidden_lines(source), []
    for i, line in enumerate(source.splitlines(), 1):
        if i not in hidden:
            out.append(line)
        elif i - 1 not in hidden:           # one placeholder per hidden region
            out.append(PLACEHOLDER)
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

"""`GuardedExecute` runs a submission in a job (autograder/jobs.py): nbgrader's Execute plus a
per-notebook deadline, set-up code, the tester fed `tester_cells`, and a kernel that dies, ignores
an interrupt or sends what cannot be decoded (an int past Python's digit limit) giving that cell
and every later one an error output (nbgrader passes a test without one). `ReplayExecute` hands
the outputs to `nbgrader autograde` (AUTOGRADER_REPLAY). Imports no torch (nbgrader_config.py).
"""
from __future__ import annotations

import json
import math
import os
from time import monotonic

from nbclient.client import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Any, Dict, Integer

# run silently in the kernel before the first cell (a failure is logged, not fatal)
SETUP_CODE = ("import autograder.kernel_output as _ko\n_ko.no_drop()\ndel _ko\n"
              "import autograder.steady_malloc as _sm\n_sm.steady()\ndel _sm\n"
              "import autograder.cores as _c\n_c.restore_torch_threads()\ndel _c")
IOPUB_TIMEOUT_MESSAGE = "Timeout waiting for IOPub output"     # nbclient's
INTERRUPTED_OUTPUT_S = 4     # an interrupted kernel that does not go idle by then is unresponsive


class UnreadableMessage(ValueError):
    """The kernel sent a message the client could not decode."""


def _refuse_unreadable(session) -> None:
    """Make `session` raise UnreadableMessage for what `deserialize` or `feed_identities`
    (frames that are no Jupyter message) cannot decode."""
    for name in ("deserialize", "feed_identities"):
        def refusing(*args, _decode=getattr(session, name), **kwargs):
            try:
                return _decode(*args, **kwargs)
            except Exception as e:
                raise UnreadableMessage(f"{type(e).__name__}: {str(e)[:200]}") from e
        setattr(session, name, refusing)


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


class GuardedExecute(Execute):
    # killed, not asked: a shutdown request blocks on a kernel that broke its own sockets
    shutdown_kernel = "immediate"
    notebook_timeout = Integer(
        900, help="Seconds the whole notebook may run (0 = no limit); cells that would start "
                  "later are not run and score zero.").tag(config=True)

    sandbox = Any(None, help="autograder.sandbox.SandboxSpec: run the kernel in this sandbox")
    tester = Any(None, help="autograder.tester.TesterProcess: runs the hidden tests apart")
    tester_cells = Dict({}, help="stub source -> the tester's command for that cell")
    tester_answer_s = Integer(60, help="seconds to wait for a test's answer after its cell")
    tester_answers = Dict({}, help="stub source -> the tester's answer (set by the run)")
    iopub_timeout = Integer(
        30, help="Seconds to wait, after a cell's reply, for the rest of its output (nbclient's "
                 "default of 4 loses output a busy grader has not read yet); after a cell that "
                 "ran out of time and was interrupted, INTERRUPTED_OUTPUT_S").tag(config=True)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        if self.sandbox is not None:
            if not hasattr(type(km), "sandbox"):     # never run unsandboxed by mistake
                raise RuntimeError(f"{type(km).__name__} cannot run a kernel in a sandbox; "
                                   "use autograder.sandbox.SandboxKernelManager")
            km.sandbox = self.sandbox
        return km

    def _remaining(self) -> float:
        return self._deadline - monotonic() if self._deadline is not None else math.inf

    _interrupted = False            # the running cell ran out of time and was interrupted

    async def _async_handle_timeout(self, timeout, cell=None):
        self._interrupted = True
        self.iopub_timeout = min(self.iopub_timeout, INTERRUPTED_OUTPUT_S)
        return await super()._async_handle_timeout(timeout, cell)

    def _get_timeout(self, cell):
        timeout, remaining = super()._get_timeout(cell), self._remaining()
        if remaining == math.inf:
            return timeout
        remaining = max(1, math.ceil(remaining))
        return remaining if timeout is None else min(timeout, remaining)

    setup_error = None                  # why setup_code failed in the kernel, if it did

    def _run_setup(self) -> None:
        cell_timeout = self.timeout
        try:
            # imports torch and the course: the kernel's start-up allowance, not one cell's
            self.timeout = max(cell_timeout or 0, self.startup_timeout or 0) or None
            msg_id = self.kc.execute(SETUP_CODE, silent=True, store_history=False)
            reply = self.wait_for_reply(msg_id)
            if reply is None or reply["content"].get("status") != "ok":
                content = (reply or {}).get("content", {})
                self.setup_error = f"{content.get('ename')}: {content.get('evalue')}"
                self.log.warning("autograder setup code failed in the kernel: %s", self.setup_error)
        except Exception as e:          # never let the setup stop grading
            self.setup_error = repr(e)
            self.log.warning("autograder setup code could not run: %r", e)
        finally:
            self.timeout = cell_timeout

    def preprocess(self, nb, resources=None, km=None):
        # nbconvert's ExecutePreprocessor.preprocess plus the deadline, set-up and dead kernels
        NotebookClient.__init__(self, nb, km)
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        timeout = int(self.notebook_timeout or 0)
        self._deadline = monotonic() + timeout if timeout > 0 else None
        report = {"notebook": (resources or {}).get("nbgrader", {}).get("notebook"),
                  "cells": 0, "cell_timeouts": [], "notebook_timeout": False,
                  "kernel_died": None, "unresponsive": None, "unreadable": None}
        t0 = monotonic()
        index = 0
        late_output_s = self.iopub_timeout
        try:
            with self.setup_kernel():
                assert self.kc
                _refuse_unreadable(self.kc.session)
                info_msg = self.wait_for_reply(self.kc.kernel_info())
                assert info_msg
                self.nb.metadata["language_info"] = info_msg["content"]["language_info"]
                self._run_setup()
                for index, cell in enumerate(self.nb.cells):
                    if cell.cell_type != "code" or not cell.source.strip():
                        continue
                    if self._remaining() <= 0:
                        report["notebook_timeout"] = True
                        cell.outputs = [_error_output(
                            "NotebookTimeout", f"not run: the notebook used up its "
                                               f"{timeout} s time limit before this cell")]
                        continue
                    self._interrupted, self.iopub_timeout = False, late_output_s
                    command = self.tester_cells.get(cell.source) \
                        if self.tester is not None else None
                    if command is not None:
                        self.tester.begin(command)
                    self.preprocess_cell(cell, resources, index)
                    if command is not None:     # a setup cell may take as long in the tester
                        wait = self.tester_answer_s if command["op"] == "test" else \
                            max(self.tester_answer_s, self._get_timeout(cell) or 0)
                        self.tester_answers[cell.source] = self.tester.end(wait)
                    report["cells"] += 1
                    if any(o.get("output_type") == "error" and
                           o.get("ename") == self.error_on_timeout.get("ename")
                           for o in cell.get("outputs", [])):
                        report["cell_timeouts"].append(index)
        except (DeadKernelError, CellTimeoutError, UnreadableMessage) as e:
            if isinstance(e, DeadKernelError):
                key, ename, why = "kernel_died", "KernelDied", (
                    "the kernel died while running cell {i} (a crash, os._exit, or the memory "
                    "limit)")
            elif isinstance(e, CellTimeoutError) and IOPUB_TIMEOUT_MESSAGE in str(e) and \
                    not self._interrupted:
                key, ename, why = "unresponsive", "OutputLate", (
                    f"the rest of cell {{i}}'s output had not reached the grader "
                    f"{late_output_s} s after the cell ended")
            elif isinstance(e, CellTimeoutError):
                key, ename, why = "unresponsive", "KernelUnresponsive", (
                    "the kernel did not respond after cell {i} timed out and was interrupted")
            else:
                key, ename, why = "unreadable", "KernelUnreadable", (
                    "the kernel sent a message the grader cannot read while running cell {i}")
            report[key] = index
            why = why.format(i=index) + (f" ({e})" if key == "unreadable" else "")
            self.log.error("%s: %s", why, e)
            for i, cell in enumerate(self.nb.cells):
                if i >= index and cell.cell_type == "code" and cell.source.strip():
                    outputs = list(cell.get("outputs", [])) if i == index else []
                    outputs.append(_error_output(ename, why + ("" if i == index else
                                                               "; this cell did not run")))
                    cell.outputs = outputs
        self.iopub_timeout = late_output_s
        report["seconds"] = round(monotonic() - t0, 3)
        self.set_widgets_metadata()
        self.log.info("autograder execution report: %s", json.dumps(report))
        self.last_report = report
        return self.nb, self.resources


class ReplayExecute(Execute):
    """Outputs copied from AUTOGRADER_REPLAY/<student>/<lab>/<nb>.ipynb if its code matches."""

    def preprocess(self, nb, resources=None, km=None):
        info = (resources or {}).get("nbgrader", {})
        root = os.environ.get("AUTOGRADER_REPLAY", "")
        path = os.path.join(root, str(info.get("student")), str(info.get("assignment")),
                            f"{info.get('notebook')}.ipynb")
        why = None
        try:
            import nbformat
            done = nbformat.read(path, as_version=4)
        except Exception as e:
            done, why = None, f"no executed notebook ({type(e).__name__}: {e})"
        cells = [c for c in nb.cells if c.cell_type == "code"]
        if done is not None:
            ran = [c for c in done.cells if c.cell_type == "code"]
            if len(ran) != len(cells) or any(a.source != b.source for a, b in zip(cells, ran)):
                why = "the executed notebook does not match the submission's code cells"
            else:
                for cell, result in zip(cells, ran):
                    cell.outputs = result.get("outputs", [])
                    cell.execution_count = result.get("execution_count")
        if why is not None:
            self.log.error("replay of %s failed: %s", path, why)
            for cell in cells:
                cell.outputs = [_error_output("NotExecuted", why)]
        return nb, resources

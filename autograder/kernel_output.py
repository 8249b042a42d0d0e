"""The kernel's side of its output channel: every message reaches the grader, however slowly the
grader reads.

A kernel sends its outputs (prints, displays, "idle") on its IOPub socket, a ZeroMQ XPUB. By
default such a socket drops what it cannot queue: past about a thousand messages waiting on each
side (the high-water marks), the newest are thrown away without a word. A cell that printed a
few thousand items on a busy machine, whose grader read slower than the kernel wrote, lost a run
of them in the middle; when "idle" is the message thrown away, the grader waits for it until its
timeout and calls the kernel unresponsive.

`no_drop()`, run in the kernel before the first cell (autograder/execute.py), sets
XPUB_NODROP: a full queue then makes the kernel's IOPub thread wait, and the kernel's cell with
it, instead of dropping. What a slow grader costs is time, never output.
"""
from __future__ import annotations

import threading

__all__ = ["no_drop"]


def no_drop(timeout: float = 30.0) -> bool:
    """Make this kernel's IOPub socket wait instead of dropping messages; False outside a
    kernel (plain Python, a test). The option is set on the IOPub thread, the only thread that
    uses the socket (ZeroMQ sockets are not thread-safe)."""
    import zmq
    from IPython import get_ipython
    shell = get_ipython()
    thread = getattr(getattr(getattr(shell, "kernel", None), "iopub_socket", None),
                     "io_thread", None)
    if thread is None:
        return False
    done = threading.Event()

    def apply():
        thread.socket.setsockopt(zmq.XPUB_NODROP, 1)
        done.set()

    thread.schedule(apply)
    if not done.wait(timeout):
        raise RuntimeError(f"the kernel's IOPub thread did not set XPUB_NODROP in {timeout} s")
    return True

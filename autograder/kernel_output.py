"""`no_drop()`: the kernel's IOPub socket (a ZeroMQ XPUB) waits instead of dropping what it
cannot queue. Dropped, a cell that printed thousands of items on a busy machine lost a run of
them, and a lost "idle" made the kernel look unresponsive.
"""
from __future__ import annotations

import threading

__all__ = ["no_drop"]


def no_drop(timeout: float = 30.0) -> bool:
    """False outside a kernel. Set on the IOPub thread: ZeroMQ sockets are not thread-safe."""
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

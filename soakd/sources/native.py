"""Threads left inside a native call (OpenCV / FFmpeg) that soakd could not wait for.

A Python daemon thread that is still inside a C++ call when the interpreter shuts down
aborts the whole process when that call returns: CPython 3.11-3.13 ends such a thread with
``pthread_exit``, whose forced unwind through OpenCV's frames calls ``std::terminate``
("terminate called without an active exception", exit 134). Sources hand every thread they
had to abandon to ``track``; the CLI asks ``wait_native_threads`` before the process exits
and, only when one is still inside its native call, leaves with ``os._exit`` so the
documented exit code survives. This module imports nothing heavy (no cv2).
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_abandoned: list[threading.Thread] = []


def track(thread: threading.Thread) -> None:
    """Remember ``thread``: it is still running a native call its owner gave up on."""
    with _lock:
        _abandoned.append(thread)


def alive() -> list[threading.Thread]:
    """The tracked threads still running (finished ones are forgotten)."""
    with _lock:
        _abandoned[:] = [t for t in _abandoned if t.is_alive()]
        return list(_abandoned)


def wait_native_threads(timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for every tracked thread to leave its native call; True
    when none is left running (the interpreter can then shut down normally)."""
    deadline = time.monotonic() + timeout_s
    for thread in alive():
        thread.join(max(deadline - time.monotonic(), 0.0))
    return not alive()

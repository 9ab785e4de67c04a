"""SIGTERM and SIGINT as a request to stop, not a crash.

``install_signal_handlers(on_signal)`` replaces the handlers of SIGTERM and SIGINT with one
that records the signal and calls ``on_signal(signum)`` (typically: set the run's stop
event). The runner then stops capturing, finishes the frame in flight, flushes, records the
run as aborted with reason ``signal SIGTERM``, judges it (INVALID) and exits with code 3.

A second SIGINT/SIGTERM while stopping (an operator pressing Ctrl-C again) restores the
default disposition and re-delivers the signal, so the process ends at once; the database
stays consistent (WAL) and the next soakd command marks the run as crashed.

Handlers can only be installed from the main thread (a Python rule); ``restore()`` puts the
previous handlers back. Use as a context manager::

    with install_signal_handlers(lambda signum: stop.set()) as sig:
        result = run_soak(settings, stop=stop)
    if sig.received is not None: ...
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


def signal_name(signum: int) -> str:
    """``15`` -> ``"SIGTERM"`` (or ``"signal 99"`` for a number without a name)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def abort_reason(signum: int) -> str:
    """The ``runs.reason`` of a run stopped by a signal: ``"signal SIGTERM"``."""
    return f"signal {signal_name(signum)}"


class SignalHandlers:
    """Installed stop handlers; ``received`` is the first signal caught (or None)."""

    def __init__(
        self,
        on_signal: Callable[[int], None],
        signals: Iterable[int] = STOP_SIGNALS,
        *,
        force_on_second: bool = True,
        on_force: Callable[[int], None] | None = None,
    ) -> None:
        self._on_signal = on_signal
        self._on_force = on_force
        self._signals = tuple(signals)
        self._force = force_on_second
        self._previous: dict[int, Any] = {}
        self.received: int | None = None
        self.count = 0

    @property
    def reason(self) -> str | None:
        """``"signal SIGTERM"`` once a signal was caught, else None."""
        return None if self.received is None else abort_reason(self.received)

    def install(self) -> SignalHandlers:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        for s in self._signals:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.received is None:
            self.received = signum
            self._on_signal(signum)
            return
        if self._force:
            # second request: stop waiting for a clean shutdown (after on_force has left the
            # run's bookkeeping true: the run will never be closed by this process)
            if self._on_force is not None:
                try:
                    self._on_force(signum)
                finally:
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)
                return
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def restore(self) -> None:
        """Put back the handlers that were installed before (idempotent)."""
        while self._previous:
            s, prev = self._previous.popitem()
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)

    def __enter__(self) -> SignalHandlers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def install_signal_handlers(
    on_signal: Callable[[int], None],
    signals: Iterable[int] = STOP_SIGNALS,
    *,
    force_on_second: bool = True,
    on_force: Callable[[int], None] | None = None,
) -> SignalHandlers:
    """Route SIGTERM/SIGINT to ``on_signal(signum)``; a second one calls ``on_force(signum)``
    and then ends the process with that signal. Returns the handle (call ``restore()`` or use
    it as a context manager)."""
    return SignalHandlers(
        on_signal, signals, force_on_second=force_on_second, on_force=on_force
    ).install()

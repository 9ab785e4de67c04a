"""``serve(settings)``: one soak as the service runs it, callable from Python.

The CLI's ``soakd run`` and the systemd unit both end up here. On top of ``Run`` it adds
what a daemon needs: sd_notify (READY after the first frame, WATCHDOG while frames finish,
STATUS, STOPPING) when ``$NOTIFY_SOCKET`` is set and ``service.notify`` is on, the
Prometheus exporter when ``service.metrics_addr`` is set, and SIGTERM/SIGINT as a clean
abort (a second one forces the exit) when called from the main thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from soakd.config import Settings
from soakd.observers.base import Observer, RunResult
from soakd.observers.journal import JournalObserver
from soakd.observers.metrics import open_metrics
from soakd.observers.systemd import SystemdObserver
from soakd.run.runner import Run
from soakd.service.signals import abort_reason, install_signal_handlers


def service_observers(settings: Settings) -> list[Observer]:
    """sd_notify and Prometheus, as the settings and the environment ask. Raises
    ``SoakdError`` when the metrics address cannot be served (exit 2)."""
    obs: list[Observer] = []
    if settings.service.notify and os.environ.get("NOTIFY_SOCKET"):
        sd = SystemdObserver.from_env()
        if sd is not None:
            obs.append(sd)
    if settings.service.metrics_addr:
        obs.append(open_metrics(settings.service.metrics_addr))
    journal = JournalObserver.from_env()  # structured entries when the journal is there
    if journal is not None:
        obs.append(journal)
    return obs


def serve(
    settings: Settings,
    *,
    observers: Sequence[Observer] = (),
    stop: threading.Event | None = None,
) -> RunResult:
    """Run one soak with the service's observers and signal handling; return its result
    (``result.exit_code`` is the process exit code). ``UsageError`` (exit 2) for anything
    wrong before the run starts."""
    run = Run(settings, observers=[*observers, *service_observers(settings)], stop=stop)
    handlers = None
    if threading.current_thread() is threading.main_thread():
        handlers = install_signal_handlers(
            lambda signum: run.on_signal(signum, abort_reason(signum)),
            on_force=lambda signum: run.mark_forced(f"{abort_reason(signum)} (second)"),
        )
    try:
        return run.execute()
    finally:
        if handlers is not None:
            handlers.restore()

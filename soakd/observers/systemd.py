"""The run as systemd sees it: an ``Observer`` that speaks sd_notify.

* ``on_loading``  -> ``EXTEND_TIMEOUT_USEC=`` (+ ``STATUS=``): model loading may take longer
  than ``TimeoutStartSec``; each call pushes the start timeout back.
* ``on_ready``    -> ``READY=1`` once the model is loaded and the first frame has finished.
* ``on_progress`` -> ``STATUS=`` every snapshot (elapsed, fps, drops, frame age), and
  ``WATCHDOG=1`` in the same datagram only when ``progress.progressing`` is True: a frame
  finished since the previous snapshot. A hung model therefore starves the watchdog and
  systemd acts on it after ``WatchdogSec``, even if the runner's own stall detection failed.
* ``on_stopping`` -> ``STOPPING=1`` with the reason.
* ``on_run_end``  -> a final ``STATUS=`` with the outcome (shown by ``systemctl status``).

Nothing is sent when ``$NOTIFY_SOCKET`` is unset (see ``soakd.observers.notify``).
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from soakd.observers.base import Observer, Progress, RunInfo, RunResult
from soakd.observers.journal import verdict_word
from soakd.observers.notify import Notifier, watchdog_interval_s
from soakd.records import LOOK_EVENT, Event, standings, waiting_on

_log = structlog.get_logger("soakd.service.systemd")


def format_status(p: Progress, waiting: list[str] | None = None) -> str:
    """One ``systemctl status`` line: ``soaking 12.0/600s, 2.0 fps, 24 frames, drops 0, stale 0,
    errors 0, age p50 12.3 ms``; warm-up and stalls are called out, and a ``duration =
    "auto"`` run's last look (``waiting``: the criteria it still waits on)."""
    total = p.elapsed_s + p.remaining_s
    age = "n/a" if p.age_p50_ms is None else f"{p.age_p50_ms:.1f} ms"
    phase = "warming up" if p.warmup else "soaking"
    text = (
        f"{phase} {p.elapsed_s:.0f}/{total:.0f}s, {p.achieved_fps:.1f} fps, "
        f"{p.frames_done} frames, drops {p.drops}, stale {p.stale}, errors {p.errors}, "
        f"age p50 {age}"
    )
    if waiting is not None:
        text += f", waiting on {', '.join(waiting)}" if waiting else ", every criterion decided"
    if not p.progressing:
        text += f", NO FRAME FOR {p.stalled_s:.0f}s"
    return text


def watchdog_warning(watchdog_s: float | None, stall_timeout_s: float) -> str | None:
    """A warning when systemd's watchdog would fire before soakd's own stall detection, which
    is the one that records the stall and a verdict."""
    if watchdog_s is None or watchdog_s > stall_timeout_s:
        return None
    return (
        f"WatchdogSec ({watchdog_s:g} s) is not above run.stall_timeout_s "
        f"({stall_timeout_s:g} s): systemd will kill a hung run before soakd records the stall"
    )


class SystemdObserver(Observer):
    """Feeds systemd's readiness, status and watchdog from the runner's hooks."""

    def __init__(self, notifier: Notifier | None = None) -> None:
        self.notifier = notifier if notifier is not None else Notifier.from_env()
        self.watchdog_s = watchdog_interval_s()
        self._run_id: str | None = None
        self._waiting: list[str] | None = None  # a duration = "auto" run's, at its last look

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SystemdObserver | None:
        """An observer when ``$NOTIFY_SOCKET`` is set, else None (nothing to talk to)."""
        notifier = Notifier.from_env(env)
        if not notifier.enabled:
            return None
        obs = cls(notifier)
        obs.watchdog_s = watchdog_interval_s(env)
        return obs

    def on_run_start(self, info: RunInfo) -> None:
        self._run_id = info.run_id
        self.notifier.status(f"starting run {info.run_id}")
        warning = watchdog_warning(self.watchdog_s, info.settings.run.stall_timeout_s)
        if warning:
            _log.warning(warning)

    def on_loading(self, message: str, extend_s: float) -> None:
        self.notifier.extend_timeout(extend_s, status=f"loading: {message}")

    def on_ready(self) -> None:
        self.notifier.ready(status=f"running {self._run_id or ''}".rstrip())

    def on_progress(self, progress: Progress) -> None:
        status = f"STATUS={format_status(progress, self._waiting)}"
        if progress.progressing:
            self.notifier.send("WATCHDOG=1", status)
        else:
            self.notifier.send(status)

    def on_event(self, event: Event) -> None:
        if event.kind == LOOK_EVENT:
            self._waiting = waiting_on(standings(event.data))
        elif event.kind in ("stall", "oom"):
            self.notifier.status(f"{event.kind}: {event.message}")

    def on_stopping(self, reason: str) -> None:
        self.notifier.stopping(status=f"stopping: {reason}")

    def on_run_end(self, result: RunResult) -> None:
        verdict = verdict_word(result.verdict)
        text = f"run {result.run_id} {result.status}"
        if result.reason:
            text += f" ({result.reason})"
        if verdict:
            text += f", verdict {verdict}"
        if result.exit_code is not None:
            text += f", exit {result.exit_code}"
        self.notifier.status(text)

    def close(self) -> None:
        self.notifier.close()

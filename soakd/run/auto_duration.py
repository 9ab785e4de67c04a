"""``run.duration = "auto"``: end the run as soon as every criterion is decided.

After ``criteria.min_duration_s`` and then every ``max(LOOK_MIN_S, LOOK_SHARE x elapsed)``,
an observer judges what the run has stored so far (``soakd gate RUN_ID -f json`` in a
process of its own, waited on by a thread of its own: the judgement's memory never lands in
this process's RSS, which the memory criteria judge, and the monitor's once-a-second
snapshot is never held up) and stops the run, completed, when every criterion but the run's
own validity is PASS or n/a. A trend counts as PASS on such a run only when it was tested
and its smallest detectable slope is at or under its tolerance
(``criteria.base.undecided_trend``): the run could have seen growth at the tolerance and did
not. A FAIL at a look is not decided (it may still pass at full length); a criterion that
can no longer pass stops the run through ``run.stop_on_fail``, which ``duration = "auto"``
turns on. The run stores a ``decided`` event with when and each trend's detectable slope,
and the verdict says "decided after ...". A run that reaches ``run.max_duration`` undecided
keeps its undecided trends INVALID: never PASS.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from soakd.analysis.criteria.base import DECIDED_EVENT, undecided
from soakd.config import CriteriaSettings, Settings
from soakd.observers.base import Observer, Progress, RunInfo
from soakd.records import Event

log = structlog.get_logger("soakd.run.auto_duration")

#: looks at least this many seconds apart, and at least this share of the time so far (a
#: long run is judged about 20 times in all, each look reading everything stored)
LOOK_MIN_S = 10.0
LOOK_SHARE = 0.05
#: a look that takes longer than this is abandoned (retried at the next)
LOOK_TIMEOUT_S = 120.0


class AutoDuration(Observer):
    """Judges the stored run from ``min_s`` on and, once every criterion is decided, stores
    a ``decided`` event (``event``) and ends the run as completed (``stop()``)."""

    def __init__(
        self,
        crit: CriteriaSettings,
        *,
        event: Callable[[Event], None],
        stop: Callable[[], None],
    ) -> None:
        self.crit, self._event, self._stop = crit, event, stop
        self._run: tuple[str, Path] | None = None
        self._next = float(crit.min_duration_s)
        self._thread: threading.Thread | None = None
        self.waiting: list[str] = []  # what the last look was still waiting on
        self.decided_at: float | None = None

    def on_run_start(self, info: RunInfo) -> None:
        self._run = (info.run_id, info.db_path)

    def on_progress(self, progress: Progress) -> None:
        busy = self._thread is not None and self._thread.is_alive()
        if self.decided_at is not None or progress.warmup or busy or self._run is None:
            return
        if progress.elapsed_s < self._next:
            return
        self._next = progress.elapsed_s + max(LOOK_MIN_S, LOOK_SHARE * progress.elapsed_s)
        self._thread = threading.Thread(
            target=self._look, args=(progress.elapsed_s,), name="soakd-auto-duration", daemon=True
        )
        self._thread.start()

    def _look(self, elapsed: float) -> None:
        assert self._run is not None
        run_id, db = self._run
        try:
            doc = judge_stored(run_id, db)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            log.warning("auto duration: the run could not be judged yet", error=str(exc))
            return  # retried at the next look
        criteria = doc.get("criteria") or []
        self.waiting = undecided((c.get("criterion", ""), c.get("status", "")) for c in criteria)
        if self.waiting or not criteria:
            return
        self.decided_at = elapsed
        detect = {
            c["criterion"]: {
                "slope": (c.get("evidence") or {}).get("min_detectable_slope"),
                "unit": c.get("unit"),
            }
            for c in criteria
            if "decided_by" in (c.get("evidence") or {})
        }
        data: dict[str, Any] = {"after_s": elapsed, "detectable": detect}
        msg = f"every criterion decided after {elapsed:.0f} s"
        self._event(Event(DECIDED_EVENT, elapsed, time.time(), msg, data=data))
        self._stop()

    def on_stopping(self, reason: str) -> None:
        """A look in flight finishes (or is left, after 30 s) before the run closes its
        store."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30.0)


def judge_stored(run_id: str, db: Path) -> dict[str, Any]:
    """The stored run judged so far: ``soakd gate RUN_ID -f json`` in a process of its own,
    so that loading and judging the run never adds to this process's RSS (the memory
    criteria judge it) nor holds the GIL from the pacer."""
    cmd = [sys.executable, "-m", "soakd", "gate", run_id, "--db", str(db), "-f", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LOOK_TIMEOUT_S)
    if proc.returncode not in (0, 1, 3):  # PASS, FAIL, INVALID: judged
        raise ValueError(f"soakd gate exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    doc = json.loads(proc.stdout)
    if not isinstance(doc, dict):
        raise ValueError("soakd gate -f json printed no object")
    return doc


def watch_auto_duration(
    settings: Settings, event: Callable[[Event], None], stop: Callable[[], Any]
) -> list[Observer]:
    """An AutoDuration for a ``run.duration = "auto"`` run; none otherwise."""
    if not settings.run.auto_duration:
        return []
    return [AutoDuration(settings.criteria, event=event, stop=stop)]

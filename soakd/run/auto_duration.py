"""``run.duration = "auto"``: end the run as soon as every criterion is decided.

After ``criteria.min_duration_s`` and then every ``max(LOOK_MIN_S, LOOK_SHARE x elapsed)``,
an observer judges what the run has stored so far (``python -m soakd.run.auto_duration
RUN_ID DB`` in a process of its own, which prints one short line, waited on by one thread
started with the run: the judgement's memory never lands in this process's RSS, which the
memory criteria judge, and the monitor's once-a-second snapshot is never held up) and stops
the run, completed, when every criterion but the run's own validity is PASS or n/a. A trend
counts as PASS on such a run only when it was tested and its smallest detectable slope is at
or under its tolerance (``criteria.base.undecided_trend``): the run could have seen growth
at the tolerance and did not. A FAIL at a look is not decided (it may still pass at full
length); a criterion that can no longer pass stops the run through ``run.stop_on_fail``,
which ``duration = "auto"`` turns on. The run stores a ``decided`` event with when and each
trend's detectable slope, and the verdict says "decided after ...". A run that reaches
``run.max_duration`` undecided keeps its undecided trends INVALID: never PASS.
"""

from __future__ import annotations

import json
import math
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from soakd.analysis.criteria.base import DECIDED_EVENT, finite, undecided
from soakd.analysis.model import FAIL, NA, PASS
from soakd.config import CriteriaSettings, Settings
from soakd.observers.base import Observer, Progress, RunInfo
from soakd.records import DECIDED, FAILING, LOOK_EVENT, UNDECIDED, Event, Standing

log = structlog.get_logger("soakd.run.auto_duration")

#: looks at least this many seconds apart, and at least this share of the time so far (a
#: long run is judged about 20 times in all, each look reading everything stored)
LOOK_MIN_S = 10.0
LOOK_SHARE = 0.05
#: a look that takes longer than this is abandoned (retried at the next)
LOOK_TIMEOUT_S = 120.0


class AutoDuration(Observer):
    """Judges the stored run from ``criteria.min_duration_s`` on and, once every criterion
    is decided, stores a ``decided`` event (``event``) and ends the run as completed
    (``stop()``). One worker thread, started with the run, does every look: what it
    allocates is allocated in the warm-up, not as a step in the measured RSS."""

    decides = 'run.duration = "auto"'

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
        self._looks: queue.Queue[float | None] = queue.Queue(maxsize=1)
        self._worker = threading.Thread(target=self._work, name="soakd-auto-duration", daemon=True)
        self.waiting: list[str] = []  # what the last look was still waiting on
        self.decided_at: float | None = None

    def on_run_start(self, info: RunInfo) -> None:
        self._run = (info.run_id, info.db_path)
        self._worker.start()

    def on_progress(self, progress: Progress) -> None:
        if self.decided_at is not None or progress.warmup or self._run is None:
            return
        if progress.elapsed_s < self._next:
            return
        try:
            self._looks.put_nowait(progress.elapsed_s)
        except queue.Full:  # the last look is still going
            return
        self._next = progress.elapsed_s + max(LOOK_MIN_S, LOOK_SHARE * progress.elapsed_s)

    def _work(self) -> None:
        while (elapsed := self._looks.get()) is not None:
            self._look(elapsed)

    def _look(self, elapsed: float) -> None:
        assert self._run is not None
        try:
            rows = judge_stored(*self._run)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            log.warning("auto duration: the run could not be judged yet", error=str(exc))
            return  # retried at the next look
        self.waiting = undecided((name, status) for name, status, *_ in rows)
        detect = {n: {"slope": m, "unit": u} for n, _s, m, u, *_ in rows if m is not None}
        self._event(look_event(elapsed, rows, self.waiting))
        if self.waiting or not rows:
            return
        self.decided_at = elapsed
        data: dict[str, Any] = {"after_s": elapsed, "detectable": detect}
        msg = f"every criterion decided after {elapsed:.0f} s"
        self._event(Event(DECIDED_EVENT, elapsed, time.time(), msg, data=data))
        self._stop()

    def on_stopping(self, reason: str) -> None:
        """The worker ends (a look in flight finishes, or is left after 30 s) before the
        run closes its store."""
        try:
            self._looks.put(None, timeout=30.0)
        except queue.Full:
            return
        if self._worker.is_alive() and self._worker is not threading.current_thread():
            self._worker.join(timeout=30.0)


#: a criterion judged at a look: (name, status, smallest detectable slope of a trend, unit,
#: threshold, why it is not PASS in a few words)
Row = tuple[str, str, float | None, str | None, float | None, str]


def look_event(elapsed: float, rows: list[Row], waiting: list[str]) -> Event:
    """The ``look`` event of a look at ``elapsed`` s: every criterion's standing (but the
    run's own validity and the n/a ones), the message naming what the run still waits on."""
    state = {PASS: DECIDED, NA: DECIDED, FAIL: FAILING}
    stand = [
        Standing(n, state.get(s, UNDECIDED), m, t, u, why).as_row()
        for n, s, m, u, t, why in rows
        if n != "run" and s != NA
    ]
    msg = f"waiting on {', '.join(waiting)}" if waiting else "every criterion decided"
    return Event(LOOK_EVENT, elapsed, time.time(), msg, data={"criteria": stand})


def judge_stored(run_id: str, db: Path) -> list[Row]:
    """The stored run judged so far, in a process of its own (``python -m
    soakd.run.auto_duration RUN_ID DB``): loading and judging the run never adds to this
    process's RSS (the memory criteria judge it) nor holds the GIL from the pacer, and
    what comes back is one short line: each criterion's ``Row``."""
    cmd = [sys.executable, "-m", "soakd.run.auto_duration", run_id, str(db)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LOOK_TIMEOUT_S)
    if proc.returncode != 0:
        raise ValueError(f"the judging process exited {proc.returncode}: {proc.stderr[-300:]}")
    rows = json.loads(proc.stdout)
    return [(str(n), str(s), finite(m), u, finite(t), str(w)) for n, s, m, u, t, w in rows]


def _judge_here(run_id: str, db: str) -> list[list[Any]]:
    """What ``judge_stored`` asks of its child: the run judged by its own criteria."""
    from soakd.analysis import evaluate
    from soakd.store.db import connect

    conn = connect(db, readonly=True)
    try:
        _data, verdict = evaluate(conn, run_id)
    finally:
        conn.close()
    rows = []
    for c in verdict.criteria:
        mds = c.evidence.get("min_detectable_slope") if "decided_by" in c.evidence else None
        seen = float(mds) if mds is not None and math.isfinite(float(mds)) else None
        why = "" if c.status in (PASS, NA) else c.detail.split(":")[0].split(";")[0][:48]
        rows.append([c.criterion, c.status, seen, c.unit, finite(c.threshold), why])
    return rows


def watch_auto_duration(
    settings: Settings, event: Callable[[Event], None], stop: Callable[[], Any]
) -> list[Observer]:
    """An AutoDuration for a ``run.duration = "auto"`` run; none otherwise."""
    if not settings.run.auto_duration:
        return []
    return [AutoDuration(settings.criteria, event=event, stop=stop)]


if __name__ == "__main__":
    print(json.dumps(_judge_here(sys.argv[1], sys.argv[2])))

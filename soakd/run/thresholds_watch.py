"""``abort_on_fail`` thresholds, watched live: an observer that ends the run early once an
``abort_on_fail`` threshold can no longer pass (k6's ``abortOnFail``).

It keeps the post-warm-up values of the columns those thresholds name (frames from
``on_frame``, telemetry from ``on_sample``) and judges them once a second, on the progress
snapshot, with the verdict's own functions (``analysis/thresholds.py``): a max or count
already over its limit (or a min under it) fails exactly; a percentile, average or rate
fails on the data so far once ``max(criteria.min_frames, ABORT_MIN_VALUES)`` values are in.
Then it stores a ``threshold_abort`` event and asks the run to stop with the reason
``threshold p95(total_ms) < 80 failed: ... (abort_on_fail)``; the verdict is FAIL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from soakd.analysis.thresholds import (
    ABORT_EVENT,
    ABORT_MIN_VALUES,
    abort_reason,
    can_no_longer_pass,
    rate,
    statistic,
)
from soakd.config import Settings, Threshold
from soakd.observers.base import Observer, Progress
from soakd.records import Event, FrameRecord, Sample


class ThresholdWatch(Observer):
    """Watches ``thresholds`` (the abort_on_fail ones); ``event`` stores an event,
    ``stop(reason)`` ends the run."""

    def __init__(
        self,
        thresholds: list[Threshold],
        *,
        warmup_s: float,
        min_values: int,
        event: Callable[[Event], None],
        stop: Callable[[str], None],
    ) -> None:
        self.thresholds, self.warmup_s, self.min_values = thresholds, warmup_s, min_values
        self._event, self._stop = event, stop
        self.values: dict[str, list[float]] = {t.column: [] for t in thresholds}
        self.rows = self.errors = 0
        self.base = {"drops": 0, "stale": 0}  # cumulative counters at the end of the warm-up
        self.last = {"drops": 0, "stale": 0}
        self.fired = False

    def on_frame(self, rec: FrameRecord) -> None:
        if rec.warmup:
            self.base = {"drops": rec.drop_count, "stale": rec.stale_count}
            return
        self.rows += 1
        self.errors += rec.error is not None
        self.last = {"drops": rec.drop_count, "stale": rec.stale_count}
        if rec.skipped:
            return
        for th in self.thresholds:
            if th.source == "frames":
                v = getattr(rec, th.column, None)
                if v is not None:
                    self.values[th.column].append(float(v))

    def on_sample(self, sample: Sample) -> None:
        if sample.t < self.warmup_s:
            return
        for th in self.thresholds:
            if th.source == "samples":
                v = sample.values.get(th.column)
                if v is not None:
                    self.values[th.column].append(float(v))

    def _value(self, th: Threshold) -> tuple[float | None, float]:
        """The threshold's statistic on the data so far, and how many values it is over."""
        if th.source != "rate":
            vals = np.asarray(list(self.values[th.column]), dtype=np.float64)
            return statistic(th, vals), float(vals.size)
        drops = max(self.last["drops"] - self.base["drops"], 0)
        stale = max(self.last["stale"] - self.base["stale"], 0)
        captured = float(self.rows + drops)
        lost = {"drops": drops, "stale": stale, "errors": self.errors}[th.column]
        return rate(float(lost), captured), captured

    def on_progress(self, progress: Progress) -> None:
        if self.fired or progress.warmup:
            return
        for th in self.thresholds:
            value, n = self._value(th)
            if value is not None and can_no_longer_pass(th, value, n, self.min_values):
                self.fired = True
                reason = abort_reason(th, value)
                self._event(Event(ABORT_EVENT, progress.elapsed_s, time.time(), reason))
                self._stop(reason)
                return


def watch_thresholds(
    settings: Settings, event: Callable[[Event], None], stop: Callable[[str], Any]
) -> list[Observer]:
    """A ThresholdWatch for the run's abort_on_fail thresholds; none when there are none."""
    crit = settings.criteria
    watched = [t.parsed() for t in crit.thresholds if t.abort_on_fail]
    if not watched:
        return []
    return [
        ThresholdWatch(
            watched,
            warmup_s=settings.run.warmup_s,
            min_values=max(crit.min_frames, ABORT_MIN_VALUES),
            event=event,
            stop=stop,
        )
    ]

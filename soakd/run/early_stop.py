"""Ending a run as soon as a criterion can no longer pass: an observer over the running
half of the criteria's protocol (``early_fail(live, crit)`` in soakd/analysis/criteria).

It keeps what the criteria ask of a running run (``criteria.base.Live``: errors, drops and
stale frames, OOMs and the telemetry since the end of the warm-up; the values of the
``abort_on_fail`` thresholds' columns) and asks the criteria once a second, on the progress
snapshot. The built-in criteria are asked with ``run.stop_on_fail`` (default false for
``soakd run``, true under ``plan run``): errors past ``max_errors``, an OOM, losses past
``max_drop_fraction`` of every tick the planned run can have, a memory floor or the frame
age (its window medians, ``Live.add_age``) rising significantly at the alpha an
O'Brien–Fleming spending function gives this look. The
``abort_on_fail`` thresholds are asked always. The first that fails stores an
``early_stop`` event naming the criterion and ends the run; the verdict then confirms that
criterion FAILs on everything stored (FAIL) or, if it does not, judges the cut-short run
INVALID, never PASS.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from soakd.analysis import stats
from soakd.analysis.criteria.base import EARLY_STOP_EVENT, EarlyFail, Live
from soakd.analysis.model import GENERATOR_SHAPES, MEMORY_METRICS
from soakd.analysis.verdict import CRITERIA
from soakd.config import CriteriaSettings, Settings
from soakd.observers.base import Observer, Progress, RunInfo
from soakd.records import Event, FrameRecord, Sample

#: the telemetry columns the running criteria read
_SAMPLE_COLUMNS = tuple(col for _, col, _ in MEMORY_METRICS)


class EarlyStop(Observer):
    """Asks ``criteria`` (modules with ``early_fail``) once a second; ``event`` stores an
    event, ``stop(reason)`` ends the run."""

    def __init__(
        self,
        live: Live,
        crit: CriteriaSettings,
        criteria: Sequence[ModuleType],
        *,
        event: Callable[[Event], None],
        stop: Callable[[str], None],
    ) -> None:
        self.live, self.crit, self.criteria = live, crit, list(criteria)
        self._event, self._stop = event, stop
        watched = [t.parsed() for t in crit.thresholds if t.abort_on_fail]
        self._frame_columns = {th.column for th in watched if th.source == "frames"}
        self._sample_columns = {th.column for th in watched if th.source == "samples"}
        self._base: dict[int, tuple[int, int]] = {}  # stream -> (drops, stale) at t0
        self._last: dict[int, tuple[int, int]] = {}
        self._ooms_at: float | None = None  # the torch OOM counter's first reading
        self.fired: EarlyFail | None = None

    def on_run_start(self, info: RunInfo) -> None:
        self.live.generates = info.shape in GENERATOR_SHAPES

    def on_event(self, event: Event) -> None:
        if event.kind == "warmup_end" and self.live.t0 is None:
            self.live.t0 = event.t
        elif event.kind == "oom":
            self.live.ooms += 1

    def on_frame(self, rec: FrameRecord) -> None:
        live, counts = self.live, (rec.drop_count, rec.stale_count)
        if rec.warmup or live.t0 is None or rec.t_capture < live.t0:
            self._base[rec.stream] = counts
            return
        self._last[rec.stream] = counts
        live.rows += 1
        live.errors += rec.error is not None
        if not rec.skipped and rec.frame_age_ms is not None and rec.t_dispatch is not None:
            live.add_age(rec.t_dispatch, rec.frame_age_ms)
        if not rec.skipped:
            for col in self._frame_columns:
                v = getattr(rec, col, None)
                if v is not None:
                    _series(live.values, col).append(float(v))

    def on_sample(self, sample: Sample) -> None:
        self._torch_ooms(sample.values.get("torch_ooms"))
        live = self.live
        if live.t0 is None or sample.t < live.t0:
            return
        _series(live.samples, "t").append(sample.t)
        for col in _SAMPLE_COLUMNS:
            v = sample.values.get(col)
            _series(live.samples, col).append(math.nan if v is None else float(v))
        for col in self._sample_columns:
            v = sample.values.get(col)
            if v is not None:
                _series(live.values, col).append(float(v))

    def _count_losses(self) -> None:
        """Dropped and stale since t0, every stream's running counters less their value at
        the end of the warm-up (counted at the look, not at every frame)."""
        base = self._base
        self.live.dropped = sum(d - base.get(s, (0, 0))[0] for s, (d, _) in self._last.items())
        self.live.stale = sum(x - base.get(s, (0, 0))[1] for s, (_, x) in self._last.items())

    def _torch_ooms(self, v: Any) -> None:
        if v is None:
            return
        if self._ooms_at is None:
            self._ooms_at = float(v)
        elif float(v) > self._ooms_at:
            self.live.ooms = max(self.live.ooms, int(float(v) - self._ooms_at))

    def on_progress(self, progress: Progress) -> None:
        if self.fired or progress.warmup or self.live.t0 is None:
            return
        self.live.now = progress.elapsed_s
        self._count_losses()
        for module in self.criteria:
            found = module.early_fail(self.live, self.crit)
            if found is not None:
                self.fired = found
                reason = (
                    found.reason
                    if found.by == "abort_on_fail"
                    else f"{found.criterion}: {found.reason} (run.stop_on_fail)"
                )
                data = {"criterion": found.criterion, "t": progress.elapsed_s}
                self._event(
                    Event(EARLY_STOP_EVENT, progress.elapsed_s, time.time(), reason, data=data)
                )
                self._stop(reason)
                return


def _series(table: dict[str, Any], key: str) -> array[float]:
    """``table[key]``, a new array of doubles when there is none."""
    got = table.get(key)
    if got is None:
        got = table[key] = array("d")
    return got  # type: ignore[no-any-return]


def _warm_up_the_looks() -> None:
    """One trend test and one spending-function value on made-up data: every module and
    cache a memory look uses is loaded before the run measures anything."""
    x = np.arange(32, dtype=np.float64)
    stats.trend(x, x + np.sin(x), 0.01)
    stats.look_alpha(0.01, 0.5, 0.25)


def early_criteria(stop_on_fail: bool) -> list[ModuleType]:
    """The criteria modules a run asks while it goes: every one with ``early_fail`` under
    ``run.stop_on_fail``, else the thresholds alone (their ``abort_on_fail`` items)."""
    return [
        m
        for m in CRITERIA
        if hasattr(m, "early_fail") and (stop_on_fail or m.__name__.endswith(".thresholds"))
    ]


def watch_early_stop(
    settings: Settings, event: Callable[[Event], None], stop: Callable[[str], Any]
) -> list[Observer]:
    """An EarlyStop over the criteria that can end this run: the built-in ones with
    ``run.stop_on_fail``, the thresholds when one is ``abort_on_fail``; none otherwise."""
    crit, run = settings.criteria, settings.run
    asked = early_criteria(run.stop_on_fail)
    if not run.stop_on_fail and not any(t.abort_on_fail for t in crit.thresholds):
        return []
    # the memory looks test trends with scipy: imported and run once now, before the
    # warm-up, so what it loads (~60 MB, some of it on first use) lands there and not in
    # the measured RSS as a step mid-run
    _warm_up_the_looks()
    live = Live(planned_s=float(run.duration), fps=float(run.fps), streams=run.streams)
    return [EarlyStop(live, crit, asked, event=event, stop=stop)]

"""Ending a run as soon as a criterion can no longer pass: an observer over the running
half of the criteria's protocol (``early_fail(live, crit)`` in soakd/analysis/criteria).

It keeps what the criteria ask of a running run (``criteria.base.Live``: errors, drops and
stale frames, OOMs, the stage times and the telemetry since the end of the warm-up; the
values of the ``abort_on_fail`` thresholds' columns) and asks the criteria once a second,
on the progress snapshot. The built-in criteria are asked with ``run.stop_on_fail`` (default
false for ``soakd run``, true under ``plan run``): errors past ``max_errors``, an OOM,
losses past ``max_drop_fraction`` of every tick the planned run can have, a memory floor,
the frame age (its window medians, ``Live.add_age``) or a stage time rising significantly
at the alpha a Pocock-type spending function gives this look (``criteria.base.look_alpha``),
jitter past its allowance. Those the host can fail (jitter, drops, frame age, stage trend,
the server's queue) stop nothing once a tick since the warm-up saw the host contended
(``contention.withholds_looks`` on ``Live.contended_ticks``): the verdict sets those frames
aside, a look cannot; and a frame is counted only once the tick at or after its end has
come (``EarlyStop.on_frame``), so no look counts a frame whose host it has not seen. The
``abort_on_fail`` thresholds are asked always. The first that fails stores an
``early_stop`` event naming the criterion and ends the run; the verdict then confirms that
criterion FAILs on everything stored (FAIL) or, if it does not, judges the cut-short run
INVALID, never PASS.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from soakd.analysis import contention
from soakd.analysis.criteria.base import (
    EARLY_STOP_EVENT,
    STAGE_FRAME_COLUMNS,
    EarlyFail,
    Live,
    LiveHistogram,
    LiveTable,
    LiveValues,
)
from soakd.analysis.model import GENERATOR_SHAPES, MEMORY_METRICS
from soakd.analysis.server import SERVER_MEMORY_METRICS
from soakd.analysis.verdict import CRITERIA
from soakd.config import SERVER_KV_METRICS, SERVER_WAITING_METRICS, CriteriaSettings, Settings
from soakd.observers.base import Observer, Progress, RunInfo
from soakd.records import STAGE_COLUMNS, Event, FrameRecord, Sample, ServerMetric

#: the telemetry columns the running criteria read: soakd's memory and a served model's
_SAMPLE_COLUMNS = tuple(col for _, col, _ in (*MEMORY_METRICS, *SERVER_MEMORY_METRICS))
#: what tells other processes' share of the host's CPUs (soakd.analysis.contention)
_HOST_COLUMNS = ("host_cpu_pct", "cpu_pct", "server_cpu_pct")
#: the stage times jitter judges (infer, or a session's output latency when untimed)
_JITTER_COLUMNS = ("infer_ms", "output_latency_ms")
#: rows of the live stage times (``Live.frames``, 6 columns: 96 KB): 3.4 minutes at 10 fps
#: frame by frame, every other frame past that (then every 4th...); a look judges at most
#: LOOK_MAX_WINDOWS windows of them
LIVE_FRAME_ROWS = 2048
#: frames held for a telemetry tick at most (``EarlyStop.on_frame``): past that the oldest
#: are counted without one (a sampler that stopped ticking must not grow soakd's memory)
HELD_MAX = 4096
#: a served model's queue metrics (summed over their label sets at each tick)
_SERVER_COLUMNS = (*SERVER_WAITING_METRICS, *SERVER_KV_METRICS)


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
        # frames that ended after the latest telemetry tick (``_tick``): held until a tick
        # covers them, so a look counts no frame whose host it has not seen (the sampler and
        # the frames' sink call in from their own threads)
        self._tick: float | None = None
        self._held: deque[FrameRecord] = deque()
        self._lock = threading.Lock()
        self.fired: EarlyFail | None = None
        #: what losing this observer switches off (``Observer.decides``)
        self.decides = (
            "run.stop_on_fail"
            if any(not m.__name__.endswith(".thresholds") for m in self.criteria)
            else "the abort_on_fail thresholds"
        )

    def on_run_start(self, info: RunInfo) -> None:
        self.live.generates = info.shape in GENERATOR_SHAPES

    def on_event(self, event: Event) -> None:
        if event.kind == "warmup_end" and self.live.t0 is None:
            self.live.t0 = event.t
        elif event.kind == "oom":
            self.live.ooms += 1
        elif event.kind in ("server_replaced", "server_lost"):
            self.live.server_changes.append(event.t)

    def on_frame(self, rec: FrameRecord) -> None:
        """A frame, counted once a telemetry tick at or after its end has come (``_held``
        until then): a look never counts a frame whose host it has not seen."""
        with self._lock:
            if self._tick is not None and (self._held or _end(rec) > self._tick):
                self._held.append(rec)
                if len(self._held) > HELD_MAX:  # no tick for long: the sampler is gone
                    self._take(self._held.popleft())
            else:
                self._take(rec)

    def _release(self, t: float) -> None:
        """The held frames that ended by the tick at ``t``, counted (in their order)."""
        with self._lock:
            self._tick = t
            held = self._held
            while held and _end(held[0]) <= t:
                self._take(held.popleft())

    def _take(self, rec: FrameRecord) -> None:
        live, counts = self.live, (rec.drop_count, rec.stale_count)
        if rec.warmup or live.t0 is None or rec.t_capture < live.t0:
            self._base[rec.stream] = counts
            return
        self._last[rec.stream] = counts
        live.rows += 1
        live.errors += rec.error is not None
        if not rec.skipped and rec.frame_age_ms is not None and rec.t_dispatch is not None:
            live.add_age(rec.t_dispatch, rec.frame_age_ms)
        if live.frames is not None and not rec.skipped and rec.t_dispatch is not None:
            live.frames.append([rec.t_dispatch, *(_num(getattr(rec, c)) for c in STAGE_COLUMNS)])
        if not rec.skipped and rec.error is None:
            for col, hist in live.stage_ms.items():
                v = getattr(rec, col)
                if v is not None:
                    hist.add(v)
        if not rec.skipped:
            for col in self._frame_columns:
                v = getattr(rec, col, None)
                if v is not None:
                    _series(live.values, col).append(float(v))

    def on_sample(self, sample: Sample) -> None:
        self._torch_ooms(sample.values.get("torch_ooms"))
        live = self.live
        if live.t0 is not None and sample.t >= live.t0:
            self._host(sample.values)
        self._release(sample.t)  # after its host is counted: the frames it covers
        if live.t0 is None or sample.t < live.t0:
            return
        if live.samples is not None:
            values = sample.values
            live.samples.append([sample.t, *(_num(values.get(c)) for c in _SAMPLE_COLUMNS)])
        if live.server is not None and sample.server:
            live.server.append([sample.t, *_summed(sample.server)])
        for col in self._sample_columns:
            v = sample.values.get(col)
            if v is not None:
                _series(live.values, col).append(float(v))

    def _host(self, values: dict[str, Any]) -> None:
        """Count a tick that sampled the host, and whether it was contended (other
        processes held ``contended_cpu_pct`` of its CPUs: soakd.analysis.contention)."""
        host, own, server = (_num(values.get(c)) for c in _HOST_COLUMNS)
        others = float(contention.others_pct(host, own, server, self.live.cpus))
        if math.isfinite(others):
            self.live.host_ticks += 1
            self.live.contended_ticks += bool(
                contention.contended(others, self.crit.contended_cpu_pct)
            )

    def _count_losses(self) -> None:
        """Dropped and stale since t0, every stream's running counters less their value at
        the end of the warm-up (counted at the look, not at every frame; under the lock the
        frames are counted under, from the sink's and the sampler's threads)."""
        with self._lock:
            base, last = self._base, list(self._last.items())
            self.live.dropped = sum(d - base.get(s, (0, 0))[0] for s, (d, _) in last)
            self.live.stale = sum(x - base.get(s, (0, 0))[1] for s, (_, x) in last)

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


def _series(table: dict[str, LiveValues], key: str) -> LiveValues:
    """``table[key]``, a new column when there is none."""
    got = table.get(key)
    if got is None:
        got = table[key] = LiveValues()
    return got


def _end(rec: FrameRecord) -> float:
    """When a frame's work ended (seconds since the run's start): done, else dispatched,
    else captured (a stale frame)."""
    for t in (rec.t_done, rec.t_dispatch):
        if t is not None:
            return t
    return rec.t_capture


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def _summed(metrics: Sequence[ServerMetric]) -> list[float]:
    """Each queue metric's value at this tick, summed over its label sets (NaN if none),
    as ``store.server_metrics.load_server_metrics`` sums them for the verdict."""
    got = dict.fromkeys(_SERVER_COLUMNS, math.nan)
    for m in metrics:
        if m.name in got and math.isfinite(m.value):
            prev = got[m.name]
            got[m.name] = m.value if math.isnan(prev) else prev + m.value
    return list(got.values())


#: numpy's cache of freed small array buffers (numpy/_core/src/multiarray/alloc.c): up to 7
#: of each byte size under 1 KiB (3.7 MB full), and up to 15 shape-and-strides blocks of
#: each of 16 sizes; a buffer freed there is no longer tracemalloc's, and stays libc's
NUMPY_DATA_CACHE, NUMPY_DIM_CACHE = (1024, 7), (16, 15)


def _fill_numpy_cache() -> None:
    """Fill numpy's small-buffer cache (``NUMPY_DATA_CACHE``) now. The looks' arrays come
    in ever new small sizes (their windows, masks and test statistics), and each new size
    left its freed buffers cached for good: the cache filled for many minutes, 0.03 MB/min
    of soakd's own RSS that memory_rss judged as the model's growth (issue 31). Full, it
    can no longer grow; its 3.7 MB land before the warm-up, with the rehearsal's."""
    sizes, depth = NUMPY_DATA_CACHE
    held: list[np.ndarray] = [
        np.empty(n, dtype=np.uint8) for n in range(1, sizes) for _ in range(depth)
    ]
    dims, dim_depth = NUMPY_DIM_CACHE  # a block of 2 x ndim intp: ndim under dims / 2
    held += [np.empty((1,) * d) for d in range(1, dims // 2) for _ in range(dim_depth)]
    del held


def _rehearse(crit: CriteriaSettings, criteria: Sequence[ModuleType]) -> None:
    """Every look the run will make, made a few times now on a made-up minute (rising
    memory and server metrics, frames), through a throwaway EarlyStop's live series:
    every module, cache and first-use allocation a look needs (scipy's tests and
    distributions, the criteria's models) lands before the warm-up ends, not as a step in
    the RSS the memory criteria judge."""
    live = Live(planned_s=120.0, fps=10.0, streams=1)
    live.samples = LiveTable(("t", *_SAMPLE_COLUMNS), rows=1024)
    live.server = LiveTable(("t", *_SERVER_COLUMNS), rows=1024, floor=False)
    live.stage_ms = {col: LiveHistogram() for col in _JITTER_COLUMNS}
    # the stage times' table as large as the run's, and filled past it (40 frames a second):
    # a stage look's largest copies are made now
    live.frames = LiveTable(STAGE_FRAME_COLUMNS, rows=LIVE_FRAME_ROWS, floor=False)
    quick = crit.model_copy(update={"floor_window_s": 1.0, "min_frames": 1})
    watch = EarlyStop(live, quick, criteria, event=lambda e: None, stop=lambda r: None)
    watch.on_event(Event("warmup_end", 0.0, 0.0))
    for i in range(600):
        t = i / 10
        for j in range(4):
            tj = t + j / 40
            watch.on_frame(FrameRecord(4 * i + j, tj, tj, tj, tj, 0.0, 0.1,
                                       infer_ms=10.0 + i % 3, total_ms=11.0,
                                       frame_age_ms=1.0 + t))  # fmt: skip
        if i % 2 == 0:
            values: dict[str, float | int | None] = {c: 1e8 + 1e6 * t for c in _SAMPLE_COLUMNS}
            server = tuple(ServerMetric(i, t, c, "", t) for c in _SERVER_COLUMNS)
            watch.on_sample(Sample(i, t, 0.0, 0.0, 0.0, values, server=server))
        if i % 100 == 99:  # every criterion asked, whatever an earlier one found
            live.now = t
            for module in criteria:
                # a look that raises here raises in the run too, where the observer's
                # failure is an event and a warning: the rehearsal only warms up
                with contextlib.suppress(Exception):
                    module.early_fail(live, quick)


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
    # the looks test trends with scipy: every look made once now, before the warm-up, so
    # what it loads (~60 MB, some of it on first use) lands there and not in the measured
    # RSS as a step mid-run
    _rehearse(crit, asked)
    _fill_numpy_cache()
    live = Live(planned_s=float(run.duration), fps=float(run.fps), streams=run.streams,
                cpus=float(os.cpu_count() or 1))  # fmt: skip
    # the live telemetry, allocated and written now (before the warm-up), never grown
    live.samples = LiveTable(("t", *_SAMPLE_COLUMNS))
    live.server = LiveTable(("t", *_SERVER_COLUMNS), floor=False)
    live.stage_ms = {col: LiveHistogram() for col in _JITTER_COLUMNS}
    live.frames = LiveTable(STAGE_FRAME_COLUMNS, rows=LIVE_FRAME_ROWS, floor=False)
    return [EarlyStop(live, crit, asked, event=event, stop=stop)]

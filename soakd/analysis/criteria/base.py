"""The context every criterion judges from, and the trend helpers several share.

``Context`` holds the run data, the ``[criteria]`` settings, the measured window (``t0`` ..
``t1``, the measured / post-warm-up masks), the window series and trends the plots and the
diagnosis read afterwards, the jitter history, the bounded path's ``FrameDigest`` and the
results of the criteria judged before (``results``, by module name: headroom reads
memory's). A trend criterion FAILs only when the Theil–Sen slope is above its tolerance and
the autocorrelation-corrected Mann–Kendall test is significant (``call_trend``); a trend
too short to test passes only when its windows' range bounds it, and is INVALID otherwise.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from soakd.analysis import stats
from soakd.analysis.digest import FrameDigest
from soakd.analysis.model import (
    FAIL,
    INVALID,
    NA,
    PASS,
    CriterionResult,
    RunData,
    age_window_s,
)
from soakd.config import CriteriaSettings
from soakd.records import STAGE_COLUMNS

#: the event a run stores when a criterion that can no longer pass ends it early
#: (``run.stop_on_fail``, or an ``abort_on_fail`` threshold); its data names the criterion
EARLY_STOP_EVENT = "early_stop"
#: the event a ``run.duration = "auto"`` run stores when every criterion is decided; its
#: data: ``after_s`` and ``detectable`` (each trend's smallest detectable slope)
DECIDED_EVENT = "decided"


#: the most windows a running look tests: its trend test (Theil–Sen) allocates n² pairs, and
#: a look whose windows grew with the run grew the heap's high-water mark with them (170
#: frame-age windows of a 90 s run at 60 fps: soakd's RSS rose 1.1 MB/min, which memory_rss
#: judges as the model's; 0.15 MB/min without the looks, bench/own_rss.py)
LOOK_MAX_WINDOWS = 64


def look_window(span: float, window: float) -> float:
    """A look's window: ``window``, or longer so that ``span`` holds LOOK_MAX_WINDOWS."""
    return max(window, span / LOOK_MAX_WINDOWS)


def thin(
    t: np.ndarray, y: np.ndarray, most: int = LOOK_MAX_WINDOWS
) -> tuple[np.ndarray, np.ndarray]:
    """Window medians merged in runs of consecutive ones (the runs' mean time and median
    value) until at most ``most`` are left: the series a look tests stays this size."""
    n = t.size
    if n <= most:
        return t, y
    g = -(-n // most)
    cut = n - n % g
    tt = t[:cut].reshape(-1, g).mean(axis=1)
    yy = np.median(y[:cut].reshape(-1, g), axis=1)
    if cut < n:
        tt = np.append(tt, t[cut:].mean())
        yy = np.append(yy, np.median(y[cut:]))
    return tt, yy


def spent(alpha: float, fraction: float) -> float:
    """The alpha the early looks have spent by ``fraction`` of the planned measured run: a
    Pocock-type spending function (Lan & DeMets 1983), alpha x ln(1 + (e - 1) t), 0 at the
    start and ``alpha`` at the planned end. It spends early, where O'Brien–Fleming's spent
    next to nothing (by 5 minutes of a 1-hour plan: 0.13 alpha here, 1e-19 alpha there), so
    a run of the default ``max_duration = 1h`` stops a leak of a few MB/min within minutes;
    the looks' false FAIL rate, measured through the looks themselves, is in
    docs/verdict.md (bench/early_alpha.py)."""
    t = min(max(fraction, 0.0), 1.0)
    return alpha * math.log1p((math.e - 1.0) * t)


def look_alpha(alpha: float, fraction: float, previous: float) -> float:
    """The nominal alpha of a look at ``fraction`` after one at ``previous``: what the
    spending function spends between them. Testing each look at its increment keeps the
    chance of any false early stop under ``alpha`` (a union bound over the looks, however
    many)."""
    return max(spent(alpha, fraction) - spent(alpha, previous), 0.0)


@dataclass(frozen=True, slots=True)
class EarlyFail:
    """A criterion that can no longer pass, found while the run goes: its id (as in the
    verdict) and why."""

    criterion: str
    reason: str
    by: str = "stop_on_fail"  # the setting that asked: run.stop_on_fail or abort_on_fail


#: the columns of ``Live.frames``: a measured frame's dispatch time and its stage times
STAGE_FRAME_COLUMNS = ("t", *STAGE_COLUMNS)

#: rows a live telemetry table holds (``LiveTable``): at the default 150 ms sampling, 41
#: minutes at full resolution; past that pairs of rows merge (300 ms a row, then 600 ms...)
LIVE_ROWS = 16384


class LiveTable:
    """Columns of doubles that one thread appends rows to while another reads them (the
    sampler and the early-stop look): appended and copied under one lock, so a look reads
    whole rows and never holds a view of a buffer that grows (a numpy view of a growing
    ``array`` made the sampler's append raise ``BufferError``). Allocated and written once
    up front (``rows`` x columns doubles: 1 MB for 8 columns), it never grows: when full,
    each pair of rows merges into one, the first's ``columns[0]`` (the time) and, with
    ``floor``, each other column's lower value, so a window's floor (what the memory
    criteria judge) survives; without, the first row whole (every other row: a window's
    median stays unbiased)."""

    def __init__(self, columns: Sequence[str], rows: int = LIVE_ROWS, floor: bool = True) -> None:
        self.columns, self.floor = tuple(columns), floor
        self._buf = np.full((max(rows, 2), len(self.columns)), np.nan)
        self._n = 0
        self._lock = threading.Lock()
        self.appended = 0  # rows appended in all
        self.merges = 0  # how many times the rows were halved

    def __len__(self) -> int:
        return self._n

    def append(self, row: Sequence[float]) -> None:
        """One row, a value for each column in order (NaN for a missing one)."""
        with self._lock:
            if self._n == len(self._buf):
                self._halve()
            self._buf[self._n] = row
            self._n += 1
            self.appended += 1

    def _halve(self) -> None:
        b, n = self._buf, self._n - self._n % 2
        half = n // 2
        merged = np.fmin(b[0:n:2], b[1:n:2]) if self.floor else b[0:n:2].copy()
        merged[:, 0] = b[0:n:2, 0]
        odd = b[n].copy() if n < self._n else None
        b[:half] = merged
        if odd is not None:
            b[half] = odd
        self._n = half + (odd is not None)
        b[self._n :] = np.nan
        self.merges += 1

    def snapshot(self) -> dict[str, np.ndarray]:
        """A copy of every column so far (the caller's own: appends go on meanwhile)."""
        with self._lock:
            rows = self._buf[: self._n].copy()
        return {c: rows[:, i] for i, c in enumerate(self.columns)}


class LiveValues:
    """One growing column of doubles (an ``abort_on_fail`` threshold's values, which a
    percentile or a count needs whole), appended to by one thread and copied by another
    under a lock: a copy is never a view of the buffer that grows."""

    def __init__(self) -> None:
        self._values = array("d")
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._values)

    def append(self, v: float) -> None:
        with self._lock:
            self._values.append(v)

    def snapshot(self) -> np.ndarray:
        with self._lock:
            return np.array(self._values, dtype=np.float64)


class LiveHistogram:
    """Counts of values in log-spaced bins (1 % wide, 1 us to 1000 s): the stage times a
    running jitter look reads (its median's confidence bound, how many frames lie above a
    level) in a fixed 17 KB, appended to by the driver and read by the look under a lock."""

    LO, RATIO, BINS = 1e-3, 1.01, 2084
    #: each bin's lower edge, and the last one's upper (bin i holds [EDGES[i], EDGES[i+1]))
    EDGES = LO * RATIO ** np.arange(BINS + 1)

    def __init__(self) -> None:
        self._counts = np.zeros(self.BINS, dtype=np.int64)
        self._lock = threading.Lock()
        self.n = 0

    def add(self, v: float) -> None:
        if not math.isfinite(v):
            return
        i = int(math.log(v / self.LO) / math.log(self.RATIO)) if v > self.LO else 0
        with self._lock:
            self._counts[min(max(i, 0), self.BINS - 1)] += 1
            self.n += 1

    def snapshot(self) -> np.ndarray:
        with self._lock:
            return self._counts.copy()


@dataclass(slots=True)
class Live:
    """What a run has shown so far, for the criteria's ``early_fail(live, crit)`` (the
    running half of the protocol, soakd/run/early_stop.py): everything counted from the end
    of the warm-up (``t0``, None until then) up to ``now``, against the planned end."""

    planned_s: float  # run.duration: the planned end, seconds from the start
    fps: float
    streams: int
    generates: bool = False  # a frame generator: judged on output intervals, not frame age
    now: float = 0.0
    t0: float | None = None
    errors: int = 0  # measured frames that raised
    dropped: int = 0  # frames dropped from the queue since t0
    stale: int = 0  # frames skipped as stale since t0
    ooms: int = 0  # OOM events, and the rise of the torch allocator's OOM counter
    #: post-warm-up telemetry: "t" and the columns the criteria read (a ``LiveTable``,
    #: appended to by the sampler, copied by a look; fixed in size); None until set
    samples: LiveTable | None = None
    #: a served model's queue metrics (``server.queue_series``' names), by the same rule
    #: but merged by keeping every other row (their window medians are judged, not floors)
    server: LiveTable | None = None
    #: post-warm-up values of the columns the abort_on_fail thresholds name
    values: dict[str, LiveValues] = field(default_factory=dict)
    #: measured frames' infer times (and a session's output latency), as jitter judges them
    stage_ms: dict[str, LiveHistogram] = field(default_factory=dict)
    #: measured frames' dispatch time and stage times (``STAGE_FRAME_COLUMNS``), as
    #: stage_trend judges them; merged by keeping every other row when full; None until set
    frames: LiveTable | None = None
    rows: int = 0  # post-warm-up frame rows (dispatched or skipped)
    #: a criterion's previous look, as a fraction of the planned run (alpha spending)
    looked: dict[str, float] = field(default_factory=dict)
    #: measured frames' age by window of the dispatch axis (``add_age``): the closed
    #: windows' centres and medians, so a ten-hour run keeps at most MAX_WINDOWS of them
    age_t: list[float] = field(default_factory=list)
    age_ms: list[float] = field(default_factory=list)
    #: when a served model's server was replaced or lost (its run events' ``t``): each
    #: server process's memory is looked at alone, as the verdict judges it
    server_changes: list[float] = field(default_factory=list)
    #: the host's CPUs (other processes' share is of all of them: soakd.analysis.contention)
    cpus: float = 1.0
    #: post-warm-up telemetry ticks that sampled the host, and those of them contended
    host_ticks: int = 0
    contended_ticks: int = 0
    _age_open: list[float] = field(default_factory=list)
    _age_index: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def lost(self) -> int:
        """Dropped and stale since t0: a lower bound of the losses the verdict counts."""
        return self.dropped + self.stale

    @property
    def fraction(self) -> float:
        """How much of the planned measured window has passed (0 before the warm-up ends)."""
        if self.t0 is None or self.planned_s <= self.t0:
            return 0.0
        return min(max((self.now - self.t0) / (self.planned_s - self.t0), 0.0), 1.0)

    @property
    def age_window_s(self) -> float:
        """The frame-age window of the planned measured span, as the verdict lays it."""
        t0 = self.t0 if self.t0 is not None else 0.0
        return age_window_s(max(self.planned_s - t0, 0.0), self.fps)

    def add_age(self, t: float, ms: float) -> None:
        """One measured frame's age, dispatched ``t`` s from the start: kept in the open
        window, whose median is kept once a later frame falls past it (under the lock:
        ``age_series`` reads both lists whole from another thread)."""
        if self.t0 is None:
            return
        w = self.age_window_s
        i = max(int((t - self.t0) / w), self._age_index)
        with self._lock:
            if i != self._age_index and self._age_open:
                self.age_t.append(self.t0 + (self._age_index + 0.5) * w)
                self.age_ms.append(float(np.median(self._age_open)))
                self._age_open.clear()
            self._age_index = i
            self._age_open.append(ms)

    def age_series(self) -> tuple[np.ndarray, np.ndarray]:
        """The closed frame-age windows' centres and medians, a copy of each, as long."""
        with self._lock:
            return np.array(self.age_t), np.array(self.age_ms)

    def server_spans(self) -> list[tuple[float, float]]:
        """Each server process's part of the run so far, ``(start, end)``: the first from
        the warm-up's end, each that took over (or came after a loss) after a warm-up of
        its own as long as the run's (``t0``, from the run's start)."""
        if self.t0 is None:
            return []
        starts = [self.t0, *(t + self.t0 for t in self.server_changes)]
        ends = [*self.server_changes, self.now]
        return [(a, b) for a, b in zip(starts, ends, strict=True) if b > a]

    def samples_now(self) -> dict[str, np.ndarray]:
        """The telemetry so far, copied (``LiveTable.snapshot``); empty when none."""
        return self.samples.snapshot() if self.samples is not None else {}

    def values_now(self, column: str) -> np.ndarray:
        """An abort_on_fail threshold's column so far, copied."""
        got = self.values.get(column)
        return got.snapshot() if got is not None else np.empty(0)

    def look(self, name: str, every_s: float, alpha: float) -> float | None:
        """A look of criterion ``name`` once ``every_s`` of the run have passed since its
        last (recorded here): the alpha the spending function (``spent``) spends between the
        two, so that the looks together never spend more than ``alpha``. None when too soon,
        before the warm-up's end or past the planned end."""
        if self.t0 is None or self.fraction >= 1.0:
            return None
        prev = self.looked.get(name, 0.0)
        if (self.fraction - prev) * (self.planned_s - self.t0) < every_s:
            return None
        self.looked[name] = self.fraction
        return look_alpha(alpha, self.fraction, prev)

    def planned_ticks(self) -> float:
        """The most ticks the measured window can have (every stream's, one more each for
        the window's edges): a loss count over it is a floor of the final fraction."""
        t0 = self.t0 if self.t0 is not None else 0.0
        return self.streams * (self.fps * max(self.planned_s - t0, 0.0) + 1.0)


@dataclass(slots=True)
class Context:
    data: RunData
    crit: CriteriaSettings
    t0: float
    t1: float
    measured: np.ndarray  # bool mask of frames: post-warm-up, dispatched
    post: np.ndarray  # bool mask: post-warm-up rows (dispatched or skipped)
    series: dict[str, stats.Windows]
    trends: dict[str, stats.Trend]
    #: the bounded path's streamed run (frames not loaded; ``data`` holds its telemetry view)
    digest: FrameDigest | None = None
    #: jitter ratios (max / median) of earlier passing runs of this config, newest first
    history: Sequence[float] = ()
    #: each criterion module's results so far, by module name ("memory": [...])
    results: dict[str, list[CriterionResult]] = field(default_factory=dict)

    @property
    def span(self) -> float:
        return max(self.t1 - self.t0, 0.0)

    def minutes(self) -> str:
        m = self.span / 60
        return f"{m:.0f}-minute" if m >= 2 else f"{self.span:.0f}-second"

    @property
    def auto(self) -> bool:
        """``run.duration = "auto"``: a trend passes only once it is decided."""
        return bool(self.data.meta.setting("run", "auto_duration"))

    @property
    def decided(self) -> bool:
        """The run stopped because a look found every criterion decided (its ``decided``
        event): the second or so stored after that look does not undo it."""
        return any(e.get("kind") == DECIDED_EVENT for e in self.data.events)


def undecided_trend(
    ctx: Context, call: TrendCall, tr: stats.Trend, per: float, tol: float, unit: str
) -> str | None:
    """For a ``run.duration = "auto"`` run, why a trend that passed is not decided: it was
    not tested (only bounded), or this run could not have seen growth at its tolerance (the
    smallest detectable slope is above it). None when decided (at a look that stopped the
    run, or now), or for a fixed-length run."""
    if not ctx.auto or ctx.decided:
        return None
    mds = tr.mds * per
    if call.how == "trend" and math.isfinite(mds) and mds <= tol:
        return None
    seen = f"growth over {mds:.3g} {unit} only" if math.isfinite(mds) else "no growth yet"
    return (
        f"undecided: this {ctx.minutes()} run could see {seen}, not its tolerance "
        f"{tol:g} {unit} (run.duration = auto, ended at run.max_duration)"
    )


def undecided(statuses: Iterable[tuple[str, str]]) -> list[str]:
    """The criteria a running ``duration = "auto"`` run still waits on, of its (criterion,
    status) pairs: every one that is neither PASS nor n/a (an interim FAIL may yet pass; a
    certain one stops the run through ``early_fail``), but the run's own validity (a
    running run is not complete)."""
    return [name for name, status in statuses if name != "run" and status not in (PASS, NA)]


def finite(v: Any) -> float | None:
    """A finite float or None."""
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def trend_fields(tr: stats.Trend, per: float) -> dict[str, Any]:
    return {
        "slope": tr.slope * per,
        "p_value": tr.p,
        "z": tr.z,
        "n_windows": tr.n,
        "n_effective": tr.n_eff,
        "autocorr_inflation": tr.inflation,
        "noise": tr.noise,
        "min_detectable_slope": tr.mds * per,
    }


def detectability(
    ctx: Context, tr: stats.Trend, per: float, threshold: float, what: str, unit: str
) -> list[str]:
    mds = tr.mds * per
    if math.isfinite(mds) and threshold < mds:
        return [
            f"this {ctx.minutes()} run cannot see {what} under {mds:.3g} {unit} "
            f"(threshold {threshold:g} {unit})"
        ]
    return []


@dataclass(frozen=True, slots=True)
class TrendCall:
    """How a trend criterion was decided: ``how`` is "rising" (FAIL), "trend" (tested,
    within the tolerance: PASS), "undecided" (tested, over the tolerance but not
    significant: INVALID), "bounded" (too few windows for a test, but the windows' range
    keeps the slope under the tolerance: PASS) or "untested" (INVALID). ``bound``: that
    largest slope."""

    status: str
    how: str
    bound: float | None = None


def too_few(tr: stats.Trend, alpha: float) -> str:
    """Why a trend could not be tested, in words: too few windows, or enough windows that
    move together so much that few of them count ("30 windows, about 2 independent")."""
    if tr.n < stats.min_trend_points(alpha):
        return f"too few windows for a trend test ({tr.n})"
    return (
        f"too few independent windows for a trend test ({tr.n} windows, about "
        f"{tr.n_eff:.0f} independent once their autocorrelation is counted)"
    )


def _range_bound(t: np.ndarray, y: np.ndarray) -> float | None:
    """The steepest slope the series' windows allow: (max - min) / span of their times."""
    ok = np.isfinite(t) & np.isfinite(y)
    if ok.sum() < 2:
        return None
    span = float(t[ok].max() - t[ok].min())
    return float(y[ok].max() - y[ok].min()) / span if span > 0 else None


def call_trend(
    tr: stats.Trend, t: np.ndarray, y: np.ndarray, alpha: float, tol: float
) -> TrendCall:
    """FAIL when rising (significant and above ``tol``); INVALID "undecided" when tested
    with its slope above ``tol`` but not significant (the run points to growth it cannot
    confirm: never a PASS); PASS when tested with its slope within ``tol``, or when its
    range bounds it under ``tol``; else untested (INVALID)."""
    if tr.rising(alpha, tol):
        return TrendCall(FAIL, "rising")
    if tr.testable(alpha):
        return TrendCall(INVALID, "undecided") if tr.slope > tol else TrendCall(PASS, "trend")
    bound = _range_bound(t, y)
    if bound is not None and bound <= tol:
        return TrendCall(PASS, "bounded", bound)
    return TrendCall(INVALID, "untested", bound)


def not_significant(ctx: Context, tr: stats.Trend, per: float, tol: float, unit: str) -> str:
    """For a trend left undecided (``call_trend``: its slope over the tolerance ``tol``,
    not significant): why and, from the slope this run can detect, about how long a run
    would decide it (the detectable slope falls as span^-1.5 for windows of the same
    noise). "" when the slope is within the tolerance."""
    slope, mds = tr.slope * per, tr.mds * per
    if not slope > tol:
        return ""
    words = f"; above {tol:g} {unit} but not significant at alpha = {ctx.crit.alpha:g}"
    need = span_to_decide(ctx, tr, per, tol)
    if need is not None:
        words += (
            f": this {ctx.minutes()} run sees growth over {mds:.3g} {unit}; about "
            + (f"{need / 60:.0f} min" if need >= 90 else f"{need:.0f} s")
            + " after the warm-up would decide it"
        )
    elif tol > 0:  # a tolerance of 0: no length decides
        words += ": a longer run would decide it"
    return words


def span_to_decide(ctx: Context, tr: stats.Trend, per: float, tol: float) -> float | None:
    """Seconds after the warm-up a run would need for its detectable slope to reach the
    tolerance ``tol`` (``per``: the slope's unit per trend unit), from this run's: the
    detectable slope falls as span^-1.5 for windows of the same noise. None when this run
    already detects ``tol`` or no length would (a tolerance of 0, no detectable slope)."""
    mds = tr.mds * per
    if not (math.isfinite(mds) and mds > tol > 0 and ctx.span > 0):
        return None
    return ctx.span * (mds / tol) ** (2 / 3)


def span_to_test(ctx: Context, tr: stats.Trend, window_s: float, min_windows: int = 0) -> float:
    """Seconds after the warm-up a run needs for a trend test of windows of ``window_s``:
    enough windows for significance and, at this run's autocorrelation, 3 effective ones."""
    need = max(stats.min_trend_points(ctx.crit.alpha), min_windows)
    if math.isfinite(tr.inflation) and tr.n >= 3:
        need = max(need, math.ceil(3 * tr.inflation) + 1)
    return need * window_s


def untested(ctx: Context, tr: stats.Trend, what: str, need_s: float) -> str:
    """The detail of an untested trend: why, and how long the run must be (no p-value: a
    test that could not be run has none worth showing)."""
    return (
        f"untested: {tr.n} windows ({tr.n_eff:.1f} effective) cannot show {what} at "
        f"alpha = {ctx.crit.alpha:g} (a test needs {stats.min_trend_points(ctx.crit.alpha)} "
        f"windows and 3 effective); run at least {math.ceil(need_s)} s after the warm-up "
        f"(run.duration >= {math.ceil(ctx.t0 + need_s)} s)"
    )


def generator_intervals(d: RunData, t0: float) -> tuple[np.ndarray, np.ndarray]:
    """Chunk-to-chunk intervals of a generator run: the first emission of each chunk that
    is not the first of its request (of a rollout: every chunk but the run's first),
    post-warm-up."""
    e = d.emissions
    if len(e["t_emit"]) == 0:
        return np.empty(0), np.empty(0)
    fid, chunk, idx = e["frame_id"], e["chunk"], e["idx"]
    new_chunk = np.ones(len(fid), dtype=bool)
    new_chunk[1:] = (fid[1:] != fid[:-1]) | (chunk[1:] != chunk[:-1])
    later = (idx > 0) | (d.meta.shape == "rollout")  # a rollout's intervals span its chunks
    keep = new_chunk & later & (e["t_emit"] >= t0) & np.isfinite(e["interval_ms"])
    return e["t_emit"][keep], e["interval_ms"][keep]

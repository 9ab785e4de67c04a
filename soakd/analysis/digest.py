"""The bounded path: what the criteria use of a run too long to load, streamed.

``digest_run(data, criteria, k)`` reads a run whose ``RunData.source`` is set (frames and
samples left in the store, see ``soakd.analysis.data.BOUNDED_ROWS``) and folds it into a
``FrameDigest`` of fixed size, whatever the run's length:

* frames, in frame_id (capture) order, a chunk at a time: one pass in Python over every
  row (``frame_chunks``: only the columns some accumulator reads) feeds all of them: exact
  counts, the loss counters (``losses.py``), the drop-rate windows (count, max of the
  counters), the first dispatched frame's stage times, and of the measured frames the
  frame-age and backlog windows (every value of a window is kept until no later frame can
  fall in it, then its exact count / floor / median / max) and per column a
  ``StreamQuantiles``. Then one scan done by SQLite (``measured_matching``) returns only the
  frames with a value in a bin that holds a wanted rank (medians, p95, p99, the jitter
  rule's k-th largest, thresholds' pNN), which makes those exact, and the jitter column's
  frames over a cut no higher than the rule's (k x median from the median's bins);
* telemetry as SQLite aggregates per memory-floor window (count, floor, max of every
  metric) and the sharp drops of each memory series (the sawtooth evidence): ``view``
  is the RunData the memory criteria then judge exactly as the exact path does (two rows a
  window: the floor and the peak).

Everything a criterion decides on is exact; means are summed in float64 (the exact path
sums float32 values), medians and percentiles interpolate in float64: values agree to
about 1e-6 relative. Only evidence may be approximate, and says so in ``notes``: the
jitter tail's cut (the median absolute deviation from 0.2 % bins), and positions of frames
over k x median beyond ``MAX_POSITIONS`` (only when the rule failed anyway).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from soakd.analysis import stats
from soakd.analysis.losses import Losses, tally_losses
from soakd.analysis.model import (
    MEMORY_METRICS,
    RunData,
    age_window_s,
    floor_window_s,
    jitter_allowed,
)
from soakd.analysis.quantiles import StreamQuantiles
from soakd.config import CriteriaSettings
from soakd.records import SAMPLE_METRICS, STAGE_COLUMNS

MAX_POSITIONS = 1_000_000  # frames over k x median (or in the tail) kept with their ids
JITTER_COLUMNS = ("infer_ms", "output_latency_ms")
_FLAGS = ("warmup", "skipped", "has_error")
_PCTS = (50.0, 95.0, 99.0)


class RowSource(Protocol):
    """Where a long run's rows stay (``soakd.analysis.data.StoreSource``; the queries are
    ``soakd.store.rundata``'s of the same names)."""

    def frame_chunks(self, names: Sequence[str]) -> Iterator[dict[str, np.ndarray]]: ...

    def first_post_id(self, t0: float) -> float | None: ...

    def measured_matching(
        self,
        t0: float,
        names: Sequence[str],
        ranges: Sequence[tuple[str, float, float]],
        over: tuple[str, float] | None,
    ) -> Iterator[dict[str, np.ndarray]]: ...

    def measured_over(
        self, t0: float, column: str, cut: float, limit: int
    ) -> dict[str, np.ndarray]: ...

    def extent(self) -> tuple[float | None, float | None, float | None]: ...

    def sample_windows(
        self, t0: float, t1: float, width: float, nwin: int
    ) -> dict[str, np.ndarray]: ...

    def sample_series_chunks(
        self, column: str, t0: float
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]: ...


class WindowFold:
    """Exact per-window count / floor / median / max (``stats.window_reduce``'s windows)
    of a series fed in chunks whose windows complete in time order: a window's values are
    held only until ``add`` is told no later value can fall in it."""

    def __init__(self, t0: float, t1: float, width: float) -> None:
        self.t0, self.t1, self.width = t0, t1, width
        self.nwin = stats.window_count(t0, t1, width)
        self._open: dict[int, list[np.ndarray]] = {}
        self.count = np.zeros(self.nwin, dtype=np.int64)
        self.floor, self.median, self.max = (np.full(self.nwin, np.nan) for _ in range(3))

    def add(self, t: np.ndarray, y: np.ndarray, complete_before: float) -> None:
        """Fold (t, y) in; windows ending at or before ``complete_before`` are final."""
        ok = np.isfinite(t) & np.isfinite(y) & (t >= self.t0) & (t <= self.t1)
        idx = stats.window_index(t[ok], self.t0, self.width, self.nwin)
        vals = y[ok].astype(np.float64)
        order = np.argsort(idx, kind="stable")
        idx, vals = idx[order], vals[order]
        ids, starts = np.unique(idx, return_index=True)
        for i, part in zip(ids.tolist(), np.split(vals, starts[1:]), strict=True):
            self._open.setdefault(i, []).append(part)
        last = math.floor((complete_before - self.t0) / self.width) - 1
        for i in [i for i in self._open if i <= min(last, self.nwin - 2)]:
            self._close(i)

    def _close(self, i: int) -> None:
        v = np.concatenate(self._open.pop(i))
        self.count[i] = v.size
        self.floor[i], self.median[i], self.max[i] = v.min(), np.median(v), v.max()

    def windows(self) -> stats.Windows:
        for i in list(self._open):
            self._close(i)
        centres = self.t0 + (np.arange(self.nwin) + 0.5) * self.width
        return stats.Windows(centres, self.count, self.floor, self.median, self.max, self.width)


@dataclass
class DropWindows:
    """Per drop-rate window: post-warm-up rows and the largest running loss counters."""

    t0: float
    t1: float
    width: float
    count: np.ndarray
    lost_max: np.ndarray
    drop_max: np.ndarray

    @classmethod
    def empty(cls, t0: float, t1: float, width: float) -> DropWindows:
        n = stats.window_count(t0, t1, width)
        return cls(t0, t1, width, np.zeros(n, np.int64), np.full(n, -np.inf), np.full(n, -np.inf))

    def add(self, t: np.ndarray, lost: np.ndarray, drop: np.ndarray) -> None:
        """Fold post-warm-up rows in (a row past the last window counts in it)."""
        idx = stats.window_index(t, self.t0, self.width, len(self.count))
        self.count += np.bincount(idx, minlength=len(self.count))
        np.maximum.at(self.lost_max, idx, lost)
        np.maximum.at(self.drop_max, idx, drop)

    @property
    def centres(self) -> np.ndarray:
        return self.t0 + (np.arange(len(self.count)) + 0.5) * self.width


@dataclass
class Jitter:
    """The jitter rule's ingredients: the column judged, its levels, the frames over
    k x median (values, ids, capture times) and the k-th largest value."""

    column: str
    levels: dict[str, float]
    over: tuple[np.ndarray, np.ndarray, np.ndarray]
    kth: float
    n: int
    tail: dict[str, Any]
    over_complete: bool = True


@dataclass
class _Counters:
    """Pass-1 totals over the rows (see ``_fold_counters``)."""

    rows: int = 0
    post: int = 0
    measured: int = 0
    last_capture: float = -math.inf
    first_post_id: float = math.inf
    err_post: int = 0
    err_warm: int = 0
    pre_max: list[float] = field(default_factory=lambda: [-math.inf] * 3)
    post_max: list[float] = field(default_factory=lambda: [-math.inf] * 3)
    top: list[float] = field(default_factory=lambda: [0.0, 0.0])
    first_ms: dict[str, float | None] | None = None


@dataclass
class FrameDigest:
    """Everything the criteria and reports read of a long run (module docstring)."""

    t0: float
    t1: float
    counters: _Counters
    loss: Losses
    drops: DropWindows
    age: stats.Windows
    backlog: stats.Windows | None
    quantiles: dict[str, StreamQuantiles]
    jitter: Jitter | None
    view: RunData
    sawtooth: dict[str, dict[str, Any]]
    #: the running loss totals (all, queue drops) at the end of the warm-up
    prev: tuple[float, float] = (0.0, 0.0)
    notes: list[str] = field(default_factory=list)

    @property
    def n_measured(self) -> int:
        return self.counters.measured

    def dist(self, col: str) -> dict[str, Any]:
        """n, p50, p95, p99, max, mean of a column over the measured frames (percentiles no
        criterion decides on are from the 0.2 % bins; ``notes`` says so)."""
        q = self.quantiles.get(col)
        if q is None or not q.n:
            return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None, "mean": None}
        p50, p95, p99 = (q.approx_percentile(p) for p in _PCTS)
        return {"n": q.n, "p50": p50, "p95": p95, "p99": p99, "max": q.max, "mean": q.mean}

    def frame_summary(self) -> dict[str, Any]:
        """What ``soakd.report.summary`` reads instead of the frames."""
        return {
            "stages": {c: self.dist(c) for c in STAGE_COLUMNS},
            "frame_age": self.dist("frame_age_ms"),
            "first_ms": dict(self.counters.first_ms or {}),
            "errors": float(self.counters.err_post + self.counters.err_warm),
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- the passes


def window_bounds(data: RunData, source: RowSource) -> tuple[float, float]:
    """(t0, t1) as ``RunData.warmup_end`` / ``window_end`` would give them."""
    first_measured, last, last_sample = source.extent()
    ends = [e["t"] for e in data.events if e.get("kind") == "warmup_end" and e.get("t") is not None]
    t0 = float(ends[0]) if ends else None
    if t0 is None:
        t0 = first_measured if first_measured is not None else (last or 0.0)
    end = float(last) if last is not None else t0
    return float(t0), max(end, float(last_sample)) if last_sample is not None else end


def _quantile_columns(data: RunData, crit: CriteriaSettings) -> list[str]:
    """The measured frames' columns with a StreamQuantiles: the reports' stages, frame age,
    a session's output latency and the thresholds' frame columns."""
    cols = [*STAGE_COLUMNS, "frame_age_ms"]
    if data.meta.shape == "session":
        cols.append("output_latency_ms")
    cols += [t.parsed().column for t in crit.thresholds if t.parsed().source == "frames"]
    return list(dict.fromkeys(cols))


def _losses(data: RunData, c: _Counters) -> tuple[Losses, float, float]:
    """The run's Losses, and the running totals (all, drops) at the end of the warm-up."""
    base = [m if math.isfinite(m) else 0.0 for m in c.pre_max]
    after = [
        max(p - b, 0.0) if math.isfinite(p) else 0.0 for p, b in zip(c.post_max, base, strict=True)
    ]
    first = c.first_post_id if c.post else None
    loss = tally_losses(
        data.meta, (after[0], after[1], after[2], c.top[0], c.top[1]), c.post, first
    )
    return loss, sum(base), base[0]


@dataclass
class _Scan:
    """What the one scan over the rows folds (``_scan``)."""

    counters: _Counters
    drops: DropWindows
    age: WindowFold
    backlog: WindowFold | None
    quantiles: dict[str, StreamQuantiles]
    sess_carry: float = -math.inf

    def count(self, ch: dict[str, np.ndarray], t0: float) -> np.ndarray:
        """Fold a chunk of rows into the counters and the drop-rate windows (the rows'
        counts, errors, largest running loss counters; ``losses.py``); returns the mask
        of its measured frames."""
        c, t, f = self.counters, ch["t_capture"], ch["flags"]
        post = ((f & 1) == 0) & (t >= t0)
        measured, err = post & ((f & 2) == 0), (f & 4) != 0
        d, s = ch["drop_count"], ch["stale_count"]
        x = ch.get("session_dropped")
        if x is None:
            x = np.zeros_like(d)
        else:  # a running max over the rows, carried across chunks (as the SQL window)
            x = np.maximum.accumulate(np.r_[self.sess_carry, x])[1:]
            self.sess_carry = float(x[-1])
        c.rows += int(t.size)
        c.post += int(post.sum())
        c.measured += int(measured.sum())
        if t.size:
            c.last_capture = max(c.last_capture, float(np.nanmax(t)))
            c.top = [max(c.top[0], float(d.max())), max(c.top[1], float(s.max()))]
        c.err_post += int((err & post).sum())
        c.err_warm += int((err & ~post).sum())
        for i, v in enumerate((d, s, x)):
            if post.any():
                c.post_max[i] = max(c.post_max[i], float(v[post].max()))
            if not post.all():
                c.pre_max[i] = max(c.pre_max[i], float(v[~post].max()))
        self.drops.add(t[post], (d + s + x)[post], d[post])
        if c.first_ms is None:
            sent = np.flatnonzero((f & 2) == 0)
            if sent.size:
                row = {k.removesuffix("_ms"): float(ch[k][sent[0]]) for k in STAGE_COLUMNS}
                c.first_ms = {k: v if math.isfinite(v) else None for k, v in row.items()}
        return measured


def _scan(data: RunData, src: RowSource, crit: CriteriaSettings, t0: float, t1: float) -> _Scan:
    """The one pass over every row of the run in Python: counts, loss counters and the
    drop-rate windows of all rows; of the measured frames the frame-age and backlog
    windows and every StreamQuantiles (``jitter:COL``: over the frames that did not
    raise)."""
    w = age_window_s(max(t1 - t0, 0.0), data.meta.fps)
    nwin = stats.window_count(t0, t1, w)
    cols = _quantile_columns(data, crit)
    oldest = data.meta.setting("run", "consume") == "oldest" and bool(data.meta.fps)
    counters = ["drop_count", "stale_count"]
    if data.meta.shape == "session":
        counters.append("session_dropped")
    drops = DropWindows.empty(t0, t0 + nwin * w, w)
    p = _Scan(_Counters(), drops, WindowFold(t0, t1, w),
              WindowFold(t0, t1, w) if oldest else None, {})  # fmt: skip
    p.counters.top = [-math.inf, -math.inf]
    extra = ["queue_len"] if oldest and "queue_len" not in cols else []
    for ch in src.frame_chunks(["t_capture", "flags", *counters, *cols, *extra]):
        m = p.count(ch, t0)
        clean = m & ((ch["flags"] & 4) == 0)
        age = ch["frame_age_ms"][m]
        td = ch["t_capture"][m] + age / 1000.0  # the dispatch axis, as the exact path takes it
        done = float(np.nanmax(ch["t_capture"]))
        p.age.add(td, age, done)
        if p.backlog is not None:
            p.backlog.add(td, ch["queue_len"][m], done)
        for col in cols:
            p.quantiles.setdefault(col, StreamQuantiles()).add(ch[col][m])
        for col in JITTER_COLUMNS:
            if col in ch:
                p.quantiles.setdefault(f"jitter:{col}", StreamQuantiles()).add(ch[col][clean])
    c = p.counters
    if not c.rows:
        c.top = [0.0, 0.0]
    if c.post:
        c.first_post_id = src.first_post_id(t0) or 0.0
    empty = drops.count == 0
    drops.lost_max[empty], drops.drop_max[empty] = np.nan, np.nan
    return p


def _jitter_column(q: dict[str, StreamQuantiles]) -> str | None:
    return next((c for c in JITTER_COLUMNS if q.get(f"jitter:{c}") and q[f"jitter:{c}"].n), None)


def _want(p: _Scan, crit: CriteriaSettings) -> tuple[str | None, int]:
    """Name the ranks the criteria decide on (frame age's median and p95, thresholds'
    pNN and medians, the jitter rule's); returns the jitter column and its k-th rank.
    The reports' other percentiles stay approximate (``FrameDigest.dist``)."""
    p.quantiles["frame_age_ms"].want_percentiles((50.0, 95.0))
    for t in crit.thresholds:
        th = t.parsed()
        if th.source == "frames" and th.column in p.quantiles:
            p.quantiles[th.column].want_percentiles((th.q if th.q is not None else 50.0,))
    col = _jitter_column(p.quantiles)
    if col is None:
        return None, 0
    q = p.quantiles[f"jitter:{col}"]
    rank = q.n - 1 - min(jitter_allowed(crit, q.n), q.n - 1)
    q.want_percentiles((50.0, 99.0))
    q.want({rank})
    return col, rank


@dataclass
class _Over:
    """The jitter column's frames over a cut no higher than the rule's (``_refine``):
    frame ids, capture times and the stored values, in frame order; ``full``: more than
    MAX_POSITIONS + 1 of them (then the rule's own are queried apart)."""

    column: str
    cut: float
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    n: int = 0
    full: bool = False

    def add(self, ch: dict[str, np.ndarray]) -> None:
        if self.full:
            return
        y = ch[self.column]
        keep = ((ch["flags"] & 4) == 0) & (y > self.cut)
        self.parts.append((ch["frame_id"][keep], ch["t_capture"][keep], y[keep]))
        self.n += int(keep.sum())
        if self.n > MAX_POSITIONS + 1:
            self.full, self.parts = True, []

    def over(self, cut: float) -> dict[str, np.ndarray]:
        """``rundata.measured_over``'s answer for ``cut`` (>= ``self.cut``)."""
        fid, t, y = (np.concatenate([p[i] for p in self.parts] or [np.empty(0)]) for i in range(3))
        keep = np.flatnonzero(y > cut)[: MAX_POSITIONS + 1]
        return {
            "frame_id": fid[keep],
            "t_capture": t[keep],
            self.column: y[keep].astype(np.float32),
        }


def _cut(q: StreamQuantiles, k: float, med: float) -> tuple[float, float]:
    """(the tail cut, the lowest of k x median, the tail cut and the max) for ``med``."""
    mid = sum(q.bin_range((q.n - 1) // 2)) / 2
    tail_cut = max(mid + 5.0 * 1.4826 * q.approx_mad(mid), 1.5 * mid)
    cut = min(k * med, tail_cut, q.max)
    return tail_cut, cut - abs(cut) * 1e-6 - 1e-30


def _refine(src: RowSource, p: _Scan, t0: float, jit: tuple[str, float] | None) -> _Over | None:
    """Pass 2, in SQLite: the measured frames with a value in a bin holding a wanted rank,
    or (``jit``: the jitter column and k) over a cut no higher than the jitter rule's
    (from the bins of the median: its exact value is not known yet), in one scan."""
    keys = [k for k, q in p.quantiles.items() if q.bins()]
    ranges = [
        (k.removeprefix("jitter:"), lo, hi) for k in keys for lo, hi in p.quantiles[k].bounds()
    ]
    over = None
    if jit is not None:
        col, k = jit
        q = p.quantiles[f"jitter:{col}"]
        lo_med, hi_med = q.bin_range((q.n - 1) // 2)[0], q.bin_range(q.n // 2)[1]
        over = _Over(col, _cut(q, k, min(lo_med, hi_med))[1])
    cols = sorted({c for c, _lo, _hi in ranges} | ({over.column} if over else set()))
    if not ranges and over is None:
        return None
    for ch in src.measured_matching(t0, cols, ranges, (over.column, over.cut) if over else None):
        clean = (ch["flags"] & 4) == 0
        for key in keys:
            v = ch[key.removeprefix("jitter:")].astype(np.float32)
            p.quantiles[key].refine(v[clean] if key.startswith("jitter:") else v)
        if over is not None:
            over.add(ch)
    return over


def _jitter(
    src: RowSource, over: _Over, q: StreamQuantiles, rank: int, k: float, t0: float
) -> Jitter:
    """The frames over k x median (exact now), the tail's (from an approximate cut) and the
    first frame at the maximum, from the frames above the lowest of the cuts."""
    col, med = over.column, q.median()
    tail_cut, cut = _cut(q, k, med)
    rows = src.measured_over(t0, col, cut, MAX_POSITIONS + 1) if over.full else over.over(cut)
    y, fid, t = rows[col], rows["frame_id"], rows["t_capture"]
    complete = y.size <= MAX_POSITIONS
    y, fid, t = y[:MAX_POSITIONS], fid[:MAX_POSITIONS], t[:MAX_POSITIONS]
    over_k = y > k * med
    at_max = np.flatnonzero(y == np.float32(q.max))
    levels = {
        "median_ms": med,
        "max_ms": q.max,
        "p99_ms": q.percentile(99.0),
        "max_frame_id": float(fid[at_max[0]]) if at_max.size else math.nan,
    }
    tail_pos = fid[y > tail_cut]
    per = stats.tail_periodicity(tail_pos)
    tail_ev = {
        "tail_cut_ms": tail_cut,
        "tail_frames": int(tail_pos.size),
        "tail_periodic": per.regular,
        "tail_period": per.period,
        "tail_score": per.score,
        "approximate": {"tail_cut_ms": "median absolute deviation from 0.2 % bins"},
    }
    j = Jitter(col, levels, (y[over_k], fid[over_k], t[over_k]), q.order_stat(rank), q.n, tail_ev)
    j.over_complete = complete
    return j


# --------------------------------------------------------------------------- telemetry


def _sample_view(
    data: RunData, src: RowSource, crit: CriteriaSettings, t0: float, t1: float
) -> tuple[RunData, dict[str, dict[str, Any]]]:
    """The RunData the memory criteria judge (two rows a floor window, module docstring)
    and the sawtooth evidence of each memory series."""
    w, _note = floor_window_s(max(t1 - t0, 0.0), crit.floor_window_s)
    nwin = stats.window_count(t0, t1, w)
    agg = src.sample_windows(t0, t1, w, nwin)
    t = np.concatenate([agg["t_lo"], agg["t_hi"]])
    samples = {"t": t}
    for m in SAMPLE_METRICS:
        samples[m] = np.concatenate([agg[f"min:{m}"], agg[f"max:{m}"]])
    order = np.argsort(t, kind="stable")
    samples = {k: v[order] for k, v in samples.items()}
    post = agg["w"] >= 0
    saw = {}

    for name, col, _title in MEMORY_METRICS:
        saw[name] = _sawtooth(src, col, t0, agg, post)
    return dataclasses.replace(data, samples=samples, source=None), saw


def _sawtooth(
    src: RowSource, col: str, t0: float, agg: dict[str, np.ndarray], post: np.ndarray
) -> dict[str, Any]:
    """``criteria.memory.sawtooth`` of the whole post-warm-up series: steps down sharper than a
    quarter of its range (the range from the window aggregates, the steps streamed)."""
    n = float(np.nansum(agg[f"count:{col}"][post]))
    lo, hi = agg[f"min:{col}"][post], agg[f"max:{col}"][post]
    if n < 3 or not np.isfinite(hi).any():
        return {"drops": 0}
    rng = float(np.nanmax(hi) - np.nanmin(lo))
    if rng <= 0:
        return {"drops": 0}
    ts, dys, prev = [], [], math.nan
    for t_c, y_c in src.sample_series_chunks(col, t0):  # the steps, carried across chunks
        dy = np.diff(np.r_[prev, y_c])
        sharp = dy < -0.25 * rng
        ts.append(t_c[sharp])
        dys.append(dy[sharp])
        prev = float(y_c[-1])
    t, dy = np.concatenate(ts or [np.empty(0)]), np.concatenate(dys or [np.empty(0)])
    out: dict[str, Any] = {"drops": int(dy.size)}
    if dy.size:
        out["drop_mb_median"] = float(np.median(-dy) / float(1 << 20))
        out["drop_t"] = [float(v) for v in t[:50]]
    return out


# --------------------------------------------------------------------------- entry


def digest_run(data: RunData, crit: CriteriaSettings, k: float) -> FrameDigest:
    """Stream ``data.source`` into a FrameDigest (``k``: the jitter k in force)."""
    src = data.source
    if src is None:
        raise ValueError("digest_run needs a RunData whose rows stay in the store")
    t0, t1 = window_bounds(data, src)
    view, saw = _sample_view(data, src, crit, t0, t1)
    p = _scan(data, src, crit, t0, t1)
    col, rank = _want(p, crit)
    over = _refine(src, p, t0, (col, k) if col else None)
    q = p.quantiles[f"jitter:{col}"] if col else None
    jit = _jitter(src, over, q, rank, k, t0) if over is not None and q is not None else None
    counters = p.counters
    loss, prev_lost, prev_drop = _losses(data, counters)
    dg = FrameDigest(t0, t1, counters, loss, p.drops, p.age.windows(),
                     p.backlog.windows() if p.backlog else None, p.quantiles, jit, view, saw,
                     (prev_lost, prev_drop))  # fmt: skip
    dg.notes.append(
        f"judged on the bounded path ({counters.rows} frames streamed): decisions exact; "
        "the jitter tail cut and the reports' stage percentiles are from 0.2 % bins "
        "(quantiles: histogram, 0.2 % relative); frame-level hints not computed"
    )
    if jit is not None and not jit.over_complete:
        dg.notes.append(f"over {MAX_POSITIONS} frames over k x median: the first ones kept")
    return dg

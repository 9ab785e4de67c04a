"""The runner's rolling statistics for the once-a-second progress snapshot (bounded), and a
cheap "failing so far" reading of the criteria on them (the verdict proper is judged after
the run, on every stored frame: this is only an early warning, labelled "so far")."""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from soakd.records import STAGES, FrameRecord

if TYPE_CHECKING:
    from soakd.config import CriteriaSettings

#: frames after warm-up before a criterion is read "so far" (fewer would be noise)
MIN_JUDGED = 20
#: seconds of post-warm-up frame ages before a trend is read
MIN_TREND_S = 10.0


#: the stage windows' record fields, by key
_FIELDS: dict[str, str] = {
    "grab": "grab_ms", "pre": "pre_ms", "infer": "infer_ms", "decode": "decode_ms",
    "total": "total_ms", "age": "frame_age_ms", "e2e": "e2e_ms",
}  # fmt: skip
#: records queued before the driver folds them in itself: readers (the monitor, once a
#: second) fold whatever is queued; at high rates this keeps the queue, and what it holds
#: alive for the garbage collector to scan, small
FOLD_EVERY = 256


class Rolling:
    """Recent per-stage values for the once-a-second progress snapshot (bounded).

    ``add_many`` takes the sink's batches (run/sink.py) and only queues them; the
    windows fold queued records in when they are read, or every FOLD_EVERY records,
    newest first and only as many as each window keeps: the same windows as appending every
    record's values in order, for about half the cost per frame."""

    def __init__(self, n: int = 128) -> None:
        self.vals = {k: deque[float](maxlen=n) for k in (*STAGES, "age", "e2e")}
        self.done_times: deque[float] = deque(maxlen=4096)
        # post-warm-up only, for "failing so far": infer times and (done s, age ms)
        self.judged_infer: deque[float] = deque(maxlen=n)
        self.judged_age: deque[tuple[float, float]] = deque(maxlen=n)
        self._new: deque[FrameRecord] = deque()  # queued batches, folded under the lock
        self._fold_lock = threading.Lock()

    def add_many(self, recs: list[FrameRecord]) -> None:
        """A batch of records, in order (run/sink.py)."""
        self._new.extend(recs)
        if len(self._new) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Move the queued records into the windows (skipped frames count in none)."""
        with self._fold_lock:
            take = self._new.popleft
            recs = [r for r in (take() for _ in range(len(self._new))) if not r.skipped]
            if not recs:
                return
            for key, name in _FIELDS.items():
                _extend(self.vals[key], recs, attrgetter(name))
            _extend(self.done_times, recs, _done)
            judged = [r for r in recs if not r.warmup]
            _extend(self.judged_infer, judged, _infer)
            _extend(self.judged_age, judged, _done_age)

    def worst_ms(self) -> float | None:
        """The longest recent frame (its stages, or capture to output): what a healthy
        frame can take, for sizing the stall timeout."""
        self._fold()
        worst = [max(self.vals[k]) for k in ("total", "e2e") if self.vals[k]]
        return max(worst) if worst else None

    def median(self, key: str) -> float | None:
        self._fold()
        d = self.vals[key]
        return statistics.median(d) if d else None

    def p95(self, key: str) -> float | None:
        self._fold()
        d = sorted(self.vals[key])
        return d[min(len(d) - 1, int(0.95 * len(d)))] if d else None

    def max(self, key: str) -> float | None:
        self._fold()
        d = self.vals[key]
        return max(d) if d else None

    def fps(self, now_s: float, window_s: float = 5.0) -> float:
        self._fold()
        times = self.done_times
        if not times:
            return 0.0
        lo = now_s - window_s
        n = sum(1 for t in reversed(times) if t >= lo)
        span = min(window_s, max(now_s, 1e-9))
        return n / span

    def failing(self, c: CriteriaSettings, *, drops: int, captured: int, errors: int) -> list[str]:
        """The criteria already failing on the recent frames, one short line each."""
        self._fold()
        out = [
            msg
            for msg in (
                self._jitter(c),
                self._age_trend(c),
                _drops(c, drops, captured),
                f"errors {errors} > {c.max_errors}" if errors > c.max_errors else None,
            )
            if msg
        ]
        return [f"{m} (so far)" for m in out]

    def _jitter(self, c: CriteriaSettings) -> str | None:
        vals = self.judged_infer
        if len(vals) < MIN_JUDGED:
            return None
        k = float(c.jitter_k) if c.jitter_k != "history" else 5.0
        med = statistics.median(vals)
        over = sum(1 for v in vals if v > k * med)
        allowed = 0 if c.jitter_rule == "max" else c.jitter_max_exceed
        if med <= 0 or over <= allowed:
            return None
        return f"infer jitter: max {max(vals):.1f} ms > {k:g} x median {med:.1f} ms"

    def _age_trend(self, c: CriteriaSettings) -> str | None:
        pts = list(self.judged_age)
        if len(pts) < MIN_JUDGED or pts[-1][0] - pts[0][0] < MIN_TREND_S:
            return None
        half = len(pts) // 2
        a, b = pts[:half], pts[half:]
        dt_min = (statistics.median(t for t, _ in b) - statistics.median(t for t, _ in a)) / 60
        slope = (statistics.median(v for _, v in b) - statistics.median(v for _, v in a)) / dt_min
        if slope > c.max_age_slope_ms_per_min:
            return f"frame age rising {slope:.0f} ms/min > {c.max_age_slope_ms_per_min:g}"
        p95 = sorted(v for _, v in pts)[int(0.95 * (len(pts) - 1))]
        if c.max_age_p95_ms is not None and p95 > c.max_age_p95_ms:
            return f"frame age p95 {p95:.1f} ms > {c.max_age_p95_ms:g}"
        return None


def _extend(
    window: deque[Any], recs: list[FrameRecord], value: Callable[[FrameRecord], Any]
) -> None:
    """Append to ``window`` the values (not None) of ``recs``, in order, reading only the
    newest ones the window can hold."""
    keep = window.maxlen or len(recs)
    newest: list[Any] = []
    for r in reversed(recs):
        v = value(r)
        if v is not None:
            newest.append(v)
            if len(newest) == keep:
                break
    window.extend(reversed(newest))


def _done(r: FrameRecord) -> float | None:
    return r.t_done


def _infer(r: FrameRecord) -> float | None:
    return r.infer_ms


def _done_age(r: FrameRecord) -> tuple[float, float] | None:
    if r.frame_age_ms is None or r.t_done is None:
        return None
    return (r.t_done, r.frame_age_ms)


def _drops(c: CriteriaSettings, drops: int, captured: int) -> str | None:
    if captured < MIN_JUDGED or drops / captured <= c.max_drop_fraction:
        return None
    return f"drops {drops / captured:.1%} > {c.max_drop_fraction:.1%}"

"""What the generator and rollout drivers share: stamping emitted frames (``Emitted``), an
exception of the workload turned into an error (or OOM) event, and the bounded summary of
first outputs and intervals (``EmitStats``).

An ``emit(n)`` at time T hands over ``n`` frames: each gets an ``Emission`` with
``t_emit = T``, ``chunk_frames = n``, ``chunk`` = the emit's number within its row (a
request, or a rollout chunk) and ``chunk_ms`` = T - the previous emit of the row (or the
row's start). ``interval_ms`` is amortised: the gap since the previous emission divided by
``n``. Which emission is "previous" is the shape's choice: a request starts over (its first
emit has no interval: it is the request's first-frame latency), a rollout is one session
(only the run's very first emit has none).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from soakd.records import Emission, FrameRecord, error_text
from soakd.run.drivers.context import DriverContext

#: recent values kept for the run summary's percentiles (bounded memory)
SUMMARY_WINDOW = 65536


@dataclass
class Emitted:
    """One row's emissions (a request, or a rollout chunk), written by one thread.
    ``prev_ns``: the emission before the row's first one (None: its first has no
    interval)."""

    frame_id: int
    t_start_ns: int
    warmup: bool
    prev_ns: int | None = None
    idx: int = 0
    chunks: int = 0
    last_ns: int | None = None
    first_ns: int | None = None
    rows: list[Emission] = field(default_factory=list)

    def stamp(self, t_ns: int, n: int, t_emit: float) -> None:
        """``n`` frames came out at ``t_ns`` (``t_emit``: seconds since the run's start)."""
        if n <= 0:
            return
        since = self.last_ns if self.last_ns is not None else self.prev_ns
        interval = None if since is None else (t_ns - since) / 1e6 / n
        chunk_ms = (t_ns - (self.last_ns if self.last_ns is not None else self.t_start_ns)) / 1e6
        if self.first_ns is None:
            self.first_ns = t_ns
        for _ in range(n):
            self.rows.append(
                Emission(self.frame_id, self.idx, t_emit, interval, self.chunks, n, chunk_ms)
            )
            self.idx += 1
        self.chunks += 1
        self.last_ns = t_ns

    @property
    def first_emit_ms(self) -> float | None:
        return None if self.first_ns is None else (self.first_ns - self.t_start_ns) / 1e6


def record_error(ctx: DriverContext[Any], exc: BaseException, frame_id: int | None) -> str:
    """The one-line error of a workload exception, counted and recorded as an ``error``
    event (``oom`` for an out-of-memory, which with ``on_oom = "stop"`` ends the run)."""
    c = ctx.counters
    error = error_text(exc)
    c.errors += 1
    if ctx.is_oom(exc):
        c.ooms += 1
        ctx.event(ctx.make_event("oom", error, frame_id))
        if ctx.settings.run.on_oom == "stop":
            ctx.request_abort("CUDA out of memory (on_oom = stop)")
    else:
        ctx.event(ctx.make_event("error", error, frame_id))
    return error


class EmitStats:
    """Bounded recent values for the run summary (warm-up excluded). ``rows_key`` names
    the rows' count in it (``generator_requests``, ``rollout_chunks``)."""

    def __init__(self, rows_key: str) -> None:
        self.rows_key = rows_key
        self.first_emit: deque[float] = deque(maxlen=SUMMARY_WINDOW)
        self.intervals: deque[tuple[float, int]] = deque(maxlen=SUMMARY_WINDOW)  # (ms, chunk)
        # presentation: an emit's first frame the whole gap since the emit before, the
        # rest of the emit 0 (shown at once)
        self.presentation: deque[float] = deque(maxlen=SUMMARY_WINDOW)
        self.rows = 0
        self.emitted = 0
        self.interval_max: float | None = None
        self.first_output_ms: float | None = None  # the run's first emission, from its start

    def add(self, em: Emitted, rec: FrameRecord) -> None:
        self.rows += 1
        self.emitted += em.idx
        if em.warmup:
            return
        if rec.first_emit_ms is not None:
            self.first_emit.append(rec.first_emit_ms)
        shown = -1
        for e in em.rows:
            if e.interval_ms is not None:
                self.intervals.append((e.interval_ms, e.chunk))
                first = e.chunk != shown
                self.presentation.append(e.interval_ms * e.chunk_frames if first else 0.0)
                shown = e.chunk
                if self.interval_max is None or e.interval_ms > self.interval_max:
                    self.interval_max = e.interval_ms

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            self.rows_key: self.rows,
            "generator_frames_emitted": self.emitted,
            "first_output_ms": self.first_output_ms,
            "first_emit_ms": pcts(list(self.first_emit)),
            "interval_ms": pcts([v for v, _ in self.intervals]),
            "presentation_ms": pcts(list(self.presentation)),
        }
        out["interval_ms"]["max"] = self.interval_max
        p95 = out["interval_ms"]["p95"]
        if p95 is not None:
            tail: dict[str, int] = {}
            for v, chunk in self.intervals:
                if v >= p95:
                    tail[str(chunk)] = tail.get(str(chunk), 0) + 1
            out["interval_tail_by_chunk"] = tail  # where the intervals at or above P95 fall
        return out


def pcts(values: list[float]) -> dict[str, Any]:
    """n, p50, p95, p99 and max of ``values`` (nearest rank, rounded to 0.1 µs)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    values.sort()
    n = len(values)

    def q(p: float) -> float:
        return round(values[min(n - 1, int(p * (n - 1) + 0.5))], 4)

    return {"n": n, "p50": q(0.5), "p95": q(0.95), "p99": q(0.99), "max": round(values[-1], 4)}

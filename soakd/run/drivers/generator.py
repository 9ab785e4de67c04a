"""The generator driver: one request per paced frame, frames come back through ``emit``.

``workload.generate(frame, emit)`` runs in a worker thread (``soakd-generate``) so that a
generator that stops answering is detected: no return within ``response_timeout_s`` is a
``stall`` event and ends the run as aborted ("stalled"), never a hang.

Per request a ``frames`` row holds the request time (``t_dispatch``), the generator's own
``pre_ms`` / ``infer_ms`` (e.g. denoise steps) / ``decode_ms`` (e.g. VAE decode) where it
reports them, ``first_emit_ms`` (request -> first emitted frame) and ``emitted``;
``total_ms`` is grab + the request's wall time (request -> return).

Every emitted frame gets an ``emissions`` row. ``emit(n)`` hands over a chunk of ``n``
frames at time T: each of its frames has ``t_emit = T`` (when it truly became available),
``chunk_frames = n`` and ``chunk_ms`` = T - the previous emission of the request (or the
request time for its first chunk). ``interval_ms`` is **amortised**: the gap since the
previous emission divided by ``n``, so a chunk of 4 frames that took 200 ms gives four
50 ms intervals. That is the per-frame cadence a player spreading the chunk evenly sees, and
the intervals of a request sum to its generation time after the first chunk; zero intervals
inside a chunk would instead make the median meaningless. The first chunk of every request
has ``interval_ms`` NULL: its time is the request's first-frame latency (``first_emit_ms``),
a one-time cost kept apart from the intervals. Generators with one chunk per request
therefore have no intervals; give them ``chunks_per_request >= 2`` (or emit frame by frame).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from soakd.records import Emission, Frame, FrameRecord
from soakd.run.drivers.context import DriverContext
from soakd.run.drivers.session import response_timeout_s
from soakd.workloads.base import GeneratorWorkload

#: recent values kept for the run summary's percentiles (bounded memory)
SUMMARY_WINDOW = 65536


@dataclass
class _Request:
    """One request's emission state, written by the worker thread only."""

    frame_id: int
    t_req_ns: int
    warmup: bool
    idx: int = 0
    chunks: int = 0
    last_ns: int | None = None
    first_ns: int | None = None
    rows: list[Emission] = field(default_factory=list)


class _Worker:
    """The ``soakd-generate`` thread: runs one request at a time."""

    _STOP = object()

    def __init__(self, ctx: DriverContext[GeneratorWorkload]) -> None:
        self.ctx = ctx
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="soakd-generate", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, frame: Frame, emit: Any) -> None:
        self.done.clear()
        self.result = self.error = None
        self.jobs.put((frame, emit))

    def stop(self) -> None:
        self.jobs.put(self._STOP)
        if self.done.is_set():
            self.thread.join(5.0)

    def _loop(self) -> None:
        wl = self.ctx.workload
        while (job := self.jobs.get()) is not self._STOP:
            frame, emit = job
            try:
                self.result = wl.generate(frame, emit)
            except BaseException as exc:  # recorded per request by the driver thread
                self.error = exc
            self.done.set()


class _Stats:
    """Bounded recent values for the run summary (warm-up excluded)."""

    def __init__(self) -> None:
        self.first_emit: deque[float] = deque(maxlen=SUMMARY_WINDOW)
        self.intervals: deque[tuple[float, int]] = deque(maxlen=SUMMARY_WINDOW)  # (ms, chunk)
        self.requests = 0
        self.emitted = 0
        self.interval_max: float | None = None

    def add(self, req: _Request, rec: FrameRecord) -> None:
        self.requests += 1
        self.emitted += req.idx
        if req.warmup:
            return
        if rec.first_emit_ms is not None:
            self.first_emit.append(rec.first_emit_ms)
        for e in req.rows:
            if e.interval_ms is not None:
                self.intervals.append((e.interval_ms, e.chunk))
                if self.interval_max is None or e.interval_ms > self.interval_max:
                    self.interval_max = e.interval_ms

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "generator_requests": self.requests,
            "generator_frames_emitted": self.emitted,
            "first_emit_ms": _pcts(list(self.first_emit)),
            "interval_ms": _pcts([v for v, _ in self.intervals]),
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


def _pcts(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    values.sort()
    n = len(values)

    def q(p: float) -> float:
        return round(values[min(n - 1, int(p * (n - 1) + 0.5))], 4)

    return {"n": n, "p50": q(0.5), "p95": q(0.95), "max": round(values[-1], 4)}


class _GeneratorDriver:
    def __init__(self, ctx: DriverContext[GeneratorWorkload]) -> None:
        self.ctx = ctx
        self.timeout_ns = int(response_timeout_s(ctx) * 1e9)
        self.worker = _Worker(ctx)
        self.stats = _Stats()
        self.first = True

    def _emit_fn(self, req: _Request) -> Any:
        now = self.ctx.clock.now_ns
        to_s = self.ctx.s

        def emit(n: int) -> None:
            t = now()
            n = int(n)
            if n <= 0:
                return
            prev = req.last_ns if req.last_ns is not None else req.t_req_ns
            chunk_ms = (t - prev) / 1e6
            interval = None if req.first_ns is None else chunk_ms / n
            if req.first_ns is None:
                req.first_ns = t
            t_emit = to_s(t)
            for _ in range(n):
                req.rows.append(
                    Emission(req.frame_id, req.idx, t_emit, interval, req.chunks, n, chunk_ms)
                )
                req.idx += 1
            req.chunks += 1
            req.last_ns = t

        return emit

    def request(self, frame: Frame, qlen: int) -> bool:
        """Run one request; False when the generator stalled (the run is ending)."""
        ctx, c = self.ctx, self.ctx.counters
        clock = ctx.clock
        t_req = clock.now_ns()
        warm = frame.t_capture_ns < ctx.warmup_end_ns or self.first
        req = _Request(frame.id, t_req, warm)
        c.dispatched += 1
        c.in_flight_since_ns = t_req
        self.worker.submit(frame, self._emit_fn(req))
        deadline = t_req + self.timeout_ns
        while not self.worker.done.wait(0.05):
            if clock.now_ns() > deadline:
                self._stall(frame, t_req)
                return False
        t_done = clock.now_ns()
        self._record(frame, qlen, req, t_req, t_done)
        return True

    def _stall(self, frame: Frame, t_req: int) -> None:
        ctx = self.ctx
        msg = f"generator did not return within {self.timeout_ns / 1e9:g} s (request {frame.id})"
        ctx.event(ctx.make_event("stall", msg, frame.id))
        ctx.request_abort("stalled")

    def _record(self, frame: Frame, qlen: int, req: _Request, t_req: int, t_done: int) -> None:
        ctx, c = self.ctx, self.ctx.counters
        timings, exc = self.worker.result, self.worker.error
        error = None
        if exc is not None:
            error = f"{type(exc).__name__}: {exc}"[:2000]
            c.errors += 1
            if ctx.is_oom(exc):
                c.ooms += 1
                ctx.event(ctx.make_event("oom", error, frame.id))
                if ctx.settings.run.on_oom == "stop":
                    ctx.request_abort("CUDA out of memory (on_oom = stop)")
            else:
                ctx.event(ctx.make_event("error", error, frame.id))
        rec = ctx.record(
            frame,
            qlen,
            t_req,
            t_done=ctx.s(t_done),
            pre_ms=getattr(timings, "pre_ms", None),
            infer_ms=getattr(timings, "infer_ms", None),
            decode_ms=getattr(timings, "decode_ms", None),
            total_ms=frame.grab_ns / 1e6 + (t_done - t_req) / 1e6,
            e2e_ms=(t_done - frame.t_sched_ns) / 1e6,
            error=error,
            first=self.first,
            warmup=req.warmup,
            first_emit_ms=None if req.first_ns is None else (req.first_ns - t_req) / 1e6,
            emitted=req.idx,
            extra=getattr(timings, "extra", None),
        )
        self.first = False
        for e in req.rows:
            ctx.emit(e)
        ctx.emit(rec)
        self.stats.add(req, rec)
        c.in_flight_since_ns = None
        c.last_done_ns = t_done
        c.done += 1


def drive(ctx: DriverContext[GeneratorWorkload]) -> None:
    d = _GeneratorDriver(ctx)
    d.worker.start()
    try:
        for frame, qlen in ctx.frames(0.1):
            if not d.request(frame, qlen) or ctx.budget_spent():
                return
    finally:
        d.worker.stop()
        ctx.counters.in_flight_since_ns = None
        ctx.summary.update(d.stats.summary())

"""The generator driver: one request per paced frame, frames come back through ``emit``.

``workload.generate(frame, emit)`` runs in a worker thread (``soakd-generate``) so that a
generator that stops answering is detected: no return within ``response_timeout_s`` is a
``stall`` event and ends the run as aborted ("stalled"), never a hang.

Per request a ``frames`` row holds the request time (``t_dispatch``), the generator's own
``pre_ms`` / ``infer_ms`` (e.g. denoise steps) / ``decode_ms`` (e.g. VAE decode) where it
reports them, ``first_emit_ms`` (request -> first emitted frame) and ``emitted``;
``total_ms`` is grab + the request's wall time (request -> return).

Every emitted frame gets an ``emissions`` row (stamped by ``emitting.Emitted``, shared with
the rollout driver). ``emit(n)`` hands over a chunk of ``n`` frames at time T: each of its
frames has ``t_emit = T`` (when it truly became available), ``chunk_frames = n`` and
``chunk_ms`` = T - the previous emission of the request (or the request time for its first
chunk). ``interval_ms`` is **amortised**: the gap since the
previous emission divided by ``n``, so a chunk of 4 frames that took 200 ms gives four
50 ms intervals. That is the per-frame cadence a player spreading the chunk evenly sees, and
the intervals of a request sum to its generation time after the first chunk; zero intervals
inside a chunk would instead make the median meaningless. The first chunk of every request
has ``interval_ms`` NULL: its time is the request's first-frame latency (``first_emit_ms``),
a one-time cost kept apart from the intervals. Generators with one chunk per request
therefore have no intervals; give them ``chunks_per_request >= 2`` (or emit frame by frame),
or run them as a rollout (``rollout.py``: one session, intervals continuous across chunks).
The summary's ``first_output_ms`` is the first request's first-frame latency.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from soakd.records import Frame
from soakd.run.drivers.context import DriverContext
from soakd.run.drivers.emitting import EmitStats, Emitted, record_error
from soakd.run.drivers.session import response_timeout_s
from soakd.workloads.base import GeneratorWorkload


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


class _GeneratorDriver:
    def __init__(self, ctx: DriverContext[GeneratorWorkload]) -> None:
        self.ctx = ctx
        self.timeout_ns = int(response_timeout_s(ctx) * 1e9)
        self.worker = _Worker(ctx)
        self.stats = EmitStats("generator_requests")
        self.first = True

    def _emit_fn(self, req: Emitted) -> Any:
        now, to_s = self.ctx.clock.now_ns, self.ctx.s

        def emit(n: int) -> None:
            t = now()
            req.stamp(t, int(n), to_s(t))

        return emit

    def request(self, frame: Frame, qlen: int) -> bool:
        """Run one request; False when the generator stalled (the run is ending)."""
        ctx, c = self.ctx, self.ctx.counters
        clock = ctx.clock
        t_req = clock.now_ns()
        warm = frame.t_capture_ns < ctx.warmup_end_ns or self.first
        req = Emitted(frame.id, t_req, warm)
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

    def _record(self, frame: Frame, qlen: int, req: Emitted, t_req: int, t_done: int) -> None:
        ctx, c = self.ctx, self.ctx.counters
        timings, exc = self.worker.result, self.worker.error
        error = None if exc is None else record_error(ctx, exc, frame.id)
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
            first_emit_ms=req.first_emit_ms,
            emitted=req.idx,
            extra=getattr(timings, "extra", None),
        )
        if self.first:
            self.stats.first_output_ms = req.first_emit_ms
            ctx.first_done(t_done)
        self.first = False
        for e in req.rows:
            ctx.emit(e)
        ctx.sink.add(rec)
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

"""The rollout driver: one long session per run (Matrix-Game's causal KV rollout).

``workload.rollout(run)`` runs once, in a worker thread (``soakd-rollout``), and pulls
its conditioning from the ``RolloutRun`` soakd hands it (``_Session`` here):

* ``run.next_condition()`` ends the chunk in progress and starts the next one: the newest
  paced frame (older ones are dropped, counted by the queue) with the chunk's action from
  ``workload.conditions`` (``soakd.workloads.conditions``, cycled); it waits for the pacer's
  next tick when none is pending and returns None when the run is ending;
* ``run.stage(name)`` times a named stage of the chunk, ``workload.sync()`` (CUDA
  synchronize) at its end; a name that repeats in a chunk adds up;
* ``run.emit(n)``: n generated frames of the chunk are out now.

Each chunk is a ``frames`` row: its condition's frame times, ``t_dispatch`` = the chunk's
start, ``total_ms`` = its wall time, ``first_emit_ms`` = start -> its first emit,
``emitted``, ``frame_age_ms`` = the condition's capture -> the chunk's first emitted frame
(action-to-photon; NULL when it emitted nothing) and ``extra`` = ``{"chunk", "action"}``.
Its named stages are ``chunk_stages`` rows; its frames ``emissions`` rows
(``emitting.Emitted``), with intervals continuous across chunks: only the run's very first
emission has none, and its latency from the ``rollout()`` call is the run's first output
(``first_output_ms`` in the summary). The worker records the chunks as they end.

The summary gets the ``EmitStats`` figures (``interval_ms``, the per-frame average, and
``presentation_ms``: frames as they become visible), ``interval_judged_on``
(``criteria.generator_interval``) and, when the workload counts them (an ``episodes``
int), ``rollout_episodes``: how many episodes the run was cut into. Each message of the
workload's ``setup_warnings`` (a stage its first episode never timed, allowed) is a
``missing_stage`` event at the rollout's start.

How a rollout ends: when ``next_condition`` returned None, normally; with an exception, the
run aborted with it as the reason ("rollout raised T: message", so INVALID), the chunk in
flight stored with the error; returning while the run was not ending, aborted ("rollout
ended after N chunks"); neither emitting nor asking for a condition for
``response_timeout_s`` (waiting inside ``next_condition`` does not count), a ``stall``
event and the run aborted ("stalled"), never a hang.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from soakd.records import STAGE_NAME, ChunkStage, Frame
from soakd.run.drivers.context import DriverContext
from soakd.run.drivers.emitting import EmitStats, Emitted, record_error
from soakd.run.drivers.session import response_timeout_s
from soakd.workloads.base import Condition, RolloutWorkload
from soakd.workloads.conditions import Conditions, load_conditions


@dataclass
class _Chunk:
    cond: Condition
    qlen: int
    em: Emitted
    stages: dict[str, float] = field(default_factory=dict)  # name -> ms


def _conditions(ctx: DriverContext[Any]) -> Conditions:
    """``workload.conditions`` (the workload object's, else the settings'); a workload
    kind without the setting gets no action (it conditions itself)."""
    for holder in (ctx.workload, ctx.settings.workload):
        spec = getattr(holder, "conditions", None)
        if isinstance(spec, str):
            return load_conditions(spec)
    return Conditions("none")


class _Session:
    """The ``RolloutRun`` handed to the workload; its methods run in the worker thread."""

    def __init__(self, ctx: DriverContext[RolloutWorkload], conditions: Conditions) -> None:
        self.ctx = ctx
        self.conditions = conditions
        self.stats = EmitStats("rollout_chunks")
        self.lock = threading.Lock()
        self.chunk: _Chunk | None = None
        self.index = 0
        self.waiting = False  # inside next_condition, for the pacer
        self.ending = False  # next_condition returned None
        self.closed = False  # the driver gave up on the rollout: nothing more is recorded
        self.t_start_ns = ctx.clock.now_ns()
        self.last_active_ns = self.t_start_ns
        self.prev_emit_ns: int | None = None
        self._frames: Iterator[tuple[Frame, int]] = ctx.frames(0.1)

    # --- the RolloutRun protocol
    def next_condition(self) -> Condition | None:
        self.end_chunk()
        got = self._next_frame()
        now = self.ctx.clock.now_ns()
        with self.lock:
            self.last_active_ns = now
            if got is None or self.closed:
                self.ending = True
                return None
            frame, qlen = got
            cond = Condition(frame, self.index, self.conditions.action(self.index))
            warm = frame.t_capture_ns < self.ctx.warmup_end_ns or self.index == 0
            em = Emitted(frame.id, now, warm, prev_ns=self.prev_emit_ns)
            self.chunk = _Chunk(cond, qlen, em)
            self.index += 1
            c = self.ctx.counters
            c.dispatched += 1
            c.in_flight_since_ns = now
        return cond

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if not isinstance(name, str) or not STAGE_NAME.fullmatch(name):
            raise ValueError(f"run.stage({name!r}): a stage name is [a-z0-9_]+ (at most 64)")
        chunk = self._current("stage")
        clock = self.ctx.clock
        t0 = clock.now_ns()
        try:
            yield
        except BaseException:
            chunk.stages[name] = chunk.stages.get(name, 0.0) + (clock.now_ns() - t0) / 1e6
            raise
        self.ctx.workload.sync()
        chunk.stages[name] = chunk.stages.get(name, 0.0) + (clock.now_ns() - t0) / 1e6

    def emit(self, n: int) -> None:
        chunk = self._current("emit")
        t = self.ctx.clock.now_ns()
        before = chunk.em.idx
        chunk.em.stamp(t, int(n), self.ctx.s(t))
        if chunk.em.idx > before:
            with self.lock:
                self.last_active_ns = t
                self.prev_emit_ns = t
                if self.stats.first_output_ms is None:
                    self.stats.first_output_ms = (t - self.t_start_ns) / 1e6

    # --- the harness side
    def _current(self, what: str) -> _Chunk:
        chunk = self.chunk
        if chunk is None:
            raise RuntimeError(f"run.{what}() outside a chunk: call run.next_condition() first")
        return chunk

    def _next_frame(self) -> tuple[Frame, int] | None:
        """The next paced frame, waiting for it; None when the run is ending."""
        ctx = self.ctx
        with self.lock:
            self.waiting = True
        try:
            if self.closed or ctx.budget_spent():
                return None
            return next(self._frames, None)
        except Exception as exc:  # the source ended under an unpaced run (reported by it)
            if not ctx.stop.is_set():
                ctx.request_abort(f"source failed: {type(exc).__name__}: {exc}")
            return None
        finally:
            with self.lock:
                self.waiting = False

    def end_chunk(self, error: str | None = None) -> None:
        """Record the chunk in progress (if any): its row, emissions and named stages."""
        with self.lock:
            chunk, self.chunk = self.chunk, None
            if chunk is None or self.closed:
                return
            self._record(chunk, self.ctx.clock.now_ns(), error)

    def _record(self, chunk: _Chunk, t_end: int, error: str | None) -> None:
        ctx, c, em, frame = self.ctx, self.ctx.counters, chunk.em, chunk.cond.frame
        rec = ctx.record(
            frame,
            chunk.qlen,
            em.t_start_ns,
            t_done=ctx.s(t_end),
            total_ms=(t_end - em.t_start_ns) / 1e6,
            e2e_ms=(t_end - frame.t_sched_ns) / 1e6,
            error=error,
            first=chunk.cond.index == 0,
            warmup=em.warmup,
            first_emit_ms=em.first_emit_ms,
            emitted=em.idx,
            extra={"chunk": chunk.cond.index, "action": chunk.cond.action},
            # a chunk's age: its condition's capture -> its first frame out
            frame_age_ms=None if em.first_ns is None else (em.first_ns - frame.t_capture_ns) / 1e6,
        )
        for e in em.rows:
            ctx.emit(e)
        for name, ms in chunk.stages.items():
            ctx.emit(ChunkStage(frame.id, name, ms))
        if chunk.cond.index == 0:
            ctx.first_done(t_end)
        ctx.sink.add(rec)
        self.stats.add(em, rec)
        c.in_flight_since_ns = None
        c.last_done_ns = t_end
        c.done += 1

    def idle_ns(self, now: int) -> int | None:
        """How long the rollout has neither emitted nor asked for a condition (None while
        it waits for the pacer inside next_condition)."""
        with self.lock:
            return None if self.waiting else now - self.last_active_ns

    def started(self, t_ns: int) -> None:
        """``rollout()`` is being called now: the first output is counted from here."""
        with self.lock:
            self.t_start_ns = self.last_active_ns = t_ns

    def close(self) -> None:
        with self.lock:
            self.closed = True


class _Worker:
    """The ``soakd-rollout`` thread: ``workload.rollout(session)``, once."""

    def __init__(self, ctx: DriverContext[RolloutWorkload], session: _Session) -> None:
        self.ctx, self.session = ctx, session
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="soakd-rollout", daemon=True)

    def _run(self) -> None:
        self.session.started(self.ctx.clock.now_ns())
        try:
            self.ctx.workload.rollout(self.session)
        except BaseException as exc:  # judged by the driver thread
            self.error = exc
        finally:
            self.done.set()


class _RolloutDriver:
    def __init__(self, ctx: DriverContext[RolloutWorkload]) -> None:
        self.ctx = ctx
        self.timeout_ns = int(response_timeout_s(ctx) * 1e9)
        self.session = _Session(ctx, _conditions(ctx))
        self.worker = _Worker(ctx, self.session)

    def run(self) -> None:
        for msg in getattr(self.ctx.workload, "setup_warnings", ()) or ():
            self.ctx.event(self.ctx.make_event("missing_stage", str(msg)))
        self.worker.thread.start()
        clock = self.ctx.clock
        while not self.worker.done.wait(0.05):
            idle = self.session.idle_ns(clock.now_ns())
            if idle is not None and idle > self.timeout_ns:
                self._stall()
                return
        self._ended()

    def _stall(self) -> None:
        ctx, s = self.ctx, self.session
        chunk = s.chunk
        fid = chunk.cond.frame.id if chunk is not None else None
        where = f" (chunk {chunk.cond.index})" if chunk is not None else ""
        msg = (
            f"rollout neither emitted nor asked for a condition within "
            f"{self.timeout_ns / 1e9:g} s{where}"
        )
        s.close()
        ctx.event(ctx.make_event("stall", msg, fid))
        ctx.request_abort("stalled")

    def _ended(self) -> None:
        """The rollout returned: record its last chunk and say why it ended."""
        ctx, s, exc = self.ctx, self.session, self.worker.error
        chunk = s.chunk
        fid = chunk.cond.frame.id if chunk is not None else None
        error = None if exc is None else record_error(ctx, exc, fid)
        s.end_chunk(error)
        if error is not None:
            ctx.request_abort(f"rollout raised {error}")
        elif not s.ending and not ctx.stop.is_set():
            ctx.request_abort(f"rollout ended after {s.index} chunks")

    def finish(self) -> None:
        self.session.close()
        self.ctx.counters.in_flight_since_ns = None
        summary = self.ctx.summary
        summary.update(self.session.stats.summary())
        summary["interval_judged_on"] = self.ctx.settings.criteria.generator_interval
        episodes = getattr(self.ctx.workload, "episodes", None)
        if isinstance(episodes, int):
            summary["rollout_episodes"] = episodes


def drive(ctx: DriverContext[RolloutWorkload]) -> None:
    d = _RolloutDriver(ctx)
    try:
        d.run()
    finally:
        d.finish()

"""The session driver: push paced frames into a realtime session and poll its outputs.

Two threads share the work, as a real client of such a model does: the driver thread takes
frames from the queue and pushes them (``workload.push``), a poller thread
(``soakd-session-poll``) calls ``workload.poll`` and stamps each output on the run's clock.

What soakd can truly see is recorded per pushed frame: the push time (``t_dispatch``, so
``frame_age_ms`` = push - capture), the drops the session reports (``session_dropped``,
cumulative) and its pending frames, and, once the next output after the push arrives, that
output's kind (``text`` or ``silence``; control-only chunks are counted but not matched) and
the latency from the frame's capture to it (``output_latency_ms``; ``t_done`` is the output's
time, so ``e2e_ms`` = output - scheduled capture). The stages the model hides stay NULL.
A frame's row is written when its output arrives (or, at the end of the run, without one).

A session that produces no output for ``response_timeout_s`` while frames wait for one is
recorded as a ``stall`` event and ends the run as aborted ("stalled"); it never hangs the run.
The run summary gets ``session_outputs`` (per kind), ``silence_ratio`` (silence / (silence +
text) outputs), ``session_dropped`` and ``session_pending_max``.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from soakd.records import Frame, FrameRecord
from soakd.run.drivers.context import DriverContext
from soakd.workloads.base import SessionWorkload

#: frames awaiting an output beyond this are written without one (bounded memory)
MAX_AWAITING = 4096


def workload_setting(ctx: DriverContext[Any], name: str, default: float) -> float:
    """A timing setting from the workload object (users' own workloads may carry one), else
    from the ``[workload]`` settings, else ``default``."""
    for holder in (ctx.workload, ctx.settings.workload):
        value = getattr(holder, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return default


def response_timeout_s(ctx: DriverContext[Any]) -> float:
    """The workload's ``response_timeout_s`` when it has one, else the run's stall timeout."""
    return workload_setting(ctx, "response_timeout_s", float(ctx.settings.run.stall_timeout_s))


@dataclass(slots=True)
class _Awaiting:
    rec: FrameRecord
    push_ns: int
    capture_ns: int
    sched_ns: int


class _Poller:
    """The ``soakd-session-poll`` thread: polls outputs, stamps them, hands them over."""

    def __init__(self, ctx: DriverContext[SessionWorkload], timeout_s: float) -> None:
        self.ctx = ctx
        self.timeout_s = timeout_s
        self.out: queue.SimpleQueue[tuple[int, list[Any]]] = queue.SimpleQueue()
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="soakd-session-poll", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, join_s: float = 2.0) -> None:
        self.halt.set()
        self.thread.join(join_s)

    def _loop(self) -> None:
        wl, now, halt = self.ctx.workload, self.ctx.clock.now_ns, self.halt
        try:
            while not halt.is_set():
                outputs = wl.poll(self.timeout_s)
                if outputs:
                    self.out.put((now(), list(outputs)))
        except BaseException as exc:  # reported by the driver thread, which ends the run
            self.error = exc


class _SessionDriver:
    def __init__(self, ctx: DriverContext[SessionWorkload]) -> None:
        self.ctx = ctx
        self.timeout_ns = int(response_timeout_s(ctx) * 1e9)
        self.awaiting: deque[_Awaiting] = deque()
        self.last_output_ns: int | None = None
        self.outputs = {"text": 0, "silence": 0, "control": 0}
        self.session_dropped = 0
        self.pending_max = 0
        self.pushed = 0
        self.first = True
        self.sample_output: str | None = None

    # --- records
    def _record(self, frame: Frame, qlen: int, t_push: int) -> FrameRecord:
        ctx = self.ctx
        warm = frame.t_capture_ns < ctx.warmup_end_ns or self.first
        return ctx.record(frame, qlen, t_push, first=self.first, warmup=warm)

    def finish(self, a: _Awaiting, t_out: int | None, kind: str | None) -> None:
        c = self.ctx.counters
        if t_out is not None:
            a.rec.t_done = self.ctx.s(t_out)
            a.rec.output_kind = kind
            a.rec.output_latency_ms = (t_out - a.capture_ns) / 1e6
            a.rec.e2e_ms = (t_out - a.sched_ns) / 1e6
            c.last_done_ns = t_out
        c.done += 1
        self.ctx.emit(a.rec)

    def _update_in_flight(self) -> None:
        self.ctx.counters.in_flight_since_ns = self.awaiting[0].push_ns if self.awaiting else None

    # --- outputs
    def drain(self, poller: _Poller) -> None:
        while True:
            try:
                t_out, outputs = poller.out.get_nowait()
            except queue.Empty:
                break
            self._take(t_out, outputs)
        self._update_in_flight()

    def _take(self, t_out: int, outputs: list[Any]) -> None:
        kind: str | None = None
        for o in outputs:
            k = o.kind if o.kind in self.outputs else "control"
            self.outputs[k] += 1
            if kind is None and k != "control":
                kind = k
                if k == "text" and self.sample_output is None:
                    self.sample_output = str(o.text)[:500]
        self.last_output_ns = t_out
        if kind is None:
            return
        aw = self.awaiting
        while aw and aw[0].push_ns <= t_out:
            self.finish(aw.popleft(), t_out, kind)

    # --- frames
    def push(self, frame: Frame, qlen: int) -> None:
        ctx, c = self.ctx, self.ctx.counters
        t_push = ctx.clock.now_ns()
        rec = self._record(frame, qlen, t_push)
        self.first = False
        c.dispatched += 1
        try:
            res = ctx.workload.push(frame)
        except Exception as exc:
            rec.error = f"{type(exc).__name__}: {exc}"[:2000]
            c.errors += 1
            ctx.event(ctx.make_event("error", rec.error, frame.id))
            self.finish(_Awaiting(rec, t_push, frame.t_capture_ns, frame.t_sched_ns), None, None)
            return
        self.pushed += 1
        if res.dropped:
            self.session_dropped += 1
        rec.session_dropped = self.session_dropped
        rec.pending = res.pending
        if res.pending is not None:
            self.pending_max = max(self.pending_max, res.pending)
        self.awaiting.append(_Awaiting(rec, t_push, frame.t_capture_ns, frame.t_sched_ns))
        while len(self.awaiting) > MAX_AWAITING:
            self.finish(self.awaiting.popleft(), None, None)
        self._update_in_flight()

    def stalled(self, now: int) -> bool:
        """No output for the response timeout while frames wait for one."""
        if not self.awaiting:
            return False
        since = self.awaiting[0].push_ns
        if self.last_output_ns is not None and self.last_output_ns > since:
            since = self.last_output_ns
        return now - since > self.timeout_ns

    def report_stall(self, now: int) -> None:
        ctx = self.ctx
        waited = (now - self.awaiting[0].push_ns) / 1e9
        msg = (
            f"session produced no output for {self.timeout_ns / 1e9:g} s "
            f"({len(self.awaiting)} frame(s) waiting, oldest pushed {waited:.1f} s ago)"
        )
        ctx.event(ctx.make_event("stall", msg, self.awaiting[0].rec.frame_id))
        ctx.request_abort("stalled")

    def summarise(self) -> None:
        o = self.outputs
        said = o["text"] + o["silence"]
        self.ctx.summary.update(
            {
                "session_frames_pushed": self.pushed,
                "session_outputs": dict(o),
                "silence_ratio": round(o["silence"] / said, 6) if said else None,
                "session_dropped": self.session_dropped,
                "session_pending_max": self.pending_max,
            }
        )
        if self.sample_output is not None:
            self.ctx.summary["sample_output"] = self.sample_output


def _start(ctx: DriverContext[SessionWorkload]) -> bool:
    try:
        ctx.workload.start()
    except Exception as exc:
        msg = f"session failed to start: {type(exc).__name__}: {exc}"
        ctx.event(ctx.make_event("error", msg))
        ctx.request_abort(msg)
        return False
    return True


def drive(ctx: DriverContext[SessionWorkload]) -> None:
    if not _start(ctx):
        return
    d = _SessionDriver(ctx)
    poll_s = workload_setting(ctx, "poll_timeout_s", 0.05)
    poller = _Poller(ctx, poll_s)
    poller.start()
    now = ctx.clock.now_ns
    budget = ctx.max_frames
    try:
        while not ctx.stop.is_set():
            pushing = budget is None or d.pushed < budget
            if pushing:
                got = ctx.next_frame(0.05)
            else:  # frame budget spent: only wait for the outputs
                got = None
                ctx.stop.wait(0.02)
            d.drain(poller)
            if poller.error is not None:
                exc = poller.error
                msg = f"session poll failed: {type(exc).__name__}: {exc}"
                ctx.event(ctx.make_event("error", msg))
                ctx.request_abort(msg)
                break
            if d.stalled(now()):
                d.report_stall(now())
                break
            if got is not None:
                d.push(*got)
            elif pushing and ctx.queue is not None and ctx.queue.closed:
                break
            if not pushing and not d.awaiting:
                break  # frame budget spent and every pushed frame answered
    finally:
        poller.stop(min(2.0, poll_s * 4 + 0.5))
        d.drain(poller)
        while d.awaiting:
            d.finish(d.awaiting.popleft(), None, None)
        ctx.counters.in_flight_since_ns = None
        d.summarise()

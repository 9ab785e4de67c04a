"""The session driver: push paced frames into a realtime session and poll its outputs.

Two threads share the work, as a real client of such a model does: the driver thread takes
frames from the queue and pushes them (``workload.push``), a poller thread
(``soakd-session-poll``) calls ``workload.poll`` and stamps each output on the run's clock.

What soakd can truly see is recorded per pushed frame: the push time (``t_dispatch``, so
``frame_age_ms`` = push - capture), the drops the session reports (``session_dropped``,
cumulative) and its pending frames, and, once the next output after the push arrives, that
output's kind (``text`` or ``silence``; control-only chunks are counted but not matched) and
the latency from the frame's capture to it (``output_latency_ms``; ``t_done`` is the output's
time, so ``e2e_ms`` = output - scheduled capture). While the model keeps talking that output
is just its next token, so a workload with ``consumed()`` (the built-in one, over a
``queue.Queue`` frame queue) also gives when the model took the frame (``t_consumed``),
``consume_ms`` (push -> taken) and ``consume_output_ms`` (taken -> the model's first output
after it: the frame's own processing). A workload with ``stages()`` (the built-in one, whose
hooks time the processor call, the model steps and the detokenisation) gives each frame it
took ``pre_ms``, ``infer_ms`` and ``decode_ms``, so the stage table and the jitter rule
(k x the infer median) apply to session runs; without it they stay NULL. A frame's row is
written once those are known (or, at the end of the run, without them). Outputs the session
loop inserted itself (``SessionOutput.inserted``: a ``<|silence|>`` added because a question
and frames arrived together) are counted apart (``session_inserted``): never a frame's next
output, never in the silence ratio.

**Pacing baseline.** A busy-waiting generation thread holding the GIL makes soakd's own
threads (pacer, poller, sampler) late. Before it starts the session the driver measures what
this machine shows without the model thread: ``BASELINE_S`` (at most ``run.warmup_s``, so the
judged window loses nothing) of ticks every ``PROBE_PERIOD_NS`` waited for with the pacer's
own ``clock.sleep_until``, with the pacer, sampler and writer already running. Their
lateness goes into the summary as ``pacing_baseline``; the diagnosis compares the pacer's
lateness over the measured frames with it.

``questions`` (the workload's ``(at_s, text)`` pairs) are pushed with ``workload.ask`` at
``at_s`` seconds after the driver starts; each one's answer latency is the time to the first
text chunk after the push (``question``/``answer`` events, ``session_questions`` in the
summary).

A session that produces no output for ``response_timeout_s`` while frames wait for one is
recorded as a ``stall`` event and ends the run as aborted ("stalled"); it never hangs the run.
A ``SessionFailed`` from push or poll (the generation thread died) ends it as aborted with
the cause as the reason. The run summary gets ``session_outputs`` (per kind),
``silence_ratio`` (silence / (silence + text) outputs), ``session_dropped``,
``session_pending_max`` and ``session_consumed``.
"""

from __future__ import annotations

import queue
import threading
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from soakd.records import Frame, FrameRecord, error_text, safe_text
from soakd.run.drivers.context import DriverContext
from soakd.workloads.base import Consumed, FrameStages, SessionFailed, SessionWorkload

#: frames awaiting an output beyond this are written without one (bounded memory)
MAX_AWAITING = 4096
#: the latest outputs' times kept to match a consume reported after them
RECENT_OUTPUTS = 1024
#: the pacing baseline: this long (at most run.warmup_s) of ticks this far apart
BASELINE_S = 0.5
PROBE_PERIOD_NS = 10_000_000
MIN_BASELINE_TICKS = 10


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
    """A pushed frame whose row waits for its next output and, when consumes are tracked,
    for the model taking it (or dropping it) and the first output after that."""

    rec: FrameRecord
    push_ns: int
    capture_ns: int
    sched_ns: int
    answered: bool = False  # the next output after the push arrived
    consumed_ns: int | None = None
    settled: bool = False  # dropped by the session, or taken and followed by an output


@dataclass(slots=True)
class _Question:
    at_s: float
    text: str
    asked_ns: int | None = None
    answer_ms: float | None = None
    answer: str | None = None

    def as_dict(self, t0_ns: int) -> dict[str, Any]:
        asked = None if self.asked_ns is None else round((self.asked_ns - t0_ns) / 1e9, 6)
        return {
            "at_s": self.at_s,
            "text": self.text,
            "t_asked": asked,
            "answer_ms": self.answer_ms,
            "answer": self.answer,
        }


@dataclass(slots=True)
class _Questions:
    """The question schedule: asks each one when due, times its first text chunk."""

    todo: deque[_Question]
    open: list[_Question] = field(default_factory=list)
    done: list[_Question] = field(default_factory=list)

    def due(self, elapsed_s: float) -> _Question | None:
        return self.todo.popleft() if self.todo and self.todo[0].at_s <= elapsed_s else None

    def text_at(self, t_ns: int, text: str) -> list[_Question]:
        """The open questions a text chunk at ``t_ns`` answers."""
        hit = [q for q in self.open if q.asked_ns is not None and q.asked_ns <= t_ns]
        for q in hit:
            q.answer_ms = (t_ns - q.asked_ns) / 1e6  # type: ignore[operator]
            q.answer = text[:200]
            self.open.remove(q)
        return hit


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
        wl: Any = ctx.workload
        self.timeout_ns = int(response_timeout_s(ctx) * 1e9)
        self.awaiting: deque[_Awaiting] = deque()
        self.by_id: dict[int, _Awaiting] = {}
        # the latest outputs: when the session made each (put it; else when soakd got it)
        # and when soakd got it
        self.recent: deque[int] = deque(maxlen=RECENT_OUTPUTS)
        self.recent_got: deque[int] = deque(maxlen=RECENT_OUTPUTS)
        self.last_output_ns: int | None = None
        self.outputs = {"text": 0, "silence": 0, "control": 0}
        self.inserted = {"text": 0, "silence": 0, "control": 0}  # put by the loop itself
        self.session_dropped = 0
        self.pending_max = 0
        self.pushed = 0
        self.consumed = 0
        self.first = True
        self.sample_output: str | None = None
        fn = getattr(wl, "consumed", None)
        self.consumed_fn = fn if callable(fn) and fn() is not None else None
        fn = getattr(wl, "stages", None)
        self.stages_fn = fn if callable(fn) and fn() is not None else None
        self.staged = 0
        asks = [_Question(float(at), str(text)) for at, text in getattr(wl, "questions", ())]
        self.questions = _Questions(deque(asks))
        self.t_start_ns = ctx.clock.now_ns()

    # --- records
    def _record(self, frame: Frame, qlen: int, t_push: int) -> FrameRecord:
        ctx = self.ctx
        warm = frame.t_capture_ns < ctx.warmup_end_ns or self.first
        return ctx.record(frame, qlen, t_push, first=self.first, warmup=warm)

    def finish(self, a: _Awaiting) -> None:
        self.by_id.pop(a.rec.frame_id, None)
        if not a.rec.warmup and a.capture_ns < self.ctx.warmup_end_ns:
            a.rec = a.rec._replace(warmup=True)  # pushed while the first frame was in flight
        self.ctx.counters.done += 1
        self.ctx.sink.add(a.rec)

    def _answer(self, a: _Awaiting, t_out: int, kind: str) -> None:
        """The next output after the push: what ``output_latency_ms`` and ``t_done`` time."""
        a.answered = True
        if a.rec.first:
            self.ctx.first_done(t_out)
        a.rec = a.rec._replace(
            t_done=self.ctx.s(t_out),
            output_kind=kind,
            output_latency_ms=(t_out - a.capture_ns) / 1e6,
            e2e_ms=(t_out - a.sched_ns) / 1e6,
        )
        self.ctx.counters.last_done_ns = t_out

    def _settle(self, a: _Awaiting, t_out: int) -> None:
        """The first output after the model took the frame."""
        assert a.consumed_ns is not None
        a.rec = a.rec._replace(consume_output_ms=(t_out - a.consumed_ns) / 1e6)
        a.settled = True

    def _flush(self) -> None:
        """Write the rows at the front whose outputs (and consume, when tracked) are known."""
        aw, tracked = self.awaiting, self.consumed_fn is not None
        while aw and aw[0].answered and (aw[0].settled or not tracked):
            self.finish(aw.popleft())
        self.ctx.counters.in_flight_since_ns = aw[0].push_ns if aw else None

    # --- outputs and consumes
    def drain(self, poller: _Poller) -> None:
        if self.consumed_fn is not None:
            for c in self.consumed_fn() or ():
                self._consume(c)
        while True:
            try:
                t_out, outputs = poller.out.get_nowait()
            except queue.Empty:
                break
            self._take(t_out, outputs)
        # after the outputs: a frame's stages are recorded before the output that settles it
        if self.stages_fn is not None:
            for st in self.stages_fn() or ():
                self._stages(st)
        self._flush()

    def _stages(self, st: FrameStages) -> None:
        a = self.by_id.get(st.frame_id)
        if a is None:
            return
        self.staged += 1
        a.rec = a.rec._replace(pre_ms=st.pre_ms, infer_ms=st.infer_ms, decode_ms=st.decode_ms)

    def _consume(self, c: Consumed) -> None:
        a = self.by_id.get(c.frame_id)
        if a is None:
            return
        if c.dropped:  # the session dropped it: never taken by the model
            a.settled = True
            return
        self.consumed += 1
        a.consumed_ns = c.t_ns
        a.rec = a.rec._replace(t_consumed=self.ctx.s(c.t_ns), consume_ms=(c.t_ns - a.push_ns) / 1e6)
        k = bisect_left(self.recent, c.t_ns)  # an output already taken, made after it
        if k < len(self.recent):
            self._settle(a, self.recent_got[k])

    def _take(self, t_out: int, outputs: list[Any]) -> None:
        """Outputs soakd got at ``t_out``: each answers the pushes, and settles the takes,
        made before it (by when the session put it, when known: soakd may get an output
        after a take that followed it); latencies are to ``t_out``."""
        kind: str | None = None
        made = t_out
        for o in outputs:
            k = o.kind if o.kind in self.outputs else "control"
            if getattr(o, "inserted", False):  # the loop's own, not the model's: no answer
                self.inserted[k] += 1
                continue
            self.outputs[k] += 1
            if k == "text":
                self._answers(t_out, str(o.text))
            if kind is None and k != "control":
                kind = k
                made = min(t_out, getattr(o, "t_made_ns", None) or t_out)
                if k == "text" and self.sample_output is None:
                    self.sample_output = str(o.text)[:500]
        self.last_output_ns = t_out
        if kind is None:
            return
        self.recent.append(made)
        self.recent_got.append(t_out)
        for a in self.awaiting:
            if not a.answered and a.push_ns <= made:
                self._answer(a, t_out, kind)
            if not a.settled and a.consumed_ns is not None and a.consumed_ns <= made:
                self._settle(a, t_out)

    # --- questions
    def _answers(self, t_out: int, text: str) -> None:
        ctx = self.ctx
        for q in self.questions.text_at(t_out, text):
            msg = f"first text {q.answer_ms:.1f} ms after the question: {text[:80]!r}"
            ctx.event(ctx.make_event("answer", msg, data=q.as_dict(ctx.t0_ns)))

    def ask_due(self) -> None:
        """Push every question whose time has come (``workload.ask``)."""
        ctx, qs = self.ctx, self.questions
        while (q := qs.due((ctx.clock.now_ns() - self.t_start_ns) / 1e9)) is not None:
            q.asked_ns = ctx.clock.now_ns()
            qs.done.append(q)
            try:
                ctx.workload.ask(q.text)  # type: ignore[attr-defined]
            except Exception as exc:
                ctx.event(ctx.make_event("error", f"question not pushed: {exc!r}"[:2000]))
                continue
            qs.open.append(q)
            ctx.event(ctx.make_event("question", q.text[:500], data={"at_s": q.at_s}))

    # --- frames
    def push(self, frame: Frame, qlen: int) -> bool:
        """Push one frame; False when the session died (the run is being aborted)."""
        ctx, c = self.ctx, self.ctx.counters
        t_push = ctx.clock.now_ns()
        rec = self._record(frame, qlen, t_push)
        self.first = False
        c.dispatched += 1
        a = _Awaiting(rec, t_push, frame.t_capture_ns, frame.t_sched_ns)
        try:
            res = ctx.workload.push(frame)
        except Exception as exc:
            failed = isinstance(exc, SessionFailed)
            error = safe_text(str(exc))[:2000] if failed else error_text(exc)
            a.rec = rec._replace(error=error)
            c.errors += 1
            ctx.event(ctx.make_event("error", error, frame.id))
            self.finish(a)
            if failed:
                ctx.request_abort(error)
            return not failed
        self.pushed += 1
        if res.dropped:
            self.session_dropped += 1
        a.rec = rec._replace(session_dropped=self.session_dropped, pending=res.pending)
        if res.pending is not None:
            self.pending_max = max(self.pending_max, res.pending)
        self.awaiting.append(a)
        self.by_id[frame.id] = a
        while len(self.awaiting) > MAX_AWAITING:
            self.finish(self.awaiting.popleft())
        self._flush()
        return True

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
        s = self.ctx.summary
        s.update(
            {
                "session_frames_pushed": self.pushed,
                "session_outputs": dict(o),
                "silence_ratio": round(o["silence"] / said, 6) if said else None,
                "session_dropped": self.session_dropped,
                "session_pending_max": self.pending_max,
                "session_consumed": self.consumed if self.consumed_fn is not None else None,
                "session_inserted": dict(self.inserted),
                "session_staged": self.staged if self.stages_fn is not None else None,
            }
        )
        if self.questions.done or self.questions.todo:
            t0 = self.ctx.t0_ns
            s["session_questions"] = [q.as_dict(t0) for q in self.questions.done]
            s["session_questions_not_asked"] = len(self.questions.todo)
        if self.sample_output is not None:
            s["sample_output"] = self.sample_output


def _start(ctx: DriverContext[SessionWorkload]) -> bool:
    try:
        ctx.workload.start()
    except Exception as exc:
        msg = f"session failed to start: {type(exc).__name__}: {exc}"
        ctx.event(ctx.make_event("error", msg))
        ctx.request_abort(msg)
        return False
    return True


def _poll_failed(ctx: DriverContext[SessionWorkload], exc: BaseException) -> None:
    """End the run on a poll that raised, naming the cause (``SessionFailed`` names it)."""
    msg = str(exc) if isinstance(exc, SessionFailed) else f"session poll failed: {exc!r}"
    ctx.event(ctx.make_event("error", msg[:2000]))
    ctx.request_abort(msg[:2000])


def _step(ctx: DriverContext[SessionWorkload], d: _SessionDriver, poller: _Poller) -> bool:
    """One turn of the driver loop; False when the loop must end."""
    pushing = ctx.max_frames is None or d.pushed < ctx.max_frames
    if pushing:
        got = ctx.next_frame(0.05)
    else:  # frame budget spent: only wait for the outputs
        got = None
        ctx.stop.wait(0.02)
    d.drain(poller)
    if poller.error is not None:
        _poll_failed(ctx, poller.error)
        return False
    now = ctx.clock.now_ns()
    if d.stalled(now):
        d.report_stall(now)
        return False
    d.ask_due()
    if got is not None:
        return d.push(*got)
    if pushing and ctx.queue is not None and ctx.queue.closed:
        return False
    return pushing or bool(d.awaiting)  # budget spent: wait until every frame is answered


def pacing_baseline(ctx: DriverContext[Any]) -> dict[str, Any] | None:
    """Lateness of ticks waited for with the pacer's ``clock.sleep_until``, every
    ``PROBE_PERIOD_NS`` for ``BASELINE_S`` (at most ``run.warmup_s``), before the model
    thread starts: what this machine shows without it. None for an unpaced run; no
    ``p95_ms`` when the warm-up is too short for ``MIN_BASELINE_TICKS``."""
    if ctx.queue is None:
        return None
    span_ns = int(min(BASELINE_S, float(ctx.settings.run.warmup_s)) * 1e9)
    n = span_ns // PROBE_PERIOD_NS
    out: dict[str, Any] = {"ticks": 0, "period_ms": PROBE_PERIOD_NS / 1e6}
    if n < MIN_BASELINE_TICKS:
        out["note"] = (
            f"not measured: run.warmup_s < {MIN_BASELINE_TICKS * PROBE_PERIOD_NS / 1e9:g} s"
        )
        return out
    clock, late = ctx.clock, []
    t = clock.now_ns()
    for k in range(1, n + 1):
        deadline = t + k * PROBE_PERIOD_NS
        if not clock.sleep_until(deadline, ctx.stop):
            break
        late.append((clock.now_ns() - deadline) / 1e6)
    if len(late) < MIN_BASELINE_TICKS:
        return out
    y = np.asarray(late)
    p50, p95, p99 = (round(float(v), 4) for v in np.percentile(y, (50, 95, 99)))
    return out | {"ticks": y.size, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
                  "max_ms": round(float(y.max()), 4)}  # fmt: skip


def drive(ctx: DriverContext[SessionWorkload]) -> None:
    baseline = pacing_baseline(ctx)
    if baseline is not None:
        ctx.summary["pacing_baseline"] = baseline
    if not _start(ctx):
        return
    d = _SessionDriver(ctx)
    poll_s = workload_setting(ctx, "poll_timeout_s", 0.05)
    poller = _Poller(ctx, poll_s)
    poller.start()
    try:
        while not ctx.stop.is_set() and _step(ctx, d, poller):
            pass
    finally:
        poller.stop(min(2.0, poll_s * 4 + 0.5))
        d.drain(poller)
        while d.awaiting:
            d.finish(d.awaiting.popleft())
        ctx.counters.in_flight_since_ns = None
        d.summarise()

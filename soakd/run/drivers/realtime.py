"""The realtime driver (``kind = "realtime"``): paced frames into a WebSocket session,
questions on a schedule, every turn timed.

Rows (``frames``): one per frame the socket took. ``t_dispatch`` is when soakd started
writing it, ``t_done`` when the socket had taken it, ``frame_age_ms`` dispatch - capture.
A frame the socket could not take before a newer one came is dropped by the latest-frame
rule: no row, counted in the running ``session_dropped`` of the rows after it (the drops
criterion counts it lost). A frame the socket failed to take is a row with its error.

A question is asked about the newest frame the socket had taken, and rides on that frame's
row: ``infer_ms`` is the time to the first delta (from ``response.create`` /
``video.query``: the time to first token of a served answer), ``decode_ms`` first delta ->
done, ``out_tokens`` the usage's output tokens, ``output_latency_ms`` capture -> first delta
(how old the picture was when its answer began), ``output_kind = "text"``; ``extra`` holds
the turn's numbers (delta intervals p50/p95/max, the per-token interval, frame age at the
question, audio seconds, real-time factor and underruns). A turn that failed (closed,
timed out, malformed, refused) is the row's ``error``. Each turn is also a ``turn`` event.

The session's life is events: ``reconnect`` (with the gap and the handshake's cost),
``session_expired``, ``server_closed``, ``server_error`` (with its code),
``server_unreachable`` (the run ends aborted: INVALID).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from soakd.records import Frame, FrameRecord
from soakd.run.drivers.context import DriverContext, StreamCounters
from soakd.run.queue import StreamQueues
from soakd.workloads.realtime.client import SERVER_TURN_EVENT

#: rows held at most while their frame's turn is open (older ones are written as they are)
MAX_HELD = 64
#: the driver's wait for a frame: at least the first, at most the second, else until the
#: next question is due (a frame wakes it sooner). Each wake costs CPU (issue 34): a 10 fps
#: session woke twice a frame at a fixed 50 ms
WAIT_S = (0.05, 0.25)


@dataclass(slots=True)
class _Held:
    rec: FrameRecord
    turn: bool = False  # a question rides on this row: it waits for its answer


class _Driver:
    def __init__(self, ctx: DriverContext[Any]) -> None:
        self.ctx = ctx
        self.wl: Any = ctx.workload
        s = ctx.settings.workload
        self.every: float | None = getattr(s, "question_every_s", None)
        self.question: str = getattr(s, "question", "")
        self.timed = deque((float(q.at_s), q.text) for q in getattr(s, "questions", ()))
        self.t_start = ctx.clock.now_ns()
        self.next_every = self.every
        self.pending: dict[int, tuple[Frame, int]] = {}  # handed over, not yet sent
        self.held: dict[int, _Held] = {}  # sent; the newest waits for a question
        self.newest: int | None = None
        self.turn_row: int | None = None  # the row the open question rides on
        self.wanted: set[int] = set()  # rows a server turn rides on, not yet drained as sent
        self.first = True
        self.turns: list[dict[str, Any]] = []
        self.sent = 0
        # unpaced (a profile): each frame pushed, asked about and answered before the next;
        # its row's total is push -> done
        self.one_at_a_time = ctx.grab is not None

    # --- frames
    def push(self, frame: Frame, qlen: int) -> None:
        self.ctx.counters.dispatched += 1
        try:
            replaced = self.wl.push(frame)
        except Exception as exc:
            rec = self.ctx.record(frame, qlen, self.ctx.clock.now_ns(), first=self.first)
            self._error_row(rec, f"{type(exc).__name__}: {exc}"[:2000])
            return
        self.pending[frame.id] = (frame, qlen)
        if replaced is not None:
            self.pending.pop(replaced, None)

    def _error_row(self, rec: FrameRecord, error: str) -> None:
        self.ctx.counters.errors += 1
        self.ctx.event(self.ctx.make_event("error", error, rec.frame_id))
        self._finish(rec._replace(error=error))

    def _finish(self, rec: FrameRecord) -> None:
        ctx = self.ctx
        if rec.first and rec.t_done is not None:
            ctx.first_done(ctx.t0_ns + int(rec.t_done * 1e9))
        self.first = False
        ctx.counters.done += 1
        if rec.t_done is not None:
            ctx.counters.last_done_ns = ctx.t0_ns + int(rec.t_done * 1e9)
        ctx.sink.add(rec)

    def _sent(self, sent: Any) -> None:
        got = self.pending.pop(sent.frame_id, None)
        if got is None:
            return
        frame, qlen = got
        ctx = self.ctx
        warm = frame.t_capture_ns < ctx.warmup_end_ns or self.first
        rec = ctx.record(
            frame,
            qlen,
            sent.t_start_ns,
            first=self.first,
            warmup=warm,
            t_done=ctx.s(sent.t_end_ns),
            e2e_ms=(sent.t_end_ns - frame.t_sched_ns) / 1e6,
            session_dropped=self.wl.dropped,
        )
        self.first = False
        if sent.error is not None:
            self._error_row(rec, sent.error)
            return
        self.sent += 1
        self._release_newest()
        self.held[frame.id] = _Held(rec, turn=frame.id in self.wanted)
        self.wanted.discard(frame.id)
        self.newest = frame.id

    def _release_newest(self) -> None:
        """The newest row is written once a newer frame is sent, unless a turn rides on it."""
        if self.newest is not None and (h := self.held.get(self.newest)) and not h.turn:
            del self.held[self.newest]
            self._finish(h.rec)
        while len(self.held) > MAX_HELD:  # turns that never end: written as they are
            self._finish(self.held.pop(next(iter(self.held))).rec)

    # --- turns
    def ask_due(self) -> None:
        t = (self.ctx.clock.now_ns() - self.t_start) / 1e9
        texts = []
        while self.timed and self.timed[0][0] <= t:
            texts.append(self.timed.popleft()[1])
        if self.next_every is not None and t >= self.next_every:
            texts.append(self.question)
            while self.next_every <= t:
                self.next_every += self.every or 1.0
        for text in texts:
            self.ask(text, t)

    def wait_s(self) -> float:
        """How long to wait for a frame: until the next question is due, within WAIT_S."""
        t = (self.ctx.clock.now_ns() - self.t_start) / 1e9
        due = [self.timed[0][0]] if self.timed else []
        if self.next_every is not None:
            due.append(self.next_every)
        return max(WAIT_S[0], min([WAIT_S[1], *(at - t for at in due)]))

    def ask(self, text: str, t: float) -> bool:
        """Ask ``text`` about the newest frame sent (its row waits for the answer); a
        question while the previous answer is open is skipped, as an event."""
        ctx = self.ctx
        if not self.wl.ask(text):
            msg = f"question skipped: the previous answer is still open: {text[:200]!r}"
            ctx.event(ctx.make_event("question_skipped", msg))
            return False
        if self.newest is not None and self.newest in self.held:
            self.held[self.newest].turn = True
            self.turn_row = self.newest
        ctx.event(ctx.make_event("question", text[:500], data={"at_s": round(t, 3)}))
        return True

    def _turn(self, turn: Any) -> None:
        ctx = self.ctx
        m = turn.measures()
        self.turns.append(m)
        fid, self.turn_row = self.turn_row, None
        h = self.held.pop(fid, None) if fid is not None else None
        kind = "turn" if turn.error is None else "error"
        msg = (
            f"turn {turn.n}: "
            + (
                turn.error
                or f"first delta {m['ttfd_ms']} ms, done {m['done_ms']} ms, {m['tokens']} token(s)"
            )
        )[:2000]
        ctx.event(ctx.make_event(kind, msg, fid, data=m))
        if h is None:
            return
        if fid == self.newest:
            self.newest = None
        first = turn.first_ns
        rec = h.rec._replace(
            infer_ms=m["ttfd_ms"],
            decode_ms=None
            if first is None or turn.done_ns is None
            else (turn.done_ns - first) / 1e6,
            out_tokens=turn.tokens if turn.tokens is not None else (turn.text_deltas or None),
            output_kind="text" if first is not None else None,
            output_latency_ms=None
            if first is None or turn.frame_capture_ns is None
            else (first - turn.frame_capture_ns) / 1e6,
            t_done=ctx.s(turn.done_ns or turn.last_delta_ns or ctx.clock.now_ns()),
            extra=m,
        )
        if self.one_at_a_time and rec.t_done is not None and rec.t_dispatch is not None:
            rec = rec._replace(total_ms=(rec.t_done - rec.t_dispatch) * 1e3)  # push -> done
        if turn.error is not None:
            ctx.counters.errors += 1
            rec = rec._replace(error=f"turn {turn.n}: {turn.error}"[:2000])
        self._finish(rec)

    def drain(self) -> None:
        sent, turns, life = self.wl.drain()
        for kind, _msg, data in life:  # a turn the server opened rides on its frame's row
            if kind == SERVER_TURN_EVENT:
                self._server_turn(data.get("frame_id"))
        for s in sent:
            self._sent(s)
        for t in turns:
            self._turn(t)
        ctx = self.ctx
        for kind, msg, data in life:
            ctx.event(ctx.make_event(kind, msg, data=data))
        ctx.counters.in_flight_since_ns = None

    def _server_turn(self, fid: int | None) -> None:
        """The server opened a turn about frame ``fid``: its row waits for the answer (held
        now, or when the socket's taking it is drained)."""
        if fid is None:
            return
        self.turn_row = fid
        if fid in self.held:
            self.held[fid].turn = True
        else:
            self.wanted.add(fid)


def summarise(drivers: list[_Driver]) -> dict[str, Any]:
    """The run summary's ``realtime`` entry over every session (one per stream): counts
    summed, turn numbers over all their turns."""
    turns = [t for d in drivers for t in d.turns]
    ok = [t for t in turns if "error" not in t and t.get("ttfd_ms") is not None]
    codes: dict[str, int] = {}
    counts: dict[str, int] = {}
    for d in drivers:
        for k, n in d.wl.errors_by_code.items():
            codes[k] = codes.get(k, 0) + n
        for k, n in d.wl.counts.items():
            counts[k] = counts.get(k, 0) + n
    out: dict[str, Any] = {
        "protocol": drivers[0].wl.s.protocol,
        "sessions": len(drivers),
        "frames_sent": sum(d.sent for d in drivers),
        "frames_dropped_backpressure": sum(d.wl.dropped for d in drivers),
        "audio_chunks_sent": sum(d.wl.audio_sent for d in drivers),
        "audio_chunks_dropped": sum(d.wl.audio_dropped for d in drivers),
        "turns": len(turns),
        "turns_failed": len(turns) - len(ok),
        "errors_by_code": codes,
        **counts,
    }
    for key in ("ttfd_ms", "per_token_ms", "delta_p95_ms", "audio_rtf"):
        v = np.asarray([t[key] for t in ok if t.get(key) is not None], dtype=float)
        if v.size:
            out[key] = {
                "p50": round(float(np.percentile(v, 50)), 3),
                "p95": round(float(np.percentile(v, 95)), 3),
                "max": round(float(v.max()), 3),
            }
    out["underruns"] = sum(int(t.get("underruns") or 0) for t in ok)
    return out


def drive(ctx: DriverContext[Any]) -> None:
    """One session per stream: the workload's own for stream 0 and, with ``run.streams`` =
    N, N - 1 more (``RealtimeSession.another``), each driven by its own thread on its
    stream's queue, as concurrent sessions of N cameras; one summary over them all."""
    queue, counters = ctx.queue, ctx.counters
    if ctx.grab is not None:  # unpaced: a profile
        ctx.summary["realtime"] = summarise([_session(ctx, _one_answer_each)])
        return
    if not isinstance(queue, StreamQueues) or not isinstance(counters, StreamCounters):
        ctx.summary["realtime"] = summarise([_session(ctx)])
        return
    drivers: list[_Driver | None] = [None] * len(counters.parts)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        sub = replace(ctx, queue=queue.stream(i), counters=counters.parts[i])
        own: Any = None  # stream i's own session (stream 0's is the run's workload)
        try:
            if i:
                own = ctx.workload.another()
                sub = replace(sub, workload=own)
            drivers[i] = _session(sub)
        except BaseException as exc:  # a session that cannot open, or a bug: the run ends
            errors.append(exc)
            ctx.request_abort(f"stream {i}: {type(exc).__name__}: {exc}"[:2000])
            ctx.stop.set()
        finally:
            if own is not None:
                with contextlib.suppress(Exception):
                    own.close()

    threads = [threading.Thread(target=one, args=(i,), name=f"soakd-driver-{i}", daemon=True)
               for i in range(len(drivers))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [d for d in drivers if d is not None]
    if done:
        ctx.summary["realtime"] = summarise(done)


def _session(
    ctx: DriverContext[Any], loop: Callable[[DriverContext[Any], _Driver], None] | None = None
) -> _Driver:
    """One session: start it, run ``loop`` (paced frames pushed, questions on their
    schedule), drain; its driver at the end."""
    wl: Any = ctx.workload
    d = _Driver(ctx)
    try:
        wl.start()
    except Exception as exc:
        msg = f"session failed to start: {type(exc).__name__}: {exc}"
        ctx.event(ctx.make_event("error", msg))
        ctx.request_abort(msg)
        return d
    try:
        (loop or _paced)(ctx, d)
    finally:
        d.drain()
        for h in list(d.held.values()):
            d._finish(h.rec)
        d.held.clear()
    return d


def _paced(ctx: DriverContext[Any], d: _Driver) -> None:
    """Paced frames pushed as they come, questions asked on their schedule."""
    wl = d.wl
    while not ctx.stop.is_set():
        budget = ctx.max_frames is None or ctx.counters.dispatched < ctx.max_frames
        got = ctx.next_frame(d.wait_s()) if budget else None
        d.drain()
        if wl.failed is not None:
            ctx.request_abort(wl.failed)
            break
        if d.newest is not None:
            d.ask_due()
        if got is not None:
            d.push(*got)
        elif not budget or (ctx.queue is not None and ctx.queue.closed):
            break
    _wait_for_open_turn(ctx, d)


def _one_answer_each(ctx: DriverContext[Any], d: _Driver) -> None:
    """Unpaced (``soakd profile``): each frame pushed, the socket's taking it awaited, the
    question asked about it and its answer awaited before the next frame: the row's infer
    is the time to first delta, decode the rest, total push -> done."""
    question = d.question or "What is happening?"
    while not ctx.stop.is_set() and not ctx.budget_spent():
        got = ctx.next_frame()
        if got is None:
            break
        d.push(*got)
        if not _until(ctx, d, lambda: not d.pending):  # the socket took it (or failed)
            break
        if d.newest == got[0].id and d.ask(question, ctx.s(ctx.clock.now_ns())):
            _wait_for_open_turn(ctx, d)
            d.drain()


def _until(ctx: DriverContext[Any], d: _Driver, done: Callable[[], bool]) -> bool:
    """Drain until ``done()``; False when the run stopped or the session failed first."""
    while not done():
        if ctx.stop.is_set() or d.wl.failed is not None:
            if d.wl.failed is not None:
                ctx.request_abort(d.wl.failed)
            return False
        d.drain()
        time.sleep(0.005)
    return True


def _wait_for_open_turn(ctx: DriverContext[Any], d: _Driver) -> None:
    """At the end, the open answer gets its response timeout to finish (it was asked)."""
    wl = d.wl
    deadline = ctx.clock.now_ns() + int(wl.s.response_timeout_s * 1e9)
    while wl.open_turn() and ctx.clock.now_ns() < deadline and wl.failed is None:
        d.drain()
        time.sleep(0.02)

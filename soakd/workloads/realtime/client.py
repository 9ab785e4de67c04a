"""One realtime session over a WebSocket: frames and audio pushed as captured, questions
asked, each answer (a turn) timed, the session's life recorded.

Two threads share the socket (``websockets``' threading client: one may send while the
other receives):

* ``soakd-rt-send`` sends what the driver handed over: the audio chunks, the **newest
  frame only** and the questions. A frame waits in a one-frame slot as captured; a frame
  pushed while the slot is still full (the socket has not taken the previous one: a server
  that reads slower than the frames come, a full TCP window, a reconnect under way)
  replaces it and is counted as dropped (latest-frame rule). The frame taken from the slot
  is JPEG-encoded and sent on this thread: a frame dropped is never encoded (issue 34:
  soakd's own CPU a frame). Audio waits in a bounded queue (``AUDIO_QUEUE_S`` of audio);
  older chunks are dropped and counted past that. Nothing is queued without bound.
* ``soakd-rt-recv`` reads server events and times the open turn: time to the first delta
  (text or audio) from the question (``response.create`` / ``video.query``), the deltas'
  intervals, the done event, usage tokens, the audio received (real-time factor, underruns
  as a listener's player would have them). A socket the server closes, or a session it ends
  for its age (an ``error`` whose code says expired), is reconnected and the renewal timed;
  the server unreachable for ``unreachable_timeout_s`` marks the session failed (the driver
  ends the run INVALID).

The driver (``soakd/run/drivers/realtime.py``) reads what happened through ``sent()``,
``turns()`` and ``life()``. The API key is read from the environment at build time and only
ever goes into the handshake's ``Authorization`` header: never into ``describe()``, an
event, a log line or an error message.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import cv2
import numpy as np

from soakd.records import Frame
from soakd.workloads.base import WorkloadContext, WorkloadError
from soakd.workloads.hf import resize_short_side
from soakd.workloads.realtime.protocol import DIALECTS, MalformedEvent, Parsed, parse_event
from soakd.workloads.realtime.settings import RealtimeWorkloadSettings

#: seconds of audio the send queue holds before its oldest chunks are dropped
AUDIO_QUEUE_S = 2.0
#: how long a receive waits before the loop looks at its clocks again (how late an answer
#: that never comes is failed past ``response_timeout_s``; each wake costs CPU, issue 34)
RECV_TICK_S = 0.25

now_ns = time.perf_counter_ns  # the run's clock (soakd.clock.MonotonicClock)


def _direct() -> dict[str, Any]:
    """websockets >= 17 wants ``legacy=True`` to return a connection outside a ``with``."""
    from websockets.sync.client import connect

    return {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}


@dataclass(slots=True)
class Sent:
    """A frame the socket took (``t_end_ns``), or could not (``error``)."""

    frame_id: int
    t_start_ns: int
    t_end_ns: int
    error: str | None = None


@dataclass(slots=True)
class Turn:
    """One question and its answer, as the receiver saw it (times: the run's clock)."""

    n: int
    question: str
    ask_ns: int
    frame_id: int | None  # the newest frame the socket had taken when the question went
    frame_capture_ns: int | None
    audio_rate: int
    start_ns: int | None = None  # response.created / response.start
    first_ns: int | None = None  # the first delta, text or audio
    last_text_ns: int | None = None
    done_ns: int | None = None
    gaps_ms: list[float] = field(default_factory=list)  # between consecutive deltas
    text: list[str] = field(default_factory=list)
    text_deltas: int = 0
    tokens: int | None = None  # from the done event's usage
    error: str | None = None
    last_delta_ns: int | None = None
    audio_bytes: int = 0
    audio_first_ns: int | None = None
    play_end_ns: int | None = None  # when the audio received so far would finish playing
    underruns: int = 0

    def delta(self, t: int, text: str = "", audio: bytes = b"") -> None:
        if self.first_ns is None:
            self.first_ns = t
        if self.last_delta_ns is not None:
            self.gaps_ms.append((t - self.last_delta_ns) / 1e6)
        self.last_delta_ns = t
        if text:
            self.text.append(text)
            self.text_deltas += 1
            self.last_text_ns = t
        if audio:
            self._play(t, len(audio))

    def _play(self, t: int, n_bytes: int) -> None:
        """A player that starts at the first chunk: a chunk that arrives after what was
        buffered has played out is an underrun (a stutter a listener hears)."""
        dur_ns = int(n_bytes / 2 / self.audio_rate * 1e9)
        self.audio_bytes += n_bytes
        if self.audio_first_ns is None or self.play_end_ns is None:
            self.audio_first_ns, self.play_end_ns = t, t + dur_ns
            return
        if t > self.play_end_ns:
            self.underruns += 1
            self.play_end_ns = t + dur_ns
        else:
            self.play_end_ns += dur_ns

    def measures(self) -> dict[str, Any]:
        """The turn's row of numbers (ms; None where not seen)."""

        def ms(a: int | None, b: int | None) -> float | None:
            return None if a is None or b is None else round((b - a) / 1e6, 3)

        g = np.asarray(self.gaps_ms)
        out: dict[str, Any] = {
            "turn": self.n,
            "ttfd_ms": ms(self.ask_ns, self.first_ns),
            "start_ms": ms(self.ask_ns, self.start_ns),
            "done_ms": ms(self.ask_ns, self.done_ns),
            "deltas": self.text_deltas,
            "tokens": self.tokens,
            "frame_age_at_ask_ms": ms(self.frame_capture_ns, self.ask_ns),
        }
        if g.size:
            out |= {
                "delta_p50_ms": round(float(np.percentile(g, 50)), 3),
                "delta_p95_ms": round(float(np.percentile(g, 95)), 3),
                "delta_max_ms": round(float(g.max()), 3),
            }
        tokens = self.tokens if self.tokens is not None else self.text_deltas
        if tokens > 1 and self.first_ns is not None and self.last_text_ns is not None:
            # decode time / (tokens - 1): AIPerf's and guidellm's inter-token latency
            out["per_token_ms"] = round((self.last_text_ns - self.first_ns) / 1e6 / (tokens - 1), 3)
        if self.audio_bytes:
            audio_s = self.audio_bytes / 2 / self.audio_rate
            end = self.done_ns if self.done_ns is not None else self.last_delta_ns
            first = self.audio_first_ns
            wall = (end - first) / 1e9 if end is not None and first is not None else 0.0
            out["audio_s"] = round(audio_s, 4)
            out["audio_rtf"] = round(audio_s / wall, 4) if wall > 0 else None
            out["underruns"] = self.underruns
        if self.error is not None:
            out["error"] = self.error
        return out


#: a turn the server opened (voice activity detection): its question, and its event
SERVER_TURN = "(the server's turn detection)"
SERVER_TURN_EVENT = "server_turn"

_DIRECT: dict[str, Any] | None = None  # connect()'s extra keyword, once known

Life = tuple[str, str, dict[str, Any]]  # (event kind, message, data)


class ConnectFailed(Exception):
    """A connection attempt that failed; ``fatal``: retrying cannot help (bad URL, key)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


def session_url(settings: RealtimeWorkloadSettings) -> str:
    """``workload.url`` with ``?model=`` added for the Realtime protocol (as its clients do)."""
    if settings.protocol != "openai-realtime" or settings.model is None:
        return settings.url
    p = urlsplit(settings.url)
    q = parse_qsl(p.query, keep_blank_values=True)
    if not any(k == "model" for k, _ in q):
        q.append(("model", settings.model))
    return urlunsplit(p._replace(query=urlencode(q)))


def pcm16(chunk: np.ndarray) -> bytes:
    """Float audio in [-1, 1] as little-endian 16-bit PCM."""
    x = np.clip(np.asarray(chunk, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return (x * 32767.0).astype("<i2").tobytes()


class RealtimeSession:
    """``kind = "realtime"``: a session shape driven by the realtime driver."""

    shape: Literal["session"] = "session"
    driver = "realtime"  # soakd/run/drivers/realtime.py
    concurrent = True  # run.streams = N: N sessions at once, one per stream (``another``)

    def __init__(self, settings: RealtimeWorkloadSettings, ctx: WorkloadContext) -> None:
        self.s, self.ctx = settings, ctx
        self.dialect = DIALECTS[settings.protocol]
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        if settings.api_key_env and not key:
            raise WorkloadError(
                f"workload.api_key_env: the environment variable {settings.api_key_env} is not set"
            )
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = session_url(settings)
        self._ws: Any = None
        self._up = threading.Event()  # a session is open (cleared while reconnecting)
        self._halt = threading.Event()
        self._cond = threading.Condition()
        self._slot: Frame | None = None  # the newest frame, not yet encoded nor sent
        cap = max(1, int(AUDIO_QUEUE_S * 1000 / settings.audio_chunk_ms))
        self._audio: deque[str] = deque()
        self._audio_cap = cap
        self._asks: deque[Turn] = deque()
        self._sent: queue.SimpleQueue[Sent] = queue.SimpleQueue()
        self._turns: queue.SimpleQueue[Turn] = queue.SimpleQueue()
        self._life: queue.SimpleQueue[Life] = queue.SimpleQueue()
        self._turn: Turn | None = None  # the open turn (receiver's; set by the sender)
        self._turn_lock = threading.Lock()
        self._newest: tuple[int, int] | None = None  # (frame id, capture ns) last sent
        self._threads: list[threading.Thread] = []
        self._n_turns = 0
        self.failed: str | None = None  # the session cannot go on: the run ends INVALID
        self.dropped = 0  # frames replaced in the slot (latest-frame rule)
        self.audio_dropped = 0  # audio chunks dropped from a full queue
        self.audio_sent = 0  # audio chunks the socket took
        self.counts: dict[str, int] = {
            "reconnects": 0,
            "expired": 0,
            "server_closed": 0,
            "malformed": 0,
            "questions_skipped": 0,
        }
        self.errors_by_code: dict[str, int] = {}
        self._info: dict[str, Any] = {}

    # --- connecting
    def _open(self) -> tuple[Any, float]:
        """A new session: handshake, the server's first event (Realtime), the hello events.
        Returns (socket, ms it took); raises ConnectFailed."""
        from websockets.exceptions import InvalidStatus, InvalidURI, WebSocketException
        from websockets.sync.client import connect

        global _DIRECT
        if _DIRECT is None:
            _DIRECT = _direct()
        t0 = now_ns()
        timeout = self.s.connect_timeout_s
        try:
            ws = connect(
                self.url,
                additional_headers=self._headers,
                open_timeout=timeout,
                max_size=None,
                close_timeout=1.0,
                **_DIRECT,
            )
        except InvalidURI as exc:
            raise ConnectFailed(f"workload.url {self.s.url!r}: {exc}", fatal=True) from None
        except InvalidStatus as exc:
            code = exc.response.status_code
            if code in (401, 403):
                raise ConnectFailed(
                    f"{self.s.url}: the server refused the API key (HTTP {code}); set "
                    "workload.api_key_env to the variable that holds it",
                    fatal=True,
                ) from None
            if code == 404:
                raise ConnectFailed(
                    f"{self.s.url}: HTTP 404, no WebSocket endpoint there (protocol "
                    f"{self.s.protocol!r} is usually served at its documented path)",
                    fatal=True,
                ) from None
            raise ConnectFailed(f"HTTP {code} at the handshake") from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
        try:
            if self.dialect.waits_for_ready:
                self._await_ready(ws, t0 + int(timeout * 1e9))
            for ev in self.dialect.hello(self.s.session, self.s.instructions, self.s.model):
                ws.send(json.dumps(ev))
        except BaseException:
            ws.close()
            raise
        return ws, (now_ns() - t0) / 1e6

    def _await_ready(self, ws: Any, deadline_ns: int) -> None:
        from websockets.exceptions import ConnectionClosed

        while True:
            left = (deadline_ns - now_ns()) / 1e9
            if left <= 0:
                raise ConnectFailed("the server sent no session.created in time")
            try:
                p = parse_event(self.dialect, ws.recv(timeout=left))
            except TimeoutError:
                continue
            except ConnectionClosed as exc:
                raise ConnectFailed(f"closed before session.created: {exc}") from None
            except MalformedEvent as exc:
                raise ConnectFailed(f"malformed first event: {exc}") from None
            if p.kind == "ready":
                return
            if p.kind == "error":
                raise ConnectFailed(
                    f"error before session.created: {p.code}: {p.message}",
                    fatal=p.code in ("invalid_api_key", "unauthorized"),
                )

    def setup(self) -> None:
        """Open the first session within ``connect_timeout_s`` (retrying a server that is
        not up yet); a bad URL, a refused key or a server never reached is WorkloadError."""
        self.ctx.phase("connecting to the realtime server")
        deadline = time.monotonic() + self.s.connect_timeout_s
        while True:
            try:
                self._ws, ms = self._open()
                break
            except ConnectFailed as exc:
                if exc.fatal or time.monotonic() >= deadline:
                    raise WorkloadError(
                        str(exc)
                        if exc.fatal
                        else f"{self.s.url}: no session within "
                        f"{self.s.connect_timeout_s:g} s (workload.connect_timeout_s): {exc}"
                    ) from None
                time.sleep(min(self.s.reconnect_backoff_s, 0.25))
        self._info["connect_ms"] = round(ms, 3)
        self._up.set()

    def _reconnect(self, why: str) -> None:
        """A new session after ``why`` (closed, expired), timed; unreachable for
        ``unreachable_timeout_s`` (or a fatal refusal) sets ``failed``."""
        self._up.clear()
        old, self._ws = self._ws, None
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
        t0 = now_ns()
        last = ""
        while not self._halt.is_set():
            try:
                ws, ms = self._open()
            except ConnectFailed as exc:
                last = str(exc)
                waited = (now_ns() - t0) / 1e9
                if exc.fatal or waited >= self.s.unreachable_timeout_s:
                    self.failed = (
                        f"server unreachable for {waited:.0f} s after the session {why} "
                        f"(workload.unreachable_timeout_s = {self.s.unreachable_timeout_s:g}): "
                        f"{last}"
                    )[:2000]
                    self._life.put(("server_unreachable", self.failed, {"after": why}))
                    return
                self._halt.wait(self.s.reconnect_backoff_s)
                continue
            self._ws = ws
            self.counts["reconnects"] += 1
            gap = (now_ns() - t0) / 1e6
            data = {"after": why, "handshake_ms": round(ms, 3), "gap_ms": round(gap, 3)}
            self._life.put(("reconnect", f"new session after it {why}: {gap:.0f} ms", data))
            self._up.set()
            return

    def another(self) -> RealtimeSession:
        """A second session to the same server with the same settings, opened (``setup``):
        the driver's for each stream past the first."""
        other = RealtimeSession(self.s, self.ctx)
        other.setup()
        return other

    # --- the driver's side
    def start(self) -> None:
        for name, target in (
            ("soakd-rt-send", self._send_loop),
            ("soakd-rt-recv", self._recv_loop),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def push(self, frame: Frame) -> int | None:
        """Hand over a frame (and its audio); returns the id of the older frame it replaced
        in the slot (dropped, never encoded: the socket had not taken it), else None."""
        chunks = self._audio_chunks(frame.audio)
        with self._cond:
            replaced = self._slot.id if self._slot is not None else None
            self._slot = frame
            for c in chunks:
                if len(self._audio) >= self._audio_cap:
                    self._audio.popleft()
                    self.audio_dropped += 1
                self._audio.append(c)
            self._cond.notify()
        if replaced is not None:
            self.dropped += 1
        return replaced

    def _jpeg(self, img: np.ndarray) -> str:
        if self.s.short_side is not None:
            img = resize_short_side(img, self.s.short_side)
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, self.s.jpeg_quality])
        if not ok:
            raise RuntimeError(f"JPEG encoding failed for a {img.shape} frame")
        return base64.b64encode(buf.tobytes()).decode("ascii")

    def _audio_chunks(self, audio: np.ndarray | None) -> list[str]:
        if audio is None or self.ctx.audio_rate is None:
            return []
        pcm = pcm16(audio)
        step = max(2, int(self.ctx.audio_rate * self.s.audio_chunk_ms / 1000) * 2)
        return [
            base64.b64encode(pcm[i : i + step]).decode("ascii") for i in range(0, len(pcm), step)
        ]

    def ask(self, text: str) -> bool:
        """Queue a question; False (skipped, counted) while the previous answer is open."""
        with self._turn_lock:
            busy = self._turn is not None or bool(self._asks)
        if busy:
            self.counts["questions_skipped"] += 1
            return False
        self._n_turns += 1
        newest = self._newest
        turn = Turn(
            self._n_turns,
            text,
            0,
            newest[0] if newest else None,
            newest[1] if newest else None,
            self.s.output_audio_rate,
        )
        with self._cond:
            self._asks.append(turn)
            self._cond.notify()
        return True

    def drain(self) -> tuple[list[Sent], list[Turn], list[Life]]:
        return _all(self._sent), _all(self._turns), _all(self._life)

    # --- the sender thread
    def _take(self) -> tuple[list[str], Frame | None, list[Turn]]:
        with self._cond:
            while not (self._slot or self._audio or self._asks or self._halt.is_set()):
                self._cond.wait(0.2)
            if not self._up.is_set():
                return [], None, []  # reconnecting: what waits stays (frames get replaced)
            audio, self._audio = list(self._audio), deque()
            frame, self._slot = self._slot, None
            asks, self._asks = list(self._asks), deque()
        return audio, frame, asks

    def _send_loop(self) -> None:
        from websockets.exceptions import ConnectionClosed

        while not self._halt.is_set():
            audio, frame, asks = self._take()
            if not (audio or frame or asks):
                self._up.wait(0.1)
                continue
            ws = self._ws
            try:
                for c in audio:
                    ws.send(json.dumps(self.dialect.audio(c)))
                    self.audio_sent += 1
                if frame is not None:
                    self._send_frame(ws, frame)
                for turn in asks:
                    self._send_ask(ws, turn)
            except (ConnectionClosed, OSError, AttributeError) as exc:
                # the receiver sees the close and reconnects; what was lost is recorded
                msg = f"socket closed while sending: {type(exc).__name__}"
                if frame is not None and not self._sent_ok(frame.id):
                    self._sent.put(Sent(frame.id, now_ns(), now_ns(), msg))
                for turn in asks:
                    self._fail_turn(turn, msg)
                self._up.wait(0.5)

    def _sent_ok(self, frame_id: int) -> bool:
        return self._newest is not None and self._newest[0] == frame_id

    def _send_frame(self, ws: Any, frame: Frame) -> None:
        """Encode ``frame`` and send it; a frame that cannot be encoded is a Sent with its
        error (the driver's error row), the socket left as it was."""
        try:
            jpeg = self._jpeg(frame.image)
        except Exception as exc:
            t = now_ns()
            self._sent.put(Sent(frame.id, t, t, f"{type(exc).__name__}: {exc}"[:2000]))
            return
        t0 = now_ns()  # writing starts: the row's dispatch
        ws.send(json.dumps(self.dialect.frame(jpeg)))
        t1 = now_ns()
        self._newest = (frame.id, frame.t_capture_ns)
        self._sent.put(Sent(frame.id, t0, t1))

    def _send_ask(self, ws: Any, turn: Turn) -> None:
        events = self.dialect.ask(turn.question)
        for ev in events[:-1]:
            ws.send(json.dumps(ev))
        newest = self._newest
        turn.frame_id, turn.frame_capture_ns = newest if newest else (None, None)
        with self._turn_lock:
            turn.ask_ns = now_ns()  # the event the answer is timed from
            self._turn = turn
        ws.send(json.dumps(events[-1]))

    def _fail_turn(self, turn: Turn, error: str) -> None:
        with self._turn_lock:
            if self._turn is turn:
                self._turn = None
            elif turn.error is not None:
                return
        turn.error = error[:500]
        if turn.ask_ns == 0:
            turn.ask_ns = now_ns()
        self._turns.put(turn)

    # --- the receiver thread
    def _recv_loop(self) -> None:
        from websockets.exceptions import ConnectionClosed

        while not self._halt.is_set():
            ws = self._ws
            if ws is None or not self._up.is_set():
                self._up.wait(0.1)
                continue
            try:
                raw = ws.recv(timeout=RECV_TICK_S)
            except TimeoutError:
                self._check_timeout()
                continue
            except ConnectionClosed as exc:
                if self._halt.is_set():
                    return
                self._closed(exc)
                continue
            self._event(now_ns(), raw)

    def _closed(self, exc: Any) -> None:
        rcvd = getattr(exc, "rcvd", None)
        code = getattr(rcvd, "code", None)
        reason = str(getattr(rcvd, "reason", "") or "")[:200]
        expired = any(w in reason.lower() for w in ("expired", "expiry", "max_duration"))
        self.counts["server_closed"] += 1
        why = "expired" if expired else "was closed by the server"
        msg = f"server closed the session: code {code}, reason {reason!r}"
        self._life.put(
            (
                "session_expired" if expired else "server_closed",
                msg,
                {"code": code, "reason": reason},
            )
        )
        if expired:
            self.counts["expired"] += 1
        self._end_turn_on_close(msg)
        self._reconnect(why)

    def _end_turn_on_close(self, msg: str) -> None:
        with self._turn_lock:
            turn = self._turn
        if turn is not None:
            self._fail_turn(turn, msg)

    def _event(self, t: int, raw: Any) -> None:
        try:
            p = parse_event(self.dialect, raw)
        except MalformedEvent as exc:
            self.counts["malformed"] += 1
            msg = f"malformed server event: {exc}"
            self._life.put(("server_error", msg, {"code": "malformed"}))
            with self._turn_lock:
                turn = self._turn
            if turn is not None:
                self._fail_turn(turn, msg)
            return
        if p.kind == "error":
            self._server_error(p)
            return
        with self._turn_lock:
            turn = self._turn
        if turn is None:
            if p.kind == "speech_stopped" or (p.kind == "start" and not self._asks):
                self._server_turn(t, p.kind)
            return
        if p.kind == "start" and turn.start_ns is None:
            turn.start_ns = t
        elif p.kind in ("text", "audio"):
            turn.delta(t, p.text, p.audio)
        elif p.kind == "done":
            self._done(turn, t, p)

    def _server_turn(self, t: int, why: str) -> None:
        """A turn the server opened (its voice activity detection heard the speaker stop, or
        it began an answer unasked): timed from that event, about the newest frame sent."""
        with self._turn_lock:
            if self._turn is not None:
                return
            self._n_turns += 1
            newest = self._newest
            fid = newest[0] if newest else None
            turn = Turn(self._n_turns, SERVER_TURN, t, fid, newest[1] if newest else None,
                        self.s.output_audio_rate)  # fmt: skip
            if why == "start":
                turn.start_ns = t
            self._turn = turn
        what = "speech stopped" if why == "speech_stopped" else "an answer began unasked"
        data = {"turn": turn.n, "frame_id": fid, "by": why}
        self._life.put((SERVER_TURN_EVENT, f"server turn {turn.n}: {what}", data))

    def _done(self, turn: Turn, t: int, p: Parsed) -> None:
        turn.done_ns, turn.tokens = t, p.tokens
        if p.failed:
            turn.error = p.message or "response failed"
        elif turn.first_ns is None:
            turn.error = "empty answer: the done event came with no delta"
        with self._turn_lock:
            if self._turn is turn:
                self._turn = None
        self._turns.put(turn)

    def _server_error(self, p: Parsed) -> None:
        code = p.code or "unknown"
        self.errors_by_code[code] = self.errors_by_code.get(code, 0) + 1
        if p.expired:
            self.counts["expired"] += 1
            msg = f"the server ended the session for its age: {code}: {p.message}"[:2000]
            self._life.put(("session_expired", msg, {"code": code}))
            self._end_turn_on_close(msg)
            self._reconnect("expired")
            return
        msg = f"server error {code}: {p.message}"[:2000]
        self._life.put(("server_error", msg, {"code": code}))
        with self._turn_lock:
            turn = self._turn
        if turn is not None and turn.first_ns is None:
            self._fail_turn(turn, msg)

    def _check_timeout(self) -> None:
        with self._turn_lock:
            turn = self._turn
        if turn is None or turn.ask_ns == 0:
            return
        if now_ns() - turn.ask_ns > self.s.response_timeout_s * 1e9:
            self._fail_turn(
                turn,
                f"no done event within {self.s.response_timeout_s:g} s "
                "(workload.response_timeout_s)",
            )

    # --- the rest
    def open_turn(self) -> bool:
        with self._turn_lock:
            return self._turn is not None or bool(self._asks)

    def describe(self) -> dict[str, Any]:
        s = self.s.model_dump()
        s.pop("api_key_env", None)  # the variable's name may say whose key: not stored
        return {**s, "api_key": bool(self._headers), **self._info}

    def close(self) -> None:
        self._halt.set()
        with self._cond:
            self._cond.notify_all()
        ws, self._ws = self._ws, None
        if ws is not None:
            bye = self.dialect.bye()
            with contextlib.suppress(Exception):
                if bye is not None:
                    ws.send(json.dumps(bye))
            with contextlib.suppress(Exception):
                ws.close()
        for t in self._threads:
            t.join(2.0)


def _all(q: queue.SimpleQueue[Any]) -> list[Any]:
    """Everything ``q`` holds now (the driver is its one reader: what ``empty`` says is
    there stays there; no exception raised a drain, three drains a frame)."""
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out

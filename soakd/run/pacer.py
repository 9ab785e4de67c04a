"""The fixed-rate producer: captures a frame at absolute deadlines on the monotonic clock.

Deadline ``k`` is ``t0 + k * period``. When the capture falls behind by a whole period or
more, the pacer skips ahead to the next deadline that is still in the future (counting the
ticks it missed) rather than bursting to catch up. Every frame keeps its scheduled time, its
capture time and how late the grab started.

With ``run.streams = N`` there is one pacer per stream, all at the same rate; stream ``s``
starts ``s / N`` of a period after stream 0 (cameras are not in phase, and frames arriving
together would only wait for one another), and its frame ``k`` has id ``k * N + s``: unique
in the run, in capture order, and ``id // N`` is the stream's own capture index.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from soakd.clock import Clock
from soakd.records import Frame
from soakd.run.queue import FrameQueue

ReadFn = Callable[[], tuple[np.ndarray, float | None]]


class Pacer:
    def __init__(
        self,
        read: ReadFn,
        queue: FrameQueue,
        *,
        fps: float,
        clock: Clock,
        t0_ns: int,
        on_end: Callable[[BaseException], None],
        audio: Any = None,
        audio_rate: int | None = None,
        on_missed: Callable[[int, str, int], None] | None = None,
        stream: int = 0,
        streams: int = 1,
    ) -> None:
        self.read = read
        self.queue = queue
        self.on_missed = on_missed
        self.period_ns = round(1e9 / fps)
        self.clock = clock
        self.stream, self.streams = stream, streams
        self.t0_ns = t0_ns + stream * self.period_ns // streams  # this stream's phase
        self.on_end = on_end
        self.audio = audio
        self.audio_rate = audio_rate
        self._audio_pos = 0  # samples delivered so far
        self.stop_event = threading.Event()
        self.captured = 0
        self.missed_ticks = 0
        #: missed ticks by cause: the source read took a whole period or more ("source"), or
        #: the pacer itself woke late, i.e. the process did not run on time ("pause")
        self.missed_by = {"source": 0, "pause": 0}
        self._last_read_ns = 0
        name = "soakd-pacer" if streams == 1 else f"soakd-pacer-{stream}"
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def _missed(self, n: int, deadline_ns: int) -> None:
        cause = "source" if self._last_read_ns >= self.period_ns else "pause"
        self.missed_ticks += n
        self.missed_by[cause] += n
        if self.on_missed is not None:
            self.on_missed(n, cause, deadline_ns)

    @property
    def ticks(self) -> int:
        """Ticks the target rate asked for so far: captured or missed."""
        return self.captured + self.missed_ticks

    def _audio_chunk(self, t_ns: int) -> np.ndarray | None:
        if self.audio is None or not self.audio_rate:
            return None
        due = int((t_ns - self.t0_ns) * self.audio_rate // 1_000_000_000)
        n = due - self._audio_pos
        if n <= 0:
            return np.zeros(0, dtype=np.float32)
        self._audio_pos = due
        return self.audio.read(n)

    def _loop(self) -> None:
        clock, period, stop = self.clock, self.period_ns, self.stop_event
        k = 0
        fid, step = self.stream, self.streams  # frame ids k * N + s
        try:
            while True:
                deadline = self.t0_ns + k * period
                now = clock.now_ns()
                if now - deadline >= period:  # late by a whole period: skip ahead, no burst
                    k_next = (now - self.t0_ns) // period + 1
                    self._missed(k_next - k, deadline)
                    k = k_next
                    deadline = self.t0_ns + k * period
                if not clock.sleep_until(deadline, stop):
                    return
                start = clock.now_ns()
                image, source_ts = self.read()
                done = clock.now_ns()
                self._last_read_ns = done - start
                frame = Frame(
                    id=fid,
                    t_sched_ns=deadline,
                    t_capture_ns=done,
                    grab_ns=done - start,
                    image=image,
                    audio=self._audio_chunk(done),
                    source_ts=source_ts,
                    stream_ns=deadline - self.t0_ns,
                    stream=self.stream,
                )
                self.queue.put(frame)
                self.captured += 1
                fid += step
                k += 1
        except BaseException as exc:  # the source ended or failed: the runner decides
            self.on_end(exc)


class UnpacedGrab:
    """The unpaced feed of a profile: the driver calls it for each frame, back to back.

    Stream time advances one frame period per frame, and each frame brings the audio the
    stream produces in that period, so windows over stream time see the stream at ``fps``.
    A source that ends or fails is reported to ``on_end`` and the error re-raised, which ends
    the driver. ``stream`` / ``streams``: as for ``Pacer`` (ids ``k * N + s``); ``RoundRobin``
    takes the streams' frames in turn.
    """

    def __init__(
        self,
        read: ReadFn,
        *,
        fps: float,
        clock: Clock,
        on_end: Callable[[BaseException], None],
        audio: Any = None,
        audio_rate: int | None = None,
        stream: int = 0,
        streams: int = 1,
    ) -> None:
        self.read = read
        self.period_ns = round(1e9 / fps)
        self.clock = clock
        self.on_end = on_end
        self.audio = audio
        self.audio_rate = audio_rate or 0
        self.captured = 0
        self.stream, self.streams = stream, streams

    def _audio_chunk(self, k: int) -> np.ndarray | None:
        if self.audio is None:
            return None
        per = self.audio_rate * self.period_ns
        return self.audio.read(int((k + 1) * per // 1_000_000_000 - k * per // 1_000_000_000))

    def frames(self, stopped: Callable[[], bool]) -> Iterator[tuple[Frame, int]]:
        """Frames back to back, each with queue length 0, until ``stopped()``: the driver's
        unpaced loop head, its state kept in locals (the harness's per-frame cost)."""
        read, now, on_end, audio = self.read, self.clock.now_ns, self.on_end, self.audio
        s, n, period = self.stream, self.streams, self.period_ns
        while not stopped():
            k = self.captured
            t = now()
            try:
                image, ts = read()
            except BaseException as exc:
                on_end(exc)
                raise
            done = now()
            self.captured = k + 1
            chunk = None if audio is None else self._audio_chunk(k)
            yield Frame(k * n + s, t, done, done - t, image, chunk, ts, k * period, s), 0


class RoundRobin:
    """The unpaced feed of several streams: each frame from the next stream in turn."""

    def __init__(self, grabs: list[UnpacedGrab]) -> None:
        self.grabs = grabs

    def frames(self, stopped: Callable[[], bool]) -> Iterator[tuple[Frame, int]]:
        takes = [g.frames(stopped).__next__ for g in self.grabs]
        try:
            while True:
                for take in takes:  # each read right before it is dispatched, as one stream's
                    yield take()
        except StopIteration:  # stopped
            return

    @property
    def captured(self) -> int:
        return sum(g.captured for g in self.grabs)

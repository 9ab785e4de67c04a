"""The frame queue between the pacer and the runner: bounded, drop-oldest, counting drops.

``consume = "newest"`` is a latest-frame queue: the consumer takes the newest frame and the
older ones it skips over are dropped (counted), so the model always answers the current
picture. ``consume = "oldest"`` mirrors models that keep a frame queue of their own
(MOSS-VL-Realtime's ``frame_queue_size``): frames are taken in order and frame age grows as
the queue fills; a full queue still drops its oldest frame.

Audio chunks ride on frames; a dropped frame's audio is carried over to the next frame, so
an audio-visual workload still hears the whole stream.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Literal

import numpy as np

from soakd.records import Frame


def _join_audio(first: np.ndarray, then: np.ndarray | None) -> np.ndarray:
    return first if then is None else np.concatenate((first, then))


class FrameQueue:
    """One stream's queue. ``cond``: a condition shared with other queues (``StreamQueues``),
    so one consumer can wait on all of them."""

    def __init__(
        self,
        maxlen: int = 1,
        consume: Literal["newest", "oldest"] = "newest",
        cond: threading.Condition | None = None,
    ) -> None:
        if maxlen < 1:
            raise ValueError("maxlen must be >= 1")
        self.maxlen = maxlen
        self.newest = consume == "newest"
        self._q: deque[Frame] = deque()
        self._cond = cond or threading.Condition(threading.Lock())
        self._closed = False
        self.drops = 0  # frames that were never dispatched because a newer one replaced them
        self.puts = 0

    def put(self, frame: Frame) -> None:
        with self._cond:
            if len(self._q) >= self.maxlen:
                dropped = self._q.popleft()
                self.drops += 1
                if dropped.audio is not None:  # audio is a stream: never drop it with a frame
                    nxt = self._q[0] if self._q else frame
                    nxt.audio = _join_audio(dropped.audio, nxt.audio)
            self._q.append(frame)
            self.puts += 1
            self._cond.notify()

    def get(self, timeout: float | None = None) -> tuple[Frame, int] | None:
        """The next frame to dispatch and how many were queued when it was taken (itself
        included); None on timeout or when closed and empty."""
        with self._cond:
            if not self._q:
                if self._closed:
                    return None
                self._cond.wait(timeout)
                if not self._q:
                    return None
            return self.take()

    def take(self) -> tuple[Frame, int]:
        """Take the next frame from a non-empty queue, the lock held (see ``get``)."""
        qlen = len(self._q)
        if self.newest:
            frame = self._q.pop()
            self.drops += len(self._q)
            if self._q and frame.audio is not None:
                for older in reversed(self._q):
                    if older.audio is not None:
                        frame.audio = _join_audio(older.audio, frame.audio)
            self._q.clear()
        else:
            frame = self._q.popleft()
        return frame, qlen

    def __len__(self) -> int:
        return len(self._q)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class StreamQueues:
    """The queues of ``run.streams`` paced sources, one per stream, read by one consumer.

    Each stream keeps its own bound and drop count (``FrameQueue``); ``get`` serves them
    round-robin: it takes from the first non-empty queue after the one served last, so under
    overload every stream loses frames at the same rate and none is starved. The queues share
    one condition, so the consumer sleeps until any stream has a frame.
    """

    def __init__(
        self,
        n: int,
        maxlen: int = 1,
        consume: Literal["newest", "oldest"] = "newest",
        *,
        one_consumer_each: bool = False,
    ) -> None:
        self._cond = threading.Condition(threading.Lock())
        # one_consumer_each: each stream is read by its own consumer (``stream(i)``, the
        # concurrent driver), so each queue wakes only its own reader; one stream is read by
        # ``get`` (the driver's one loop), which must be woken by its queue's put
        shared = None if one_consumer_each and n > 1 else self._cond
        self.queues = [FrameQueue(maxlen, consume, shared) for _ in range(n)]
        self._next = 0  # the stream served first on the next get
        self._closed = False

    def get(self, timeout: float | None = None) -> tuple[Frame, int] | None:
        """The next stream's frame and its queue's length when taken (round-robin); None on
        timeout or when closed and every queue is empty."""
        with self._cond:
            got = self._take()
            if got is None and not self._closed:
                self._cond.wait(timeout)
                got = self._take()
            return got

    def _take(self) -> tuple[Frame, int] | None:
        n = len(self.queues)
        for i in range(n):
            s = (self._next + i) % n
            q = self.queues[s]
            if len(q):
                self._next = (s + 1) % n
                return q.take()
        return None

    def drops_of(self, stream: int) -> int:
        """Frames of ``stream`` dropped so far (cumulative)."""
        return self.queues[stream].drops

    def stream(self, i: int) -> OneStream:
        """Stream ``i``'s queue alone, read as the queues are (its own consumer's view)."""
        return OneStream(self.queues[i], i)

    @property
    def drops(self) -> int:
        """Frames dropped so far, all streams together."""
        return sum(q.drops for q in self.queues)

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues)

    def close(self) -> None:
        for q in self.queues:
            q.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class OneStream:
    """One stream's queue with the reading interface of ``StreamQueues``: what each thread of
    the concurrent driver takes its stream's frames from."""

    def __init__(self, queue: FrameQueue, stream: int) -> None:
        self.queue, self.index = queue, stream

    def get(self, timeout: float | None = None) -> tuple[Frame, int] | None:
        return self.queue.get(timeout)

    def drops_of(self, stream: int) -> int:
        if stream != self.index:
            raise ValueError(f"stream {stream}: this view reads stream {self.index} only")
        return self.queue.drops

    @property
    def drops(self) -> int:
        return self.queue.drops

    @property
    def closed(self) -> bool:
        return self.queue.closed

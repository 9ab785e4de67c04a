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
    def __init__(self, maxlen: int = 1, consume: Literal["newest", "oldest"] = "newest") -> None:
        if maxlen < 1:
            raise ValueError("maxlen must be >= 1")
        self.maxlen = maxlen
        self.newest = consume == "newest"
        self._q: deque[Frame] = deque()
        self._cond = threading.Condition(threading.Lock())
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

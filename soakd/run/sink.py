"""The frame records' way out of the driver: appended one by one, handed on in batches.

A driver appends each frame's record (``add``); the staged driver, the one that runs at
hundreds of thousands of frames a second around a no-op model, appends a ``StagedFrame``
instead: the frame's raw clock readings, turned into records a whole batch at a time
(``staged_records``, numpy over the batch's columns) when the batch leaves. Either way the
hot path pays one ``deque.append`` (atomic under the GIL, no lock) per frame.

``drain`` hands everything appended so far, in order, to ``deliver`` as one list of
records: the store writer, the rolling windows and the observers take one call per batch
instead of one per frame. The driver drains every ``batch`` frames; the runner's monitor
drains on each of its ticks (about once a second, ``MONITOR_TICK_S``), so that at a low rate, or
while the model hangs, no frame waits for a full batch, and once more when the run ends.
``drain`` holds a lock: batches leave in order and ``deliver`` is never called from two
threads at once.
A driver appends records or staged frames, never both; ``add_now`` delivers one record
at once, after whatever is pending (the staged driver's errors and skipped frames).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np

from soakd.records import FrameRecord

#: frames appended before the driver drains them itself
BATCH = 256


class StagedFrame(NamedTuple):
    """A staged frame that ran every stage, as the driver saw it: clock readings in ns on
    the run's monotonic clock (``t1`` dispatched, ``t2`` preprocessed, ``t3`` inferred,
    ``t4`` decoded), the rest as its FrameRecord will carry them."""

    frame_id: int
    stream: int
    t_sched: int
    t_capture: int
    grab: int
    t1: int
    t2: int
    t3: int
    t4: int
    queue_len: int
    drop_count: int
    stale_count: int
    out_tokens: int | None
    vision_tokens: int | None
    audio_tokens: int | None
    extra: dict[str, object] | None
    first: bool
    warmup: bool


_record = partial(tuple.__new__, FrameRecord)


def staged_records(frames: list[StagedFrame], t0_ns: int) -> list[FrameRecord]:
    """The frames' records: each time in seconds since ``t0_ns``, each duration in ms, the
    same values as ``DriverContext.record`` computes for one frame (int64 differences,
    then one float division each)."""
    c = list(zip(*frames, strict=True))
    ns = np.array(c[2:9], dtype=np.int64)
    ts, tc, g, t1, t2, t3, t4 = ns
    sec = ((ns[[0, 1, 3, 6]] - t0_ns) / 1e9).tolist()
    ms = (
        np.stack((tc - g - ts, g, t2 - t1, t3 - t2, t4 - t3, g + t4 - t1, t1 - tc, t4 - ts)) / 1e6
    ).tolist()
    none, false = (None,) * len(frames), (False,) * len(frames)
    return list(
        map(
            _record,
            zip(
                c[0], *sec, *ms[:6], c[9], ms[6], ms[7], c[10], c[11], c[12], c[13], c[14],
                none, c[16], c[17], false, none, none, none, none, none, none, c[15], c[1],
                none, none, none, strict=True,
            ),
        )
    )  # fmt: skip


class FrameSink:
    def __init__(
        self, deliver: Callable[[list[FrameRecord]], None], t0_ns: int, batch: int = BATCH
    ) -> None:
        self.deliver = deliver
        self.t0_ns = t0_ns
        self.batch = batch
        #: appended by the driver: records, or the staged driver's StagedFrames
        self.pending: deque[FrameRecord | StagedFrame] = deque()
        self._lock = threading.Lock()

    def add(self, item: FrameRecord | StagedFrame) -> None:
        """Append one frame; drain when a batch has gathered."""
        self.pending.append(item)
        if len(self.pending) >= self.batch:
            self.drain()

    def add_now(self, rec: FrameRecord) -> None:
        """Deliver one record at once, after everything pending."""
        with self._lock:
            self._drain()
            self.deliver([rec])

    def drain(self) -> None:
        """Deliver every frame appended so far, in order, as one list of records (nothing
        when none is pending)."""
        with self._lock:
            self._drain()

    def _drain(self) -> None:
        pending = self.pending
        if not pending:
            return
        take = pending.popleft
        batch = [take() for _ in range(len(pending))]
        if type(batch[0]) is StagedFrame:
            self.deliver(staged_records(batch, self.t0_ns))  # type: ignore[arg-type]
        else:
            self.deliver(batch)  # type: ignore[arg-type]

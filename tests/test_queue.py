"""The frame queue: bounded, drop-oldest, newest-or-oldest consumption, drops counted."""

from __future__ import annotations

import threading
import time

import numpy as np

from soakd.records import Frame
from soakd.run.queue import FrameQueue, StreamQueues

IMG = np.zeros((2, 2, 3), np.uint8)


def f(i: int) -> Frame:
    return Frame(id=i, t_sched_ns=i, t_capture_ns=i, grab_ns=0, image=IMG)


def test_full_queue_drops_oldest() -> None:
    """Putting into a full queue evicts the oldest frame and counts one drop."""
    q = FrameQueue(2, "oldest")
    for i in range(5):
        q.put(f(i))
    assert q.drops == 3
    got = q.get(0)
    assert got is not None and got[0].id == 3 and got[1] == 2


def test_newest_consumption_drops_the_rest() -> None:
    """consume=newest takes the newest frame and counts the ones it skipped as drops."""
    q = FrameQueue(3, "newest")
    for i in range(3):
        q.put(f(i))
    got = q.get(0)
    assert got is not None and got[0].id == 2 and got[1] == 3
    assert q.drops == 2 and len(q) == 0


def test_get_times_out_and_close_wakes_consumer() -> None:
    """An empty queue returns None after the timeout; close() wakes a waiting consumer."""
    q = FrameQueue(1)
    assert q.get(0.01) is None
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(q.get(5)))
    t.start()
    q.close()
    t.join(2)
    assert not t.is_alive() and out == [None] and q.closed


def test_max_queue_one_never_holds_two() -> None:
    """With max_queue=1 (the default) a slow consumer always sees the latest frame."""
    q = FrameQueue(1)
    for i in range(10):
        q.put(f(i))
        assert len(q) == 1
    got = q.get(0)
    assert got is not None and got[0].id == 9 and q.drops == 9


def test_dropped_frames_hand_their_audio_on() -> None:
    """Audio is a stream: the audio of frames the queue drops reaches the next frame taken."""
    q = FrameQueue(1, "newest")
    for i in range(3):
        fr = f(i)
        fr.audio = np.full(4, i, np.float32)
        q.put(fr)
    got = q.get(0)
    assert got is not None
    assert got[0].audio is not None and got[0].audio.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    q2 = FrameQueue(3, "newest")
    for i in range(3):
        fr = f(i)
        fr.audio = np.full(2, i, np.float32)
        q2.put(fr)
    got = q2.get(0)
    assert got is not None and got[0].audio is not None
    assert got[0].audio.tolist() == [0, 0, 1, 1, 2, 2]


def test_one_stream_of_a_concurrent_driver_wakes_its_reader_on_put_not_on_a_timeout() -> None:
    """StreamQueues of one stream read by one consumer (a served model's run, streams = 1): a
    frame put wakes the consumer waiting on every queue at once, never its timeout (which
    added up to 100 ms to every served frame's age)."""
    qs = StreamQueues(1, one_consumer_each=True)
    out: list[float] = []

    def read() -> None:
        t0 = time.monotonic()
        got = qs.get(30)
        out.append(time.monotonic() - t0 if got is not None else -1.0)

    t = threading.Thread(target=read)
    t.start()
    time.sleep(0.1)
    qs.queues[0].put(f(1))
    t.join(30)
    assert out and 0 <= out[0] < 15, out  # woken by the put, not by the 30 s timeout

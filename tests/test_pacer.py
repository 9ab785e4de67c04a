"""The pacer: absolute deadlines on the monotonic clock, skip ahead when late, never burst."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from soakd.clock import FakeClock
from soakd.run.pacer import Pacer, RoundRobin, UnpacedGrab
from soakd.run.queue import FrameQueue

IMG = np.zeros((2, 2, 3), np.uint8)


def run_pacer(read_ns: list[int], fps: float = 10.0) -> tuple[Pacer, FrameQueue, list[int]]:
    """Drive a pacer on a fake clock; each read advances the clock by the next read_ns."""
    clock = FakeClock()
    q = FrameQueue(10_000, "oldest")
    reads = iter(read_ns)
    ended: list[BaseException] = []

    def read() -> tuple[np.ndarray, float | None]:
        try:
            clock.advance(next(reads))
        except StopIteration:
            raise EOFError("done") from None
        return IMG, None

    p = Pacer(read, q, fps=fps, clock=clock, t0_ns=0, on_end=ended.append)
    p._loop()  # run synchronously: the fake clock makes it deterministic
    assert isinstance(ended[0], EOFError)
    sched = []
    while (got := q.get(0)) is not None:
        sched.append(got[0].t_sched_ns)
    return p, q, sched


def test_deadlines_are_absolute() -> None:
    """Capture time does not accumulate into the schedule: frame k is due at k * period."""
    _, _, sched = run_pacer([30_000_000] * 5)  # 30 ms grabs at 10 fps
    assert sched == [k * 100_000_000 for k in range(5)]


def test_late_pacer_skips_ahead_without_burst() -> None:
    """A grab that overruns by 2.5 periods skips the missed deadlines instead of bursting."""
    p, _, sched = run_pacer([1_000_000, 250_000_000, 1_000_000, 1_000_000])
    # frame 1 is due at 100 ms and its grab ends at 350 ms: deadlines 200 and 300 are skipped
    assert sched == [0, 100_000_000, 400_000_000, 500_000_000]
    assert p.missed_ticks == 2
    gaps = np.diff(sched)
    assert (gaps >= 100_000_000).all()  # never two frames inside one period


def test_frame_records_grab_and_capture_time() -> None:
    """Each frame carries its scheduled time, capture time and grab duration."""
    clock = FakeClock()
    q = FrameQueue(10, "oldest")
    n = {"i": 0}

    def read() -> tuple[np.ndarray, float | None]:
        n["i"] += 1
        if n["i"] > 2:
            raise EOFError
        clock.advance(7_000_000)
        return IMG, 1.5

    p = Pacer(read, q, fps=5, clock=clock, t0_ns=0, on_end=lambda e: None)
    p._loop()
    got = q.get(0)
    assert got is not None
    fr = got[0]
    assert fr.t_sched_ns == 0 and fr.grab_ns == 7_000_000 and fr.t_capture_ns == 7_000_000
    assert fr.source_ts == 1.5


def test_stop_interrupts_the_wait() -> None:
    """stop() ends a pacer that is sleeping towards a far deadline, promptly."""
    from soakd.clock import MonotonicClock

    clock = MonotonicClock()
    q = FrameQueue(1)
    p = Pacer(
        lambda: (IMG, None), q, fps=0.01, clock=clock, t0_ns=clock.now_ns(), on_end=lambda e: None
    )
    p.start()
    got = q.get(2.0)  # the first frame is due at once
    assert got is not None
    ev = threading.Event()
    threading.Thread(target=lambda: (p.stop(), ev.set())).start()
    assert ev.wait(2.0), "pacer did not stop within 2 s while waiting 100 s for a deadline"


def _unpaced(stream: int, streams: int, log: list[str]) -> UnpacedGrab:
    def read() -> tuple[np.ndarray, float | None]:
        log.append(f"read {stream}")
        return IMG, None

    return UnpacedGrab(
        read, fps=10.0, clock=FakeClock(), on_end=lambda e: None, stream=stream, streams=streams
    )


def test_unpaced_streams_are_grabbed_in_turn_each_right_before_it_is_taken() -> None:
    """Unpaced, N streams take turns, and each frame is read only when the driver asks for
    it (never read ahead, which would age it by the frames dispatched meanwhile)."""
    log: list[str] = []
    feed = RoundRobin([_unpaced(s, 3, log) for s in range(3)])
    for n, (frame, qlen) in enumerate(feed.frames(lambda: False)):
        log.append(f"take {frame.stream}")
        assert (frame.id, qlen) == (n, 0)  # ids k * N + s in capture order
        if n == 5:
            break
    assert log == [f"{op} {s}" for s in (0, 1, 2, 0, 1, 2) for op in ("read", "take")]


def test_unpaced_feed_ends_when_stopped_and_reports_a_failing_source() -> None:
    """The unpaced feed stops at ``stopped()``; a source that raises is reported to
    ``on_end`` and the error reaches the driver."""
    stop = threading.Event()
    grab = _unpaced(0, 1, [])
    frames = grab.frames(stop.is_set)
    next(frames)
    stop.set()
    assert next(frames, None) is None and grab.captured == 1
    ended: list[BaseException] = []

    def fail() -> tuple[np.ndarray, float | None]:
        raise EOFError("gone")

    broken = UnpacedGrab(fail, fps=10.0, clock=FakeClock(), on_end=ended.append)
    with pytest.raises(EOFError):
        next(broken.frames(lambda: False))
    assert [str(e) for e in ended] == ["gone"]

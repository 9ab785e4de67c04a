"""The frame sink: records leave the driver in batches, in order, with nothing lost, and a
staged frame's batched record is exactly the record built for it one at a time."""

from __future__ import annotations

import random
import threading
from typing import Any

import numpy as np

from soakd.clock import FakeClock
from soakd.config import load_settings
from soakd.records import Frame, FrameRecord, StageOutput
from soakd.run.drivers import DriverContext, get_driver
from soakd.run.drivers.context import WarmUp
from soakd.run.pacer import UnpacedGrab
from soakd.run.sink import FrameSink, StagedFrame, staged_records

T0 = 5_000_000_000


def _ctx(sink: FrameSink, **kw: Any) -> DriverContext[Any]:
    return DriverContext(
        settings=load_settings(overrides=["workload.kind=synthetic"]),
        workload=kw.pop("workload", None),
        clock=kw.pop("clock", FakeClock(start_ns=T0)),
        t0_ns=T0,
        stop=threading.Event(),
        sink=sink,
        emit=lambda r: None,
        event=lambda e: None,
        queue=None,
        grab=kw.pop("grab", None),
        warm=WarmUp(T0 + 10**9),
        **kw,
    )


def _staged(rng: random.Random, i: int) -> StagedFrame:
    t = T0 + i * 33_333_333 + rng.randrange(10**6)
    ts, grab = t, rng.randrange(10**5, 10**7)
    tc = ts + rng.randrange(10**5) + grab
    t1 = tc + rng.randrange(10**7)
    t2, t3 = t1 + rng.randrange(10**7), t1 + rng.randrange(10**7, 10**8)
    t4 = t3 + rng.randrange(10**6)
    out = (rng.choice([None, 7]), rng.choice([None, 560]), None, rng.choice([None, {"k": 1}]))
    return StagedFrame(
        i, i % 3, ts, tc, grab, t1, t2, t3, t4, i % 4, i // 2, i // 5, *out, i == 0, i < 3
    )


def _one_by_one(s: StagedFrame) -> FrameRecord:
    """The same frame's record as every other driver builds it (DriverContext.record)."""
    ctx = _ctx(FrameSink(lambda b: None, T0))
    frame = Frame(s.frame_id, s.t_sched, s.t_capture, s.grab, np.zeros(1), stream=s.stream)
    return ctx.record(
        frame,
        s.queue_len,
        s.t1,
        t_done=(s.t4 - T0) / 1e9,
        pre_ms=(s.t2 - s.t1) / 1e6,
        infer_ms=(s.t3 - s.t2) / 1e6,
        decode_ms=(s.t4 - s.t3) / 1e6,
        total_ms=(s.grab + s.t4 - s.t1) / 1e6,
        e2e_ms=(s.t4 - s.t_sched) / 1e6,
        drop_count=s.drop_count,
        stale_count=s.stale_count,
        out_tokens=s.out_tokens,
        vision_tokens=s.vision_tokens,
        audio_tokens=s.audio_tokens,
        extra=s.extra,
        first=s.first,
        warmup=s.warmup,
    )


def test_a_batch_of_staged_frames_becomes_exactly_their_one_by_one_records() -> None:
    rng = random.Random(3)
    frames = [_staged(rng, i) for i in range(300)]
    assert staged_records(frames, T0) == [_one_by_one(s) for s in frames]


def test_the_sink_delivers_in_order_every_batch_and_what_is_left_on_drain() -> None:
    got: list[list[int]] = []
    sink = FrameSink(lambda b: got.append([r.frame_id for r in b]), T0, batch=4)
    for i in range(10):
        sink.add(FrameRecord(i, 0.0, 0.0, None, None, 0.0, 0.0))
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    sink.drain()
    sink.drain()  # nothing pending: no empty batch
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_record_added_now_leaves_after_the_staged_frames_before_it() -> None:
    got: list[Any] = []
    sink = FrameSink(got.append, T0)
    rng = random.Random(1)
    sink.add(_staged(rng, 0))
    sink.add(_staged(rng, 1))
    sink.add_now(FrameRecord(2, 0.0, 0.0, None, None, 0.0, 0.0, error="boom"))
    assert [[r.frame_id for r in b] for b in got] == [[0, 1], [2]]
    assert all(type(r) is FrameRecord for b in got for r in b)


def test_frames_appended_by_one_thread_are_all_delivered_by_drains_from_another() -> None:
    """The monitor drains while the driver appends: every frame once, in order."""
    got: list[int] = []
    sink = FrameSink(lambda b: got.extend(r.frame_id for r in b), T0, batch=1000)
    n = 20_000

    def drive() -> None:
        for i in range(n):
            sink.add(FrameRecord(i, 0.0, 0.0, None, None, 0.0, 0.0))

    t = threading.Thread(target=drive)
    t.start()
    while t.is_alive():
        sink.drain()
    sink.drain()
    assert got == list(range(n))


class _Stages:
    """A staged workload on a fake clock: each stage takes a known time; frame 2 raises."""

    shape = "staged"

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.n = clock, 0

    def preprocess(self, frame: Frame) -> Frame:
        self.clock.advance(1_000_000)
        return frame

    def infer(self, frame: Frame) -> Frame:
        self.clock.advance(20_000_000 + frame.id * 1000)
        if frame.id == 2:
            raise ValueError("planted")
        return frame

    def decode(self, frame: Frame) -> StageOutput:
        self.clock.advance(3_000_000)
        return StageOutput(text=f"f{frame.id}", tokens=frame.id)

    def sync(self) -> None:
        return None


def _drive_staged(
    workload: type[_Stages], max_frames: int
) -> tuple[DriverContext[Any], list[FrameRecord], bool]:
    """The staged driver over an unpaced feed on a fake clock, in its own thread; the
    records it handed on, and whether it was still running 10 s later."""
    clock = FakeClock(start_ns=T0)
    got: list[FrameRecord] = []
    grab = UnpacedGrab(
        lambda: (np.zeros((4, 4, 3), np.uint8), None), fps=10, clock=clock, on_end=print
    )
    ctx = _ctx(
        FrameSink(got.extend, T0), workload=workload(clock), clock=clock, grab=grab,
        max_frames=max_frames,
    )  # fmt: skip
    driver = threading.Thread(target=get_driver("staged"), args=(ctx,), daemon=True)
    driver.start()
    driver.join(10)
    ran_on = driver.is_alive()  # past the budget: only the stop event would end it
    ctx.stop.set()
    driver.join(5)
    ctx.sink.drain()
    return ctx, got, ran_on


def test_the_staged_driver_times_each_stage_and_records_an_error_in_its_place() -> None:
    ctx, got, _ = _drive_staged(_Stages, 5)
    assert [r.frame_id for r in got] == [0, 1, 2, 3, 4]
    assert [r.infer_ms for r in got] == [20.0, 20.001, None, 20.003, 20.004]
    assert [r.pre_ms for r in got] == [1.0] * 5
    assert [r.decode_ms for r in got] == [3.0, 3.0, None, 3.0, 3.0]
    assert [r.out_tokens for r in got] == [0, 1, None, 3, 4]
    assert got[2].error == "ValueError: planted" and got[2].total_ms is None
    assert [r.first for r in got] == [True, False, False, False, False]
    assert ctx.summary["sample_output"] == "f0" and ctx.counters.done == 5


class _Broken(_Stages):
    def infer(self, frame: Frame) -> Frame:
        raise RuntimeError("always")


def test_a_frame_budget_ends_the_staged_driver_even_when_every_frame_fails() -> None:
    ctx, got, ran_on = _drive_staged(_Broken, 3)
    assert not ran_on
    assert [r.error for r in got] == ["RuntimeError: always"] * 3
    assert ctx.counters.errors == ctx.counters.done == 3

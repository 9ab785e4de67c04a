"""The generator workload kind: the built-in tiny generator, the generator driver's records
(first-frame latency kept apart from amortised inter-frame intervals), hang detection, and
users' own generators through ``factory``."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from soakd.clock import FakeClock, MonotonicClock
from soakd.config import GeneratorWorkloadSettings, Settings, load_settings
from soakd.errors import UsageError
from soakd.records import Emission, Event, Frame, FrameRecord
from soakd.run.drivers import DriverContext
from soakd.run.drivers.context import WarmUp
from soakd.run.drivers.generator import drive
from soakd.run.pacer import UnpacedGrab
from soakd.run.runner import run_soak
from soakd.run.sink import FrameSink
from soakd.workloads.base import EmitFn, GeneratorTimings, WorkloadContext, WorkloadError
from soakd.workloads.generator import TinyGenerator, build

# --- fakes used by the driver tests and, through ``factory``, by the end-to-end ones


class ScriptedGenerator:
    """Advances a FakeClock by ``chunk_ms[i]`` before emitting chunk ``i`` of ``sizes[i]``."""

    shape: Literal["generator"] = "generator"

    def __init__(self, clock: FakeClock, chunk_ms: list[float], sizes: list[int]) -> None:
        self.clock, self.chunk_ms, self.sizes = clock, chunk_ms, sizes

    def setup(self) -> None: ...
    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None: ...

    def generate(self, frame: Frame, emit: EmitFn) -> GeneratorTimings:
        for ms, n in zip(self.chunk_ms, self.sizes, strict=True):
            self.clock.advance(int(ms * 1e6))
            emit(n)
        return GeneratorTimings(pre_ms=1.0, infer_ms=2.0, decode_ms=3.0)


class HangingGenerator:
    """Answers ``answer`` requests, then blocks until closed (a hung pipeline)."""

    shape: Literal["generator"] = "generator"

    def __init__(self, answer: int = 2) -> None:
        self.answer = answer
        self.calls = 0
        self.closed = threading.Event()

    def setup(self) -> None: ...
    def describe(self) -> dict[str, Any]:
        return {"answer": self.answer}

    def close(self) -> None:
        self.closed.set()

    def generate(self, frame: Frame, emit: EmitFn) -> GeneratorTimings:
        self.calls += 1
        if self.calls > self.answer:
            self.closed.wait()
        emit(1)
        emit(1)
        return GeneratorTimings()


def hanging_factory(options: dict[str, Any], ctx: WorkloadContext) -> HangingGenerator:
    return HangingGenerator(int(options.get("answer", 2)))


def tiny_factory(options: dict[str, Any], ctx: WorkloadContext) -> TinyGenerator:
    """A user's factory that wraps the tiny generator (stands for a real pipeline)."""
    return TinyGenerator(GeneratorWorkloadSettings(**options), ctx)


def _frame(i: int, t_ns: int) -> Frame:
    return Frame(i, t_ns, t_ns, 0, np.zeros((16, 16, 3), np.uint8))


def _ctx(
    workload: Any, clock: Any, *, max_frames: int, **settings: Any
) -> tuple[DriverContext, list[Any], list[Event], list[str]]:
    records: list[Any] = []
    events: list[Event] = []
    aborts: list[str] = []
    ov = [f"workload.{k}={v!r}" for k, v in settings.items()]
    ctx = DriverContext(
        settings=load_settings(overrides=["workload.kind=generator", *ov]),
        workload=workload,
        clock=clock,
        t0_ns=clock.now_ns(),
        stop=threading.Event(),
        sink=FrameSink(records.extend, clock.now_ns(), batch=1),
        emit=records.append,
        event=events.append,
        queue=None,
        grab=UnpacedGrab(
            lambda: (np.zeros((16, 16, 3), np.uint8), None),
            fps=30,
            clock=clock,
            on_end=lambda e: None,
        ),
        warm=WarmUp(0),
        max_frames=max_frames,
        request_abort=aborts.append,
    )
    return ctx, records, events, aborts


# --- the built-in tiny generator


def test_tiny_generator_emits_every_chunk_and_times_its_stages() -> None:
    """The tiny generator emits chunks_per_request chunks of frames_per_chunk frames and
    reports positive pre, denoise (infer) and decode times."""
    s = GeneratorWorkloadSettings(
        width=32, height=24, frames_per_chunk=3, chunks_per_request=2, mode="request"
    )
    gen = build(s, WorkloadContext())
    assert isinstance(gen, TinyGenerator)
    gen.setup()
    try:
        emitted: list[int] = []
        t = gen.generate(_frame(0, 0), emitted.append)
    finally:
        gen.close()
    assert emitted == [3, 3]
    assert t.pre_ms is not None and t.pre_ms > 0
    assert t.infer_ms is not None and t.infer_ms > 0
    assert t.decode_ms is not None and t.decode_ms > 0
    assert gen.describe()["num_inference_steps"] == s.num_inference_steps


def test_tiny_generator_rejects_a_size_the_decoder_cannot_make() -> None:
    """A width or height that is not a multiple of 8 is a one-line WorkloadError."""
    with pytest.raises(WorkloadError, match=r"multiples of 8.*30x24"):
        build(GeneratorWorkloadSettings(width=30, height=24), WorkloadContext())


def test_bad_generator_factory_reference_is_a_config_error() -> None:
    """A factory that is not 'package.module:function' is rejected when settings load."""
    from soakd.config import ConfigError

    with pytest.raises(ConfigError, match=r"workload.factory: must look like"):
        load_settings(overrides=["workload.kind=generator", "workload.factory='not a ref'"])


# --- the driver, on a fake clock: exact numbers


def test_driver_keeps_first_frame_latency_apart_and_amortises_chunks() -> None:
    """The first chunk's time is first_emit_ms with NULL intervals; a later chunk of n frames
    after a gap of g ms gives n intervals of g/n, all with t_emit at the chunk's arrival."""
    clock = FakeClock(start_ns=10**9)
    wl = ScriptedGenerator(clock, chunk_ms=[100.0, 40.0, 60.0], sizes=[4, 4, 2])
    ctx, records, events, aborts = _ctx(wl, clock, max_frames=2)
    drive(ctx)
    frames = [r for r in records if isinstance(r, FrameRecord)]
    ems = [r for r in records if isinstance(r, Emission)]
    assert [f.frame_id for f in frames] == [0, 1]
    f0 = frames[0]
    assert f0.first_emit_ms == pytest.approx(100.0)
    assert f0.emitted == 10
    assert (f0.pre_ms, f0.infer_ms, f0.decode_ms) == (1.0, 2.0, 3.0)
    assert f0.total_ms == pytest.approx(200.0)
    req0 = [e for e in ems if e.frame_id == 0]
    assert [e.idx for e in req0] == list(range(10))
    assert [e.interval_ms for e in req0[:4]] == [None] * 4
    assert [e.interval_ms for e in req0[4:8]] == [pytest.approx(10.0)] * 4
    assert [e.interval_ms for e in req0[8:]] == [pytest.approx(30.0)] * 2
    assert [e.chunk_ms for e in req0] == [
        pytest.approx(v) for v in [100.0] * 4 + [40.0] * 4 + [60.0] * 2
    ]
    assert [e.t_emit for e in req0[4:8]] == [pytest.approx(0.14)] * 4
    # the second request starts over: its first chunk is latency again, not an interval
    req1 = [e for e in ems if e.frame_id == 1]
    assert [e.interval_ms for e in req1[:4]] == [None] * 4
    assert ctx.summary["first_emit_ms"]["p50"] == pytest.approx(100.0)
    assert ctx.summary["interval_ms"]["max"] == pytest.approx(30.0)
    assert ctx.summary["generator_frames_emitted"] == 20
    assert events == [] and aborts == []


def test_driver_records_a_generator_error_per_request_and_goes_on() -> None:
    """A request that raises gets an error row and an error event; the next one still runs."""

    class Flaky(ScriptedGenerator):
        n = 0

        def generate(self, frame: Frame, emit: EmitFn) -> GeneratorTimings:
            self.n += 1
            if self.n == 1:
                raise RuntimeError("decoder exploded")
            return super().generate(frame, emit)

    clock = FakeClock()
    ctx, records, events, _ = _ctx(Flaky(clock, [5.0], [1]), clock, max_frames=2)
    drive(ctx)
    frames = [r for r in records if isinstance(r, FrameRecord)]
    assert frames[0].error == "RuntimeError: decoder exploded"
    assert frames[1].error is None and frames[1].emitted == 1
    assert [e.kind for e in events] == ["error"]


def test_driver_detects_a_hung_generator_within_the_response_timeout() -> None:
    """A generate() that never returns is a 'stall' event and an abort request within
    response_timeout_s, and the driver returns instead of hanging."""
    wl = HangingGenerator(answer=1)
    ctx, records, events, aborts = _ctx(wl, MonotonicClock(), max_frames=5, response_timeout_s=0.3)
    t0 = time.monotonic()
    drive(ctx)
    took = time.monotonic() - t0
    wl.close()
    assert took < 5.0
    assert [e.kind for e in events] == ["stall"]
    assert "did not return within 0.3 s" in events[0].message
    assert aborts == ["stalled"]
    assert [r.frame_id for r in records if isinstance(r, FrameRecord)] == [0]


# --- end to end, through the runner and a real SQLite file


@pytest.fixture
def gen_settings(db_path: Path) -> Callable[..., Settings]:
    def make(*overrides: str) -> Settings:
        base = [
            f"run.db={str(db_path)!r}",
            "run.duration=2.5",
            "run.fps=6",
            "run.warmup_s=0.5",
            "run.log_every=0",
            "source.width=64",
            "source.height=48",
            "workload.kind=generator",
            "workload.mode=request",  # these tests are of the request-per-frame shape
            "workload.width=32",
            "workload.height=32",
        ]
        return load_settings(overrides=[*base, *overrides])

    return make


@pytest.mark.slow
@pytest.mark.model
def test_soak_of_the_tiny_generator_stores_latency_and_intervals(
    gen_settings: Callable[..., Settings], db_path: Path
) -> None:
    """A short soak of the tiny generator stores one row per request with first_emit_ms and
    stage times, and one emission per generated frame whose intervals are the chunk gap
    divided by its frames (NULL for each request's first chunk)."""
    res = run_soak(gen_settings(), judge=False)
    assert res.status == "completed", res.reason
    conn = sqlite3.connect(db_path)
    rows = conn.execute(
        "SELECT frame_id, first_emit_ms, emitted, pre_ms, infer_ms, decode_ms, t_done - t_dispatch"
        " FROM frames WHERE run_id = ? ORDER BY frame_id",
        (res.run_id,),
    ).fetchall()
    assert len(rows) >= 5
    for _, first_ms, emitted, pre, infer, decode, wall_s in rows:
        assert emitted == 8  # 2 chunks x 4 frames (the defaults)
        assert 0 < first_ms <= wall_s * 1000 + 1e-6
        assert pre > 0 and infer > 0 and decode > 0
    n_em = conn.execute(
        "SELECT count(*) FROM emissions WHERE run_id = ?", (res.run_id,)
    ).fetchone()[0]
    assert n_em == 8 * len(rows)
    bad = conn.execute(
        "SELECT count(*) FROM emissions WHERE run_id = ? AND ("
        " (chunk = 0 AND interval_ms IS NOT NULL) OR"
        " (chunk > 0 AND abs(interval_ms - chunk_ms / chunk_frames) > 1e-9))",
        (res.run_id,),
    ).fetchone()[0]
    assert bad == 0
    assert res.summary["interval_ms"]["n"] > 0
    assert res.summary["first_emit_ms"]["p50"] > 0
    assert res.summary["generator_frames_emitted"] == n_em


@pytest.mark.slow
def test_hung_generator_ends_the_run_as_aborted_stalled(
    gen_settings: Callable[..., Settings], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's generator that stops answering mid-run ends the run as aborted ('stalled')
    with a stall event, well before the run's duration, instead of hanging."""
    settings = gen_settings(
        "run.duration=60",
        "workload.factory='tests.test_generator:hanging_factory'",
        "workload.options={answer = 3}",
        "workload.response_timeout_s=0.5",
    )
    t0 = time.monotonic()
    res = run_soak(settings, judge=False)
    assert time.monotonic() - t0 < 20
    assert (res.status, res.reason) == ("aborted", "stalled")
    conn = sqlite3.connect(db_path)
    kinds = [r[0] for r in conn.execute("SELECT kind FROM events WHERE run_id = ?", (res.run_id,))]
    assert "stall" in kinds
    n = conn.execute("SELECT count(*) FROM frames WHERE run_id = ?", (res.run_id,)).fetchone()[0]
    assert n == 3


@pytest.mark.slow
@pytest.mark.model
def test_generator_factory_wraps_a_users_pipeline(
    gen_settings: Callable[..., Settings], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kind = 'generator' with factory = 'pkg.mod:fn' soaks the user's generator, built with
    the options table, and stores its emissions."""
    settings = gen_settings(
        "run.duration=1.5",
        "workload.factory='tests.test_generator:tiny_factory'",
        "workload.options={width = 16, height = 16, frames_per_chunk = 1, chunks_per_request = 3}",
    )
    res = run_soak(settings, judge=False)
    assert res.status == "completed", res.reason
    conn = sqlite3.connect(db_path)
    emitted = {
        r[0] for r in conn.execute("SELECT emitted FROM frames WHERE run_id = ?", (res.run_id,))
    }
    assert emitted == {3}


def test_generator_factory_that_cannot_be_imported_fails_before_the_run(
    gen_settings: Callable[..., Settings],
) -> None:
    """A generator factory whose module does not exist is a usage error (exit 2) naming it."""
    settings = gen_settings("workload.factory='no_such_module_xyz:make'")
    with pytest.raises(UsageError, match=r"cannot import 'no_such_module_xyz'") as err:
        run_soak(settings, judge=False)
    assert int(err.value.exit_code) == 2


def test_shipped_generator_config_is_valid() -> None:
    """configs/generator.toml loads and validates: the built-in tiny generator as a rollout
    (configs/matrix-game.toml is kind = "matrix_game" now: tests/test_matrix_game.py)."""
    from .conftest import REPO

    s = load_settings(REPO / "configs" / "generator.toml")
    assert isinstance(s.workload, GeneratorWorkloadSettings)
    assert s.workload.factory is None and s.workload.mode == "rollout"
    assert s.criteria.content_fps == 8.0

"""workload.timing: stages timed by synchronizing at each stage's end ("sync", the default) or
by CUDA events recorded between them ("events"), which fall back to the host clock, and say
so, where there is no CUDA device.

No GPU runs here: the events' semantics are checked on a fake GPU (one stream on a fake
clock: launched work queues behind what is queued, an event completes when the stream
reaches it); the fallback runs for real on the CPU through the runner and the store."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from soakd.clock import FakeClock
from soakd.config import ConfigError, load_settings
from soakd.records import Event, Frame, FrameRecord, StageOutput
from soakd.run.drivers import DriverContext, get_driver, timing
from soakd.run.drivers.context import WarmUp
from soakd.run.pacer import UnpacedGrab
from soakd.run.runner import run_soak
from soakd.run.sink import FrameSink
from soakd.workloads.base import WorkloadContext

T0 = 1_000_000_000
MS = 1_000_000
FACTORY = "tests.test_stage_timing:host_model"


class FakeGpu:
    """One CUDA stream on a fake clock, shaped like the part of ``torch`` the timer uses."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.busy_until = 0  # when the stream finishes the work queued on it
        self.events_made = self.event_waits = self.device_syncs = 0
        self.cuda = SimpleNamespace(
            Event=lambda enable_timing: _FakeEvent(self),
            current_stream=lambda device: self,
            is_available=lambda: True,
            synchronize=self.synchronize,
        )

    def launch(self, ms: int) -> None:
        """Queue ``ms`` of GPU work; the host goes on at once."""
        self.busy_until = max(self.busy_until, self.clock.now_ns()) + ms * MS

    def wait_until(self, t: int) -> None:
        self.clock.advance(max(0, t - self.clock.now_ns()))

    def synchronize(self, device: Any = None) -> None:
        self.device_syncs += 1
        self.wait_until(self.busy_until)


class _FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        gpu.events_made += 1
        self.gpu, self.at = gpu, 0

    def record(self, stream: FakeGpu) -> None:
        self.at = max(self.gpu.clock.now_ns(), stream.busy_until)

    def synchronize(self) -> None:
        self.gpu.event_waits += 1
        self.gpu.wait_until(self.at)

    def elapsed_time(self, end: _FakeEvent) -> float:
        if max(self.at, end.at) > self.gpu.clock.now_ns():
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (end.at - self.at) / MS


class _GpuModel:
    """preprocess: 1 ms on the host, then 30 ms of GPU work queued; infer: 2 ms host, 10 ms
    GPU; decode: 3 ms on the host. ``sync()`` waits for the device."""

    shape = "staged"

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu

    def preprocess(self, frame: Frame) -> Frame:
        self.gpu.clock.advance(1 * MS)
        self.gpu.launch(30)
        return frame

    def infer(self, frame: Frame) -> Frame:
        self.gpu.clock.advance(2 * MS)
        self.gpu.launch(10)
        return frame

    def decode(self, frame: Frame) -> StageOutput:
        self.gpu.clock.advance(3 * MS)
        return StageOutput(tokens=1)

    def sync(self) -> None:
        self.gpu.cuda.synchronize()


def _drive(
    monkeypatch: pytest.MonkeyPatch, frames: int, *overrides: str
) -> tuple[FakeGpu, list[FrameRecord], list[Event], dict[str, Any]]:
    """The staged driver over ``_GpuModel`` on cuda:0 of the fake GPU, unpaced."""
    clock = FakeClock(start_ns=T0)
    gpu = FakeGpu(clock)
    monkeypatch.setattr(timing, "_torch", lambda: gpu)
    got: list[FrameRecord] = []
    events: list[Event] = []
    settings = load_settings(
        overrides=['workload.kind="python"', f'workload.factory="{FACTORY}"', *overrides]
    )
    grab = UnpacedGrab(lambda: (np.zeros((4, 4, 3), np.uint8), None), fps=10, clock=clock,
                       on_end=print)  # fmt: skip
    ctx: DriverContext[Any] = DriverContext(
        settings=settings, workload=_GpuModel(gpu), clock=clock, t0_ns=T0,
        stop=threading.Event(), sink=FrameSink(got.extend, T0), emit=lambda r: None,
        event=events.append, queue=None, grab=grab, warm=WarmUp(T0), max_frames=frames,
    )  # fmt: skip
    get_driver("staged")(ctx)
    ctx.sink.drain()
    return gpu, got, events, ctx.summary


def _stages(rec: FrameRecord) -> tuple[float | None, ...]:
    return rec.pre_ms, rec.infer_ms, rec.decode_ms


def test_events_put_queued_gpu_work_in_the_stage_that_launched_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With timing = "events" the 30 ms preprocess queued is preprocess's, infer is its own
    10 ms, the host's decode hides behind the GPU, and the frame ends when the GPU is done;
    four events are made once for the run, each frame waits once on its last event and the
    device is never synchronized."""
    gpu, got, events, summary = _drive(
        monkeypatch, 5, 'workload.device="cuda:0"', 'workload.timing="events"'
    )
    assert [_stages(r) for r in got] == [(30.0 + 1.0, 10.0, 0.0)] * 5
    assert all(r.t_done is not None for r in got)
    assert (gpu.events_made, gpu.event_waits, gpu.device_syncs) == (4, 5, 0)
    assert summary["stage_timing"] == "events" and events == []


def test_sync_is_the_default_and_waits_for_the_device_after_each_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without workload.timing each stage ends after workload.sync(): the host waits for the
    GPU twice a frame, so infer carries its 2 ms launch after preprocess's work and decode
    its own 3 ms; no CUDA event is made."""
    gpu, got, events, summary = _drive(monkeypatch, 3, 'workload.device="cuda:0"')
    assert [_stages(r) for r in got] == [(31.0, 12.0, 3.0)] * 3
    assert (gpu.events_made, gpu.device_syncs) == (0, 6)
    assert summary["stage_timing"] == "sync" and events == []


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (['workload.device="mps"'], "device 'mps' is not a CUDA device; timed on the host"),
        (["workload.device_map={a = 0, b = 1}"], "a device_map spans several GPUs"),
    ],
)
def test_events_without_one_cuda_device_fall_back_to_sync_and_say_so(
    monkeypatch: pytest.MonkeyPatch, overrides: list[str], why: str
) -> None:
    """timing = "events" on a device that is not CUDA, or over a device_map, runs as
    "sync" (no event made), and one stage_timing event says why."""
    gpu, got, events, summary = _drive(monkeypatch, 2, 'workload.timing="events"', *overrides)
    assert gpu.events_made == 0 and summary["stage_timing"] == "sync" and len(got) == 2
    assert [e.kind for e in events] == ["stage_timing"] and why in events[0].message
    assert events[0].data == {
        "requested": "events",
        "used": "sync",
        "device": "mps" if "mps" in overrides[0] else "cpu",
    }


@pytest.mark.parametrize(
    "workload",
    [
        ['workload.kind="tiny-vlm"'],
        ['workload.kind="av"'],
        ['workload.kind="hf"', 'workload.model_path="/models/m"'],
        ['workload.kind="python"', f'workload.factory="{FACTORY}"'],
    ],
)
def test_a_timing_other_than_sync_or_events_is_a_config_error(workload: list[str]) -> None:
    """workload.timing accepts "sync" and "events" only; anything else is one line naming
    the key and both values."""
    with pytest.raises(ConfigError) as err:
        load_settings(overrides=[*workload, 'workload.timing="gpu"'])
    assert str(err.value) == "workload.timing: must be 'sync' or 'events', got 'gpu'"


class _HostModel:
    """A CPU model: a little numpy in each stage."""

    shape = "staged"

    def setup(self) -> None:
        self.x = np.random.default_rng(0).standard_normal((64, 64))

    def preprocess(self, frame: Frame) -> Any:
        return frame.image.astype(np.float32).mean()

    def infer(self, inputs: Any) -> Any:
        return float((self.x @ self.x).sum()) + float(inputs)

    def decode(self, outputs: Any) -> StageOutput:
        return StageOutput(text=f"{outputs:.3f}", tokens=1)

    def sync(self) -> None: ...
    def describe(self) -> dict[str, Any]:
        return {"model": "host"}

    def close(self) -> None: ...


def host_model(options: dict[str, Any], ctx: WorkloadContext) -> _HostModel:
    return _HostModel()


def test_events_on_a_cpu_run_fall_back_to_the_host_clock_and_the_run_stores_it(
    tmp_path: Path,
) -> None:
    """A real run of a CPU workload with timing = "events": every frame is timed on the host
    clock, one stage_timing event is stored saying so, and runs.summary records "sync" as
    the timing used."""
    db = tmp_path / "t.db"
    settings = load_settings(
        overrides=[
            'workload.kind="python"', f'workload.factory="{FACTORY}"',
            'workload.timing="events"', f"run.db={str(db)!r}", "run.warmup_s=0",
            "run.log_every=0", "source.width=64", "source.height=48",
        ]
    )  # fmt: skip
    result = run_soak(settings, max_frames=6, paced=False, judge=False)
    assert result.summary["frames_done"] == 6 and result.summary["errors"] == 0
    with sqlite3.connect(db) as conn:
        evs = conn.execute(
            "SELECT message, data FROM events WHERE run_id = ? AND kind = 'stage_timing'",
            (result.run_id,),
        ).fetchall()
        (summary,) = conn.execute(
            "SELECT summary FROM runs WHERE id = ?", (result.run_id,)
        ).fetchone()
        n = conn.execute(
            "SELECT count(*) FROM frames WHERE run_id = ? AND pre_ms >= 0 AND infer_ms >= 0",
            (result.run_id,),
        ).fetchone()[0]
    assert len(evs) == 1 and "device 'cpu' is not a CUDA device" in evs[0][0]
    assert json.loads(evs[0][1])["used"] == "sync"
    assert json.loads(summary)["stage_timing"] == "sync" and n == 6

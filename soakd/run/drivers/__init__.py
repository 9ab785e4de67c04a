"""Drivers: the consumer loop of a run, one per workload shape.

The runner owns the pacer, the queue, the sampler, the store and the observers; a driver
only takes frames (``ctx.next_frame``), calls the workload, and hands back records
(``ctx.emit``) and events (``ctx.event``). ``drive(ctx)`` returns when ``ctx.stop`` is set,
the frame budget is spent, or the source ended; it records errors per frame and never lets a
workload exception end the run (except where the settings say so, e.g. ``on_oom = "stop"``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from soakd.clock import Clock
from soakd.records import Emission, Event, Frame, FrameRecord
from soakd.run.queue import FrameQueue

if TYPE_CHECKING:
    from soakd.config import Settings


@dataclass(slots=True)
class Counters:
    """Live counters shared by the driver and the runner's monitor (written by the driver
    thread only; read racily by the monitor, which is fine for a display)."""

    dispatched: int = 0
    done: int = 0
    stale: int = 0
    errors: int = 0
    ooms: int = 0
    in_flight_since_ns: int | None = None  # when the frame now in the workload was dispatched
    last_done_ns: int = 0


@dataclass
class DriverContext:
    settings: Settings
    workload: Any
    clock: Clock
    t0_ns: int
    stop: threading.Event
    emit: Callable[[FrameRecord | Emission], None]
    event: Callable[[Event], None]
    queue: FrameQueue | None  # paced runs
    grab: Callable[[], Frame] | None  # unpaced runs: capture inline
    warmup_end_ns: int
    max_frames: int | None = None
    counters: Counters = field(default_factory=Counters)
    summary: dict[str, Any] = field(default_factory=dict)  # kind-specific summary entries
    request_abort: Callable[[str], None] = lambda reason: None

    def s(self, ns: int) -> float:
        """Monotonic ns -> seconds since the run's start."""
        return (ns - self.t0_ns) / 1e9

    def next_frame(self, timeout: float = 0.1) -> tuple[Frame, int] | None:
        """The next frame to dispatch and the queue length when it was taken."""
        if self.grab is not None:
            return self.grab(), 0
        assert self.queue is not None
        return self.queue.get(timeout)

    @property
    def drops(self) -> int:
        return self.queue.drops if self.queue is not None else 0

    def make_event(
        self,
        kind: str,
        message: str = "",
        frame_id: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> Event:
        now = self.clock.now_ns()
        return Event(
            kind=kind,
            t=self.s(now),
            wall=self.clock.wall(),
            message=message,
            frame_id=frame_id,
            data=data,
        )

    def is_oom(self, exc: BaseException) -> bool:
        name = type(exc).__name__
        return name == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def get_driver(shape: str) -> Callable[[DriverContext], None]:
    modules = {
        "staged": "soakd.run.drivers.staged",
        "session": "soakd.run.drivers.session",
        "generator": "soakd.run.drivers.generator",
    }
    if shape not in modules:
        raise ValueError(f"unknown workload shape {shape!r}")
    import importlib

    drive: Callable[[DriverContext], None] = importlib.import_module(modules[shape]).drive
    return drive

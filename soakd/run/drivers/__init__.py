"""Drivers: the consumer loop of a run, one per workload shape.

The runner owns the pacer, the queue, the sampler, the store and the observers; a driver
only takes frames (``ctx.frames()``), calls the workload, and hands back frame records
(``ctx.sink``, batched), a generator's other rows (``ctx.emit``) and events
(``ctx.event``). ``drive(ctx)`` returns when ``ctx.stop`` is set,
the frame budget is spent, or the source ended; it records errors per frame and never lets a
workload exception end the run (except where the settings say so, e.g. ``on_oom = "stop"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from soakd.run.drivers import concurrent, generator, realtime, rollout, session, staged
from soakd.run.drivers.context import Counters, DriverContext

__all__ = ["Counters", "DriverContext", "get_driver"]

_DRIVERS: dict[str, Callable[[DriverContext[Any]], None]] = {
    "staged": staged.drive,
    "session": session.drive,
    "generator": generator.drive,
    "rollout": rollout.drive,
    "concurrent": concurrent.drive,  # staged, one frame in flight per stream
    "realtime": realtime.drive,  # a session shape over a WebSocket (kind = "realtime")
}


def get_driver(shape: str) -> Callable[[DriverContext[Any]], None]:
    """The driver for a workload shape (``staged``, ``session``, ``generator``,
    ``rollout``)."""
    if shape not in _DRIVERS:
        raise ValueError(f"unknown workload shape {shape!r}")
    return _DRIVERS[shape]

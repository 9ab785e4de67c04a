"""How the staged driver times a frame's stages: ``workload.timing``.

* ``"sync"`` (the default): each stage ends after ``workload.sync()``
  (``torch.cuda.synchronize`` on CUDA) and is read on the run's monotonic clock. The host
  waits for the GPU after ``preprocess`` and after ``infer``.
* ``"events"``: a CUDA timing event is recorded on the device's current stream at each of
  the frame's four boundaries (dispatched, preprocessed, inferred, decoded). Nothing waits
  between stages; the frame ends when the GPU reaches its last event (one wait on that
  event, never a device synchronize), and ``pre`` and ``infer`` are the elapsed times
  between events. GPU work a stage queued and did not wait for is counted in that stage,
  and the next stage's host work overlaps it. ``decode`` runs from the end of ``infer`` on
  the GPU to the frame's end on the host clock. The four events are made once per run and
  recorded again every frame; a frame reads them once.

``"events"`` needs one CUDA device: on any other device (``cpu``, ``mps``), with a
``device_map`` over several GPUs, or where CUDA is not available, the run falls back to
``"sync"`` (on a CPU device: the host clock), says so once in a ``stage_timing`` event,
and stores the timing it used in its summary (``stage_timing``). Only the workloads that run
on a torch device have the setting (``tiny-vlm``, ``hf``, ``av``, ``python`` and plugins).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from typing import Any

from soakd.run.drivers.context import DriverContext


class CudaEvents:
    """The four timing events of a frame on one CUDA stream, made once and reused."""

    def __init__(self, torch: Any, device: str, now: Callable[[], int]) -> None:
        stream = torch.cuda.current_stream(device)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        self._events = events
        self._now = now
        #: record the dispatched / preprocessed / inferred boundary (no wait)
        self.begin, self.after_pre, self.after_infer, self._end = (
            partial(e.record, stream) for e in events
        )

    def finish(self, t1: int) -> tuple[int, int, int]:
        """Record the frame's last event, wait for the GPU to reach it and return the frame's
        preprocessed, inferred and done times (ns) on the run's clock: ``t1`` (dispatched)
        plus the GPU's elapsed times, then the host clock at the end."""
        e1, e2, e3, e4 = self._events
        self._end()
        e4.synchronize()
        t4 = self._now()
        t2 = min(t1 + round(e1.elapsed_time(e2) * 1e6), t4)
        t3 = min(t2 + round(e2.elapsed_time(e3) * 1e6), t4)
        return t2, t3, t4


def _torch() -> Any:
    """torch, imported when a run asks for events (a seam for tests' fake GPU)."""
    return importlib.import_module("torch")


def _fallback(device: str, device_map: Any) -> str | None:
    """Why ``"events"`` cannot time this workload, or None when it can."""
    if device_map:
        return "a device_map spans several GPUs; timed by workload.sync()"
    if not device.startswith("cuda"):
        return f"device {device!r} is not a CUDA device; timed on the host clock"
    if not _torch().cuda.is_available():
        return "CUDA is not available; timed on the host clock"
    return None


def stage_events(ctx: DriverContext[Any]) -> CudaEvents | None:
    """The run's CUDA events when ``workload.timing = "events"`` can be honoured, else None
    (``"sync"``). Stores the timing used (``summary["stage_timing"]``) and, when events were
    asked for and cannot be used, says why once (a ``stage_timing`` event)."""
    wl = ctx.settings.workload
    requested = getattr(wl, "timing", None)
    if requested is None:  # a workload without a torch device: the host clock, as always
        return None
    device = str(getattr(wl, "device", "cpu"))
    why = _fallback(device, getattr(wl, "device_map", None)) if requested == "events" else None
    used = "events" if requested == "events" and why is None else "sync"
    first = "stage_timing" not in ctx.summary  # several streams' drivers share the summary
    ctx.summary["stage_timing"] = used
    if why is not None and first:
        data = {"requested": requested, "used": used, "device": device}
        ctx.event(ctx.make_event("stage_timing", f"workload.timing = 'events': {why}", None, data))
    return CudaEvents(_torch(), device, ctx.clock.now_ns) if used == "events" else None

"""Observers: how the live display, the logs, sd_notify and the Prometheus exporter follow a
run without the runner knowing about any of them.

The runner calls every hook from its own threads; a hook must be quick and must not raise
(an observer that raises is logged once and dropped, the run goes on, and the runner, told
through ``Observers(failed=...)``, stores an ``observer_failed`` event the verdict warns of;
an observer that ``decides`` early, such as the early stop, names what its loss switched
off). Frame records come
in batches (``on_frames``: by default ``on_frame`` for each, at most 50 ms or 256 frames
after the frame finished); ``on_frame`` and ``on_sample`` are on the hot path: keep them
allocation-light.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from soakd.records import Event, FrameRecord, Sample

if TYPE_CHECKING:
    from soakd.config import Settings

log = structlog.get_logger("soakd.observers")


@dataclass(slots=True)
class RunInfo:
    run_id: str
    settings: Settings
    db_path: Path
    config_hash: str
    mode: str = "soak"
    gpu_name: str | None = None
    shape: str | None = None  # the workload's: staged, session, generator or rollout


@dataclass(slots=True)
class Progress:
    """A once-a-second snapshot (the runner's own rolling statistics)."""

    elapsed_s: float
    remaining_s: float
    frames_done: int  # frames finished (dispatched and completed) so far
    frames_captured: int
    achieved_fps: float  # frames finished per second over the last window
    drops: int
    stale: int
    errors: int
    age_p50_ms: float | None
    stage_p50_ms: dict[str, float | None] = field(
        default_factory=dict
    )  # grab/pre/infer/decode/total
    stage_p95_ms: dict[str, float | None] = field(default_factory=dict)
    stage_max_ms: dict[str, float | None] = field(default_factory=dict)
    failing: list[str] = field(default_factory=list)  # criteria already failing "so far"
    rss_bytes: int | None = None
    gpu_mem_bytes: int | None = None
    warmup: bool = False
    progressing: bool = True  # a frame finished since the previous snapshot
    stalled_s: float = 0.0  # seconds since the last frame finished


@dataclass(slots=True)
class RunResult:
    run_id: str
    status: str  # completed | aborted | crashed
    reason: str | None
    duration_s: float
    summary: dict[str, Any]
    verdict: Any = None  # soakd.analysis Verdict, once judged
    exit_code: int | None = None


class Observer:
    """Base class with no-op hooks; override what you need. ``decides``: the setting an
    observer carries out that can end the run early ("run.stop_on_fail"), None for one that
    only follows it: losing it makes that early decision impossible."""

    decides: str | None = None

    def on_phase(self, name: str) -> None: ...  # before the run starts: what it is doing
    def on_run_start(self, info: RunInfo) -> None: ...
    def on_loading(self, message: str, extend_s: float) -> None: ...
    def on_ready(self) -> None: ...
    def on_frame(self, rec: FrameRecord) -> None: ...
    def on_frames(self, recs: Sequence[FrameRecord]) -> None:
        """A batch of frame records, in order (the driver hands them over in batches:
        run/sink.py); by default ``on_frame`` for each."""
        for rec in recs:
            self.on_frame(rec)

    def on_sample(self, sample: Sample) -> None: ...
    def on_event(self, event: Event) -> None: ...
    def on_progress(self, progress: Progress) -> None: ...
    def on_stopping(self, reason: str) -> None: ...
    def on_run_end(self, result: RunResult) -> None: ...
    def close(self) -> None: ...


#: what ``Observers`` tells of an observer that raised: the observer, the hook, the error
Failed = Callable[[Observer, str, BaseException], None]


class Observers(Observer):
    """Fans hooks out to observers; one that raises is logged once, dropped and handed to
    ``failed`` (the runner stores it as a run event), once, whichever thread saw it."""

    def __init__(self, observers: Iterable[Observer], failed: Failed | None = None) -> None:
        self._obs: list[Observer] = list(observers)
        self._failed = failed
        self._lock = threading.Lock()

    @property
    def observers(self) -> list[Observer]:
        """The observers still called."""
        return list(self._obs)

    def _call(self, name: str, *args: Any) -> None:
        for o in list(self._obs):
            try:
                getattr(o, name)(*args)
            except Exception as exc:
                self._drop(o, name, exc)

    def _drop(self, o: Observer, hook: str, exc: BaseException) -> None:
        with self._lock:
            if o not in self._obs:  # another thread dropped it first
                return
            self._obs.remove(o)
        log.warning(
            "observer failed; dropped",
            observer=type(o).__name__,
            hook=hook,
            error=f"{type(exc).__name__}: {exc}",
        )
        if self._failed is not None:
            try:
                self._failed(o, hook, exc)
            except Exception as err:  # telling of a failure never fails the run
                log.error("observer failure not recorded", error=f"{type(err).__name__}: {err}")

    def on_phase(self, name: str) -> None:
        self._call("on_phase", name)

    def on_run_start(self, info: RunInfo) -> None:
        self._call("on_run_start", info)

    def on_loading(self, message: str, extend_s: float) -> None:
        self._call("on_loading", message, extend_s)

    def on_ready(self) -> None:
        self._call("on_ready")

    def on_frames(self, recs: Sequence[FrameRecord]) -> None:
        self._call("on_frames", recs)

    def on_sample(self, sample: Sample) -> None:
        self._call("on_sample", sample)

    def on_event(self, event: Event) -> None:
        self._call("on_event", event)

    def on_progress(self, progress: Progress) -> None:
        self._call("on_progress", progress)

    def on_stopping(self, reason: str) -> None:
        self._call("on_stopping", reason)

    def on_run_end(self, result: RunResult) -> None:
        self._call("on_run_end", result)

    def close(self) -> None:
        self._call("close")

"""What a driver is given: the run's clock, stop event, frame feed, record builder and
callbacks (``DriverContext``), and the live counters it shares with the monitor."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from soakd.clock import Clock
from soakd.records import ChunkStage, Emission, Event, Frame, FrameRecord
from soakd.run.sink import FrameSink

#: how long a driver waiting for a frame sleeps before it looks at the stop flag again: a
#: frame and the queue's close (the run's stop closes the feed at once) wake it sooner. A
#: served run's driver waits most of each period; woken 10 times a second it paid a wake's
#: CPU each time (issue 34)
IDLE_WAIT_S = 1.0

if TYPE_CHECKING:
    from soakd.config import Settings


@dataclass(slots=True)
class Counters:
    """Live counters shared by the driver and the runner's monitor (written by the driver
    thread only; read racily by the monitor, which is fine for a display)."""

    dispatched: int = 0
    done: int = 0
    stale: int = 0  # all streams together; per stream in ``stale_by``
    errors: int = 0
    ooms: int = 0
    in_flight_since_ns: int | None = None  # when the frame now in the workload was dispatched
    in_flight_stream: int = 0  # the stream of that frame
    last_done_ns: int = 0
    stale_by: dict[int, int] = field(default_factory=dict)  # stream -> stale frames

    def in_flight_streams(self) -> set[int]:
        """The stream with a frame in the workload now (none, or one)."""
        return set() if self.in_flight_since_ns is None else {self.in_flight_stream}

    def skip(self, stream: int) -> None:
        """Count a frame of ``stream`` skipped as stale."""
        self.stale += 1
        self.stale_by[stream] = self.stale_by.get(stream, 0) + 1


class StreamCounters:
    """The live counters of a run whose streams each have their own driver thread (the
    concurrent driver): what the monitor reads, summed over each stream's ``Counters``.
    The frame in flight longest is the one a stall is judged on. Read-only."""

    def __init__(self, parts: list[Counters]) -> None:
        self.parts = parts

    def _sum(self, name: str) -> int:
        return sum(getattr(p, name) for p in self.parts)

    dispatched = property(lambda self: self._sum("dispatched"))
    done = property(lambda self: self._sum("done"))
    stale = property(lambda self: self._sum("stale"))
    errors = property(lambda self: self._sum("errors"))
    ooms = property(lambda self: self._sum("ooms"))

    @property
    def last_done_ns(self) -> int:
        return max(p.last_done_ns for p in self.parts)

    @property
    def stale_by(self) -> dict[int, int]:
        return {s: n for p in self.parts for s, n in p.stale_by.items()}

    def _oldest(self) -> Counters | None:
        busy = [p for p in self.parts if p.in_flight_since_ns is not None]
        return min(busy, key=lambda p: p.in_flight_since_ns or 0) if busy else None

    @property
    def in_flight_since_ns(self) -> int | None:
        oldest = self._oldest()
        return None if oldest is None else oldest.in_flight_since_ns

    @property
    def in_flight_stream(self) -> int:
        oldest = self._oldest()
        return 0 if oldest is None else oldest.in_flight_stream

    def in_flight_streams(self) -> set[int]:
        """The streams with a frame in the workload now."""
        return {p.in_flight_stream for p in self.parts if p.in_flight_since_ns is not None}


class QueueView(Protocol):
    """What a driver reads its paced frames from: every stream (``StreamQueues``, served
    round-robin) or one (``OneStream``, a thread of the concurrent driver)."""

    def get(self, timeout: float | None = None) -> tuple[Frame, int] | None: ...
    def drops_of(self, stream: int) -> int: ...
    @property
    def drops(self) -> int: ...
    @property
    def closed(self) -> bool: ...


W = TypeVar("W")


class UnpacedFeed(Protocol):
    """Frames captured inline, back to back (run/pacer.py: UnpacedGrab, RoundRobin)."""

    def frames(self, stopped: Callable[[], bool]) -> Iterator[tuple[Frame, int]]: ...


class WarmUp:
    """The warm-up's end, one for the run: every copy of a driver context shares it (the
    concurrent driver runs one per stream). It is ``run.warmup_s`` or, later, the end of the
    slowest first frame: with the concurrent driver (``wait_for``: its streams) the warm-up is
    ``settled`` once each stream has finished its first frame (``first_done``), so the frames
    any stream captured while another's first frame compiled are warm-up too; one driver
    settles it with its first frame done (the runner's counter says so)."""

    def __init__(self, end_ns: int, wait_for: int = 0) -> None:
        self.end_ns = end_ns
        self._waiting = wait_for
        self._lock = threading.Lock()

    def first_done(self, t_ns: int) -> None:
        with self._lock:
            self.end_ns = max(self.end_ns, t_ns)
            self._waiting -= 1

    @property
    def settled(self) -> bool:
        """Every stream waited for has finished its first frame."""
        return self._waiting <= 0


@dataclass
class DriverContext(Generic[W]):
    settings: Settings
    workload: W
    clock: Clock
    t0_ns: int
    stop: threading.Event
    sink: FrameSink  # where each frame's record goes (handed on in batches)
    emit: Callable[[Emission | ChunkStage], None]  # a generator's other rows, at once
    event: Callable[[Event], None]
    queue: QueueView | None  # paced runs: the streams' queues (one stream's, concurrent)
    grab: UnpacedFeed | None  # unpaced runs: capture inline
    warm: WarmUp  # shared by the copies of this context (one per stream, concurrent)
    max_frames: int | None = None
    counters: Counters = field(default_factory=Counters)
    summary: dict[str, Any] = field(default_factory=dict)  # kind-specific summary entries
    request_abort: Callable[[str], None] = lambda reason: None
    #: the unpaced feed's one iterator, shared by ``frames`` and ``next_frame``
    _unpaced: Iterator[tuple[Frame, int]] | None = field(default=None, init=False, repr=False)

    @property
    def warmup_end_ns(self) -> int:
        """Frames captured before this are warm-up (``WarmUp``)."""
        return self.warm.end_ns

    def s(self, ns: int) -> float:
        """Monotonic ns -> seconds since the run's start."""
        return (ns - self.t0_ns) / 1e9

    def next_frame(self, timeout: float = 0.1) -> tuple[Frame, int] | None:
        """The next frame to dispatch and the queue length when it was taken."""
        if self.grab is not None:
            return next(self._unpaced_frames(), None)
        assert self.queue is not None
        return self.queue.get(timeout)

    def _unpaced_frames(self) -> Iterator[tuple[Frame, int]]:
        assert self.grab is not None
        if self._unpaced is None:
            self._unpaced = self.grab.frames(self.stop.is_set)
        return self._unpaced

    def frames(self, timeout: float = 0.1) -> Iterator[tuple[Frame, int]]:
        """Frames to dispatch (with the queue length when taken) until the run stops, the
        queue closes or, unpaced, the source ends: the loop head every driver shares."""
        stopped = self.stop.is_set
        if self.grab is not None:  # unpaced: the hot loop of a profile
            yield from self._unpaced_frames()
            return
        assert self.queue is not None
        while not stopped():
            got = self.queue.get(timeout)
            if got is not None:
                yield got
            elif self.queue.closed:
                return

    def first_done(self, t_ns: int) -> None:
        """The driver's first frame finished at ``t_ns``: the warm-up lasts at least until
        then, so every frame captured while it was in flight (a compile, a cache fill) is a
        warm-up frame however short ``run.warmup_s`` is (for every stream: ``WarmUp``)."""
        self.warm.first_done(t_ns)

    def budget_spent(self) -> bool:
        """The frame budget (``max_frames``, profiles) is used up."""
        return self.max_frames is not None and self.counters.done >= self.max_frames

    def record(
        self, frame: Frame, qlen: int, t_taken: int, *, dispatched: bool = True, **fields: Any
    ) -> FrameRecord:
        """A frame's record with the fields every driver fills the same way (times, lateness,
        grab, queue, age at ``t_taken``, drops, warm-up) and ``fields`` for the shape's own
        (stages, outputs, flags), which may also replace those (a rollout chunk's age).
        ``dispatched=False``: skipped, never given to the model."""
        if "warmup" not in fields:
            fields["warmup"] = frame.t_capture_ns < self.warmup_end_ns
        if "drop_count" not in fields:
            fields["drop_count"] = self.drops_of(frame.stream)
        if "stale_count" not in fields:
            fields["stale_count"] = self.counters.stale_by.get(frame.stream, 0)
        if "frame_age_ms" not in fields:
            fields["frame_age_ms"] = (t_taken - frame.t_capture_ns) / 1e6
        t0 = self.t0_ns
        return FrameRecord(
            frame_id=frame.id,
            t_sched=(frame.t_sched_ns - t0) / 1e9,
            t_capture=(frame.t_capture_ns - t0) / 1e9,
            t_dispatch=(t_taken - t0) / 1e9 if dispatched else None,
            t_done=fields.pop("t_done", None),
            lateness_ms=(frame.t_capture_ns - frame.grab_ns - frame.t_sched_ns) / 1e6,
            grab_ms=frame.grab_ns / 1e6,
            queue_len=qlen,
            stream=frame.stream,
            **fields,
        )

    @property
    def drops(self) -> int:
        """Frames dropped by the queues so far, all streams together."""
        return self.queue.drops if self.queue is not None else 0

    def drops_of(self, stream: int) -> int:
        """Frames of ``stream`` dropped so far: what its rows' ``drop_count`` carries."""
        return self.queue.drops_of(stream) if self.queue is not None else 0

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
        """CUDA's OutOfMemoryError, host memory exhausted (MemoryError, ENOMEM), or an error
        whose message says out of memory."""
        if isinstance(exc, MemoryError):
            return True
        if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
            return True
        name = type(exc).__name__
        return name == "OutOfMemoryError" or "out of memory" in str(exc).lower()

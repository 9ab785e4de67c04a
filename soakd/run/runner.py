"""A run is a stack of components: build them, start them in order, monitor, stop them in
reverse, close the run row, judge.

Threads (all named, stoppable, joined in reverse start order): ``soakd-store`` (writer),
``soakd-sampler``, ``soakd-driver`` (consumer, calls the model), ``soakd-pacer`` (producer).
The calling thread is the monitor: it ends the run on duration, frame budget, stall, source
end, store failure or a stop request (signals), and publishes a progress snapshot each
second to the observers (live display, logs, sd_notify, Prometheus).
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import structlog

from soakd.analysis import evaluate
from soakd.analysis import store as store_verdict
from soakd.analysis.model import Verdict
from soakd.clock import Clock, MonotonicClock
from soakd.config import Settings
from soakd.environment import GpuUnavailable
from soakd.environment import collect as collect_environment
from soakd.errors import SoakdError, UsageError
from soakd.observers.base import Observer, Observers, Progress, RunInfo, RunResult
from soakd.records import (
    OBSERVER_FAILED_EVENT,
    STAGES,
    ChunkStage,
    Emission,
    Event,
    FrameRecord,
    Sample,
    safe_text,
)
from soakd.run.auto_duration import watch_auto_duration
from soakd.run.drivers import Counters, DriverContext, get_driver
from soakd.run.drivers.concurrent import counters_for
from soakd.run.drivers.context import WarmUp
from soakd.run.early_stop import watch_early_stop
from soakd.run.outcome import Outcome, exit_code
from soakd.run.pacer import Pacer, RoundRobin, UnpacedGrab
from soakd.run.progress import Rolling
from soakd.run.queue import StreamQueues
from soakd.run.sink import FrameSink
from soakd.sources import open_source
from soakd.sources.audio import AudioSource, make_audio_source
from soakd.sources.base import Source
from soakd.store import db as store
from soakd.store import runs
from soakd.telemetry.devices import run_probes
from soakd.telemetry.probes import cuda_ordinal
from soakd.telemetry.sampler import Sampler
from soakd.telemetry.server import server_probes
from soakd.workloads.base import Workload, WorkloadContext, WorkloadError
from soakd.workloads.registry import build_workload

log = structlog.get_logger("soakd.run.runner")

#: events that are also logged as warnings
_WARN_EVENTS = ("error", "oom", "stall", "source_end", "signal", "sampler_crashed", "pause")

#: the stall timeout, once frames finish: this many times the longest recent frame (or the
#: frame period, if longer), never under STALL_FLOOR_S, never over ``run.stall_timeout_s``
STALL_FACTOR = 10.0
STALL_FLOOR_S = 5.0
#: about the monitor's longest sleep: how late it may see a stall, the first frame or a
#: store error, and how long the sink's frames may wait for it at a low rate (a paced run's
#: end it wakes for on time). Each wake costs the process CPU, most of it a cold cache (on a
#: 2-vCPU VM about 130 µs alone, half that beside another thread's wake): so the monitor
#: wakes once a second, on a tick of the sampler's (``_tick_s``; docs/benchmarks.md, issue 34)
MONITOR_TICK_S = 1.0
#: how long ``workload.close()`` may take before the run goes on without it
CLOSE_TIMEOUT_S = 30.0


def monitor_sleep_s(now_ns: int, t0_ns: int, period_ns: int, end_ns: int | None) -> float:
    """How long the monitor sleeps from ``now_ns``: to its next deadline, a whole number of
    sampler periods (``period_ns``) from the run's start ``t0_ns``, as near MONITOR_TICK_S
    as they come, so that it wakes with a sampler tick; or to a paced run's end
    (``end_ns``) if that comes first."""
    step = max(1, round(MONITOR_TICK_S * 1e9 / period_ns)) * period_ns
    deadline = t0_ns + ((now_ns - t0_ns) // step + 1) * step
    if end_ns is not None:
        deadline = min(deadline, end_ns)
    return max(0.0, (deadline - now_ns) / 1e9)


def new_run_id(now: float | None = None) -> str:
    """Sortable and unique: ``20261202T120455-3f2a9c``."""
    t = time.gmtime(now if now is not None else time.time())
    return time.strftime("%Y%m%dT%H%M%S", t) + "-" + secrets.token_hex(3)


class Component(Protocol):
    """A part of the run's stack: started in order, stopped in reverse."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


class _Feed:
    """The paced feed: one pacer per stream and their queues, stopped together (the driver
    then sees the queues closed and returns)."""

    def __init__(self, pacers: Sequence[Pacer], queue: StreamQueues) -> None:
        self.pacers, self.queue = pacers, queue

    def start(self) -> None:
        for p in self.pacers:
            p.start()

    def stop(self) -> None:
        for p in self.pacers:
            p.stop_event.set()  # all at once: each wait ends together
        for p in self.pacers:
            p.stop()
        self.queue.close()


class _DriverThread:
    """``soakd-driver``: the workload's driver in its own thread. ``join_s`` is how long
    ``stop`` waits for the frame in flight (short after a stall: the model is hung)."""

    def __init__(
        self,
        drive: Callable[[DriverContext[Any]], None],
        ctx: DriverContext[Any],
        on_crash: Callable[[BaseException], None],
        on_return: Callable[[], None],
    ) -> None:
        self.drive, self.ctx, self.on_crash, self.on_return = drive, ctx, on_crash, on_return
        self.join_s = 5.0
        self.thread = threading.Thread(target=self._main, name="soakd-driver", daemon=True)

    def _main(self) -> None:
        try:
            self.drive(self.ctx)
        except BaseException as exc:  # a bug in a driver, or the source ending unpaced
            self.on_crash(exc)
        finally:
            self.on_return()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.thread.join(self.join_s)
        if self.thread.is_alive():
            log.warning("the frame in flight did not finish; leaving it behind")


@dataclass
class _Stack:
    """What one run is built from; ``parts`` in start order."""

    ctx: DriverContext[Any]
    parts: list[Component]
    driver: _DriverThread
    pacers: list[Pacer]  # one per stream; none unpaced
    queue: StreamQueues | None
    grab: UnpacedGrab | RoundRobin | None

    @property
    def captured(self) -> int:
        """Frames captured so far, all streams together."""
        if not self.pacers:
            return self.ctx.counters.done
        return sum(p.captured for p in self.pacers)


class Run:
    """One run. ``execute()`` returns a RunResult; see ``run_soak``."""

    def __init__(
        self,
        settings: Settings,
        *,
        observers: Sequence[Observer] = (),
        mode: str = "soak",
        max_frames: int | None = None,
        paced: bool = True,
        stop: threading.Event | None = None,
        clock: Clock | None = None,
        judge: bool = True,
    ) -> None:
        self.settings = settings
        self.obs = Observers(
            [
                *observers,
                *watch_early_stop(settings, self._event, self.request_stop),
                *watch_auto_duration(settings, self._event, self.request_stop),
            ],
            failed=self._observer_failed,
        )
        self.mode = mode
        self.max_frames = max_frames
        self.paced = paced
        self.stop = stop or threading.Event()
        self.clock = clock or MonotonicClock()
        self.judge = judge
        self.run_id = new_run_id()
        self.db_path = settings.resolved_db()
        self._outcome = Outcome()
        self._outcome_lock = threading.Lock()
        self._rolling = Rolling()
        self._last_sample: Sample | None = None
        self._source_error: BaseException | None = None
        self._driver_crash = False  # the driver thread raised (its frame in flight is no hang)
        self._queue: StreamQueues | None = None
        #: sources (run.streams): paced each by its own pacer, or grabbed in turn unpaced
        self.n_streams = settings.run.streams
        self._source_slow_logged = False
        self._workload_closed = False
        self._writer_started = False
        self._at_stop: tuple[int | None, float] = (None, settings.run.stall_timeout_s)
        self._in_flight_at_stop: set[int] = set()  # the streams with a frame in flight
        self._early_events: list[Event] = []  # observer failures before the store opened
        self.t0_ns = 0
        self.log = log.bind(run_id=self.run_id)

    # --- stopping
    def request_stop(
        self, reason: str | None = None, status: str = "aborted", internal: bool = False
    ) -> None:
        """Ask the run to end; the first reason wins. ``reason=None`` = normal completion."""
        with self._outcome_lock:
            if not self.stop.is_set():
                if reason is not None:
                    self._outcome = Outcome(status, safe_text(reason), internal)
                self.stop.set()

    # --- record plumbing (driver and sampler threads)
    def _deliver_frames(self, batch: list[FrameRecord]) -> None:
        """A batch of frame records from the sink (run/sink.py), in order."""
        self.writer.put_frames(batch)
        self._rolling.add_many(batch)
        self.obs.on_frames(batch)

    def _emit(self, rec: Emission | ChunkStage) -> None:
        self.writer.put(rec)

    def _event(self, ev: Event) -> None:
        self.writer.put(ev)
        self.obs.on_event(ev)
        if ev.kind in _WARN_EVENTS:
            self.log.warning(ev.kind, message=ev.message, frame=ev.frame_id)

    def _observer_failed(self, o: Observer, hook: str, exc: BaseException) -> None:
        """An observer raised and was dropped (``Observers``): an ``observer_failed`` event
        (kept until the store opens when it came before), and, for one that ``decides``
        early, an error line: that early decision is off for the rest of the run."""
        name, error = type(o).__name__, f"{type(exc).__name__}: {exc}"[:300]
        if o.decides:
            msg = f"{name} failed in {hook} ({error}): {o.decides} can no longer end this run"
            self.log.error("early decisions are off", observer=name, decides=o.decides)
        else:
            msg = f"{name} failed in {hook} ({error}); dropped for the rest of the run"
        data = {"observer": name, "hook": hook, "error": error, "decides": o.decides}
        t = (self.clock.now_ns() - self.t0_ns) / 1e9 if self.t0_ns else 0.0
        ev = Event(OBSERVER_FAILED_EVENT, t, self.clock.wall(), msg, data=data)
        if self._writer_started:
            self.writer.put(ev)
        else:
            self._early_events.append(ev)

    def _now_event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> Event:
        t = (self.clock.now_ns() - self.t0_ns) / 1e9
        return Event(kind, t, self.clock.wall(), message, data=data)

    def _sample(self, s: Sample) -> None:
        self._last_sample = s
        self.writer.put(s)
        for d in s.devices:  # one per GPU when the run samples several (gpu_samples)
            self.writer.put(d)
        for m in s.server:  # a served model's server metrics (server_metrics)
            self.writer.put(m)
        self.obs.on_sample(s)

    # --- building (before the run row exists: a failure here is a usage error)
    def _open_store(self) -> sqlite3.Connection:
        """The run database, checked for damage before anything is written (a damaged
        file is a usage error, exit 2, as every read command refuses it)."""
        try:
            conn = store.connect(self.db_path)
        except store.StoreError as exc:
            raise UsageError(str(exc)) from None
        try:
            if not store.check_damage(conn, self.db_path):
                self.log.info("damage check cut short", budget_s=store.DAMAGE_CHECK_S)
        except store.StoreError as exc:
            conn.close()
            raise UsageError(str(exc)) from None
        return conn

    def _open_inputs(
        self, stack: contextlib.ExitStack
    ) -> tuple[list[Source], list[AudioSource | None]]:
        """One source (and audio source) per stream: copies of ``[source]`` (``[audio]``),
        stream ``i`` seeded ``run.seed + i``."""
        s = self.settings
        sources: list[Source] = []
        audios: list[AudioSource | None] = []
        for i in range(self.n_streams):
            source = open_source(s.source, fps=s.run.fps, seed=s.run.seed + i)
            source.open()
            stack.callback(source.close)
            sources.append(source)
            audio = make_audio_source(s.audio, seed=i) if s.audio.kind != "none" else None
            if audio is not None:
                audio.open()
                stack.callback(audio.close)
            audios.append(audio)
        return sources, audios

    def _build_workload(self) -> Workload:
        s = self.settings
        wctx = WorkloadContext(
            seed=s.run.seed,
            width=s.source.width,
            height=s.source.height,
            fps=s.run.fps,
            duration_s=s.run.duration,
            audio_rate=s.audio.sample_rate if s.audio.kind != "none" else None,
            cache_dir=getattr(s.workload, "cache_dir", None),
            device=getattr(s.workload, "device", None) or "cpu",
            device_map=getattr(s.workload, "device_map", None),
            extend_timeout=lambda sec: self.obs.on_loading("loading workload", sec),
            phase=self.obs.on_phase,
            log=self.log,
        )
        try:
            wl = build_workload(s.workload, wctx)
            wl.setup()
        except (WorkloadError, SoakdError, FileNotFoundError) as exc:
            raise UsageError(f"workload {s.workload.kind!r}: {exc}") from None
        except SystemExit as exc:  # a factory or setup() that calls sys.exit(): nothing ran
            raise UsageError(
                f"workload {s.workload.kind!r}: called sys.exit({exc.code}) while loading"
            ) from None
        except Exception as exc:  # the model's own loading code raised: a one-line error
            raise UsageError(
                f"workload {s.workload.kind!r}: setup failed: {type(exc).__name__}: {exc}"
            ) from None
        if getattr(wl, "shape", None) not in ("staged", "session", "generator", "rollout"):
            raise UsageError(
                f"workload {s.workload.kind!r}: object has no valid 'shape' "
                "(expected 'staged', 'session', 'generator' or 'rollout')"
            )
        if self.n_streams > 1 and wl.shape != "staged" and not getattr(wl, "concurrent", False):
            with contextlib.suppress(Exception):
                wl.close()
            raise UsageError(
                f"run.streams: {self.n_streams} streams need a staged workload; workload "
                f"{s.workload.kind!r} is a {wl.shape} workload and takes one stream"
            )
        return wl

    # --- the run
    def execute(self) -> RunResult:
        with contextlib.ExitStack() as stack:
            stack.callback(self.obs.close)
            self.obs.on_phase("opening the store and source")
            conn = self._open_store()
            stack.callback(conn.close)
            sources, audios = self._open_inputs(stack)
            t_load = time.perf_counter()
            self.obs.on_phase("loading workload")
            workload = self._build_workload()
            load_s = time.perf_counter() - t_load
            stack.callback(self._close_workload, workload)
            return self._soak(conn, sources, audios, workload, load_s)
        raise AssertionError("unreachable")  # pragma: no cover (ExitStack may swallow)

    def _soak(
        self,
        conn: sqlite3.Connection,
        sources: list[Source],
        audios: list[AudioSource | None],
        workload: Workload,
        load_s: float,
    ) -> RunResult:
        # the GPUs to sample: one that run.gpus names but this host lacks is exit 2, no row
        self._probes = run_probes(self.settings, self.log)
        # a served model: its server's processes and metrics (exit 2 when not found)
        self._probes += server_probes(self.settings, self.log)
        env = collect_environment(ordinal=_gpu_ordinal(self.settings))
        self.t0_ns = self.clock.now_ns()
        runs.open_run(conn, self._new_run(workload, sources[0], load_s, env), self.clock.wall())
        # the monitor asks for a flush on each tick (``flush_soon``); the writer's own timer
        # is the fallback, should the monitor stop asking
        self.writer = store.StoreWriter(
            self.db_path, self.run_id, flush_interval_s=2 * MONITOR_TICK_S
        )
        self.writer.start()
        self._frames = FrameSink(self._deliver_frames, self.t0_ns)
        self._writer_started = True
        for ev in self._early_events:
            self.writer.put(ev)
        built = self._build_stack(sources, audios, workload)
        self._announce(env, workload.shape)
        self.obs.on_phase("warm-up" if self.settings.run.warmup_s > 0 else "first frame")
        self._run_stack(built)
        t_end_ns = self.clock.now_ns()
        # release the model before judging: judging needs memory a leak may have taken
        self._close_workload(workload)
        return self._close(conn, built, load_s, t_end_ns)

    def _new_run(
        self, workload: Workload, source: Source, load_s: float, env: dict[str, Any]
    ) -> runs.NewRun:
        s = self.settings
        describe = dict(workload.describe())
        describe["shape"] = workload.shape
        describe["load_s"] = round(load_s, 3)
        try:
            describe["source"] = dict(source.describe())
            if self.n_streams > 1:
                describe["source"]["streams"] = self.n_streams
        except Exception as exc:  # a description is nice to have, never worth failing for
            self.log.warning("source.describe() failed", error=f"{type(exc).__name__}: {exc}")
        return runs.NewRun(
            id=self.run_id,
            name=s.run.name,
            mode=self.mode,
            workload_kind=s.workload.kind,
            fps=s.run.fps if self.paced else None,
            config=s.to_dict(),
            config_hash=s.config_hash(),
            workload=describe,
            environment=env,
            labels=s.run.labels,
        )

    def _announce(self, env: dict[str, Any], shape: str) -> None:
        s = self.settings
        info = RunInfo(
            run_id=self.run_id,
            settings=s,
            db_path=self.db_path,
            config_hash=s.config_hash(),
            mode=self.mode,
            gpu_name=env.get("gpu_name"),
            shape=shape,
        )
        self.obs.on_run_start(info)
        self.log.info(
            "run started",
            db=str(self.db_path),
            workload=s.workload.kind,
            fps=s.run.fps if self.paced else "unpaced",
            duration_s=s.run.duration,
            mode=self.mode,
        )

    def _build_feed(
        self, sources: list[Source], audios: list[AudioSource | None], concurrent: bool = False
    ) -> tuple[StreamQueues | None, list[Pacer], UnpacedGrab | RoundRobin | None]:
        """Paced: one pacer per stream into its queue (``StreamQueues``); unpaced: the grab
        a profile's driver calls inline (the streams in turn when there are several)."""
        s, clock = self.settings, self.clock
        rate = s.audio.sample_rate if audios[0] is not None else None
        if not self.paced:
            grabs = [
                UnpacedGrab(
                    source.read,
                    fps=s.run.fps,
                    clock=clock,
                    on_end=self._source_ended,
                    audio=audio,
                    audio_rate=rate,
                    stream=i,
                    streams=self.n_streams,
                )
                for i, (source, audio) in enumerate(zip(sources, audios, strict=True))
            ]
            return None, [], grabs[0] if len(grabs) == 1 else RoundRobin(grabs)
        queue = self._queue = StreamQueues(
            self.n_streams, s.run.max_queue, s.run.consume, one_consumer_each=concurrent
        )
        pacers = [
            Pacer(
                source.read,
                q,
                fps=s.run.fps,
                clock=clock,
                t0_ns=self.t0_ns,
                on_end=self._source_ended,
                audio=audio,
                audio_rate=rate,
                on_missed=self._ticks_missed,
                stream=i,
                streams=self.n_streams,
            )
            for i, (source, audio, q) in enumerate(zip(sources, audios, queue.queues, strict=True))
        ]
        return queue, pacers, None

    def _build_stack(
        self, sources: list[Source], audios: list[AudioSource | None], workload: Workload
    ) -> _Stack:
        s, clock = self.settings, self.clock
        sampler = Sampler(
            self._probes,
            interval_ms=s.run.sample_interval_ms,
            clock=clock,
            t0_ns=self.t0_ns,
            on_sample=self._sample,
            on_event=self._event,
            on_crash=self._sampler_crashed,
            log=self.log,
        )
        # a workload that answers several requests at once (a served model) gets one
        # frame in flight per stream (drivers/concurrent.py)
        concurrent = bool(getattr(workload, "concurrent", False)) and self.paced
        queue, pacers, grab = self._build_feed(sources, audios, concurrent)
        ctx = DriverContext(
            settings=s,
            workload=workload,
            clock=clock,
            t0_ns=self.t0_ns,
            stop=self.stop,
            sink=self._frames,
            emit=self._emit,
            event=self._event,
            queue=queue,
            grab=grab,
            warm=WarmUp(
                self.t0_ns + int(s.run.warmup_s * 1e9), self.n_streams if concurrent else 0
            ),
            max_frames=self.max_frames,
            counters=cast(
                Counters, counters_for(self.n_streams if concurrent else 1, self.t0_ns)
            ),  # a StreamCounters (read-only sums) for the concurrent driver
            request_abort=lambda reason: self.request_stop(reason),
        )
        # a workload's own driver (realtime) runs its streams itself; a staged one that
        # answers several at once gets the concurrent driver
        own = getattr(workload, "driver", None)
        drive = get_driver(own or ("concurrent" if concurrent else workload.shape))
        driver = _DriverThread(drive, ctx, self._driver_crashed, on_return=self.request_stop)
        parts: list[Component] = [sampler, driver]
        if pacers and queue is not None:
            parts.append(_Feed(pacers, queue))
        return _Stack(ctx, parts, driver, pacers, queue, grab)

    # --- component callbacks (their own threads)
    def _sampler_crashed(self, exc: BaseException) -> None:
        # telemetry degrades, it does not end the run: the gap shows in the samples
        self._event(self._now_event("sampler_crashed", f"{type(exc).__name__}: {exc}"))

    def _source_ended(self, exc: BaseException) -> None:
        self._source_error = exc
        msg = str(exc) if str(exc).startswith("source") else f"{type(exc).__name__}: {exc}"
        self._event(self._now_event("source_end", msg))
        if self._queue is not None:
            self._queue.close()
        self.request_stop(f"source ended: {exc}")

    def _ticks_missed(self, n: int, cause: str, deadline_ns: int) -> None:
        """A pause (the process did not run on time) is an event; a slow source misses ticks
        on every frame, so only its first miss is. Its data holds the ticks missed and their
        ms (``ticks``, ``ms``: contention.pauses reads them)."""
        if cause != "pause" and self._source_slow_logged:
            return
        self._source_slow_logged |= cause != "pause"
        ms = n * 1e3 / self.settings.run.fps
        what = "the process did not run on time" if cause == "pause" else "the source was slow"
        kind = "pause" if cause == "pause" else "source_slow"
        data = {"ticks": n, "ms": ms}
        self._event(self._now_event(kind, f"{n} tick(s) missed (~{ms:.0f} ms): {what}", data))

    def on_signal(self, signum: int, reason: str) -> None:
        """A stop signal: recorded as a ``signal`` event, then the run stops cleanly."""
        if self._writer_started:
            self._event(self._now_event("signal", f"{reason}: stopping"))
        self.request_stop(reason)

    def mark_forced(self, reason: str) -> None:
        """A second stop signal: the process is about to die; leave the run row INVALID
        with that reason (best effort, on a fresh connection)."""
        try:
            conn = store.connect(self.db_path, mark_orphans=False)
            try:
                runs.mark_forced(conn, self.run_id, reason)
            finally:
                conn.close()
        except Exception as exc:
            self.log.warning("cannot mark the forced exit", error=f"{type(exc).__name__}: {exc}")

    def _driver_crashed(self, exc: BaseException) -> None:
        if self._source_error is not None:
            return  # unpaced: the source ended under the driver, already recorded
        self._driver_crash = True
        self.log.exception("driver crashed", exc_info=exc)
        self.request_stop(f"driver crashed: {type(exc).__name__}: {exc}", internal=True)

    def _run_stack(self, built: _Stack) -> bool:
        """Start the parts in order, monitor, stop them in reverse. True on a stall."""
        for part in built.parts:
            part.start()
        try:
            stalled = self._monitor(built)
        except KeyboardInterrupt:  # library use without signal handlers: Ctrl-C ends cleanly
            self.request_stop("signal SIGINT")
            stalled = False
        except BaseException as exc:  # a bug in the monitor: close the run, then re-raise
            self.request_stop(f"internal error: {type(exc).__name__}: {exc}", internal=True)
            self.log.exception("monitor crashed")
            stalled = False
        self.obs.on_stopping(self._outcome.reason or "completed")
        built.driver.join_s = 1.0 if stalled else self._grace_s(built.ctx.counters)
        for part in reversed(built.parts):
            part.stop()
        self._frames.drain()  # what the driver appended since the last batch
        c = built.ctx.counters
        # as the run ended, before closing the workload can release a hung frame
        self._at_stop = (c.in_flight_since_ns, self.stall_timeout_s(c))
        self._in_flight_at_stop = c.in_flight_streams()
        if not stalled and c.in_flight_since_ns is not None and not self._driver_crash:
            stalled = self._stalled_at_end(c)  # (a crashed driver left its frame: no hang)
        return stalled

    def stall_timeout_s(self, c: Counters) -> float:
        """The configured stall timeout until a frame finished; then scaled to the run:
        STALL_FACTOR x the longest recent frame or the frame period, at least STALL_FLOOR_S,
        at most the configured value (a 60 s default cannot protect a 20 s soak)."""
        cap = self.settings.run.stall_timeout_s
        worst_ms = self._rolling.worst_ms()
        if c.done == 0 or worst_ms is None:
            return cap
        frame_s = max(1.0 / self.settings.run.fps, worst_ms / 1e3)
        return min(cap, max(STALL_FLOOR_S, STALL_FACTOR * frame_s))

    def _grace_s(self, c: Counters) -> float:
        """How long to wait at the end for the frame in flight: what is left of its stall
        budget (a frame that takes longer is a hang), or 5 s when none is in flight."""
        since = c.in_flight_since_ns
        if since is None:
            return 5.0
        return max(1.0, self.stall_timeout_s(c) - (self.clock.now_ns() - since) / 1e9)

    def _stalled_at_end(self, c: Counters) -> bool:
        """The frame in flight when the run ended never finished: a hang the duration hid."""
        since = c.in_flight_since_ns
        if since is None:
            return False
        msg = "the frame in flight at the end did not finish: " + self._stall_message(c, since)
        self._event(self._now_event("stall", msg))
        with self._outcome_lock:
            self._outcome = Outcome("aborted", "stalled", self._outcome.internal)
        return True

    def _monitor(self, built: _Stack) -> bool:
        """Runs in the calling thread until the run should end. Returns True on a stall."""
        s, clock, c = self.settings, self.clock, built.ctx.counters
        end_ns = self.t0_ns + int(s.run.duration * 1e9)
        next_progress = self.t0_ns + 1_000_000_000
        ready, warm_logged, last_done_seen = False, False, 0
        while not self.stop.wait(self._tick_s(end_ns)):
            self._frames.drain()  # a low rate or a hung model: no record waits for a batch
            self.writer.flush_soon()  # with this wake, not on a timer of its own
            now = clock.now_ns()
            if self.paced and now >= end_ns:
                self.request_stop()
                break
            if not ready and c.done >= 1:
                ready = True
                self.obs.on_ready()
            if not warm_logged and self._warm(built, c) and now >= built.ctx.warmup_end_ns:
                warm_logged = True
                self._event(self._warmup_event(built.ctx, now))
            since = c.in_flight_since_ns
            if since is not None and now - since > self.stall_timeout_s(c) * 1e9:
                self._event(self._now_event("stall", self._stall_message(c, since)))
                self.request_stop("stalled")
                return True
            if self.writer.error is not None:
                self.request_stop(str(self.writer.error), internal=True)
                break
            if now >= next_progress:
                next_progress += 1_000_000_000
                progressing, last_done_seen = c.done != last_done_seen, c.done
                self.obs.on_progress(self._progress(built, now, end_ns, progressing))
        return False

    def _tick_s(self, end_ns: int) -> float:
        """How long the monitor sleeps (``monitor_sleep_s``)."""
        period = round(self.settings.run.sample_interval_ms * 1e6)
        end = end_ns if self.paced else None
        return monitor_sleep_s(self.clock.now_ns(), self.t0_ns, period, end)

    @staticmethod
    def _warm(built: _Stack, c: Counters) -> bool:
        """A frame has finished and, with the concurrent driver, every stream's first."""
        return c.done >= 1 and built.ctx.warm.settled

    def _warmup_event(self, ctx: DriverContext[Any], now: int) -> Event:
        """The ``warmup_end`` event, at the boundary the drivers flag frames by (not when the
        monitor saw it pass): ``run.warmup_s`` or the end of the first frame, whichever is
        later (``DriverContext.first_done``)."""
        warm, end = self.settings.run.warmup_s, ctx.warmup_end_ns
        t = (end - self.t0_ns) / 1e9
        msg = f"warm-up of {warm:g} s ended"
        if end > self.t0_ns + int(warm * 1e9):
            msg = f"warm-up ended with the first frame at {t:.2f} s (warmup_s {warm:g} s)"
        return Event("warmup_end", t, self.clock.wall() - (now - end) / 1e9, msg)

    def _stall_message(self, c: Counters, since_ns: int) -> str:
        return (
            f"no frame finished for {self.stall_timeout_s(c):.3g} s "
            f"(frame in flight since t={(since_ns - self.t0_ns) / 1e9:.1f} s)"
        )

    def _progress(self, built: _Stack, now: int, end_ns: int, progressing: bool) -> Progress:
        c, r = built.ctx.counters, self._rolling
        elapsed = (now - self.t0_ns) / 1e9
        vals = self._last_sample.values if self._last_sample is not None else {}
        gpu = vals.get("gpu_proc_mem_bytes") or vals.get("gpu_mem_used_bytes")
        return Progress(
            elapsed_s=elapsed,
            remaining_s=max(0.0, (end_ns - now) / 1e9) if self.paced else 0.0,
            frames_done=c.done,
            frames_captured=built.captured,
            achieved_fps=r.fps(elapsed),
            drops=built.ctx.drops,
            stale=c.stale,
            errors=c.errors,
            age_p50_ms=r.median("age"),
            stage_p50_ms={k: r.median(k) for k in STAGES},
            stage_p95_ms={k: r.p95(k) for k in STAGES},
            stage_max_ms={k: r.max(k) for k in STAGES},
            failing=r.failing(
                self.settings.criteria,
                drops=built.ctx.drops,
                captured=built.captured,
                errors=c.errors,
            ),
            rss_bytes=vals.get("rss_bytes"),  # type: ignore[arg-type]
            gpu_mem_bytes=gpu,  # type: ignore[arg-type]
            warmup=not self._warm(built, c) or now < built.ctx.warmup_end_ns,
            progressing=progressing,
            stalled_s=(now - c.last_done_ns) / 1e9,
        )

    # --- closing
    def _close_workload(self, workload: Workload) -> None:
        """``workload.close()`` once, in its own thread, for at most CLOSE_TIMEOUT_S. A close
        that raises or hangs (a session whose generation thread died re-raises its error
        here) is stored as an ``error`` event and the run cannot pass: it is aborted with
        that cause as its reason (INVALID), and its verdict is still computed."""
        if self._workload_closed:
            return
        self._workload_closed = True
        failure: list[BaseException] = []

        def close() -> None:
            try:
                workload.close()
            except BaseException as exc:
                failure.append(exc)

        t = threading.Thread(target=close, name="soakd-close", daemon=True)
        t.start()
        t.join(CLOSE_TIMEOUT_S)
        if t.is_alive():
            self._workload_failed(f"workload close did not return within {CLOSE_TIMEOUT_S:g} s")
        elif failure:
            exc = failure[0]
            self._workload_failed(f"workload close failed: {type(exc).__name__}: {exc}")

    def _workload_failed(self, message: str) -> None:
        self.log.error(message)
        if self._writer_started:
            self._event(self._now_event("error", message))
        with self._outcome_lock:
            o = self._outcome
            reason = message if o.reason is None else f"{o.reason}; {message}"
            self._outcome = Outcome("aborted", reason, o.internal)

    def _close(
        self, conn: sqlite3.Connection, built: _Stack, load_s: float, t_end_ns: int
    ) -> RunResult:
        """Flush the store, close the run row, judge, and compute the exit code once."""
        duration_s = (t_end_ns - self.t0_ns) / 1e9
        self.writer.put(self._now_event("end", self._outcome.reason or "completed"))
        self.writer.close()
        if self.writer.error is not None:  # rows were lost: soakd failed, whatever the model did
            o = self._outcome
            if o.status == "completed":
                o = Outcome("aborted", str(self.writer.error))
            self._outcome = Outcome(o.status, o.reason, internal=True)
        o = self._outcome
        result = RunResult(
            run_id=self.run_id,
            status=o.status,
            reason=o.reason,
            duration_s=duration_s,
            summary=self._summary(built, duration_s, load_s),
        )
        try:
            runs.close_run(
                conn,
                self.run_id,
                status=o.status,
                reason=o.reason,
                ended_unix=self.clock.wall(),
                duration_s=duration_s,
                summary=result.summary,
            )
        except Exception as exc:
            why = store.describe_store_error(self.db_path, exc)
            raise SoakdError(f"{why} (closing the run)") from exc
        result.verdict = self._judge(conn, result) if self.judge else None
        result.exit_code = exit_code(self._outcome, result.verdict)
        self._store_exit_code(conn, int(result.exit_code))
        self.log.info(
            "run ended",
            status=result.status,
            reason=result.reason,
            verdict=getattr(result.verdict, "status", None),
            exit_code=int(result.exit_code),
            duration_s=round(duration_s, 3),
        )
        self.obs.on_run_end(result)
        return result

    def _store_exit_code(self, conn: sqlite3.Connection, code: int) -> None:
        try:
            runs.set_exit_code(conn, self.run_id, code)
        except Exception as exc:  # the verdict is stored; only the exit code column is missing
            self.log.warning("cannot store the exit code", error=f"{type(exc).__name__}: {exc}")

    def _judge(self, conn: sqlite3.Connection, result: RunResult) -> Verdict | None:
        """Judge the stored run and store its verdict. A verdict that cannot be computed (a
        bug: its traceback is logged) is None; one that cannot be stored (the disk full, the
        store failing: one line naming it) is still returned, to be printed; either way soakd
        failed (exit 4) and ``summary["verdict_error"]`` says how."""
        try:
            _, verdict = evaluate(conn, self.run_id, self.settings.criteria)
        except Exception as exc:
            self.log.exception("the verdict could not be computed")
            self._verdict_failed(result, f"{type(exc).__name__}: {exc}")
            return None
        try:
            store_verdict(conn, verdict)
        except (sqlite3.Error, OSError) as exc:
            why = f"the {verdict.status} verdict could not be stored: " + (
                store.describe_store_error(self.db_path, exc)
            )
            self.log.error("the verdict could not be stored", error=why)
            self._verdict_failed(result, why)
        return verdict

    def _verdict_failed(self, result: RunResult, why: str) -> None:
        o = self._outcome
        self._outcome = Outcome(o.status, o.reason, internal=True)
        result.summary["verdict_error"] = why

    def _summary(self, built: _Stack, duration_s: float, load_s: float) -> dict[str, Any]:
        """The run's counters (``runs.summary``), all streams together; with several
        streams, ``streams`` holds each stream's own (``_stream_counters``)."""
        c, queue = built.ctx.counters, built.queue
        in_flight, stall_s = self._at_stop
        out: dict[str, Any] = {
            "duration_s": round(duration_s, 3),
            "load_s": round(load_s, 3),
            "frames_captured": built.captured,
            "frames_dispatched": c.dispatched,
            "frames_done": c.done,
            "drops": queue.drops if queue is not None else 0,
            "stale": c.stale,
            "errors": c.errors,
            "ooms": c.ooms,
            **_pacer_counters(built.pacers, c.done),
            # frames captured but never finished: still queued, or in the model at the end
            "queued_at_end": len(queue) if queue is not None else 0,
            "in_flight_at_end": len(self._in_flight_at_stop),
            "in_flight_since_s": None if in_flight is None else (in_flight - self.t0_ns) / 1e9,
            "stall_timeout_s": round(stall_s, 3),
            "achieved_fps": round(c.done / duration_s, 4) if duration_s > 0 else 0.0,
            "writer_rows": self.writer.rows_written,
            "writer_flushes": self.writer.flushes,
        }
        if self.n_streams > 1 and queue is not None:
            out["streams"] = [self._stream_counters(built, i, out) for i in range(self.n_streams)]
        out.update(built.ctx.summary)
        return out

    def _stream_counters(self, built: _Stack, i: int, total: dict[str, Any]) -> dict[str, Any]:
        """Stream ``i``'s counters, keyed as the run's: what its own verdict reads."""
        c, queue, pacer = built.ctx.counters, built.queue, built.pacers[i]
        assert queue is not None
        mine = i in self._in_flight_at_stop
        return {
            "stream": i,
            "frames_captured": pacer.captured,
            "drops": queue.drops_of(i),
            "stale": c.stale_by.get(i, 0),
            **_pacer_counters([pacer], 0),
            "queued_at_end": len(queue.queues[i]),
            "in_flight_at_end": int(bool(mine)),
            "in_flight_since_s": total["in_flight_since_s"] if mine else None,
        }


def _pacer_counters(pacers: Sequence[Pacer], done: int) -> dict[str, int]:
    """Ticks asked for and missed (by cause), summed over ``pacers``; unpaced (no pacer):
    one tick per finished frame, none missed."""
    if not pacers:
        keys = ("pacer_missed_ticks", "missed_ticks_source", "missed_ticks_pause")
        return {"pacer_ticks": done, **dict.fromkeys(keys, 0)}
    return {
        "pacer_missed_ticks": sum(p.missed_ticks for p in pacers),
        "pacer_ticks": sum(p.ticks for p in pacers),
        "missed_ticks_source": sum(p.missed_by["source"] for p in pacers),
        "missed_ticks_pause": sum(p.missed_by["pause"] for p in pacers),
    }


def run_soak(
    settings: Settings,
    *,
    observers: Sequence[Observer] = (),
    mode: str = "soak",
    max_frames: int | None = None,
    paced: bool = True,
    stop: threading.Event | None = None,
    clock: Clock | None = None,
    judge: bool = True,
) -> RunResult:
    """Run one soak (or, with ``paced=False`` and ``max_frames``, a back-to-back profile) and
    return its result; the verdict is stored and attached when ``judge`` is true.

    Raises ``UsageError`` (exit 2) for anything wrong before the run starts: an unopenable
    source or database path, a workload that cannot be built or loaded.
    """
    return Run(
        settings,
        observers=observers,
        mode=mode,
        max_frames=max_frames,
        paced=paced,
        stop=stop,
        clock=clock,
        judge=judge,
    ).execute()


def _gpu_ordinal(settings: Settings) -> int:
    """The CUDA ordinal of the workload's device (``cuda:1`` -> 1), 0 when it has none."""
    try:
        return cuda_ordinal(getattr(settings.workload, "device", None))
    except GpuUnavailable:
        return 0

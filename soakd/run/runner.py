"""The soak loop: wire source, pacer, queue, workload driver, sampler, store and observers,
run for the configured duration (or frame budget), then close the run and judge it.

Threads (all named, stoppable, joined in reverse start order): ``soakd-store`` (writer),
``soakd-sampler``, ``soakd-pacer`` (producer), ``soakd-driver`` (consumer, calls the model).
The calling thread is the monitor: it ends the run on duration, frame budget, stall, source
end, store failure or a stop request (signals), and publishes a progress snapshot each
second to the observers (live display, logs, sd_notify, Prometheus).
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from soakd.clock import Clock, MonotonicClock
from soakd.config import Settings
from soakd.environment import collect as collect_environment
from soakd.errors import ExitCode, SoakdError, UsageError
from soakd.observers.base import Observer, Progress, RunInfo, RunResult
from soakd.records import STAGES, Emission, Event, Frame, FrameRecord, Sample
from soakd.run.drivers import Counters, DriverContext, get_driver
from soakd.run.pacer import Pacer
from soakd.run.queue import FrameQueue
from soakd.store import db as store
from soakd.workloads.base import WorkloadContext, WorkloadError

log = structlog.get_logger("soakd.run.runner")


def new_run_id(now: float | None = None) -> str:
    """Sortable and unique: ``20261202T120455-3f2a9c``."""
    t = time.gmtime(now if now is not None else time.time())
    return time.strftime("%Y%m%dT%H%M%S", t) + "-" + secrets.token_hex(3)


class Observers(Observer):
    """Fans hooks out to observers; one that raises is logged once and dropped."""

    def __init__(self, observers: Iterable[Observer]) -> None:
        self._obs: list[Observer] = list(observers)

    def _call(self, name: str, *args: Any) -> None:
        for o in list(self._obs):
            try:
                getattr(o, name)(*args)
            except Exception as exc:
                log.warning(
                    "observer failed; dropped",
                    observer=type(o).__name__,
                    hook=name,
                    error=f"{type(exc).__name__}: {exc}",
                )
                self._obs.remove(o)

    def on_run_start(self, info: RunInfo) -> None:
        self._call("on_run_start", info)

    def on_loading(self, message: str, extend_s: float) -> None:
        self._call("on_loading", message, extend_s)

    def on_ready(self) -> None:
        self._call("on_ready")

    def on_frame(self, rec: FrameRecord) -> None:
        for o in self._obs:
            try:
                o.on_frame(rec)
            except Exception:
                self._call("on_frame", rec)  # slow path: find and drop the culprit
                return

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


class _Rolling:
    """Recent per-stage values for the once-a-second progress snapshot (bounded)."""

    def __init__(self, n: int = 128) -> None:
        self.vals = {k: deque[float](maxlen=n) for k in (*STAGES, "age")}
        self.done_times: deque[float] = deque(maxlen=4096)

    def add(self, r: FrameRecord) -> None:
        if r.skipped:
            return
        v = self.vals
        v["grab"].append(r.grab_ms)
        if r.pre_ms is not None:
            v["pre"].append(r.pre_ms)
        if r.infer_ms is not None:
            v["infer"].append(r.infer_ms)
        if r.decode_ms is not None:
            v["decode"].append(r.decode_ms)
        if r.total_ms is not None:
            v["total"].append(r.total_ms)
        if r.frame_age_ms is not None:
            v["age"].append(r.frame_age_ms)
        if r.t_done is not None:
            self.done_times.append(r.t_done)

    def median(self, key: str) -> float | None:
        d = self.vals[key]
        return statistics.median(d) if d else None

    def fps(self, now_s: float, window_s: float = 5.0) -> float:
        times = self.done_times
        if not times:
            return 0.0
        lo = now_s - window_s
        n = sum(1 for t in reversed(times) if t >= lo)
        span = min(window_s, max(now_s, 1e-9))
        return n / span


@dataclass
class _StopState:
    status: str = "completed"
    reason: str | None = None
    exit_hint: ExitCode | None = None


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
        self.obs = Observers(observers)
        self.mode = mode
        self.max_frames = max_frames
        self.paced = paced
        self.stop = stop or threading.Event()
        self.clock = clock or MonotonicClock()
        self.judge = judge
        self.run_id = new_run_id()
        self.db_path = settings.resolved_db()
        self._state = _StopState()
        self._state_lock = threading.Lock()
        self._rolling = _Rolling()
        self._last_sample: Sample | None = None
        self._source_error: BaseException | None = None
        self._driver_error: BaseException | None = None
        self.log = log.bind(run_id=self.run_id)

    # --- stopping
    def request_stop(
        self, reason: str | None = None, status: str = "aborted", exit_hint: ExitCode | None = None
    ) -> None:
        """Ask the run to end; the first reason wins. ``reason=None`` = normal completion."""
        with self._state_lock:
            if not self.stop.is_set():
                if reason is not None:
                    self._state = _StopState(status, reason, exit_hint)
                self.stop.set()

    # --- record plumbing (driver and sampler threads)
    def _emit(self, rec: FrameRecord | Emission) -> None:
        self.writer.put(rec)
        if type(rec) is FrameRecord:
            self._rolling.add(rec)
            self.obs.on_frame(rec)

    def _event(self, ev: Event) -> None:
        self.writer.put(ev)
        self.obs.on_event(ev)
        if ev.kind in ("error", "oom", "stall", "source_end", "signal", "sampler_crashed"):
            self.log.warning(ev.kind, message=ev.message, frame=ev.frame_id)

    def _sample(self, s: Sample) -> None:
        self._last_sample = s
        self.writer.put(s)
        self.obs.on_sample(s)

    # --- set-up
    def _open_store(self) -> Any:
        try:
            return store.connect(self.db_path)
        except store.StoreError as exc:
            raise UsageError(str(exc)) from None

    def _build_workload(self) -> Any:
        from soakd.workloads.registry import build_workload

        s = self.settings
        src = s.source
        wctx = WorkloadContext(
            seed=s.run.seed,
            width=src.width,
            height=src.height,
            fps=s.run.fps,
            audio_rate=s.audio.sample_rate if s.audio.kind != "none" else None,
            cache_dir=getattr(s.workload, "cache_dir", None),
            extend_timeout=lambda sec: self.obs.on_loading("loading workload", sec),
            log=self.log,
        )
        try:
            wl = build_workload(s.workload, wctx)
            wl.setup()
        except (WorkloadError, SoakdError) as exc:
            raise UsageError(f"workload {s.workload.kind!r}: {exc}") from None
        except FileNotFoundError as exc:
            raise UsageError(f"workload {s.workload.kind!r}: {exc}") from None
        shape = getattr(wl, "shape", None)
        if shape not in ("staged", "session", "generator"):
            raise UsageError(
                f"workload {s.workload.kind!r}: object has no valid 'shape' "
                "(expected 'staged', 'session' or 'generator')"
            )
        return wl

    def _insert_run(
        self, conn: Any, t0_wall: float, describe: dict[str, Any], env: dict[str, Any]
    ) -> None:
        s = self.settings
        conn.execute(
            "INSERT INTO runs (id, name, mode, status, started_at, started_unix, pid, host,"
            " workload_kind, fps, config, config_hash, workload, environment)"
            " VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.run_id,
                s.run.name,
                self.mode,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0_wall)),
                t0_wall,
                os.getpid(),
                os.uname().nodename,
                s.workload.kind,
                s.run.fps if self.paced else None,
                json.dumps(s.to_dict(), sort_keys=True),
                s.config_hash(),
                json.dumps(describe, default=str),
                json.dumps(env, default=str),
            ),
        )

    # --- the run
    def execute(self) -> RunResult:
        from soakd.sources import open_source
        from soakd.telemetry.probes import default_probes
        from soakd.telemetry.sampler import Sampler

        s = self.settings
        conn = self._open_store()
        try:
            source = open_source(s.source, fps=s.run.fps, seed=s.run.seed)
            source.open()
        except SoakdError:
            conn.close()
            raise
        audio = None
        if s.audio.kind != "none":
            from soakd.sources.audio import make_audio_source

            audio = make_audio_source(s.audio)
            if audio is not None:
                audio.open()
        try:
            t_load = time.perf_counter()
            workload = self._build_workload()
            load_s = time.perf_counter() - t_load
        except BaseException:
            source.close()
            conn.close()
            raise
        try:
            return self._execute(conn, source, audio, workload, load_s, default_probes, Sampler)
        finally:
            try:
                workload.close()
            finally:
                source.close()
                if audio is not None:
                    audio.close()
                conn.close()
                self.obs.close()

    def _execute(
        self,
        conn: Any,
        source: Any,
        audio: Any,
        workload: Any,
        load_s: float,
        default_probes: Any,
        sampler_cls: Any,
    ) -> RunResult:
        s = self.settings
        clock = self.clock
        describe = dict(workload.describe())
        describe["shape"] = workload.shape
        describe["load_s"] = round(load_s, 3)
        try:
            describe["source"] = source.describe()
        except Exception:
            pass
        env = collect_environment()
        device = getattr(s.workload, "device", None)
        probes = default_probes(device, self.log)

        t0_ns = clock.now_ns()
        t0_wall = clock.wall()
        self._insert_run(conn, t0_wall, describe, env)
        self.writer = store.StoreWriter(self.db_path, self.run_id)
        self.writer.start()
        info = RunInfo(
            run_id=self.run_id,
            settings=s,
            db_path=self.db_path,
            config_hash=s.config_hash(),
            mode=self.mode,
            gpu_name=env.get("gpu_name"),
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

        def sampler_crashed(exc: BaseException) -> None:
            # telemetry degrades, it does not end the run: the gap shows in the samples
            now_s = (clock.now_ns() - t0_ns) / 1e9
            msg = f"{type(exc).__name__}: {exc}"
            self._event(Event("sampler_crashed", now_s, clock.wall(), msg))

        sampler = sampler_cls(
            probes,
            interval_ms=s.run.sample_interval_ms,
            clock=clock,
            t0_ns=t0_ns,
            on_sample=self._sample,
            on_event=self._event,
            on_crash=sampler_crashed,
            log=self.log,
        )
        queue: FrameQueue | None = None
        pacer: Pacer | None = None
        grab = None

        def source_ended(exc: BaseException) -> None:
            self._source_error = exc
            msg = f"{type(exc).__name__}: {exc}" if not str(exc).startswith("source") else str(exc)
            self._event(Event("source_end", (clock.now_ns() - t0_ns) / 1e9, clock.wall(), msg))
            if queue is not None:
                queue.close()
            self.request_stop(f"source ended: {exc}")

        if self.paced:
            queue = FrameQueue(s.run.max_queue, s.run.consume)
            pacer = Pacer(
                source.read,
                queue,
                fps=s.run.fps,
                clock=clock,
                t0_ns=t0_ns,
                on_end=source_ended,
                audio=audio,
                audio_rate=s.audio.sample_rate if audio is not None else None,
            )
        else:
            period_ns = round(1e9 / s.run.fps)
            rate = s.audio.sample_rate if audio is not None else 0
            k = 0

            def grab() -> Frame:
                # back to back: stream time advances one frame period per frame, and each
                # frame brings the audio the stream produces in that period
                nonlocal k
                t = clock.now_ns()
                try:
                    image, ts = source.read()
                except BaseException as exc:
                    source_ended(exc)
                    raise
                done = clock.now_ns()
                chunk = None
                if audio is not None:
                    n = (k + 1) * rate * period_ns // 1_000_000_000 - k * rate * period_ns // (
                        1_000_000_000
                    )
                    chunk = audio.read(int(n))
                frame = Frame(k, t, done, done - t, image, chunk, ts, stream_ns=k * period_ns)
                k += 1
                return frame

        counters = Counters(last_done_ns=t0_ns)
        dctx = DriverContext(
            settings=s,
            workload=workload,
            clock=clock,
            t0_ns=t0_ns,
            stop=self.stop,
            emit=self._emit,
            event=self._event,
            queue=queue,
            grab=grab,
            warmup_end_ns=t0_ns + int(s.run.warmup_s * 1e9),
            max_frames=self.max_frames,
            counters=counters,
            request_abort=lambda reason: self.request_stop(reason),
        )
        drive = get_driver(workload.shape)

        def driver_main() -> None:
            try:
                drive(dctx)
            except BaseException as exc:  # a bug in a driver, or the source ending unpaced
                if self._source_error is None:
                    self._driver_error = exc
                    self.log.exception("driver crashed")
                    self.request_stop(
                        f"driver crashed: {type(exc).__name__}: {exc}", exit_hint=ExitCode.INTERNAL
                    )
            finally:
                if not self.stop.is_set():
                    self.request_stop()  # frame budget spent: normal completion

        driver = threading.Thread(target=driver_main, name="soakd-driver", daemon=True)
        sampler.start()
        if pacer is not None:
            pacer.start()
        driver.start()
        try:
            stalled = self._monitor(dctx, t0_ns, pacer)
        except KeyboardInterrupt:  # library use without signal handlers: Ctrl-C ends cleanly
            self.request_stop("signal SIGINT")
            stalled = False
        except BaseException as exc:  # a bug in the monitor: close the run, then re-raise
            self.request_stop(
                f"internal error: {type(exc).__name__}: {exc}", exit_hint=ExitCode.INTERNAL
            )
            self.log.exception("monitor crashed")
            stalled = False

        # --- shut down in reverse order
        self.obs.on_stopping(self._state.reason or "completed")
        if pacer is not None:
            pacer.stop()
        if queue is not None:
            queue.close()
        driver.join(1.0 if stalled else max(5.0, min(60.0, s.run.stall_timeout_s)))
        if driver.is_alive() and not stalled:
            self.log.warning("the frame in flight did not finish; leaving it behind")
        sampler.stop()
        t_end_ns = clock.now_ns()
        duration_s = (t_end_ns - t0_ns) / 1e9
        self.writer.put(Event("end", duration_s, clock.wall(), self._state.reason or "completed"))
        self.writer.close()
        store_error = self.writer.error
        if store_error is not None and self._state.status == "completed":
            self._state = _StopState("aborted", str(store_error), ExitCode.INTERNAL)

        summary = self._summary(dctx, pacer, queue, duration_s, load_s)
        result = RunResult(
            run_id=self.run_id,
            status=self._state.status,
            reason=self._state.reason,
            duration_s=duration_s,
            summary=summary,
        )
        try:
            conn.execute(
                "UPDATE runs SET status = ?, reason = ?, ended_at = ?, duration_s = ?,"
                " summary = ? WHERE id = ?",
                (
                    result.status,
                    result.reason,
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock.wall())),
                    duration_s,
                    json.dumps(summary, default=str),
                    self.run_id,
                ),
            )
        except Exception as exc:
            raise SoakdError(f"{self.db_path}: cannot close the run: {exc}") from exc
        if store_error is not None:
            result.exit_code = ExitCode.INTERNAL
        if self.judge:
            self._judge(conn, result)
        if result.exit_code is None:
            result.exit_code = self._state.exit_hint or (
                ExitCode.PASS if result.status == "completed" else ExitCode.INVALID
            )
        elif self._state.exit_hint is not None:
            result.exit_code = self._state.exit_hint
        try:
            conn.execute(
                "UPDATE runs SET exit_code = ? WHERE id = ?", (int(result.exit_code), self.run_id)
            )
        except Exception:
            pass
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

    def _judge(self, conn: Any, result: RunResult) -> None:
        from soakd.analysis import judge_run

        try:
            verdict = judge_run(conn, self.run_id, self.settings)
        except Exception as exc:
            self.log.exception("the verdict could not be computed")
            result.exit_code = ExitCode.INTERNAL
            result.summary["verdict_error"] = f"{type(exc).__name__}: {exc}"
            return
        result.verdict = verdict
        if result.exit_code is None:
            result.exit_code = ExitCode(int(verdict.exit_code))

    def _monitor(self, dctx: DriverContext, t0_ns: int, pacer: Pacer | None) -> bool:
        """Runs in the calling thread until the run should end. Returns True on a stall."""
        s = self.settings
        clock = self.clock
        c = dctx.counters
        end_ns = t0_ns + int(s.run.duration * 1e9)
        warm_end_ns = dctx.warmup_end_ns
        stall_ns = int(s.run.stall_timeout_s * 1e9)
        next_progress = t0_ns + 1_000_000_000
        ready = False
        warm_logged = s.run.warmup_s <= 0
        last_done_seen = 0
        stalled = False
        wait = 0.05
        while not self.stop.wait(wait):
            now = clock.now_ns()
            if self.paced and now >= end_ns:
                self.request_stop()
                break
            if not ready and c.done >= 1:
                ready = True
                self.obs.on_ready()
            if not warm_logged and now >= warm_end_ns:
                warm_logged = True
                self._event(
                    Event(
                        "warmup_end",
                        (now - t0_ns) / 1e9,
                        clock.wall(),
                        f"warm-up of {s.run.warmup_s:g} s ended",
                    )
                )
            since = c.in_flight_since_ns
            if since is not None and now - since > stall_ns:
                stalled = True
                msg = (
                    f"no frame finished for {s.run.stall_timeout_s:g} s "
                    f"(frame in flight since t={(since - t0_ns) / 1e9:.1f} s)"
                )
                self._event(Event("stall", (now - t0_ns) / 1e9, clock.wall(), msg))
                self.request_stop("stalled")
                break
            if self.writer.error is not None:
                self.request_stop(str(self.writer.error), exit_hint=ExitCode.INTERNAL)
                break
            if now >= next_progress:
                next_progress += 1_000_000_000
                progressing = c.done != last_done_seen
                last_done_seen = c.done
                self.obs.on_progress(self._progress(dctx, now, t0_ns, end_ns, pacer, progressing))
        return stalled

    def _progress(
        self,
        dctx: DriverContext,
        now: int,
        t0_ns: int,
        end_ns: int,
        pacer: Pacer | None,
        progressing: bool,
    ) -> Progress:
        c = dctx.counters
        r = self._rolling
        elapsed = (now - t0_ns) / 1e9
        smp = self._last_sample
        vals = smp.values if smp is not None else {}
        gpu = vals.get("gpu_proc_mem_bytes") or vals.get("gpu_mem_used_bytes")
        return Progress(
            elapsed_s=elapsed,
            remaining_s=max(0.0, (end_ns - now) / 1e9) if self.paced else 0.0,
            frames_done=c.done,
            frames_captured=pacer.captured if pacer is not None else c.done,
            achieved_fps=r.fps(elapsed),
            drops=dctx.drops,
            stale=c.stale,
            errors=c.errors,
            age_p50_ms=r.median("age"),
            stage_p50_ms={k: r.median(k) for k in STAGES},
            rss_bytes=vals.get("rss_bytes"),  # type: ignore[arg-type]
            gpu_mem_bytes=gpu,  # type: ignore[arg-type]
            warmup=now < dctx.warmup_end_ns,
            progressing=progressing,
            stalled_s=(now - c.last_done_ns) / 1e9,
        )

    def _summary(
        self,
        dctx: DriverContext,
        pacer: Pacer | None,
        queue: FrameQueue | None,
        duration_s: float,
        load_s: float,
    ) -> dict[str, Any]:
        c = dctx.counters
        out: dict[str, Any] = {
            "duration_s": round(duration_s, 3),
            "load_s": round(load_s, 3),
            "frames_captured": pacer.captured if pacer is not None else c.done,
            "frames_dispatched": c.dispatched,
            "frames_done": c.done,
            "drops": queue.drops if queue is not None else 0,
            "stale": c.stale,
            "errors": c.errors,
            "ooms": c.ooms,
            "pacer_missed_ticks": pacer.missed_ticks if pacer is not None else 0,
            "achieved_fps": round(c.done / duration_s, 4) if duration_s > 0 else 0.0,
            "writer_rows": self.writer.rows_written,
            "writer_flushes": self.writer.flushes,
        }
        out.update(dctx.summary)
        return out


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

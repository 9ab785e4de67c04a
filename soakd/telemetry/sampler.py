"""The telemetry sampler: one thread (``soakd-sampler``) asking every probe at a fixed rate.

Deadlines are absolute on the monotonic clock: tick ``k`` is due at ``t0 + k * period``.
A tick that starts a whole period or more late skips to the latest deadline already passed
(it runs at once, the missed ticks are counted in ``skipped``) and never bursts to catch up.
Each ``Sample`` keeps its actual time (``t``, seconds since ``t0``), the wall time,
``lag_ms`` (actual start - deadline) and ``tick_ms`` (how long the probes took). A probe
with ``sample_devices(into, seq, t)`` (``GpuDevicesProbe``: a run on several GPUs) also
returns one ``DeviceSample`` per GPU, carried in ``Sample.devices``; one with
``sample_server(seq, t)`` (``ServerMetricsProbe``: a served model's /metrics) returns the
server's series, carried in ``Sample.server``; one with ``take_changes()``
(``ServerProcessProbe``: the server replaced or lost) hands on its changes, each an
``Event`` at the tick's time.

A probe that raises is disabled after one log line (its columns stay NULL) and the sampler
goes on; anything else failing in the loop (the ``on_sample`` callback, a bug) ends the
thread loudly: it is logged, kept in ``error`` and handed to ``on_crash``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from soakd.clock import Clock, MonotonicClock
from soakd.records import SAMPLE_FIELDS, DeviceSample, Event, Sample, ServerMetric
from soakd.telemetry.probes import Probe

THREAD_NAME = "soakd-sampler"


class Sampler:
    """Samples ``probes`` every ``interval_ms`` and hands each ``Sample`` to ``on_sample``
    (from the sampler thread: keep it quick)."""

    def __init__(
        self,
        probes: Sequence[Probe],
        *,
        interval_ms: float,
        clock: Clock,
        t0_ns: int,
        on_sample: Callable[[Sample], None],
        on_event: Callable[[Event], None] | None = None,
        on_crash: Callable[[BaseException], None] | None = None,
        log: Any = None,
    ) -> None:
        if not 1 <= interval_ms <= 60_000:
            raise ValueError(f"interval_ms: must be within 1..60000, got {interval_ms}")
        self.probes: list[Probe] = list(probes)
        self.period_ns = round(interval_ms * 1e6)
        self.clock = clock
        self.t0_ns = t0_ns
        self.on_sample = on_sample
        self.on_event = on_event
        self.on_crash = on_crash
        self.log = log
        self.disabled: dict[str, str] = {}  # probe name -> why
        self.samples = 0
        self.skipped = 0  # deadlines passed over because a tick ran a period or more late
        self.cpu_ns = 0  # CPU time the sampler thread used (thread_time_ns)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        # a real clock sleeps on the stop event (interruptible, no spinning: the sampler
        # needs no sub-millisecond precision); a fake clock jumps to the deadline
        self._coarse = isinstance(clock, MonotonicClock)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and join the thread, then close the probes (once). Called from the sampler
        thread itself (an ``on_sample`` callback) it only asks the loop to end."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            if thread is threading.current_thread():
                return
            thread.join(timeout)
            if thread.is_alive():
                self._warn(f"telemetry sampler did not stop within {timeout:g} s")
                return
        if self._closed:
            return
        self._closed = True
        for probe in self.probes:
            try:
                probe.close()
            except Exception as exc:
                self._warn(f"telemetry probe {probe.name}: close failed: {exc!r}")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the loop -----------------------------------------------------------------------

    def _sleep_until(self, deadline_ns: int) -> bool:
        """False when stopped."""
        if not self._coarse:
            return self.clock.sleep_until(deadline_ns, self._stop)
        remaining = deadline_ns - self.clock.now_ns()
        if remaining <= 0:
            return not self._stop.is_set()
        return not self._stop.wait(remaining / 1e9)

    def _first_tick(self) -> int:
        behind = self.clock.now_ns() - self.t0_ns
        return max(0, -(-behind // self.period_ns))  # the first deadline not yet passed

    def _run(self) -> None:
        cpu0 = time.thread_time_ns()
        try:
            self._loop()
        except BaseException as exc:
            self.error = exc
            self._warn(f"telemetry sampler crashed: {type(exc).__name__}: {exc}")
            if self.on_crash is not None:
                self.on_crash(exc)
        finally:
            self.cpu_ns = time.thread_time_ns() - cpu0

    def _loop(self) -> None:
        clock, period, t0 = self.clock, self.period_ns, self.t0_ns
        k = self._first_tick()
        seq = 0
        while True:
            deadline = t0 + k * period
            now = clock.now_ns()
            if now - deadline >= period:  # late by a whole period: skip ahead, no burst
                k_now = (now - t0) // period
                self.skipped += k_now - k
                k = k_now
                deadline = t0 + k * period
            if not self._sleep_until(deadline):
                return
            start = clock.now_ns()
            wall = clock.wall()
            t = (start - t0) / 1e9
            values: dict[str, float | int | None] = dict.fromkeys(SAMPLE_FIELDS)
            devices, server = self._tick(values, seq, t)
            end = clock.now_ns()
            self.on_sample(
                Sample(
                    seq=seq,
                    t=t,
                    wall=wall,
                    lag_ms=(start - deadline) / 1e6,
                    tick_ms=(end - start) / 1e6,
                    values=values,
                    devices=devices,
                    server=server,
                )
            )
            self.samples = seq = seq + 1
            k += 1

    def _tick(
        self, values: dict[str, float | int | None], seq: int, t: float
    ) -> tuple[tuple[DeviceSample, ...], tuple[ServerMetric, ...]]:
        devices: list[DeviceSample] = []
        server: list[ServerMetric] = []
        for probe in self.probes:
            if probe.name in self.disabled:
                continue
            try:
                per_device = getattr(probe, "sample_devices", None)
                per_series = getattr(probe, "sample_server", None)
                if per_device is not None:
                    devices += per_device(values, seq, t)
                elif per_series is not None:
                    server += per_series(seq, t)
                else:
                    probe.sample(values)
                changes = getattr(probe, "take_changes", None)
                if changes is not None:
                    self._changed(changes(), t)
            except Exception as exc:
                self._disable(probe, exc)
        return tuple(devices), tuple(server)

    def _changed(self, changes: Sequence[Any], t: float) -> None:
        """A probe's changes (``ServerProcessProbe``: the server replaced or lost): a warning
        and a run event at this tick's time each."""
        for c in changes:
            self._warn(f"{c.kind}: {c.message}")
            if self.on_event is not None:
                data = {**c.data, "t": t}
                self.on_event(Event(c.kind, t, self.clock.wall(), c.message, data=data))

    def _disable(self, probe: Probe, exc: Exception) -> None:
        why = f"{type(exc).__name__}: {exc}"
        self.disabled[probe.name] = why
        message = f"telemetry probe {probe.name} failed and is disabled, its columns stay NULL"
        self._warn(f"{message}: {why}")
        if self.on_event is not None:
            now = self.clock.now_ns()
            self.on_event(
                Event(
                    kind="probe_disabled",
                    t=(now - self.t0_ns) / 1e9,
                    wall=self.clock.wall(),
                    message=f"{probe.name}: {why}",
                    data={"probe": probe.name},
                )
            )

    def _warn(self, message: str) -> None:
        if self.log is not None:
            self.log.warning(message)

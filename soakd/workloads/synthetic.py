"""A torch-free workload with planted behaviour, so every verdict can be tested against a
known truth.

Stage times are real sleeps (mean ``pre_ms`` / ``infer_ms`` / ``decode_ms``, lognormal noise
of relative sigma ``jitter``), or with ``cpu_bound`` that much of the thread's own CPU time,
spun (a model computing on the CPU: slower in wall time when the host is loaded).
``spike_every`` makes every Nth frame's infer ``spike_ms`` longer; ``drift_ms_per_min``
makes infer grow linearly with elapsed time. Memory is real:
``leak_mb_per_min`` allocates, touches and keeps memory (from ``leak_after_s`` on: a leak
that starts late); ``plateau_mb`` allocates that much evenly over the first ``plateau_s``
and then nothing (bounded growth, a cache that fills); ``sawtooth_mb`` allocates up to that
size over ``sawtooth_period_s`` and releases it, repeatedly. ``error_every`` makes every Nth
infer raise; with ``error_stream`` set, only that stream's frames raise (``run.streams``):
every Nth of them, or all when ``error_every`` is 0. ``stall_after_s`` makes infer block
(until the workload is closed) once the workload is that old.
"""

from __future__ import annotations

import math
import mmap
import threading
import time
from typing import Any, Literal

import numpy as np

from soakd.records import Frame, StageOutput
from soakd.workloads.base import WorkloadContext
from soakd.workloads.synthetic_settings import SyntheticWorkload as SyntheticSettings

_MB = 1 << 20
_CHUNK = _MB  # memory is held in 1 MiB anonymous mappings
_PAGE = mmap.PAGESIZE


class SyntheticError(RuntimeError):
    """The planted error of ``error_every``."""


def _touched(nbytes: int) -> mmap.mmap:
    """``nbytes`` of anonymous memory with every page touched, so it counts in RSS. An
    anonymous mapping is returned to the OS the moment it is dropped (munmap), which a
    malloc'd buffer is not: glibc raises its mmap threshold after the first large free and
    then keeps freed memory in the heap, which would flatten a planted sawtooth."""
    m = mmap.mmap(-1, nbytes)
    m[::_PAGE] = b"\x01" * len(range(0, nbytes, _PAGE))
    return m


class Synthetic:
    shape: Literal["staged"] = "staged"

    def __init__(self, settings: SyntheticSettings, ctx: WorkloadContext) -> None:
        self.s = settings
        self._rng = np.random.default_rng(settings.seed)
        self._n = 0
        self._n_error_stream = 0  # infer calls on frames of ``error_stream``
        self._t0: float | None = None
        self._leak: list[mmap.mmap] = []
        self._leaked = 0
        self._saw: list[mmap.mmap] = []
        self._closed = threading.Event()
        sigma = settings.jitter
        # lognormal with mean 1: exp(N(-sigma^2/2, sigma))
        self._mu = -0.5 * sigma * sigma
        self._sigma = sigma
        # whether infer depends on the workload's age (memory, stall, drift): when it does
        # not, a no-op infer reads no clock
        self._aging = bool(
            settings.leak_mb_per_min > 0
            or settings.plateau_mb > 0
            or settings.sawtooth_mb > 0
            or settings.stall_after_s > 0
            or settings.drift_ms_per_min
        )
        # nothing planted in infer: it only counts (the no-op workload of the harness
        # benchmarks, whose per-frame cost should be the harness's, not this model's)
        self._plain_infer = not (
            self._aging
            or settings.infer_ms > 0
            or settings.spike_every
            or settings.error_every
            or settings.error_stream is not None
        )

    # --- helpers
    def _elapsed(self) -> float:
        if self._t0 is None:
            self._t0 = time.perf_counter()
        return time.perf_counter() - self._t0

    def _noisy(self, ms: float) -> float:
        if ms <= 0:
            return 0.0
        if self._sigma == 0:
            return ms
        return ms * math.exp(self._rng.normal(self._mu, self._sigma))

    def _sleep(self, ms: float) -> None:
        if ms <= 0:
            return
        if not self.s.cpu_bound:
            self._closed.wait(ms / 1000.0)
            return
        # ms of this thread's own CPU time: the stage takes longer in wall time when other
        # processes share the CPU, as a model computing on the CPU does
        until = time.thread_time() + ms / 1000.0
        while time.thread_time() < until and not self._closed.is_set():
            pass

    def _memory(self, elapsed: float) -> None:
        s = self.s
        target = 0.0
        if s.leak_mb_per_min > 0:
            target += s.leak_mb_per_min * _MB * max(elapsed - s.leak_after_s, 0.0) / 60.0
        if s.plateau_mb > 0:
            target += s.plateau_mb * _MB * min(elapsed / s.plateau_s, 1.0)
        while self._leaked + _CHUNK <= target:
            self._leak.append(_touched(_CHUNK))
            self._leaked += _CHUNK
        if s.sawtooth_mb > 0:
            phase = (elapsed % s.sawtooth_period_s) / s.sawtooth_period_s
            want = int(s.sawtooth_mb * phase)  # MiB held now: ramps up, then drops to 0
            held = len(self._saw)
            if want > held:
                self._saw.extend(_touched(_CHUNK) for _ in range(want - held))
            elif want < held:
                del self._saw[want:]

    # --- the staged protocol
    def setup(self) -> None:
        self._elapsed()

    def preprocess(self, frame: Frame) -> Any:
        if self.s.pre_ms > 0:  # a 0 ms stage draws no noise and does not sleep
            self._sleep(self._noisy(self.s.pre_ms))
        return frame.stream

    def infer(self, inputs: Any) -> Any:
        self._n += 1
        n = self._n
        if self._plain_infer:
            return n
        s = self.s
        ms = s.infer_ms
        if self._aging:
            elapsed = self._elapsed()
            self._memory(elapsed)
            if s.stall_after_s > 0 and elapsed >= s.stall_after_s:
                self._closed.wait()  # blocks until close(): a hung model
                raise SyntheticError("synthetic stall released by close()")
            ms += s.drift_ms_per_min * elapsed / 60.0
        ms = self._noisy(ms)
        if s.spike_every and n % s.spike_every == 0:
            ms += s.spike_ms
        self._sleep(ms)
        self._planted_error(n, inputs)
        return n

    def _planted_error(self, n: int, stream: int) -> None:
        """``error_every`` over every infer call, or over ``error_stream``'s only."""
        s = self.s
        if s.error_stream is None:
            if s.error_every and n % s.error_every == 0:
                raise SyntheticError(f"planted error on infer call {n}")
        elif stream == s.error_stream:
            self._n_error_stream += 1
            k = self._n_error_stream
            if not s.error_every or k % s.error_every == 0:
                raise SyntheticError(f"planted error on stream {stream}")

    def decode(self, outputs: Any) -> StageOutput:
        if self.s.decode_ms > 0:
            self._sleep(self._noisy(self.s.decode_ms))
        return StageOutput(f"frame {outputs}", 1)  # text, tokens

    def sync(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "synthetic", **self.s.model_dump()}

    def close(self) -> None:
        self._closed.set()
        self._leak.clear()
        self._saw.clear()


def build(settings: SyntheticSettings, ctx: WorkloadContext) -> Synthetic:
    return Synthetic(settings, ctx)

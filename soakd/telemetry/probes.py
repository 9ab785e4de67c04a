"""Telemetry probes: each fills some ``soakd.records.SAMPLE_FIELDS`` keys of one sample.

A probe is ``name``, ``sample(into)`` and ``close()``. Probes degrade, they do not crash: a
query that fails leaves its key None (stored as NULL); a query the device does not support
is not asked again. ``default_probes`` returns what works on this host and logs ONE warning
saying why the GPU columns will be NULL when they will.

* ``ProcessProbe`` (psutil): ``rss_bytes``, ``cpu_pct`` (this process, % of one core, so
  above 100 with several busy threads), ``sys_mem_used_bytes`` (total - available),
  ``sys_mem_total_bytes``; the host beside it: ``host_cpu_pct`` (every CPU busy, % of all
  of them since the previous tick: neither idle, waiting on I/O nor stolen),
  ``host_steal_pct`` (taken by the hypervisor for other guests), ``host_load1`` and
  ``host_run_queue`` (``procs_running`` in /proc/stat, the sampler's thread included; None
  off Linux).
* ``NvmlProbe`` (nvidia-ml-py ``pynvml``): device memory used/total (v2 memory info when the
  driver has it, else v1), GPU and memory utilisation (%), this process's GPU memory,
  temperature (C), board power (W), SM clock (MHz).
* ``TorchCudaProbe``: the CUDA caching allocator of this process (allocated, reserved, their
  peaks, allocation retries, OOMs). It never imports torch nor initialises CUDA itself
  (that would create a context and change what is measured): until the workload has done
  both, its keys stay None.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import psutil

from soakd.environment import GpuUnavailable, nvml_handle
from soakd.telemetry import procfs

Values = dict[str, float | int | None]


@runtime_checkable
class Probe(Protocol):
    """One source of telemetry, asked once per sampler tick (from the sampler thread)."""

    name: str

    def sample(self, into: Values) -> None:
        """Set this probe's keys in ``into`` (None where a value is unknown)."""
        ...

    def close(self) -> None: ...


class ProcessProbe:
    """This process and the host's memory and CPU. On Linux each tick reads
    ``/proc/self/statm``, ``/proc/stat`` (CPU times and run queue together) and
    ``/proc/meminfo`` once each (``telemetry/procfs.py``), and this process's CPU from
    ``os.times()`` (no file): the numbers psutil gives, at under half its cost (issue 34:
    the sampler's own CPU on a served run). Elsewhere, psutil."""

    name = "process"

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self._cpu_s, self._at = _own_cpu_s(), time.monotonic()
        self._host = _host_cpu(procfs.read("/proc/stat"))

    def sample(self, into: Values) -> None:
        into["rss_bytes"] = procfs.rss("self") or int(self._proc.memory_info().rss)
        into["cpu_pct"] = self._cpu_pct()
        mem = procfs.memory()
        if mem is None:
            vm = psutil.virtual_memory()
            mem = int(vm.total), int(vm.available)
        into["sys_mem_used_bytes"] = mem[0] - mem[1]
        into["sys_mem_total_bytes"] = mem[0]
        self._sample_host(into)

    def _cpu_pct(self) -> float:
        """This process's CPU since the previous tick, % of one core, as psutil's
        ``cpu_percent(None)`` (every thread, children not counted, one decimal)."""
        cpu, now = _own_cpu_s(), time.monotonic()
        dt = now - self._at
        pct = round(100.0 * max(0.0, cpu - self._cpu_s) / dt, 1) if dt > 0 else 0.0
        self._cpu_s, self._at = cpu, now
        return pct

    def _sample_host(self, into: Values) -> None:
        """Host CPU since the previous tick, from the two readings' differences (psutil's
        own ``cpu_times_percent`` keeps one module-wide previous reading, which another
        caller in this process would move)."""
        text = procfs.read("/proc/stat")
        now = _host_cpu(text)
        delta = {f: v - self._host.get(f, 0.0) for f, v in now.items()}
        self._host = now
        total = sum(v for f, v in delta.items() if f not in ("guest", "guest_nice"))
        if total > 0:
            spare = sum(delta.get(f, 0.0) for f in ("idle", "iowait", "steal"))
            into["host_cpu_pct"] = 100.0 * max(0.0, total - spare) / total
            into["host_steal_pct"] = 100.0 * delta.get("steal", 0.0) / total
        with contextlib.suppress(OSError):
            into["host_load1"] = os.getloadavg()[0]
        into["host_run_queue"] = procfs.procs_running(text) if text is not None else None

    def close(self) -> None:
        """Holds nothing."""


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _host_cpu(text: bytes | None) -> dict[str, float]:
    """The host's CPU times by psutil's names: /proc/stat's, else psutil's."""
    times = procfs.host_cpu(text)
    return times if times is not None else dict(psutil.cpu_times(percpu=False)._asdict())


def procs_running(stat: str = "/proc/stat") -> int | None:
    """The host's run queue: threads running or ready to run now (Linux); None elsewhere."""
    text = procfs.read(stat)
    return None if text is None else procfs.procs_running(text)


# ---------------------------------------------------------------------------------------
# NVML


def cuda_ordinal(device: str | None) -> int:
    """``'cuda'`` -> 0, ``'cuda:1'`` -> 1; anything else raises ``GpuUnavailable``."""
    if device is None:
        raise GpuUnavailable("the workload has no device setting")
    m = re.fullmatch(r"cuda(?::(\d+))?", device.strip())
    if not m:
        raise GpuUnavailable(f"device {device!r} is not CUDA")
    return int(m.group(1) or 0)


class NvmlProbe:
    """One GPU through NVML. ``nvml`` is the ``pynvml`` module (injectable for tests)."""

    name = "nvml"

    def __init__(self, handle: Any, nvml: Any, *, pid: int | None = None) -> None:
        self.nvml = nvml
        self.handle = handle
        self.pid = pid or os.getpid()
        self.unsupported: set[str] = set()  # queries the device answered "not supported"
        self._permanent: tuple[type[BaseException], ...] = tuple(
            getattr(nvml, n)
            for n in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
            if hasattr(nvml, n)
        )
        self._memory = self._pick_memory_query()
        self._queries: list[tuple[str, Callable[[Values], None]]] = [
            ("memory", self._memory),
            ("utilization", self._utilization),
            ("processes", self._process_memory),
            ("temperature", self._temperature),
            ("power", self._power),
            ("sm_clock", self._sm_clock),
        ]

    @classmethod
    def for_device(cls, device: str | None, nvml: Any = None) -> NvmlProbe:
        """Initialise NVML and pick the GPU behind ``device`` ('cuda' / 'cuda:N'), honouring
        ``CUDA_VISIBLE_DEVICES``; raises ``GpuUnavailable`` saying why not."""
        ordinal = cuda_ordinal(device)
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                raise GpuUnavailable("nvidia-ml-py (pynvml) is not installed") from None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuUnavailable(f"NVML cannot start: {exc} (no NVIDIA driver?)") from None
        try:
            handle = nvml_handle(nvml, ordinal, os.environ.get("CUDA_VISIBLE_DEVICES"))
            return cls(handle, nvml)
        except BaseException:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()
            raise

    # -- queries: each fills its keys; NVMLError -> None, "not supported" -> never again --

    def _pick_memory_query(self) -> Callable[[Values], None]:
        nvml, handle = self.nvml, self.handle
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                nvml.nvmlDeviceGetMemoryInfo(handle, version=v2)

                def memory_v2(into: Values) -> None:
                    info = nvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
                    into["gpu_mem_used_bytes"] = int(info.used)
                    into["gpu_mem_total_bytes"] = int(info.total)

                return memory_v2
            except (nvml.NVMLError, TypeError):
                pass  # an older driver or binding: the v1 struct below

        def memory_v1(into: Values) -> None:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            into["gpu_mem_used_bytes"] = int(info.used)
            into["gpu_mem_total_bytes"] = int(info.total)

        return memory_v1

    def _utilization(self, into: Values) -> None:
        u = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        into["gpu_util_pct"] = float(u.gpu)
        into["gpu_mem_util_pct"] = float(u.memory)

    def _process_memory(self, into: Values) -> None:
        procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        mine = [p.usedGpuMemory for p in procs if p.pid == self.pid]
        known = [m for m in mine if m is not None]
        into["gpu_proc_mem_bytes"] = int(sum(known)) if known else None

    def _temperature(self, into: Values) -> None:
        nvml = self.nvml
        into["gpu_temp_c"] = float(
            nvml.nvmlDeviceGetTemperature(self.handle, nvml.NVML_TEMPERATURE_GPU)
        )

    def _power(self, into: Values) -> None:
        into["gpu_power_w"] = self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0

    def _sm_clock(self, into: Values) -> None:
        nvml = self.nvml
        into["gpu_sm_clock_mhz"] = float(
            nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_SM)
        )

    def sample(self, into: Values) -> None:
        transient = self.nvml.NVMLError
        for name, query in self._queries:
            if name in self.unsupported:
                continue
            try:
                query(into)
            except self._permanent:
                self.unsupported.add(name)
            except transient:
                pass  # this tick only (GPU lost, busy...): the keys stay None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


# ---------------------------------------------------------------------------------------
# torch CUDA allocator

_TORCH_KEYS = (
    ("torch_allocated_bytes", "allocated_bytes.all.current"),
    ("torch_reserved_bytes", "reserved_bytes.all.current"),
    ("torch_max_allocated_bytes", "allocated_bytes.all.peak"),
    ("torch_max_reserved_bytes", "reserved_bytes.all.peak"),
    ("torch_alloc_retries", "num_alloc_retries"),
    ("torch_ooms", "num_ooms"),
)


class TorchCudaProbe:
    """The torch CUDA caching allocator's counters for one device (torch's ordinal)."""

    name = "torch_cuda"

    def __init__(self, ordinal: int = 0) -> None:
        self.ordinal = ordinal
        self._torch: Any = None

    def _ready(self) -> Any:
        """torch, once the workload has imported it and initialised CUDA; else None."""
        if self._torch is not None:
            return self._torch
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return None
        self._torch = torch
        return torch

    def sample(self, into: Values) -> None:
        torch = self._ready()
        if torch is None:
            return
        stats = torch.cuda.memory_stats(self.ordinal)
        for key, stat in _TORCH_KEYS:
            into[key] = stats.get(stat)

    def close(self) -> None:
        self._torch = None


def _log_warning(log: Any, message: str) -> None:
    if log is not None:
        log.warning(message)


def default_probes(device: str | None, log: Any = None) -> list[Probe]:
    """The probes that work here for a workload on ``device``: always ``ProcessProbe``; for a
    CUDA device ``NvmlProbe`` when NVML finds the GPU, and ``TorchCudaProbe`` (which waits
    for the workload to initialise CUDA) when NVML works or torch already reports CUDA.
    When GPU columns will be NULL, ``log`` gets one warning saying why (stdlib or structlog
    logger)."""
    probes: list[Probe] = [ProcessProbe()]
    try:
        ordinal = cuda_ordinal(device)
    except GpuUnavailable as exc:
        _log_warning(log, f"GPU telemetry off, GPU columns will be NULL: {exc}")
        return probes
    try:
        probes.append(NvmlProbe.for_device(device))
    except GpuUnavailable as exc:
        if not _torch_cuda_loaded():
            _log_warning(log, f"GPU telemetry off, GPU columns will be NULL: {exc}")
            return probes
        _log_warning(log, f"NVML telemetry off, gpu_* columns will be NULL: {exc}")
    probes.append(TorchCudaProbe(ordinal))
    return probes


def _torch_cuda_loaded() -> bool:
    """torch is already imported and reports CUDA (never imports torch itself)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False

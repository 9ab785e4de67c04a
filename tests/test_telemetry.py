"""Telemetry probes and the sampler thread: real psutil, a real clock for cadence, a fake
clock for exact skip-ahead, and a fake pynvml where a GPU would be needed."""

from __future__ import annotations

import itertools
import mmap
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from soakd.clock import FakeClock, MonotonicClock
from soakd.environment import GpuUnavailable, nvml_handle, visible_device
from soakd.records import SAMPLE_FIELDS, Event, Sample
from soakd.telemetry import procfs
from soakd.telemetry.probes import (
    NvmlProbe,
    ProcessProbe,
    TorchCudaProbe,
    Values,
    cuda_ordinal,
    default_probes,
)
from soakd.telemetry.sampler import THREAD_NAME, Sampler

MB = 1 << 20


class ListLog:
    """A logger that keeps its warnings."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str, *args: Any, **kw: Any) -> None:
        self.warnings.append(message)


# -- ProcessProbe ---------------------------------------------------------------------------


def test_process_probe_rss_rises_when_50_mb_are_touched() -> None:
    """rss_bytes is this process's real RSS: it grows by ~50 MB when 50 MB are written."""
    probe = ProcessProbe()
    before: Values = {}
    probe.sample(before)
    # fresh pages from the kernel, written so resident (numpy's allocation could reuse heap
    # pages a worker that ran other tests already has resident)
    block = mmap.mmap(-1, 50 * MB)
    block.write(b"\x01" * (50 * MB))
    after: Values = {}
    probe.sample(after)
    assert block[-1] == 1
    assert isinstance(before["rss_bytes"], int) and isinstance(after["rss_bytes"], int)
    assert after["rss_bytes"] - before["rss_bytes"] >= 40 * MB
    total, used = after["sys_mem_total_bytes"], after["sys_mem_used_bytes"]
    assert isinstance(total, int) and isinstance(used, int) and 0 < used < total
    assert isinstance(after["cpu_pct"], float) and after["cpu_pct"] >= 0
    assert set(after) <= set(SAMPLE_FIELDS)


def test_process_probe_reads_what_psutil_reads_for_this_process_and_host() -> None:
    """ProcessProbe's numbers (from /proc and os.times) are psutil's: RSS within 2 MB of
    memory_info's, host memory total equal, and a thread spinning for a second reads as
    psutil's cpu_percent of this process over the same second, within 3 points or a
    quarter of it."""
    probe = ProcessProbe()
    ours = psutil.Process()
    ours.cpu_percent(None)
    probe.sample({})
    end = time.monotonic() + 1.0

    def spin() -> None:
        while time.monotonic() < end:
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    spinner.join()
    into: Values = {}
    probe.sample(into)
    want = ours.cpu_percent(None)
    rss = ours.memory_info().rss
    assert isinstance(into["rss_bytes"], int) and abs(into["rss_bytes"] - rss) < 2 * MB
    assert into["sys_mem_total_bytes"] == psutil.virtual_memory().total
    got = into["cpu_pct"]
    # a spinner a busy host let run at all (5 %), read within 3 points or a quarter of it
    assert isinstance(got, float) and want > 5 and abs(got - want) <= max(3, want / 4), (
        got,
        want,
    )


def test_without_proc_the_process_probe_reads_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /proc cannot be read (another OS), ProcessProbe fills the same keys from
    psutil: RSS near memory_info's, host memory, a host CPU figure; the run queue None."""
    from soakd.telemetry import procfs

    monkeypatch.setattr(procfs, "read", lambda path: None)
    probe = ProcessProbe()
    time.sleep(0.05)
    into: Values = {}
    probe.sample(into)
    assert isinstance(into["rss_bytes"], int)
    assert abs(into["rss_bytes"] - psutil.Process().memory_info().rss) < 2 * MB
    assert into["sys_mem_total_bytes"] == psutil.virtual_memory().total
    assert isinstance(into["cpu_pct"], float)
    assert into["host_run_queue"] is None


_SPIN = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass"


def test_a_proc_file_kept_open_is_read_afresh_and_a_gone_process_reads_none() -> None:
    """procfs keeps /proc files open between reads: a spinning child's CPU in its
    /proc/PID/stat grows from read to read, the file reads None once the child is gone, and
    at most KEEP_OPEN files stay open however many paths were read."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        first = procfs.stat(spin.pid)
        assert first is not None
        later, deadline = first, time.monotonic() + 30
        while later.cpu_s <= first.cpu_s and time.monotonic() < deadline:
            time.sleep(0.05)
            got = procfs.stat(spin.pid)
            assert got is not None
            later = got
        assert later.cpu_s > first.cpu_s
    finally:
        spin.kill()
        spin.wait()
    assert procfs.stat(spin.pid) is None
    fds = len(os.listdir("/proc/self/fd"))
    paths = [f"/proc/self/{'./' * i}stat" for i in range(procfs.KEEP_OPEN + 20)]
    assert all(procfs.read(p) for p in paths)
    assert len(os.listdir("/proc/self/fd")) <= fds + procfs.KEEP_OPEN


def test_process_probe_reads_a_real_cpu_hog_as_host_load() -> None:
    """With one spinning process per CPU and one more, host_cpu_pct reads the host as
    (nearly) all busy, agreeing with psutil's own busy share over the same interval within
    5 points; the run queue holds the hogs; the load average is a number."""
    ncpu = os.cpu_count() or 1
    hogs = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(ncpu + 1)]
    try:
        time.sleep(0.5)  # the hogs running
        probe = ProcessProbe()
        psutil.cpu_percent(None)
        time.sleep(1.0)
        into: Values = {}
        probe.sample(into)
        theirs = psutil.cpu_percent(None)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert isinstance(into["host_cpu_pct"], float) and into["host_cpu_pct"] >= 90, into
    assert abs(into["host_cpu_pct"] - theirs) <= 5, (into, theirs)
    assert into["host_steal_pct"] is not None and 0 <= into["host_steal_pct"] <= 100
    assert isinstance(into["host_run_queue"], int) and into["host_run_queue"] >= ncpu, into
    assert isinstance(into["host_load1"], float) and into["host_load1"] >= 0


# -- Sampler ------------------------------------------------------------------------------


class ScriptedProbe:
    """A probe that fills rss_bytes with its call count and can advance a fake clock or
    raise on chosen calls."""

    name = "scripted"

    def __init__(
        self,
        clock: FakeClock | None = None,
        slow: dict[int, int] | None = None,
        fail_on: int | None = None,
    ) -> None:
        self.clock, self.slow, self.fail_on = clock, slow or {}, fail_on
        self.calls = 0
        self.closed = 0

    def sample(self, into: Values) -> None:
        n = self.calls
        self.calls += 1
        if n == self.fail_on:
            raise RuntimeError("probe broke")
        if self.clock is not None and n in self.slow:
            self.clock.advance(self.slow[n])
        into["rss_bytes"] = n

    def close(self) -> None:
        self.closed += 1


def run_fake(
    probes: list[Any], clock: FakeClock, n: int, **kw: Any
) -> tuple[Sampler, list[Sample]]:
    """Run a sampler on a fake clock until it has produced ``n`` samples."""
    got: list[Sample] = []
    done = threading.Event()
    holder: dict[str, Sampler] = {}

    def on_sample(s: Sample) -> None:
        got.append(s)
        if len(got) == n:
            holder["s"].stop()  # from the sampler thread: sets stop, no self-join
            done.set()

    sampler = Sampler(probes, interval_ms=100, clock=clock, t0_ns=0, on_sample=on_sample, **kw)
    holder["s"] = sampler
    sampler.start()
    assert done.wait(10), f"no {n} samples within 10 s"
    sampler.stop()  # joins
    assert not sampler.running
    return sampler, got


def test_sampler_skips_ahead_after_a_slow_tick_and_never_bursts() -> None:
    """A tick 250 ms long at 100 ms: the next runs at the latest passed deadline, then on grid."""
    clock = FakeClock()
    probe = ScriptedProbe(clock, slow={3: 250_000_000})
    sampler, got = run_fake([probe], clock, 7)
    assert [s.seq for s in got] == list(range(7))
    assert [s.t for s in got] == pytest.approx([0, 0.1, 0.2, 0.3, 0.55, 0.6, 0.7])
    assert [s.lag_ms for s in got] == pytest.approx([0, 0, 0, 0, 50, 0, 0])
    assert got[3].tick_ms == pytest.approx(250)
    assert sampler.skipped == 1
    assert got[0].wall == pytest.approx(clock.wall() - 0.7)
    assert set(got[0].values) == set(SAMPLE_FIELDS) and got[2].values["rss_bytes"] == 2
    assert probe.closed == 1  # once, though stop() was called from the thread and after


def test_sampler_starts_at_the_first_deadline_after_t0() -> None:
    """Started 250 ms after t0, the first tick is due at 300 ms (the grid of t0)."""
    clock = FakeClock(start_ns=250_000_000)
    got: list[Sample] = []
    sampler = Sampler([], interval_ms=100, clock=clock, t0_ns=0, on_sample=got.append)
    assert sampler._first_tick() == 3


def test_failing_probe_is_disabled_logged_once_and_sampling_goes_on() -> None:
    """A probe that raises is skipped from then on, one warning and one event say so."""
    clock = FakeClock()
    bad = ScriptedProbe(fail_on=1)
    bad.name = "bad"
    good = ProcessProbe()
    log = ListLog()
    events: list[Event] = []
    sampler, got = run_fake([bad, good], clock, 5, log=log, on_event=events.append)
    assert bad.calls == 2  # once fine, once failing, never again
    assert [s.values["rss_bytes"] is not None for s in got] == [True] * 5  # good still runs
    assert len(log.warnings) == 1 and "bad" in log.warnings[0] and "probe broke" in log.warnings[0]
    assert [e.kind for e in events] == ["probe_disabled"] and sampler.disabled == {
        "bad": "RuntimeError: probe broke"
    }


def test_sampler_crash_in_callback_is_loud_and_ends_the_thread() -> None:
    """An on_sample that raises ends the thread, keeps the error and calls on_crash."""
    crashed: list[BaseException] = []

    def on_sample(s: Sample) -> None:
        raise OSError("disk full")

    sampler = Sampler(
        [],
        interval_ms=100,
        clock=FakeClock(),
        t0_ns=0,
        on_sample=on_sample,
        on_crash=crashed.append,
        log=ListLog(),
    )
    sampler.start()
    assert sampler._thread is not None
    sampler._thread.join(5)
    assert not sampler.running
    assert isinstance(sampler.error, OSError) and crashed == [sampler.error]
    sampler.stop()


def test_sampler_rejects_an_interval_out_of_range() -> None:
    """interval_ms of 0 is a programming error, refused at construction."""
    with pytest.raises(ValueError, match="interval_ms"):
        Sampler([], interval_ms=0, clock=FakeClock(), t0_ns=0, on_sample=lambda s: None)


def test_sampler_real_clock_cadence_over_two_seconds() -> None:
    """With the real clock at 100 ms, ~2 s gives ~20 samples, monotonic, on time, cheap."""
    clock = MonotonicClock()
    got: list[Sample] = []
    done = threading.Event()

    def on_sample(s: Sample) -> None:
        got.append(s)
        if s.t >= 2.0:
            done.set()

    t0 = clock.now_ns()
    sampler = Sampler([ProcessProbe()], interval_ms=100, clock=clock, t0_ns=t0, on_sample=on_sample)
    sampler.start()
    assert any(t.name == THREAD_NAME for t in threading.enumerate())
    assert done.wait(10), "sampler produced no sample at t >= 2 s within 10 s"
    sampler.stop()
    assert not sampler.running
    n = len(got)
    assert 18 <= n <= 23
    assert [s.seq for s in got] == list(range(n))
    ts = [s.t for s in got]
    assert all(b > a for a, b in itertools.pairwise(ts))
    lags = sorted(s.lag_ms for s in got)
    assert lags[len(lags) // 2] < 20  # median lag: loose, a busy CI box still passes
    ticks = sorted(s.tick_ms for s in got)
    assert ticks[0] >= 0 and ticks[len(ticks) // 2] < 20  # a tick is a few probe reads
    assert sampler.cpu_ns / 1e9 < 0.05 * ts[-1]  # well under 5 % of a core (target 1 %)


# -- NVML through a fake pynvml ---------------------------------------------------------------


def make_fake_pynvml(
    *,
    uuids: tuple[str, ...] = ("GPU-aaaa-1111", "GPU-bbbb-2222"),
    init_error: str | None = None,
    v2: bool = True,
    unsupported: frozenset[str] = frozenset(),
    procs: list[tuple[int, int | None]] | None = None,
    used: Callable[[int], int] | None = None,
) -> types.ModuleType:
    """A stand-in for nvidia-ml-py's pynvml: no GPU runs here, so NVML itself cannot be
    called; the fake mirrors the real module's names, structs and error classes. One GPU
    per UUID; ``used(index)``: a device's used memory (v2) at each call (default 7 GiB)."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_FunctionNotFound(NVMLError):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVMLError_NotSupported = NVMLError_NotSupported  # type: ignore[attr-defined]
    m.NVMLError_FunctionNotFound = NVMLError_FunctionNotFound  # type: ignore[attr-defined]
    m.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound  # type: ignore[attr-defined]
    m.nvmlMemory_v2 = 0x2000028  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    m.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    m.calls = {}  # type: ignore[attr-defined]
    m.shutdowns = 0  # type: ignore[attr-defined]
    m.flaky = set()  # type: ignore[attr-defined]  # query names failing once with NVMLError

    def api(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(*a: Any, **kw: Any) -> Any:
                m.calls[name] = m.calls.get(name, 0) + 1  # type: ignore[attr-defined]
                if name in unsupported:
                    raise NVMLError_NotSupported("Not Supported")
                if name in m.flaky:  # type: ignore[attr-defined]
                    m.flaky.discard(name)  # type: ignore[attr-defined]
                    raise NVMLError("GPU is lost")
                return fn(*a, **kw)

            setattr(m, name, call)
            return call

        return wrap

    @api("nvmlInit")
    def _init() -> None:
        if init_error:
            raise NVMLError_LibraryNotFound(init_error)

    @api("nvmlShutdown")
    def _shutdown() -> None:
        m.shutdowns += 1  # type: ignore[attr-defined]

    api("nvmlDeviceGetCount")(lambda: len(uuids))
    api("nvmlDeviceGetHandleByIndex")(lambda i: ("handle", i))
    api("nvmlDeviceGetIndex")(lambda h: h[1])
    api("nvmlDeviceGetUUID")(lambda h: uuids[h[1]].encode())

    @api("nvmlDeviceGetHandleByUUID")
    def _by_uuid(u: str) -> Any:
        raise NVMLError("Not Found")

    @api("nvmlDeviceGetMemoryInfo")
    def _mem(h: Any, version: int | None = None) -> Any:
        if version is not None and not v2:
            raise NVMLError_FunctionNotFound("Function Not Found")
        v2_used = used(h[1]) if used is not None else 7 * 1024**3
        # v1 'used' includes the memory the driver reserves
        return types.SimpleNamespace(
            total=80 * 1024**3, used=v2_used if version else v2_used + 1024**3, free=1
        )

    api("nvmlDeviceGetUtilizationRates")(lambda h: types.SimpleNamespace(gpu=93, memory=41))
    me = os.getpid()
    plist = procs if procs is not None else [(me, 3 * 1024**3), (me + 1, 5 * 1024**3)]
    api("nvmlDeviceGetComputeRunningProcesses")(
        lambda h: [types.SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in plist]
    )
    api("nvmlDeviceGetTemperature")(lambda h, sensor: 64)
    api("nvmlDeviceGetPowerUsage")(lambda h: 312_500)  # milliwatts
    api("nvmlDeviceGetClockInfo")(lambda h, clock: 1980)
    return m


def test_nvml_probe_maps_every_field_to_its_column_and_unit() -> None:
    """v2 memory used/total, utilisation, this pid's memory, temp, mW -> W, SM clock."""
    nvml = make_fake_pynvml()
    probe = NvmlProbe.for_device("cuda:1", nvml)
    assert probe.handle == ("handle", 1)
    into: Values = {}
    probe.sample(into)
    assert into == {
        "gpu_mem_used_bytes": 7 * 1024**3,
        "gpu_mem_total_bytes": 80 * 1024**3,
        "gpu_util_pct": 93.0,
        "gpu_mem_util_pct": 41.0,
        "gpu_proc_mem_bytes": 3 * 1024**3,  # the other pid's 5 GiB is not ours
        "gpu_temp_c": 64.0,
        "gpu_power_w": 312.5,
        "gpu_sm_clock_mhz": 1980.0,
    }
    probe.close()
    assert nvml.shutdowns == 1  # type: ignore[attr-defined]


def test_nvml_probe_falls_back_to_v1_memory_info() -> None:
    """A driver without nvmlDeviceGetMemoryInfo_v2 is read through the v1 struct."""
    probe = NvmlProbe.for_device("cuda", make_fake_pynvml(v2=False))
    into: Values = {}
    probe.sample(into)
    assert into["gpu_mem_used_bytes"] == 8 * 1024**3


def test_nvml_unsupported_query_is_null_and_never_asked_again() -> None:
    """NotSupported (e.g. power on some boards) leaves the column None and stops asking."""
    nvml = make_fake_pynvml(unsupported=frozenset({"nvmlDeviceGetPowerUsage"}))
    probe = NvmlProbe.for_device("cuda:0", nvml)
    for _ in range(3):
        into: Values = {}
        probe.sample(into)
        assert into.get("gpu_power_w") is None and into["gpu_temp_c"] == 64.0
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 1  # type: ignore[attr-defined]
    assert probe.unsupported == {"power"}


def test_nvml_transient_error_nulls_that_tick_only() -> None:
    """A failing query (GPU lost) gives None for this tick and a value on the next."""
    nvml = make_fake_pynvml()
    probe = NvmlProbe.for_device("cuda:0", nvml)
    nvml.flaky.add("nvmlDeviceGetUtilizationRates")  # type: ignore[attr-defined]
    first: Values = {}
    probe.sample(first)
    second: Values = {}
    probe.sample(second)
    assert first.get("gpu_util_pct") is None and first["gpu_mem_used_bytes"] is not None
    assert second["gpu_util_pct"] == 93.0


def test_nvml_process_memory_is_none_when_this_pid_is_not_listed() -> None:
    """No CUDA context yet (or a hidden PID namespace): gpu_proc_mem_bytes is None, not 0."""
    probe = NvmlProbe.for_device("cuda", make_fake_pynvml(procs=[(1, 10)]))
    into: Values = {}
    probe.sample(into)
    assert into["gpu_proc_mem_bytes"] is None


@pytest.mark.parametrize(
    ("env", "ordinal", "want"),
    [(None, 1, 1), ("2,0", 1, 0), ("GPU-bbbb, 0", 0, "GPU-bbbb"), ("1,-1,0", 0, 1)],
)
def test_cuda_visible_devices_maps_ordinal_to_nvml(
    env: str | None, ordinal: int, want: int | str
) -> None:
    """CUDA ordinals are positions in CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    assert visible_device(ordinal, env) == want


@pytest.mark.parametrize(("env", "ordinal"), [("", 0), ("0", 1), ("1,-1,0", 1)])
def test_device_hidden_by_cuda_visible_devices_is_unavailable(env: str, ordinal: int) -> None:
    """An ordinal past the visible list (CUDA stops at an invalid entry) is not a GPU."""
    with pytest.raises(GpuUnavailable, match="not visible"):
        visible_device(ordinal, env)


def test_uuid_prefix_from_cuda_visible_devices_selects_that_gpu() -> None:
    """CUDA_VISIBLE_DEVICES=GPU-bbbb picks the GPU whose UUID starts with it."""
    nvml = make_fake_pynvml()
    assert nvml_handle(nvml, 0, "GPU-bbbb") == ("handle", 1)
    with pytest.raises(GpuUnavailable, match="GPU-zzzz"):
        nvml_handle(nvml, 0, "GPU-zzzz")


@pytest.mark.parametrize(("device", "want"), [("cuda", 0), ("cuda:3", 3)])
def test_cuda_ordinal_parses_device_strings(device: str, want: int) -> None:
    """'cuda' is ordinal 0, 'cuda:N' is N."""
    assert cuda_ordinal(device) == want


# -- default_probes --------------------------------------------------------------------------


def test_default_probes_without_gpu_warn_once_and_keep_process_probe() -> None:
    """On this GPU-less machine a CUDA device gives ProcessProbe only and one warning why."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is a dependency of soakd")
    log = ListLog()
    probes = default_probes("cuda:0", log)
    assert [p.name for p in probes] == ["process"]
    assert len(log.warnings) == 1 and "GPU columns will be NULL" in log.warnings[0]
    assert "NVML" in log.warnings[0]


def test_default_probes_for_a_cpu_device_say_it_is_not_cuda() -> None:
    """A CPU workload gets ProcessProbe and one warning naming the device."""
    log = ListLog()
    assert [p.name for p in default_probes("cpu", log)] == ["process"]
    assert log.warnings == ["GPU telemetry off, GPU columns will be NULL: device 'cpu' is not CUDA"]


def test_default_probes_without_nvidia_ml_py_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """With pynvml not importable the warning names nvidia-ml-py."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    log = ListLog()
    assert [p.name for p in default_probes("cuda", log)] == ["process"]
    assert len(log.warnings) == 1 and "nvidia-ml-py" in log.warnings[0]


def test_default_probes_with_nvml_present_return_gpu_probes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With (a fake) pynvml that finds the GPU: process, nvml and torch probes, no warning."""
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    log = ListLog()
    probes = default_probes("cuda:1", log)
    assert [p.name for p in probes] == ["process", "nvml", "torch_cuda"]
    assert log.warnings == []
    for p in probes:
        p.close()


def test_default_probes_with_nvml_init_failing_name_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nvmlInit failing (no driver) is reported in the one warning."""
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(init_error="Library Not Found"))
    log = ListLog()
    assert [p.name for p in default_probes("cuda", log)] == ["process"]
    assert len(log.warnings) == 1 and "Library Not Found" in log.warnings[0]


# -- torch allocator -------------------------------------------------------------------------


def test_torch_probe_stays_null_without_initialised_cuda() -> None:
    """Without CUDA (this machine) the torch columns stay None and nothing is initialised."""
    probe = TorchCudaProbe(0)
    into: Values = {}
    probe.sample(into)
    assert into == {}


def test_torch_probe_maps_memory_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    """With (a fake, no GPU here) initialised torch.cuda the allocator stats map to columns."""
    stats = {
        "allocated_bytes.all.current": 100,
        "reserved_bytes.all.current": 200,
        "allocated_bytes.all.peak": 300,
        "reserved_bytes.all.peak": 400,
        "num_alloc_retries": 2,
        "num_ooms": 1,
    }
    asked: list[int] = []

    def memory_stats(device: int) -> dict[str, int]:
        asked.append(device)
        return stats

    cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, memory_stats=memory_stats
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    into: Values = {}
    TorchCudaProbe(2).sample(into)
    assert asked == [2]
    assert into == {
        "torch_allocated_bytes": 100,
        "torch_reserved_bytes": 200,
        "torch_max_allocated_bytes": 300,
        "torch_max_reserved_bytes": 400,
        "torch_alloc_retries": 2,
        "torch_ooms": 1,
    }

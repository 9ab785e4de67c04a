"""What machine and software a run ran on, stored with the run (``runs.environment``).

Versions are read from package metadata, never by importing (a synthetic run must not pay
for importing torch). GPU facts come from NVML when it is there; otherwise they are None.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psutil

import soakd


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


class GpuUnavailable(Exception):
    """Why a CUDA ordinal has no NVML device here (one line)."""


def visible_device(ordinal: int, env: str | None) -> str | int:
    """The NVML index (int) or UUID prefix (str) behind CUDA ordinal ``ordinal`` given
    ``CUDA_VISIBLE_DEVICES`` = ``env`` (None: unset, every device is visible in order)."""
    if env is None:
        return ordinal
    entries = []
    for raw in env.split(","):
        entry = raw.strip()
        if not entry or entry.startswith("-"):
            break  # CUDA stops at the first invalid entry
        entries.append(entry)
    if ordinal >= len(entries):
        raise GpuUnavailable(
            f"cuda:{ordinal} is not visible (CUDA_VISIBLE_DEVICES={env!r} shows "
            f"{len(entries)} device{'s' if len(entries) != 1 else ''})"
        )
    entry = entries[ordinal]
    return int(entry) if entry.isdigit() else entry


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_handle(nvml: Any, ordinal: int, env: str | None) -> Any:
    """The NVML device handle of CUDA ordinal ``ordinal`` under ``CUDA_VISIBLE_DEVICES`` =
    ``env``: the one owner of "which physical GPU is cuda:N" (Slurm's ``--gpus`` binding,
    a systemd instance's env file), for the telemetry and the run's environment alike."""
    want = visible_device(ordinal, env)
    count = nvml.nvmlDeviceGetCount()
    if count == 0:
        raise GpuUnavailable("NVML sees no GPU")
    if isinstance(want, int):
        if want >= count:
            raise GpuUnavailable(f"GPU index {want} not found (NVML sees {count})")
        return nvml.nvmlDeviceGetHandleByIndex(want)
    # a UUID or a unique UUID prefix, as CUDA accepts it
    for i in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        if _decode(nvml.nvmlDeviceGetUUID(handle)).startswith(want):
            return handle
    with contextlib.suppress(nvml.NVMLError):  # e.g. a MIG instance UUID
        return nvml.nvmlDeviceGetHandleByUUID(want)
    raise GpuUnavailable(f"no GPU with UUID {want!r} (from CUDA_VISIBLE_DEVICES)")


def visible_ordinals(nvml: Any, env: str | None) -> list[int]:
    """The CUDA ordinals this process can use under ``CUDA_VISIBLE_DEVICES`` = ``env``, as
    CUDA counts them: every NVML device when unset, else the entries up to the first one
    that names no device (CUDA ignores the rest)."""
    out: list[int] = []
    for ordinal in range(nvml.nvmlDeviceGetCount()):
        try:
            nvml_handle(nvml, ordinal, env)
        except GpuUnavailable:
            break
        out.append(ordinal)
    return out


def nvml_index(nvml: Any, handle: Any) -> int:
    """The NVML index of ``handle`` (the ``gpu`` nvidia-smi and dcgm-exporter show)."""
    index = getattr(nvml, "nvmlDeviceGetIndex", None)
    if index is not None:
        return int(index(handle))
    uuid = _decode(nvml.nvmlDeviceGetUUID(handle))
    for i in range(nvml.nvmlDeviceGetCount()):
        if _decode(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) == uuid:
            return i
    raise GpuUnavailable(f"GPU {uuid} has no NVML index")


def device_uuid(nvml: Any, handle: Any) -> str:
    return _decode(nvml.nvmlDeviceGetUUID(handle))


def gpu_facts(ordinal: int = 0, nvml: Any = None) -> dict[str, Any]:
    """Name, UUID, driver and CUDA driver of the GPU that is CUDA ordinal ``ordinal`` in this
    process (through ``CUDA_VISIBLE_DEVICES``, as the NVML probe picks it); None values and
    ``gpu_error`` saying why when there is none. ``nvml``: the ``pynvml`` module (tests)."""
    facts: dict[str, Any] = dict.fromkeys(("gpu_name", "gpu_uuid", "driver", "cuda_driver"))
    try:
        nvml = nvml or importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no GPU
        facts["gpu_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return facts
    try:
        h = nvml_handle(nvml, ordinal, os.environ.get("CUDA_VISIBLE_DEVICES"))
        facts["gpu_name"] = _decode(nvml.nvmlDeviceGetName(h))
        facts["gpu_uuid"] = _decode(nvml.nvmlDeviceGetUUID(h))
        facts["driver"] = _decode(nvml.nvmlSystemGetDriverVersion())
        cv = nvml.nvmlSystemGetCudaDriverVersion()
        facts["cuda_driver"] = f"{cv // 1000}.{(cv % 1000) // 10}"
    except Exception as exc:
        facts["gpu_error"] = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return facts


def _cgroup_paths(root: Path, proc_cgroup: Path) -> list[Path]:
    """Where this process's memory limit may be written, most specific first."""
    out: list[Path] = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, rel = [*line.split(":", 2), "", ""][:3]
        rel = rel.lstrip("/")
        if controllers == "":  # cgroup v2
            out += [root / rel / "memory.max", root / "memory.max"]
        elif "memory" in controllers.split(","):  # cgroup v1
            out += [
                root / "memory" / rel / "memory.limit_in_bytes",
                root / "memory" / "memory.limit_in_bytes",
            ]
    return out


def cgroup_memory_limit(
    root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """This process's cgroup memory limit in bytes (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``); None when unlimited or unknown."""
    for f in _cgroup_paths(root, proc_cgroup):
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes a huge number for "no limit"
            return int(text)
        return None
    return None


def collect(*, gpu: bool = True, ordinal: int = 0) -> dict[str, Any]:
    """Facts about this host and process; with ``gpu``, those of CUDA ordinal ``ordinal``
    (the workload's device, as CUDA_VISIBLE_DEVICES maps it)."""
    env: dict[str, Any] = {
        "host": os.uname().nodename,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "soakd": soakd.__version__,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
        "opencv": _version("opencv-python-headless") or _version("opencv-python"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # what host memory a leak has to exhaust (the memory headroom criterion)
        "host_mem_total_bytes": psutil.virtual_memory().total,
        "cgroup_mem_max_bytes": cgroup_memory_limit(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch_cuda"] = getattr(torch.version, "cuda", None)
    if gpu:
        env.update(gpu_facts(ordinal))
    return env

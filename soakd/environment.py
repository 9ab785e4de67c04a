"""What machine and software a run ran on, stored with the run (``runs.environment``).

Versions are read from package metadata, never by importing (a synthetic run must not pay
for importing torch). GPU facts come from NVML when it is there; otherwise they are None.
"""

from __future__ import annotations

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


def gpu_facts(device_index: int = 0) -> dict[str, Any]:
    facts: dict[str, Any] = {"gpu_name": None, "driver": None, "cuda_driver": None}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no GPU
        facts["gpu_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return facts
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        name = pynvml.nvmlDeviceGetName(h)
        facts["gpu_name"] = name.decode() if isinstance(name, bytes) else name
        drv = pynvml.nvmlSystemGetDriverVersion()
        facts["driver"] = drv.decode() if isinstance(drv, bytes) else drv
        cv = pynvml.nvmlSystemGetCudaDriverVersion()
        facts["cuda_driver"] = f"{cv // 1000}.{(cv % 1000) // 10}"
    except Exception as exc:
        facts["gpu_error"] = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
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


def collect(*, gpu: bool = True) -> dict[str, Any]:
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
        env.update(gpu_facts())
    return env

"""Memory criteria per GPU: ``memory_gpu[i]`` for each GPU a run sampled apart (``run.gpus``
or a ``device_map`` over several GPUs; ``i`` is the NVML index, as in ``gpu_samples`` and
the Prometheus ``gpu`` label).

Each is judged by the rule of ``memory_gpu`` (``soakd.analysis.verdict``: floors of
``floor_window_s`` windows, their Theil–Sen slope against
``max_memory_growth_mb_per_min``, FAIL only when the Mann–Kendall test finds the rise
significant) on that GPU's used memory after the warm-up, so a leak on one GPU of a sharded
model fails its own criterion, and the run, while the others pass. A run on one GPU has no
per-GPU criteria: ``memory_gpu`` judges it. Pure: ``RunData.gpus`` in (loaded by
``soakd.analysis.data`` from ``gpu_samples``), series and results out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from soakd.analysis.model import CriterionResult, RunData


def criterion_name(gpu: int) -> str:
    """``memory_gpu[1]``: the criterion of the GPU with NVML index ``gpu``."""
    return f"memory_gpu[{gpu}]"


@dataclass(frozen=True, slots=True)
class DeviceSeries:
    """One GPU's used memory after the warm-up: finite values only, in time order."""

    gpu: int
    name: str
    title: str
    t: np.ndarray
    y: np.ndarray


def memory_series(data: RunData, t0: float) -> Iterator[DeviceSeries]:
    """Each GPU of ``data.gpus`` by index: its ``mem_used_bytes`` from ``t0`` on."""
    for gpu, cols in sorted(data.gpus.items()):
        t = cols["t"]
        y = cols.get("mem_used_bytes", np.full(t.shape, np.nan))
        keep = (t >= t0) & np.isfinite(y)
        yield DeviceSeries(gpu, criterion_name(gpu), f"GPU {gpu} memory used", t[keep], y[keep])


def unreported(s: DeviceSeries, threshold: float) -> CriterionResult:
    """A GPU sampled apart whose used memory NVML never reported after the warm-up: not
    applicable, as ``memory_gpu`` is when its column is not reported."""
    return CriterionResult.na(
        s.name,
        s.title,
        threshold=threshold,
        unit="MB/min",
        detail=f"not applicable: GPU {s.gpu} reported no used memory after warm-up",
    )

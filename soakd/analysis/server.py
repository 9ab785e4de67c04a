"""A served model's server, judged (``workload.kind = "openai"``): its memory and its queue.

A served model leaks in the server, not in soakd, so a run of a served model has three more
criteria, judged by the rules soakd's own telemetry is judged by:

* ``memory_server_rss``: the server's processes' RSS (with their children), the rule of
  ``memory_rss`` (the Theil–Sen slope of ``floor_window_s`` window floors, FAIL only when
  significant and over ``max_memory_growth_mb_per_min``); INVALID when the server process
  was to be sampled and gave no samples, n/a (saying why) for a remote server
  (``telemetry.server_process = "off"``);
* ``memory_server_gpu``: the GPU memory of the server's processes (NVML), as ``memory_gpu``;
* ``server_queue``: the server-side twin of frame age. The server's waiting requests
  (``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``) and its KV-cache use
  (``vllm:kv_cache_usage_perc``, ``sglang:token_usage``) may not keep rising: the slope of
  their per-window medians, FAIL when significant and over ``max_server_queue_slope_per_min``
  / ``max_kv_cache_slope_per_min``. n/a when the server exports none of them.

Pure: ``RunData.samples`` and ``RunData.server`` in (loaded by ``soakd.analysis.data``), the
series and the results that need no trend test out; ``soakd.analysis.verdict`` runs the tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from soakd.analysis.model import CriterionResult, RunData, RunMeta
from soakd.config import SERVED_KINDS, SERVER_KV_METRICS, SERVER_WAITING_METRICS

#: (criterion, sample column, title) of the server's memory criteria
SERVER_MEMORY_METRICS: tuple[tuple[str, str, str], ...] = (
    ("memory_server_rss", "server_rss_bytes", "Server RSS"),
    ("memory_server_gpu", "server_gpu_mem_bytes", "Server GPU memory"),
)
QUEUE = "server_queue"
QUEUE_TITLE = "Server queue not rising"


def is_served(meta: RunMeta) -> bool:
    """The run drove a model behind a network endpoint (its server is judged too)."""
    return meta.workload_kind in SERVED_KINDS


def _telemetry(meta: RunMeta) -> dict[str, object]:
    t = meta.config.get("telemetry")
    return t if isinstance(t, dict) else {}


def process_sampled(meta: RunMeta) -> bool:
    """The run was to sample the server's process (not a remote server)."""
    t = _telemetry(meta)
    return t.get("server_process") != "off" or bool(t.get("server_pid") or t.get("server_unit"))


def memory_missing(
    meta: RunMeta, name: str, title: str, threshold: float, gpu_any: bool
) -> CriterionResult:
    """A server memory criterion without samples after the warm-up: INVALID when the server's
    RSS was to be sampled (it died, or was never found), else n/a saying why."""
    unit = "MB/min"
    if not process_sampled(meta):
        detail = (
            "not applicable: the server is not on this host (telemetry.server_process = "
            '"off"): its memory is not judged'
        )
        return CriterionResult.na(name, title, threshold=threshold, unit=unit, detail=detail)
    if name == "memory_server_rss":
        return CriterionResult.invalid(
            name, title, threshold=threshold, unit=unit,
            detail="no server RSS samples after warm-up (the server process was not sampled)",
        )  # fmt: skip
    why = "no GPU present or visible" if not gpu_any else "NVML reported no server process"
    return CriterionResult.na(
        name, title, threshold=threshold, unit=unit, detail=f"not applicable: {why}"
    )


@dataclass(frozen=True, slots=True)
class QueueSeries:
    """One server queue metric after the warm-up: finite values in time order, with its
    tolerance (per minute) and its unit."""

    metric: str
    t: np.ndarray
    y: np.ndarray
    threshold: float
    unit: str


def queue_series(
    data: RunData, t0: float, waiting_slope: float, kv_slope: float
) -> Iterator[QueueSeries]:
    """The first waiting-requests metric and the first KV-cache metric the server exported."""
    for names, thr, unit in (
        (SERVER_WAITING_METRICS, waiting_slope, "requests/min"),
        (SERVER_KV_METRICS, kv_slope, "share/min"),
    ):
        for name in names:
            if name in data.server:
                t, y = data.server[name]
                keep = (t >= t0) & np.isfinite(y)
                yield QueueSeries(name, t[keep], y[keep], thr, unit)
                break


def queue_not_exported(threshold: float) -> CriterionResult:
    names = ", ".join((*SERVER_WAITING_METRICS, *SERVER_KV_METRICS))
    return CriterionResult.na(
        QUEUE,
        QUEUE_TITLE,
        threshold=threshold,
        unit="requests/min",
        detail=f"not applicable: the server exported none of {names} (or was not scraped)",
    )

"""A served model's server, judged (``workload.kind = "openai"``): its memory and its queue.

A served model leaks in the server, not in soakd, so a run of a served model has three more
criteria, judged by the rules soakd's own telemetry is judged by:

* ``memory_server_rss``: the server's processes' RSS (with their children), the rule of
  ``memory_rss`` (the Theil–Sen slope of ``floor_window_s`` window floors, FAIL only when
  significant and over ``max_memory_growth_mb_per_min``); INVALID when the server process
  was to be sampled and gave no samples, n/a (saying why) for a remote server
  (``telemetry.server_process = "off"``);
* ``memory_server_gpu``: the GPU memory of the server's processes (NVML), as ``memory_gpu``;
* both judged **per server lifetime**: a server replaced mid-run (a ``server_replaced``
  event: another process took its port, its unit restarted) or lost (``server_lost``) splits
  the run into the lifetimes of its processes (``lifetimes``), each judged alone in its own
  window (a process that took over mid-run after a warm-up of its own, as long as the
  run's). FAIL when any judged lifetime leaks; else the last lifetime decides: its PASS
  (or INVALID), or INVALID "the server was replaced at t = ..." when it is too short to
  judge, or INVALID "the server ... was lost at t = ..." when nothing took the dead one's
  place (``combine_lifetimes``). Never a PASS on a dead process's samples;
* ``server_queue``: the server-side twin of frame age. The server's waiting requests
  (``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``) and its KV-cache use
  (``vllm:kv_cache_usage_perc``, ``sglang:token_usage``) may not keep rising: the slope of
  their per-window medians, FAIL when significant and over ``max_server_queue_slope_per_min``
  / ``max_kv_cache_slope_per_min``. n/a when the server exports none of them.

Pure: ``RunData.samples`` and ``RunData.server`` in (loaded by ``soakd.analysis.data``), the
series and the results that need no trend test out; ``soakd.analysis.verdict`` runs the tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from soakd.analysis.model import FAIL, CriterionResult, RunData, RunMeta
from soakd.config import SERVED_KINDS, SERVER_KV_METRICS, SERVER_WAITING_METRICS

#: (criterion, sample column, title) of the server's memory criteria
SERVER_MEMORY_METRICS: tuple[tuple[str, str, str], ...] = (
    ("memory_server_rss", "server_rss_bytes", "Server RSS"),
    ("memory_server_gpu", "server_gpu_mem_bytes", "Server GPU memory"),
)
#: the run events that end a server's lifetime (soakd.telemetry.server.ServerProcessProbe)
REPLACED, LOST = "server_replaced", "server_lost"
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
class Lifetime:
    """One server process's time in the run: ``[start, end)`` in run seconds, its pid (None
    when no event named it) and how it ended: ``"replaced"``, ``"lost"``, or ``""`` (it
    served to the end)."""

    start: float
    end: float
    pid: int | None
    ended: str

    def window(self, t0: float, t1: float, warmup_s: float = 0.0) -> tuple[float, float] | None:
        """Its part of the measured window ``[t0, t1]``; None when it has none. A process
        that took over mid-run has a warm-up of its own, ``warmup_s`` from its start (the
        run's, which its first process had): its model loading and first requests' caches
        are not its growth."""
        own = self.start + warmup_s if math.isfinite(self.start) else self.start
        a, b = max(own, t0), min(self.end, t1)
        return (a, b) if b > a else None

    def where(self) -> str:
        return f"pid {self.pid}" if self.pid is not None else "the first server"


def _pid(data: dict[str, Any], key: str) -> int | None:
    v = data.get(key)
    return int(v) if isinstance(v, int) else None


def lifetimes(events: Sequence[dict[str, Any]]) -> list[Lifetime]:
    """The server's lifetimes from the run's ``server_replaced`` and ``server_lost`` events:
    one, open at both ends, for a run whose server never changed."""
    changes = sorted(
        (e for e in events if e.get("kind") in (REPLACED, LOST) and e.get("t") is not None),
        key=lambda e: float(e["t"]),
    )
    out: list[Lifetime] = []
    start, pid, alive = -math.inf, None, True
    for e in changes:
        t, data = float(e["t"]), e.get("data") or {}
        if e["kind"] == REPLACED:
            if alive:
                out.append(Lifetime(start, t, _pid(data, "old_pid") or pid, "replaced"))
            start, pid, alive = t, _pid(data, "new_pid"), True
        elif alive:
            out.append(Lifetime(start, t, _pid(data, "pid") or pid, "lost"))
            alive = False
    if alive:
        out.append(Lifetime(start, math.inf, pid, ""))
    return out


def changes_unloaded(data: RunData) -> int:
    """Server changes the run stored but its loaded events do not hold (a run with more
    events than ``load_events`` reads): its lifetimes cannot be told apart."""
    stored = sum(data.event_counts.get(k, 0) for k in (REPLACED, LOST))
    loaded = sum(1 for e in data.events if e.get("kind") in (REPLACED, LOST))
    return max(0, stored - loaded)


def _at(x: float) -> str:
    return "the start" if not math.isfinite(x) else f"t = {x:.1f} s"


def _row(life: Lifetime, res: CriterionResult | None) -> dict[str, Any]:
    return {
        "pid": life.pid,
        "start": life.start if math.isfinite(life.start) else None,
        "end": life.end if math.isfinite(life.end) else None,
        "ended": life.ended or None,
        "status": res.status if res is not None else None,
        "value": res.value if res is not None else None,
    }


def combine_lifetimes(
    name: str,
    title: str,
    threshold: float,
    judged: Sequence[tuple[Lifetime, CriterionResult | None, bool]],
) -> tuple[CriterionResult, int | None]:
    """One server memory criterion from its lifetimes' results (``(lifetime, its result or
    None when it had no samples in the measured window, whether it was long enough to
    judge)``, in time order, the run's last lifetime last), and which of them decided it
    (None: none): FAIL when any lifetime FAILs (the steepest), else INVALID when the last
    server was lost, else the last lifetime's result when it was long enough to judge,
    else INVALID "the server was replaced at t"."""
    rows = [_row(life, res) for life, res, _ in judged]
    fails = [
        (r.value or 0.0, i, life, r)
        for i, (life, r, _) in enumerate(judged)
        if r is not None and r.status == FAIL
    ]
    last, res, long = judged[-1]
    unit = "MB/min"
    if fails:  # the steepest leak
        _, worst, leaking, bad = max(fails, key=lambda f: f[0])
        return _relabel(bad, f"server {leaking.where()} (from {_at(leaking.start)})", rows), worst
    if last.ended == "lost":
        detail = (
            f"the server ({last.where()}) was lost at {_at(last.end)} and nothing took its"
            " place: its memory is not judged on a dead process's samples"
        )
        return _invalid(name, title, threshold, unit, detail, rows), None
    if res is not None and long:  # PASS, or INVALID saying why (untested, undecided)
        at = len(judged) - 1
        return _relabel(res, f"server {last.where()} (from {_at(last.start)})", rows), at
    detail = (
        f"the server was replaced at {_at(last.start)} (now {last.where()}): its life since"
        " is too short to judge its memory (or was not sampled), and the earlier server's"
        " samples are not the new one's"
    )
    return _invalid(name, title, threshold, unit, detail, rows), None


def _relabel(res: CriterionResult, who: str, rows: list[dict[str, Any]]) -> CriterionResult:
    res.detail = f"{who}: {res.detail}"
    res.evidence = {**(res.evidence or {}), "lifetimes": rows}
    return res


def _invalid(
    name: str, title: str, thr: float, unit: str, detail: str, rows: list[dict[str, Any]]
) -> CriterionResult:
    res = CriterionResult.invalid(name, title, threshold=thr, unit=unit, detail=detail)
    res.evidence = {**(res.evidence or {}), "lifetimes": rows}
    return res


def unloaded_changes(name: str, title: str, threshold: float, missing: int) -> CriterionResult:
    detail = (
        f"the server changed more often than the events loaded show ({missing} more"
        " server_replaced / server_lost events): its lifetimes cannot be told apart"
    )
    return CriterionResult.invalid(name, title, threshold=threshold, unit="MB/min", detail=detail)


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

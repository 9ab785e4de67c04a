"""Time to exhaustion: each memory metric's headroom (limit - peak used) at its floor slope,
against ``criteria.horizon`` (how long the model must run between restarts; or
``min_headroom_hours`` when set); reads the memory criterion's results.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from soakd.analysis import server
from soakd.analysis.criteria.base import Context
from soakd.analysis.model import FAIL, INVALID, MEMORY_METRICS, MIB, PASS, CriterionResult
from soakd.config import CriteriaSettings


def _memory_limit(ctx: Context, name: str) -> tuple[float, str, float] | None:
    """(limit bytes, where it comes from, peak bytes used against it) for a memory metric:
    RSS against the host's memory or the cgroup limit, whichever is lower; the GPU metrics
    against the device's total, with the device's peak used (it is what runs out)."""
    d = ctx.data
    post = d.samples["t"] >= ctx.t0
    col = dict((n, c) for n, c, _ in (*MEMORY_METRICS, *server.SERVER_MEMORY_METRICS))[name]
    if name in ("memory_rss", "memory_server_rss"):  # host memory, shared by both
        limits = [
            (v, src)
            for v, src in (
                (d.meta.fact("host_mem_total_bytes"), "host memory"),
                (d.meta.fact("cgroup_mem_max_bytes"), "cgroup memory.max"),
            )
            if v is not None
        ]
        peak = d.sample(col)[post]
        if not limits or not np.isfinite(peak).any():
            return None
        lim, src = min(limits)
        return lim, src, float(np.nanmax(peak))
    total = d.sample("gpu_mem_total_bytes")[post]
    used = d.sample("gpu_mem_used_bytes")[post]
    if not np.isfinite(used).any():
        used = d.sample(col)[post]
    if not np.isfinite(total).any() or not np.isfinite(used).any():
        return None
    return float(np.nanmax(total)), "GPU memory", float(np.nanmax(used))


def _hours_left(ctx: Context, res: CriterionResult, headroom: float) -> float | None:
    """Hours until ``headroom`` bytes are gone at the metric's floor slope: infinite for a
    flat floor (no significant rise), the bound's rate when only a bound was possible, the
    level tail's slope after a rise that stopped, None when untested, undecided (a slope
    over the tolerance the test could not confirm) or still settling."""
    tr = ctx.trends.get(res.criterion)
    how = res.evidence.get("decided_by")
    if tr is None or how in ("untested", "undecided", "settling"):
        return None
    if how == "bounded":
        per_s = float(res.evidence["bound_slope"]) * MIB / 60
    elif how == "settled":  # the rise stopped: what the level tail still grows, if anything
        tail = res.evidence["settled"]
        if not (tail["p_value"] < ctx.crit.alpha and tail["slope"] > 0):
            return math.inf
        per_s = float(tail["slope"]) * MIB / 60
    elif tr.p < ctx.crit.alpha and tr.slope > 0:
        per_s = tr.slope
    else:
        return math.inf
    if per_s <= 0:
        return math.inf
    return max(headroom, 0.0) / per_s / 3600


def horizon_hours(crit: CriteriaSettings) -> float:
    """The hours memory must last: ``min_headroom_hours`` when set, else the horizon."""
    if crit.min_headroom_hours is not None:
        return crit.min_headroom_hours
    return crit.horizon / 3600


def _headroom_metrics(
    ctx: Context, memory: Sequence[CriterionResult]
) -> tuple[dict[str, Any], list[str]]:
    """Per memory metric with a known limit: limit, peak, headroom and hours left (None:
    flat or untested); and the metrics whose trend was untested."""
    per_metric: dict[str, Any] = {}
    untested: list[str] = []
    for res in memory:
        lim = _memory_limit(ctx, res.criterion) if res.status in (PASS, FAIL, INVALID) else None
        if lim is None:
            continue
        limit, src, peak = lim
        hours = _hours_left(ctx, res, limit - peak)
        per_metric[res.criterion] = {
            "limit_mb": limit / MIB,
            "limit_source": src,
            "peak_mb": peak / MIB,
            "headroom_mb": (limit - peak) / MIB,
            "hours": hours if hours is None or math.isfinite(hours) else None,
            "flat": hours is not None and math.isinf(hours),
            # too few windows for a trend test: the hours are at the range's worst-case bound
            "bound_only": res.evidence.get("decided_by") == "bounded",
        }
        if hours is None:
            untested.append(res.criterion)
    return per_metric, untested


def judge_headroom(ctx: Context, memory: Sequence[CriterionResult]) -> CriterionResult:
    """Time to exhaustion at the measured floor slope against the headroom left (limit -
    peak used), for each memory metric with a known limit; FAIL when a growth the trend
    test found runs out within the horizon (``horizon_hours``); INVALID when only a run too
    short for a trend test bounds the growth so that it might (a worst-case bound is no
    claim about the model), or when a metric with a limit could not be tested."""
    thr = horizon_hours(ctx.crit)
    title = "Memory headroom"
    per_metric, untested = _headroom_metrics(ctx, memory)
    ev: dict[str, Any] = {"metrics": per_metric, "horizon_hours": thr}
    if not per_metric:
        return CriterionResult.na(
            "memory_headroom",
            title,
            threshold=thr,
            unit="h",
            detail="not applicable: no memory limit recorded (host, cgroup or GPU total)",
        )
    finite = {k: v for k, v in per_metric.items() if v["hours"] is not None}
    worst = min(finite, key=lambda k: finite[k]["hours"]) if finite else None
    value = finite[worst]["hours"] if worst else None
    measured = {k: v for k, v in finite.items() if not v["bound_only"] and v["hours"] < thr}
    bounds = {k: v for k, v in finite.items() if v["bound_only"] and v["hours"] < thr}
    if measured:  # a growth the trend test found runs out within the horizon: the model's
        name = min(measured, key=lambda k: measured[k]["hours"])
        m = measured[name]
        status, value = FAIL, m["hours"]
        detail = (
            f"{name}: {m['headroom_mb']:.0f} MB left of {m['limit_mb']:.0f} MB "
            f"({m['limit_source']}) gone in {value:.3g} h at the floor slope, within the "
            f"{thr:.3g} h horizon"
        )
    elif bounds:  # only a worst-case bound runs out: the run is too short to tell
        name = min(bounds, key=lambda k: bounds[k]["hours"])
        m = bounds[name]
        status = INVALID
        detail = (
            f"{name}: too short to rule out running out within the {thr:.3g} h horizon: "
            f"the floors' range bounds their growth at most so that the {m['headroom_mb']:.0f}"
            f" MB left would last {m['hours']:.3g} h (no trend test: too few windows); soak "
            "longer, or set criteria.horizon to how long the model must run"
        )
    elif untested:
        status = INVALID
        detail = f"untested: {', '.join(untested)} could not be tested for a trend"
    else:
        status = PASS
        detail = "; ".join(_headroom_words(k, v) for k, v in per_metric.items())
    return CriterionResult(
        criterion="memory_headroom",
        title=title,
        status=status,
        value=value,
        threshold=thr,
        unit="h",
        detail=detail,
        evidence=ev,
    )


def _headroom_words(name: str, m: dict[str, Any]) -> str:
    left = f"{m['headroom_mb']:.0f} MB left of {m['limit_mb']:.0f} MB ({m['limit_source']})"
    if m["hours"] is None:
        return f"{name}: {left}, floor flat"
    return f"{name}: {left}, {m['hours']:.3g} h at the floor slope"


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return [judge_headroom(ctx, ctx.results["memory"])]

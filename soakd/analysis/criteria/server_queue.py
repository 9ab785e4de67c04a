"""A served model's own request queue (vLLM / SGLang metrics): no rising trend."""

from __future__ import annotations

from typing import Any

import numpy as np

from soakd.analysis import server, stats
from soakd.analysis.criteria.base import Context, TrendCall, call_trend, trend_fields
from soakd.analysis.model import FAIL, INVALID, PASS, CriterionResult, floor_window_s


def judge_server_queue(ctx: Context) -> list[CriterionResult]:
    """``server_queue``: the server's waiting requests and KV-cache use may not keep rising
    (per-window medians, the trend rule of frame age); none for an in-process model."""
    d, c = ctx.data, ctx.crit
    if not server.is_served(d.meta):
        return []
    w, _note = floor_window_s(ctx.span, c.floor_window_s)
    calls: list[tuple[server.QueueSeries, TrendCall, stats.Trend]] = []
    ev: dict[str, Any] = {"window_s": w, "metrics": {}}
    for q in server.queue_series(d, ctx.t0, c.max_server_queue_slope_per_min,
                                 c.max_kv_cache_slope_per_min):  # fmt: skip
        win = stats.window_reduce(q.t, q.y, w, t0=ctx.t0, t1=ctx.t1)
        has = win.nonempty()
        tr = stats.trend(win.t[has], win.median[has], c.alpha)
        call = call_trend(tr, win.t[has], win.median[has], c.alpha, q.threshold / 60)
        ctx.series[f"{server.QUEUE}:{q.metric}"] = win
        calls.append((q, call, tr))
        ev["metrics"][q.metric] = {
            "median": float(np.median(q.y)) if q.y.size else None,
            "max": float(q.y.max()) if q.y.size else None,
            "threshold_per_min": q.threshold,
            "decided_by": call.how,
            **trend_fields(tr, 60.0),
        }
    if not calls:
        return [server.queue_not_exported(c.max_server_queue_slope_per_min)]
    order = {FAIL: 0, INVALID: 1, PASS: 2}
    q, call, tr = min(calls, key=lambda x: order.get(x[1].status, 3))
    return [
        CriterionResult(
            criterion=server.QUEUE,
            title=server.QUEUE_TITLE,
            status=call.status,
            value=tr.slope * 60,
            threshold=q.threshold,
            unit=q.unit,
            detail=_queue_detail(ctx, q, call, tr),
            evidence=ev,
        )
    ]


def _queue_detail(ctx: Context, q: server.QueueSeries, call: TrendCall, tr: stats.Trend) -> str:
    slope = f"{tr.slope * 60:+.3g} {q.unit}"
    if call.how == "rising":
        return f"{q.metric} rising {slope} (p = {tr.p:.2g}): the server falls behind"
    if call.how == "untested":
        return f"untested: {q.metric} has too few windows for a trend test; run longer"
    if call.how == "bounded" and call.bound is not None:
        return f"{q.metric}: too few windows for a test, their range allows {call.bound * 60:.3g}"
    return f"{q.metric} median {float(np.median(q.y)):.3g}, slope {slope} (p = {tr.p:.2g})"


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return judge_server_queue(ctx)

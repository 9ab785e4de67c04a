"""A served model's own request queue (vLLM / SGLang metrics): no rising trend."""

from __future__ import annotations

from typing import Any

import numpy as np

from soakd.analysis import server, stats
from soakd.analysis.criteria.base import (
    Context,
    EarlyFail,
    Live,
    TrendCall,
    call_trend,
    look_window,
    trend_fields,
)
from soakd.analysis.data import make_run_data
from soakd.analysis.model import FAIL, INVALID, PASS, CriterionResult, RunMeta, floor_window_s
from soakd.config import CriteriaSettings

#: windows between two looks at the server's queue while a run goes (as memory's)
LOOK_EVERY_WINDOWS = 5


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
    ev["decided_by"] = call.how  # the metric the status rests on
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
    if call.how == "undecided":
        return (
            f"undecided: {q.metric} slope {slope} (p = {tr.p:.2g}) is over "
            f"{q.threshold:g} {q.unit} but not significant at alpha = {ctx.crit.alpha:g}; "
            f"run longer"
        )
    if call.how == "bounded" and call.bound is not None:
        return f"{q.metric}: too few windows for a test, their range allows {call.bound * 60:.3g}"
    return f"{q.metric} median {float(np.median(q.y)):.3g}, slope {slope} (p = {tr.p:.2g})"


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return judge_server_queue(ctx)


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """The server's queue (or KV-cache use) rising significantly above its tolerance at
    this look's share of alpha (``criteria.base.look_alpha``), by the verdict's own rule
    (``judge_server_queue``) on the metrics scraped so far; never for an in-process model
    (no ``live.server`` rows)."""
    if live.server is None or len(live.server) < 3:
        return None
    alpha = live.look(server.QUEUE, LOOK_EVERY_WINDOWS * crit.floor_window_s, crit.alpha)
    if alpha is None or live.t0 is None:
        return None
    rows = live.server.snapshot()
    t = rows.pop("t")
    scraped = {k: (t[np.isfinite(y)], y[np.isfinite(y)]) for k, y in rows.items()}
    data = make_run_data(
        RunMeta("live", fps=live.fps, workload_kind="openai"),
        samples={"t": t},
        server={k: v for k, v in scraped.items() if v[0].size},
    )
    none = np.zeros(0, dtype=bool)
    window = look_window(max(live.now - live.t0, 0.0), crit.floor_window_s)
    look = crit.model_copy(update={"alpha": alpha, "floor_window_s": window})
    ctx = Context(data, look, live.t0, live.now, none, none, {}, {})
    [res] = judge_server_queue(ctx)
    if res.status != FAIL:
        return None
    at = f"alpha {alpha:.2g} at {live.fraction:.0%} of the run"
    return EarlyFail(server.QUEUE, f"{res.detail}, significant at this look's {at}")

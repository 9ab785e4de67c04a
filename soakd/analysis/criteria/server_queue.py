"""A served model's own request queue (vLLM / SGLang metrics): no rising trend.

A host contended by other processes is never blamed on the model: when the queue FAILs,
the scrapes taken while the host was contended (soakd.analysis.contention: the server could
not run) are set aside and each failing metric's trend is judged on the rest. A rise among
those still FAILs; when only the contended scrapes rise, the criterion is INVALID ("the host
was contended"), never PASS.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from soakd.analysis import contention as host
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
    res = CriterionResult(
        criterion=server.QUEUE,
        title=server.QUEUE_TITLE,
        status=call.status,
        value=tr.slope * 60,
        threshold=q.threshold,
        unit=q.unit,
        detail=_queue_detail(ctx, q, call, tr),
        evidence=ev,
    )
    if res.status == FAIL:
        return [_against_host(ctx, res, [x for x, cl, _ in calls if cl.status == FAIL], w)]
    return [res]


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


def _against_host(
    ctx: Context, res: CriterionResult, failing: list[server.QueueSeries], w: float
) -> CriterionResult:
    """A server_queue FAIL against the host: for each ``failing`` metric, the scrapes taken
    while the host was contended (the tick covering the scrape: ``contention.during``) are
    set aside and its trend is judged on the rest, on the same windows. One that still
    rises FAILs (the detail counts the scrapes set aside); none: INVALID, with the figures.
    The FAIL stands for a metric whose scrapes no host tick covers (an older soakd)."""
    pct = ctx.crit.contended_cpu_pct
    rows: dict[str, Any] = {}
    for q in failing:
        h = host.during(ctx.data, q.t, q.t, pct)
        if h is None or not h.busy.any():
            return res
        rows[q.metric] = _quiet_trend(ctx, q, h.quiet, w) | {
            "scrapes_contended": int(h.busy.sum()),
            "scrapes_quiet": int(h.quiet.sum()),
            "others_contended_pct": h.median(h.busy),
        }
    res.evidence["contention"] = {"contended_cpu_pct": pct, "metrics": rows}
    rising = [f"{m} {r['quiet_slope_per_min']:+.3g}/min" for m, r in rows.items()
              if r["quiet_fails"]]  # fmt: skip
    n = sum(r["scrapes_contended"] for r in rows.values())
    if rising:
        res.detail += (
            f"; {n} scrape(s) taken while other processes held >= {pct:g} % of the CPUs, "
            f"the others rise alone ({', '.join(rising)})"
        )
        return res
    res.status, res.detail = INVALID, f"{_contended_detail(pct, rows)}; {res.detail}"
    return res


def _quiet_trend(ctx: Context, q: server.QueueSeries, keep: np.ndarray, w: float) -> dict[str, Any]:
    """The queue rule on the scrapes of ``keep`` alone: their slope, p and whether they
    fail it (too few to test: they do not)."""
    c = ctx.crit
    win = stats.window_reduce(q.t[keep], q.y[keep], w, t0=ctx.t0, t1=ctx.t1)
    has = win.nonempty()
    tr = stats.trend(win.t[has], win.median[has], c.alpha)
    call = call_trend(tr, win.t[has], win.median[has], c.alpha, q.threshold / 60)
    return {"quiet_slope_per_min": tr.slope * 60, "quiet_p_value": tr.p,
            "quiet_fails": call.status == FAIL}  # fmt: skip


def _contended_detail(pct: float, rows: dict[str, Any]) -> str:
    """Why a rising server queue is INVALID: the scrapes set aside, the rest's slopes."""
    parts = [
        f"{m}: {r['scrapes_contended']} scrape(s) set aside"
        + (f" (median {med:.0f} %)" if (med := r["others_contended_pct"]) is not None else "")
        + f", the {r['scrapes_quiet']} outside it slope {r['quiet_slope_per_min']:+.3g}/min"
        f" (p = {r['quiet_p_value']:.2g})"
        for m, r in rows.items()
    ]
    return (
        f"the host was contended: the queue rose only while other processes held >= {pct:g} "
        f"% of the CPUs (the server could not run): {'; '.join(parts)}: soak on a quiet host "
        "or pin CPUs"
    )


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return judge_server_queue(ctx)


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """The server's queue (or KV-cache use) rising significantly above its tolerance at
    this look's share of alpha (``criteria.base.look_alpha``), by the verdict's own rule
    (``judge_server_queue``) on the metrics scraped so far; never for an in-process model
    (no ``live.server`` rows). Nor once a tick since the warm-up saw the host contended
    (``contention.withholds_looks``): the verdict sets the scrapes taken then aside
    (``_against_host``), a look cannot, so the run goes on and the verdict decides."""
    if host.withholds_looks(live.contended_ticks):
        return None
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

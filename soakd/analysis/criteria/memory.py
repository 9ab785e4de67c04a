"""Memory floors: the Theil–Sen slope of each metric's window minima (RSS, GPU, the torch
allocator's reserved, a served model's server) under ``max_memory_growth_mb_per_min``; an
allocator sawtooth returning to the same floor is not a leak.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from soakd.analysis import server, stats
from soakd.analysis.criteria.base import (
    Context,
    EarlyFail,
    Live,
    call_trend,
    detectability,
    look_window,
    not_significant,
    span_to_test,
    trend_fields,
    undecided_trend,
    untested,
)
from soakd.analysis.data import make_run_data
from soakd.analysis.model import (
    FAIL,
    FLOOR_SLACK,
    INVALID,
    MEMORY_METRICS,
    MIB,
    MIN_WINDOWS,
    PASS,
    CriterionResult,
    RunMeta,
    floor_window_s,
)
from soakd.config import CriteriaSettings


def sawtooth(t: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Sharp drops in a memory series: count, and their typical size in MiB."""
    if y.size < 3:
        return {"drops": 0}
    dy = np.diff(y)
    rng = float(np.nanmax(y) - np.nanmin(y))
    if rng <= 0:
        return {"drops": 0}
    sharp = dy < -0.25 * rng
    n = int(sharp.sum())
    out: dict[str, Any] = {"drops": n}
    if n:
        out["drop_mb_median"] = float(np.median(-dy[sharp]) / MIB)
        out["drop_t"] = [float(v) for v in t[1:][sharp][:50]]
    return out


def judge_memory(ctx: Context) -> list[CriterionResult]:
    d, c = ctx.data, ctx.crit
    st = d.samples["t"]
    post = st >= ctx.t0
    thr = c.max_memory_growth_mb_per_min
    w, short_note = floor_window_s(ctx.span, c.floor_window_s)
    out: list[CriterionResult] = []
    gpu_any = any(np.isfinite(d.sample(col)[post]).any() for _, col, _ in MEMORY_METRICS[1:])
    for name, col, title in MEMORY_METRICS:
        y = d.sample(col)[post]
        t = st[post]
        ok = np.isfinite(y)
        if not ok.any():
            out.append(_memory_missing(ctx, name, col, title, thr, gpu_any))
            continue
        res = judge_memory_metric(ctx, name, title, t[ok], y[ok], w)
        if short_note:
            res.warnings.insert(0, short_note)
        out.append(res)
    if server.is_served(d.meta):
        out += judge_server_memory(ctx, w, gpu_any)
    return out


def judge_memory_metric(
    ctx: Context, name: str, title: str, t: np.ndarray, y: np.ndarray, w: float
) -> CriterionResult:
    """One memory metric: the Theil–Sen slope of its window floors, in MB/min."""
    c = ctx.crit
    thr = c.max_memory_growth_mb_per_min
    win = stats.window_reduce(t, y, w, t0=ctx.t0, t1=ctx.t1, medians=False)
    ctx.series[name] = win
    has = win.nonempty()
    tr = stats.trend(win.t[has], win.floor[has], c.alpha)
    ctx.trends[name] = tr
    per = 60.0 / MIB
    slope = tr.slope * per
    call = call_trend(tr, win.t[has], win.floor[has], c.alpha, thr / per)
    floors = win.floor[has]
    ev: dict[str, Any] = {
        "floor_window_s": w,
        "first_floor_mb": float(floors[0] / MIB),
        "last_floor_mb": float(floors[-1] / MIB),
        "peak_mb": float(y.max() / MIB),
        "sawtooth": ctx.digest.sawtooth[name]
        if ctx.digest and name in ctx.digest.sawtooth
        else sawtooth(t, y),
        "decided_by": call.how,
        **trend_fields(tr, per),
    }
    if call.bound is not None:
        ev["bound_slope"] = call.bound * per
    if call.how == "rising":
        detail = f"floor rising {slope:.3g} MB/min (p = {tr.p:.2g})"
    elif call.how == "untested":
        need = span_to_test(ctx, tr, c.floor_window_s, MIN_WINDOWS)
        ev["min_span_to_test_s"] = need
        detail = untested(ctx, tr, "leaks", need)
    elif call.how == "bounded":
        detail = (
            f"too few windows for a trend test, but the floors' range allows at most "
            f"{call.bound * per:.3g} MB/min, peak {ev['peak_mb']:.0f} MB"  # type: ignore[operator]
        )
    else:
        detail = (
            f"floor slope {slope:+.3g} MB/min (p = {tr.p:.2g}), peak {ev['peak_mb']:.0f} MB"
            + not_significant(ctx, tr, per, thr, "MB/min")
        )
    status = call.status
    if status == PASS and w < c.floor_window_s * (1 - FLOOR_SLACK):
        status, detail = INVALID, _floor_too_short(ctx, w)
    open_ = undecided_trend(ctx, call, tr, per, thr, "MB/min") if status == PASS else None
    if open_:
        status, detail = INVALID, open_
    return CriterionResult(
        criterion=name,
        title=title,
        status=status,
        value=slope,
        threshold=thr,
        unit="MB/min",
        detail=detail,
        evidence=ev,
        warnings=detectability(ctx, tr, per, thr, "leaks", "MB/min"),
    )


def _floor_too_short(ctx: Context, w: float) -> str:
    """Why a memory metric that looked flat is INVALID: its floor window had to be shortened
    below ``floor_window_s``, so an allocator sawtooth slower than that can hide growth."""
    need = MIN_WINDOWS * ctx.crit.floor_window_s
    return (
        f"too short to judge: the floor window was shortened from "
        f"{ctx.crit.floor_window_s:g} s to {w:.2g} s, where an allocator sawtooth can hide "
        f"growth; run at least {math.ceil(need)} s after the warm-up "
        f"(run.duration >= {math.ceil(ctx.t0 + need)} s) or lower criteria.floor_window_s"
    )


def judge_server_memory(ctx: Context, w: float, gpu_any: bool) -> list[CriterionResult]:
    """A served model's server: its RSS and GPU memory, by the rule of soakd's own, per
    server lifetime when the server was replaced or lost (soakd.analysis.server)."""
    d, thr = ctx.data, ctx.crit.max_memory_growth_mb_per_min
    lives = server.lifetimes(d.events)
    missing = server.changes_unloaded(d)
    st = d.samples["t"]
    post = st >= ctx.t0
    out = []
    for name, col, title in server.SERVER_MEMORY_METRICS:
        y = d.sample(col)
        ok = post & np.isfinite(y)
        if not ok.any():
            out.append(server.memory_missing(d.meta, name, title, thr, gpu_any))
        elif missing:
            out.append(server.unloaded_changes(name, title, thr, missing))
        elif len(lives) == 1 and not lives[0].ended:  # one server from start to end
            out.append(judge_memory_metric(ctx, name, title, st[ok], y[ok], w))
        else:
            out.append(_judge_lifetimes(ctx, lives, name, title, st, y, ok))
    return out


def _judge_lifetimes(
    ctx: Context,
    lives: list[server.Lifetime],
    name: str,
    title: str,
    t: np.ndarray,
    y: np.ndarray,
    ok: np.ndarray,
) -> CriterionResult:
    """A server memory criterion over the server's lifetimes, each judged alone in its own
    window (server.combine_lifetimes decides); the plots and the headroom get the deciding
    lifetime's floors and trend, or none."""
    judged, kept = [], []
    for life in lives:
        res, long = _judge_lifetime(ctx, life, name, title, t, y, ok)
        judged.append((life, res, long))
        kept.append((ctx.series.pop(name, None), ctx.trends.pop(name, None)))
    res, by = server.combine_lifetimes(name, title, ctx.crit.max_memory_growth_mb_per_min, judged)
    win, tr = kept[by] if by is not None else (None, None)
    if win is not None and tr is not None:
        ctx.series[name], ctx.trends[name] = win, tr
    return res


def _judge_lifetime(
    ctx: Context,
    life: server.Lifetime,
    name: str,
    title: str,
    t: np.ndarray,
    y: np.ndarray,
    ok: np.ndarray,
) -> tuple[CriterionResult | None, bool]:
    """One server lifetime's memory judged alone in its own window (its own floor window);
    None when it has under 3 samples there; and whether it was long enough to judge."""
    span = life.window(ctx.t0, ctx.t1)
    if span is None:
        return None, False
    mine = ok & (t >= span[0]) & (t < span[1])
    if mine.sum() < 3:
        return None, False
    sub = replace(ctx, t0=span[0], t1=span[1])
    w, _note = floor_window_s(sub.span, ctx.crit.floor_window_s)
    long = w >= ctx.crit.floor_window_s * (1 - FLOOR_SLACK)
    return judge_memory_metric(sub, name, title, t[mine], y[mine], w), long


def _memory_missing(
    ctx: Context, name: str, col: str, title: str, thr: float, gpu_any: bool
) -> CriterionResult:
    d = ctx.data
    if name == "memory_rss":
        return CriterionResult.invalid(
            name, title, threshold=thr, unit="MB/min", detail="no RSS samples after warm-up"
        )
    if d.meta.is_cuda and not gpu_any:
        return CriterionResult.invalid(
            name,
            title,
            threshold=thr,
            unit="MB/min",
            detail=f"CUDA workload ({d.meta.device}) without GPU memory samples",
        )
    why = "GPU not present or not visible" if not gpu_any else f"{col} not reported here"
    return CriterionResult.na(
        name, title, threshold=thr, unit="MB/min", detail=f"not applicable: {why}"
    )


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return judge_memory(ctx)


#: floor windows between two looks at the memory floors while a run goes (each look spends
#: alpha; 20 s apart at the default 4 s window)
LOOK_EVERY_WINDOWS = 5


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """A memory floor rising significantly above the tolerance at this look's share of
    alpha: a spending function over the planned run (``criteria.base.look_alpha``), so
    that all the looks together risk a false early stop of at most alpha, by the same rule
    (``judge_memory_metric``) on the samples so far: soakd's own (RSS, GPU, torch) and a
    served model's server (``memory_server_rss``, ``memory_server_gpu``), each only when
    sampled."""
    alpha = live.look("memory", LOOK_EVERY_WINDOWS * crit.floor_window_s, crit.alpha)
    if alpha is None or live.t0 is None:
        return None
    samples = live.samples_now()
    if len(samples.get("t", ())) < 3:
        return None
    data = make_run_data(RunMeta("live", fps=live.fps), samples=samples)
    none = np.zeros(0, dtype=bool)
    span = max(live.now - live.t0, 0.0)
    window = look_window(span, crit.floor_window_s)  # a bounded test, however long the run
    look = crit.model_copy(update={"alpha": alpha, "floor_window_s": window})
    ctx = Context(data, look, live.t0, live.now, none, none, {}, {})
    w, _note = floor_window_s(ctx.span, window)
    for name, col, title in (*MEMORY_METRICS, *server.SERVER_MEMORY_METRICS):
        t, y = data.samples["t"], data.sample(col)
        ok = np.isfinite(y)
        if ok.sum() < 3:
            continue
        res = judge_memory_metric(ctx, name, title, t[ok], y[ok], w)
        if res.status == FAIL:
            at = f"alpha {alpha:.2g} at {live.fraction:.0%} of the run"
            return EarlyFail(name, f"{res.detail}, significant at this look's {at}")
    return None

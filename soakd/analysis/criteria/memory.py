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
    TrendCall,
    call_trend,
    detectability,
    look_window,
    not_significant,
    span_to_test,
    too_few,
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
    """One memory metric: the Theil–Sen slope of its window floors, in MB/min, and the
    shape of its growth (``_shape``): a rise that stopped is bounded growth, not a leak."""
    c = ctx.crit
    thr = c.max_memory_growth_mb_per_min
    win = stats.window_reduce(t, y, w, t0=ctx.t0, t1=ctx.t1, medians=False)
    ctx.series[name] = win
    has = win.nonempty()
    tr = stats.trend(win.t[has], win.floor[has], c.alpha)
    ctx.trends[name] = tr
    per = 60.0 / MIB
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
        "shape": "rising" if call.how == "rising" else "level",
        **trend_fields(tr, per),
    }
    if call.bound is not None:
        ev["bound_slope"] = call.bound * per
    status, detail, call, judged = _shape(ctx, tr, call, win.t[has], floors, ev)
    decided = status in (PASS, FAIL) or call.how == "undecided"
    if decided and w < c.floor_window_s * (1 - FLOOR_SLACK):
        # shortened windows: a sawtooth slower than them can hide growth or read as it
        status, detail = INVALID, _floor_too_short(ctx, w)
    open_ = undecided_trend(ctx, call, judged, per, thr, "MB/min") if status == PASS else None
    if open_:
        status, detail = INVALID, open_
    warnings = [] if status == FAIL else detectability(ctx, judged, per, thr, "leaks", "MB/min")
    if status != FAIL:
        warnings += certain_growth(ctx, name, judged, per, thr)
    return CriterionResult(
        criterion=name,
        title=title,
        status=status,
        value=judged.slope * per,  # the slope the status rests on (a tail's, after a bend)
        threshold=thr,
        unit="MB/min",
        detail=detail,
        evidence=ev,
        warnings=warnings,
    )


def _shape(
    ctx: Context,
    tr: stats.Trend,
    call: TrendCall,
    t: np.ndarray,
    floors: np.ndarray,
    ev: dict[str, Any],
) -> tuple[str, str, TrendCall, stats.Trend]:
    """Status and detail of the floors by the shape of their growth, the call and the trend
    (the whole window's, or the level tail's after a rise that stopped) they rest on:

    * growth over the tolerance (or untested) that bends into a level tail is bounded: PASS
      when the tail shows it stays level, else INVALID "still settling", never a leak;
      growth under it that rose 1 MB or more and then shows a level tail is told the same
      way (its tail, not the whole window, is the slope that goes on);
    * growth over the tolerance that goes on, or a tail (after the bend, or the last half)
      rising over it, FAILs;
    * a slope over the tolerance the test could not confirm, the whole window's or its last
      half's, is INVALID "undecided", never PASS;
    * otherwise the whole window's trend decides, as before."""
    c, per = ctx.crit, 60.0 / MIB
    thr = c.max_memory_growth_mb_per_min
    slope = tr.slope * per
    # growth over the tolerance, or growth the test could not judge: did it stop?
    over = call.how in ("rising", "untested") or slope > thr
    settle = (
        stats.settling(t, floors, c.alpha, thr / per, min_points=MIN_WINDOWS // 2)
        if over or (tr.p < c.alpha and slope > 0)
        else None
    )
    if settle is not None and settle.level and (over or (settle.shown and settle.rise >= MIB)):
        status, detail = _settled(ctx, settle, ev, per, thr)
        how = "trend" if status == PASS else "settling"
        return status, detail, TrendCall(status, how), settle.tail
    if call.how == "rising":
        since = (
            f" (and {settle.tail.slope * per:.3g} MB/min after t = {settle.t:.0f} s)"
            if settle
            else ""
        )
        detail = f"floor rising {slope:.3g} MB/min (p = {tr.p:.2g}){since}: growth that goes on"
        return FAIL, detail, call, tr
    late = (
        (settle.t, settle.tail)
        if settle is not None and settle.tail.rising(c.alpha, thr / per)
        else _late_growth(t, floors, c.alpha, thr / per)
    )
    if late is not None:
        ev.update(shape="rising late", decided_by="rising late", late=trend_fields(late[1], per))
        detail = (
            f"floor rising {late[1].slope * per:.3g} MB/min since t = {late[0]:.0f} s (p = "
            f"{late[1].p:.2g}; {slope:+.3g} MB/min over the whole window): growth that "
            f"started late and goes on"
        )
        return FAIL, detail, TrendCall(FAIL, "rising"), late[1]
    return _not_rising(ctx, tr, call, t, floors, ev)


def _not_rising(
    ctx: Context,
    tr: stats.Trend,
    call: TrendCall,
    t: np.ndarray,
    floors: np.ndarray,
    ev: dict[str, Any],
) -> tuple[str, str, TrendCall, stats.Trend]:
    """``_shape`` of floors that neither settled nor rose for certain: INVALID untested or
    undecided (a slope over the tolerance, the whole window's or its last half's, that the
    test could not confirm), else PASS (tested, or bounded by the floors' range)."""
    c, per = ctx.crit, 60.0 / MIB
    thr = c.max_memory_growth_mb_per_min
    slope = tr.slope * per
    if call.how == "untested":
        need = span_to_test(ctx, tr, c.floor_window_s, MIN_WINDOWS)
        ev["min_span_to_test_s"] = need
        return INVALID, untested(ctx, tr, "leaks", need), call, tr
    if call.how == "bounded":
        detail = (
            f"{too_few(tr, ctx.crit.alpha)}, but the floors' range allows at most "
            f"{call.bound * per:.3g} MB/min, peak {ev['peak_mb']:.0f} MB"  # type: ignore[operator]
        )
        return PASS, detail, call, tr
    detail = (
        f"floor slope {slope:+.3g} MB/min (p = {tr.p:.2g}), peak {ev['peak_mb']:.0f} MB"
        + not_significant(ctx, tr, per, thr, "MB/min")
    )
    if call.how == "undecided":  # growth over the tolerance the test could not confirm
        return INVALID, f"undecided: {detail}", call, tr
    half = _last_half(t, floors, c.alpha)
    if half is not None and half[1].slope * per > thr:  # a late rise it could not confirm
        ev.update(decided_by="undecided", late=trend_fields(half[1], per))
        detail = (
            f"undecided: floor slope {half[1].slope * per:+.3g} MB/min since t = "
            f"{half[0]:.0f} s (p = {half[1].p:.2g}; {slope:+.3g} MB/min over the whole "
            f"window), above {thr:g} MB/min but not significant at alpha = {c.alpha:g} / 2: "
            f"a longer run would decide it"
        )
        return INVALID, detail, TrendCall(INVALID, "undecided"), half[1]
    return PASS, detail, call, tr


def _late_growth(
    t: np.ndarray, y: np.ndarray, alpha: float, tol: float
) -> tuple[float, stats.Trend] | None:
    """A leak that started late: the last half of the floors rising over ``tol`` at
    alpha / 2 (one fixed split, chosen before looking, so the whole window's test and this
    one together spend at most 1.5 alpha on a flat floor). (start time, trend) or None."""
    late = _last_half(t, y, alpha)
    return late if late is not None and late[1].rising(alpha / 2, tol) else None


def _last_half(t: np.ndarray, y: np.ndarray, alpha: float) -> tuple[float, stats.Trend] | None:
    """The trend of the last half of the floors at alpha / 2, with its start time; None
    when that half has too few windows for a test."""
    h = y.size // 2
    if y.size - h < stats.min_trend_points(alpha / 2):
        return None
    return float(t[h]), stats.trend(t[h:], y[h:], alpha / 2)


def _settled(
    ctx: Context, s: stats.Settling, ev: dict[str, Any], per: float, thr: float
) -> tuple[str, str]:
    """A floor whose rise stopped at ``s.t``: PASS when the tail after it shows it stays
    level (its slope's upper bound under the tolerance), else INVALID "still settling"
    with how long the run would need. Never FAIL "a leak": the growth was bounded."""
    tail_s = float(ctx.t1 - s.t)
    ev.update(
        shape="bounded",
        decided_by="settled" if s.shown else "settling",
        settled={
            "at_s": s.t,
            "rise_mb": s.rise / MIB,
            "tail_s": tail_s,
            "upper_slope": s.upper * per,
            **trend_fields(s.tail, per),
        },
    )
    what = f"bounded growth of {s.rise / MIB:.3g} MB that stopped at t = {s.t:.0f} s"
    tail_slope = s.tail.slope * per
    if s.shown:
        return PASS, (
            f"{what}: the floor stays level after it ({tail_slope:+.3g} MB/min over "
            f"{tail_s:.0f} s, at most {s.upper * per:.3g} MB/min at alpha = "
            f"{ctx.crit.alpha:g}), peak {ev['peak_mb']:.0f} MB"
        )
    need = _settle_span(s, tail_s, per, thr)
    more = f"; about {need:.0f} s of level floor would show it" if math.isfinite(need) else ""
    return INVALID, (
        f"still settling: {what}, but the {tail_s:.0f} s after it cannot yet show that the "
        f"floor stays level (it allows up to {s.upper * per:.3g} MB/min, tolerance "
        f"{thr:g} MB/min){more}"
    )


def _settle_span(s: stats.Settling, tail_s: float, per: float, thr: float) -> float:
    """About how long a level tail must be for its slope's upper bound to fall under the
    tolerance: the bound's margin over the slope falls as span^-1.5 (evenly spaced
    windows of the same noise)."""
    slope, upper = s.tail.slope * per, s.upper * per
    if not (math.isfinite(upper) and thr > slope and upper > slope and tail_s > 0):
        return math.inf
    return tail_s * ((upper - slope) / (thr - slope)) ** (2 / 3)


WEEK_S = 7 * 86_400.0


def size_mb(mb: float) -> str:
    """A memory size for a reader: "907 MB", "6.2 GB" (MB = 2^20 bytes, GB = 2^30)."""
    return f"{mb / 1024:.3g} GB" if abs(mb) >= 1024 else f"{mb:.3g} MB"


def projection(mb_per_min: float, horizon_s: float) -> str:
    """What a growth rate adds up to: "0.9 GB a day, 6.2 GB a week", and over the horizon
    when that is not a week."""
    words = f"{size_mb(mb_per_min * 1440)} a day, {size_mb(mb_per_min * 10_080)} a week"
    if abs(horizon_s - WEEK_S) > 1:
        hours = horizon_s / 3600
        words += f", {size_mb(mb_per_min * horizon_s / 60)} over criteria.horizon ({hours:.3g} h)"
    return words


def certain_growth(ctx: Context, name: str, tr: stats.Trend, per: float, thr: float) -> list[str]:
    """A warning for a floor that grows for certain (significant at alpha) though under the
    tolerance: passing under it is the contract, silence about it is not."""
    slope = tr.slope * per
    if not (tr.p < ctx.crit.alpha and slope > 0):
        return []
    return [
        f"{name}: the floor grows {slope:.3g} MB/min for certain (p = {tr.p:.2g}), under "
        f"the tolerance {thr:g} MB/min: {projection(slope, ctx.crit.horizon)}"
    ]


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
    """One server lifetime's memory judged alone in its own window (its own floor window,
    after a warm-up as long as the run's, ``ctx.t0``, when it took over mid-run); None when
    it has under 3 samples there; and whether it was long enough to judge."""
    span = life.window(ctx.t0, ctx.t1, warmup_s=max(ctx.t0, 0.0))
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
    mine = [(live.t0, live.now)]
    servers = live.server_spans()
    for name, col, title in (*MEMORY_METRICS, *server.SERVER_MEMORY_METRICS):
        t, y = data.samples["t"], data.sample(col)
        # a served model's server: each of its processes alone, as the verdict judges them
        for t0, t1 in servers if col.startswith("server_") else mine:
            ctx = Context(data, look, t0, t1, none, none, {}, {})
            w, _note = floor_window_s(ctx.span, window)
            ok = np.isfinite(y) & (t >= t0) & (t < t1)
            if ok.sum() < 3:
                continue
            res = judge_memory_metric(ctx, name, title, t[ok], y[ok], w)
            if res.status == FAIL:
                at = f"alpha {alpha:.2g} at {live.fraction:.0%} of the run"
                return EarlyFail(name, f"{res.detail}, significant at this look's {at}")
    return None

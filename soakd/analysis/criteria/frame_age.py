"""Frame age (capture to result): its p95 under a ceiling and no rising trend; a queue backlog
(``consume = "oldest"``) named as the cause when it grows; a generator's output intervals.

A host contended by other processes is never blamed on the model: when frame age FAILs, the
frames captured while the host was contended (soakd.analysis.contention) are set aside and
the rule judges the rest. A rise, a p95 or a backlog among those still FAILs; when only the
contended frames fail it, the criterion is INVALID ("the host was contended"), never PASS.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from soakd.analysis import contention as host
from soakd.analysis import stats
from soakd.analysis.criteria.base import (
    Context,
    EarlyFail,
    Live,
    TrendCall,
    call_trend,
    detectability,
    generator_intervals,
    not_significant,
    span_to_test,
    thin,
    too_few,
    trend_fields,
    undecided_trend,
    untested,
)
from soakd.analysis.digest import FrameDigest
from soakd.analysis.model import FAIL, INVALID, PASS, CriterionResult, age_window_s
from soakd.config import CriteriaSettings


def _age_series(ctx: Context) -> tuple[str, str, str, np.ndarray, np.ndarray]:
    """(criterion, title, what, t, y) of the age criterion: frame age on the dispatch axis,
    or a generator's output intervals."""
    d = ctx.data
    if d.meta.generates:
        t, y = generator_intervals(d, ctx.t0)
        return "interval", "Stable output interval", "interval growth", t, y
    # on the dispatch axis: a backlog's frames are dispatched (and aged) late
    y = d.frame("frame_age_ms")[ctx.measured]
    t = d.frames["t_capture"][ctx.measured] + y / 1000.0  # age = dispatch - capture
    return "frame_age", "Stable frame age", "frame-age growth", t, y


def _first_emit_evidence(ctx: Context) -> dict[str, float]:
    fe = ctx.data.frame("first_emit_ms")[ctx.measured]
    fe = fe[np.isfinite(fe)]
    if not fe.size:
        return {}
    return {"first_emit_ms_median": float(np.median(fe)), "first_emit_ms_max": float(fe.max())}


def _backlog(
    ctx: Context, t: np.ndarray, w: float, keep: np.ndarray | None = None
) -> dict[str, Any] | None:
    """With ``consume = "oldest"``: the trend of the queue length (window medians on the
    dispatch axis, plus the frames still queued at the end) and the frame-age slope it
    implies (frames per second x the frame period). A growing backlog keeps aging frames
    that are never dispatched, so measured frame age alone would understate it. ``keep``:
    the measured frames to read (default all)."""
    d = ctx.data
    fps = d.meta.fps
    if d.meta.setting("run", "consume") != "oldest" or not fps:
        return None
    q = d.frame("queue_len")[ctx.measured]
    ok = np.isfinite(q) & np.isfinite(t)
    if keep is not None:
        ok &= keep
    if not ok.any():
        return None
    return _backlog_trend(ctx, stats.window_reduce(t[ok], q[ok], w, t0=ctx.t0, t1=ctx.t1))


def _backlog_trend(ctx: Context, win: stats.Windows) -> dict[str, Any] | None:
    """The backlog evidence from the queue length's windows (see ``_backlog``)."""
    fps = ctx.data.meta.fps
    if not fps:
        return None
    has = win.nonempty()
    wt, wq = win.t[has], win.median[has]
    queued = ctx.data.meta.counter("queued_at_end")
    if queued is not None:
        wt, wq = np.append(wt, ctx.t1), np.append(wq, queued)
    tr = stats.trend(wt, wq, ctx.crit.alpha)
    ms_per_frame = 1000.0 / fps
    return {
        "queue_slope_per_min": tr.slope * 60,
        "queue_p_value": tr.p,
        "queued_at_end": queued,
        "implied_age_slope_ms_per_min": tr.slope * 60 * ms_per_frame,
        "growing": tr.rising(ctx.crit.alpha, ctx.crit.max_age_slope_ms_per_min / 60 / ms_per_frame),
    }


def _age_problems(
    ctx: Context, call: TrendCall, tr: stats.Trend, p95: float, backlog: dict[str, Any] | None
) -> list[str]:
    c = ctx.crit
    problems = []
    if call.how == "rising":
        problems.append(f"rising {tr.slope * 60:.3g} ms/min (p = {tr.p:.2g})")
    if backlog and backlog["growing"]:
        end = backlog["queued_at_end"]
        problems.append(
            f"backlog growing {backlog['queue_slope_per_min']:.3g} frames/min "
            f"(~{backlog['implied_age_slope_ms_per_min']:.3g} ms/min of frame age"
            + (f", {end:.0f} frames still queued at the end" if end else "")
            + ")"
        )
    if c.max_age_p95_ms is not None and p95 > c.max_age_p95_ms:
        problems.append(f"p95 {p95:.4g} ms over {c.max_age_p95_ms:g} ms")
    return problems


def _age_outcome(
    ctx: Context,
    call: TrendCall,
    tr: stats.Trend,
    problems: list[str],
    what: str,
    rate: float | None,
    ev: dict[str, Any],
) -> tuple[str, str]:
    """(status, detail) of the age criterion: FAIL on any problem, else as the trend was
    decided (an untested one records the run length that would test it in ``ev``)."""
    med = ev["median_ms"]
    if problems:
        return FAIL, "; ".join(problems)
    if call.how == "untested":
        need = span_to_test(ctx, tr, age_window_s(0.0, rate))
        ev["min_span_to_test_s"] = need
        return INVALID, untested(ctx, tr, what, need)
    open_ = undecided_trend(ctx, call, tr, 60.0, ctx.crit.max_age_slope_ms_per_min, "ms/min")
    if open_:
        return INVALID, open_
    if call.how == "bounded" and call.bound is not None:
        return PASS, (
            f"median {med:.4g} ms; {too_few(tr, ctx.crit.alpha)}, but their range allows "
            f"at most {call.bound * 60:.3g} ms/min"
        )
    tol = ctx.crit.max_age_slope_ms_per_min
    detail = (
        f"median {med:.4g} ms, slope {tr.slope * 60:+.3g} ms/min (p = {tr.p:.2g})"
        + not_significant(ctx, tr, 60, tol, "ms/min")
    )
    # a rise over the tolerance the test could not confirm: never a PASS
    return (INVALID, f"undecided: {detail}") if call.how == "undecided" else (PASS, detail)


def judge_frame_age(ctx: Context) -> CriterionResult:
    d, c, dg = ctx.data, ctx.crit, ctx.digest
    generator = d.meta.generates
    thr = c.max_age_slope_ms_per_min
    if dg:
        return _age_streamed(ctx, dg)
    name, title, what, t, y = _age_series(ctx)
    ok = np.isfinite(y)
    if not ok.any():
        return CriterionResult.invalid(
            name,
            title,
            threshold=thr,
            unit="ms/min",
            detail=f"no {'intervals' if generator else 'frame ages'} measured",
        )
    backlog = None if generator else _backlog(ctx, t, age_window_s(ctx.span, d.meta.fps))
    t_all, y_all = t, y
    t, y = t[ok], y[ok]
    # windows hold ~10 values: of frames for frame age, of intervals for a generator (many
    # intervals per request, so the request rate would make the windows far too long)
    rate = y.size / ctx.span if generator and ctx.span > 0 else d.meta.fps
    w = age_window_s(ctx.span, rate)
    win = stats.window_reduce(t, y, w, t0=ctx.t0, t1=ctx.t1)
    levels = (float(np.median(y)), float(np.percentile(y, 95)), float(y.max()))
    res = age_result(ctx, (name, title, what), win, levels, backlog, rate)
    if res.status == FAIL and not generator:
        return _against_host(ctx, res, t_all, y_all, w)
    return res


def _quiet_fails(
    ctx: Context, t: np.ndarray, y: np.ndarray, w: float, keep: np.ndarray
) -> tuple[list[str], dict[str, Any]]:
    """The rule on the frames of ``keep`` alone (``t``, ``y``: every measured frame's
    dispatch time and age): its problems (none: they pass) and their figures."""
    ok = keep & np.isfinite(y)
    if not ok.any():
        return [], {}
    c = ctx.crit
    win = stats.window_reduce(t[ok], y[ok], w, t0=ctx.t0, t1=ctx.t1)
    has = win.nonempty()
    tr = stats.trend(win.t[has], win.median[has], c.alpha)
    call = call_trend(tr, win.t[has], win.median[has], c.alpha, c.max_age_slope_ms_per_min / 60)
    med, p95 = float(np.median(y[ok])), float(np.percentile(y[ok], 95))
    problems = _age_problems(ctx, call, tr, p95, _backlog(ctx, t, w, keep))
    return problems, {"quiet_median_ms": med, "quiet_p95_ms": p95,
                      "quiet_slope_ms_per_min": tr.slope * 60, "quiet_p_value": tr.p}  # fmt: skip


def _against_host(
    ctx: Context, res: CriterionResult, t: np.ndarray, y: np.ndarray, w: float
) -> CriterionResult:
    """A frame-age FAIL against the host (``t``, ``y``: every measured frame's dispatch time
    and age, so it waited from ``t - y`` to ``t``): the frames that waited while the host
    was contended, or that queued behind such a frame (a backlog draining after the host
    went quiet: ``contention.waited``), are set aside and the rule judges the rest. Their
    problems still FAIL (the detail counts the contended frames); none: INVALID, with the
    figures. A model whose median frame does not fit the frame period is not excused
    (``outpaced``)."""
    c = ctx.crit
    if host.outpaced(ctx.data, ctx.measured):
        return res  # the rate, not the host, ages the frames: a backlog on any host
    ok = np.isfinite(y)
    stream = ctx.data.frame("stream")[ctx.measured][ok]
    h = host.waited(ctx.data, (t - y / 1e3)[ok], t[ok], stream, c.contended_cpu_pct)
    if h is None or not h.busy.any():
        return res
    quiet = ok.copy()
    quiet[ok] = h.quiet
    problems, figures = _quiet_fails(ctx, t, y, w, quiet)
    p95, limit = res.evidence["p95_ms"], c.max_age_p95_ms
    over_limit = limit is not None and p95 > limit
    cut = limit if over_limit and limit is not None else p95
    aged = y[ok] > cut
    n_aged, n_busy = int(aged.sum()), int((aged & h.busy).sum())
    cn: dict[str, Any] = {
        "contended_cpu_pct": c.contended_cpu_pct,
        "frames_contended": int(h.busy.sum()),
        # of them, those whose own wait was quiet: queued behind a contended frame
        "frames_behind": int((h.busy & ~host.contended(h.others, c.contended_cpu_pct)).sum()),
        "frames_quiet": int(quiet.sum()),
        "aged_over_ms": cut,
        "aged_over": "max_age_p95_ms" if over_limit else "p95",
        "aged": n_aged,
        "aged_contended": n_busy,
        "aged_contended_share": n_busy / n_aged if n_aged else None,
        "others_at_aged_pct": h.median(aged),
        "others_elsewhere_pct": h.median(~aged),
        "quiet_problems": problems,
        "quiet_fails": bool(problems),
        **figures,
    }
    res.evidence["contention"] = cn
    if problems:
        res.detail += (
            f"; {cn['frames_contended']} frame(s) waited while other processes held >= "
            f"{c.contended_cpu_pct:g} % of the CPUs, the others fail the rule alone "
            f"({'; '.join(problems)})"
        )
        return res
    res.status, res.detail = INVALID, f"{_contended_detail(cn)}; {res.detail}"
    return res


def _contended_detail(cn: dict[str, Any]) -> str:
    """Why a failing frame age is INVALID: the aged frames' share under contention, with
    the figures."""
    at, rest = cn["others_at_aged_pct"], cn["others_elsewhere_pct"]
    figures = f"median {at:.0f} % at them" if at is not None else ""
    if rest is not None:
        figures += f"{', ' if figures else ''}{rest:.0f} % at the other frames"
    over = "the p95 limit" if cn["aged_over"] == "max_age_p95_ms" else "the run's p95"
    share = cn["aged_contended_share"]
    quiet = (
        f"the {cn['frames_quiet']} frame(s) outside it pass (median "
        f"{cn['quiet_median_ms']:.4g} ms, p95 {cn['quiet_p95_ms']:.4g} ms, slope "
        f"{cn['quiet_slope_ms_per_min']:+.3g} ms/min)"
        if cn["frames_quiet"]
        else "no frame waited outside it"
    )
    behind = cn.get("frames_behind") or 0
    queued = (
        f" or queued behind frames that did ({behind} frame(s) waited out that backlog "
        "after the host went quiet)"
        if behind
        else ""
    )
    return (
        f"the host was contended: {share or 0:.0%} of the {cn['aged']} frame(s) older than "
        f"{cn['aged_over_ms']:.4g} ms ({over}) waited while other processes held >= "
        f"{cn['contended_cpu_pct']:g} % of the CPUs{queued} ({figures}); {quiet}: soak on a "
        "quiet host or pin CPUs"
    )


def _age_streamed(ctx: Context, dg: FrameDigest) -> CriterionResult:
    """The age criterion of a streamed run (frame age only: no generator on that path)."""
    q = dg.quantiles["frame_age_ms"]
    thr = ctx.crit.max_age_slope_ms_per_min
    words = ("frame_age", "Stable frame age", "frame-age growth")
    if not q.n:
        return CriterionResult.invalid(
            words[0], words[1], threshold=thr, unit="ms/min", detail="no frame ages measured"
        )
    queue = dg.backlog
    backlog = _backlog_trend(ctx, queue) if queue is not None and queue.count.any() else None
    levels = (q.median(), q.percentile(95.0), q.max)
    return age_result(ctx, words, dg.age, levels, backlog, ctx.data.meta.fps)


def age_result(
    ctx: Context,
    words: tuple[str, str, str],
    win: stats.Windows,
    levels: tuple[float, float, float],
    backlog: dict[str, Any] | None,
    rate: float | None,
) -> CriterionResult:
    """The age criterion from its windows and (median, p95, max) of its values."""
    c, generator = ctx.crit, ctx.data.meta.generates
    name, title, what = words
    thr = c.max_age_slope_ms_per_min
    ctx.series[name] = win
    has = win.nonempty()
    tr = stats.trend(win.t[has], win.median[has], c.alpha)
    ctx.trends[name] = tr
    call = call_trend(tr, win.t[has], win.median[has], c.alpha, thr / 60)
    med, p95, mx = levels
    ev: dict[str, Any] = {
        "median_ms": med,
        "p95_ms": p95,
        "max_ms": mx,
        "window_s": win.width_s,
        "decided_by": call.how,
        **trend_fields(tr, 60.0),
    }
    if call.bound is not None:
        ev["bound_slope"] = call.bound * 60
    if backlog:
        ev["backlog"] = backlog
    if generator:
        ev.update(_first_emit_evidence(ctx))
    if c.max_age_p95_ms is not None:
        ev["max_age_p95_ms"] = c.max_age_p95_ms
    problems = _age_problems(ctx, call, tr, p95, backlog)
    status, detail = _age_outcome(ctx, call, tr, problems, what, rate, ev)
    return CriterionResult(
        criterion=name,
        title=title,
        status=status,
        value=tr.slope * 60,
        threshold=thr,
        unit="ms/min",
        detail=detail,
        evidence=ev,
        warnings=detectability(ctx, tr, 60.0, thr, what, "ms/min"),
    )


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return [judge_frame_age(ctx)]


#: frame-age windows between two looks while a run goes (each look spends alpha)
LOOK_EVERY_WINDOWS = 5


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """Frame age rising significantly above ``max_age_slope_ms_per_min`` at this look's
    share of alpha (spent over the planned run, ``criteria.base.look_alpha``), tested as
    the verdict tests it (``call_trend``) on the medians of the windows closed so far: a
    backlog that keeps growing stops the run without waiting for its planned end. A
    generator's frames are judged on their output intervals, not on frame age: not asked.
    Nor once a tick since the warm-up saw the host contended (``contention.withholds_looks``):
    the verdict sets the frames that waited then aside (``_against_host``), a look cannot,
    so the run goes on and the verdict decides."""
    if live.generates or host.withholds_looks(live.contended_ticks):
        return None
    alpha = live.look("frame_age", LOOK_EVERY_WINDOWS * live.age_window_s, crit.alpha)
    if alpha is None:
        return None
    t, y = thin(*live.age_series())  # a bounded test, however long the run
    tol = crit.max_age_slope_ms_per_min
    tr = stats.trend(t, y, alpha)
    if call_trend(tr, t, y, alpha, tol / 60).how != "rising":
        return None
    at = f"alpha {alpha:.2g} at {live.fraction:.0%} of the run"
    return EarlyFail(
        "frame_age",
        f"rising {tr.slope * 60:.3g} ms/min over {tol:g} ms/min (p = {tr.p:.2g}), "
        f"significant at this look's {at}",
    )

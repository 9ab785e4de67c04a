"""Frames lost: every tick the target rate asked for that did not finish (``losses.py``), as a
fraction of the ticks with a Wilson bound, and the drop rate's trend over the run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from soakd.analysis import stats
from soakd.analysis.criteria.base import Context, EarlyFail, Live, trend_fields
from soakd.analysis.losses import count_losses
from soakd.analysis.model import FAIL, PASS, CriterionResult, RunData, age_window_s
from soakd.config import CriteriaSettings


def _loss_counters(
    d: RunData, post: np.ndarray
) -> tuple[np.ndarray, np.ndarray, tuple[float, ...], tuple[float, ...]]:
    """The cumulative per-row counters ``lost`` (all losses) and ``drop`` (queue drops), and
    per kind (queue drops, stale skips, drops inside a session model, whose own frame queue
    loses frames too) the count at the end of the warm-up and the count after it."""
    drop = np.nan_to_num(d.frame("drop_count"))
    stale = np.nan_to_num(d.frame("stale_count"))
    sess = np.fmax.accumulate(np.nan_to_num(d.frame("session_dropped")))
    pre = ~post
    base = tuple(float(a[pre].max()) if pre.any() else 0.0 for a in (drop, stale, sess))
    after = tuple(
        max(float(a[post].max()) - b, 0.0) for a, b in zip((drop, stale, sess), base, strict=True)
    )
    return drop + stale + sess, drop, base, after


def _loss_rates(
    ctx: Context,
    lost_cum: np.ndarray,
    drop: np.ndarray,
    w: float,
    prev_lost: float,
    prev_drop: float,
) -> stats.Windows:
    """Per-window loss rates of the post-warm-up rows: frames lost in a window over frames
    captured in it (rows + drops), from the cumulative counters ``lost_cum`` / ``drop``
    (``prev_*``: their values at the end of the warm-up). Floor, median and max all hold the
    rate."""
    t = ctx.data.frames["t_capture"][ctx.post]
    win = stats.window_reduce(t, lost_cum, w, t0=ctx.t0, t1=ctx.t1, medians=False)
    dwin = stats.window_reduce(t, drop, w, t0=ctx.t0, t1=ctx.t1, medians=False)
    return loss_rates(win.t, win.count, win.max, dwin.max, w, prev_lost, prev_drop)


def loss_rates(
    t: np.ndarray, count: np.ndarray, lost_max: np.ndarray, drop_max: np.ndarray, w: float,
    prev_lost: float, prev_drop: float,
) -> stats.Windows:  # fmt: skip
    """``_loss_rates`` from per-window row counts and largest running counters."""
    rates = np.full(len(t), np.nan)
    for i in range(len(t)):
        if count[i] == 0:
            continue
        lost_i = lost_max[i] - prev_lost
        drop_i = drop_max[i] - prev_drop
        cap_i = count[i] + max(drop_i, 0.0)
        rates[i] = max(lost_i, 0.0) / cap_i if cap_i else np.nan
        prev_lost, prev_drop = lost_max[i], drop_max[i]
    return stats.Windows(t, count, rates, rates, rates, w)


def _recent_rate(rates: stats.Windows) -> float | None:
    """The loss rate of the last quarter of the windows (their mean): where a rising rate
    has got to by the end. Not the fitted line: when many windows lose nothing, the
    Theil–Sen slope of a rate that rises late is 0."""
    has = np.isfinite(rates.median)
    if not has.any():
        return None
    vals = rates.median[has]
    return float(np.mean(vals[-max(1, len(vals) // 4) :]))


def judge_drops(ctx: Context) -> CriterionResult:
    """Lost ticks / ticks after the warm-up (see ``losses.py``): FAIL above the threshold,
    or when the per-window loss rate of the rows rises significantly past it."""
    d, c = ctx.data, ctx.crit
    title = "Lost frames"
    post, dg = ctx.post, ctx.digest
    if not (dg.counters.post if dg else post.any()):
        return CriterionResult.invalid(
            "drops",
            title,
            threshold=c.max_drop_fraction,
            unit="fraction",
            detail="no post-warm-up frames",
        )
    w = age_window_s(ctx.span, d.meta.fps)
    if dg:
        loss, dw = dg.loss, dg.drops
        rates = loss_rates(dw.centres, dw.count, dw.lost_max, dw.drop_max, w, *dg.prev)
    else:
        lost_cum, drop, base, _ = _loss_counters(d, post)
        loss = count_losses(d, post)
        rates = _loss_rates(ctx, lost_cum[post], drop[post], w, sum(base), base[0])
    frac = loss.fraction
    ctx.series["drop_rate"] = rates
    tr = stats.trend(rates.t, rates.median, c.alpha)
    ctx.trends["drop_rate"] = tr
    end_rate = _recent_rate(rates)
    accelerating = tr.z > 0 and tr.p < c.alpha
    ev: dict[str, Any] = {
        **loss.counts,
        "missed_ticks_source": loss.missed_source,
        "missed_ticks_pause": loss.missed_pause,
        "pacer_ticks": d.meta.counter("pacer_ticks"),
        "lost": loss.lost,
        "ticks": loss.ticks,
        "captured": loss.ticks - (loss.counts["missed_ticks"] or 0.0),
        "dispatched_rows": loss.rows,
        "window_s": w,
        "accelerating": accelerating,
        "rate_at_end": end_rate,
        "rate_trend": trend_fields(tr, 60.0),
    }
    over_end = accelerating and end_rate is not None and end_rate > c.max_drop_fraction
    status = FAIL if frac > c.max_drop_fraction or over_end else PASS
    detail = f"{loss.lost:.0f} of {loss.ticks:.0f} frames lost ({loss.words()})"
    if accelerating and end_rate:
        detail += f"; drop rate rising, {end_rate:.1%} by the end"
    return CriterionResult(
        criterion="drops",
        title=title,
        status=status,
        value=frac,
        threshold=c.max_drop_fraction,
        unit="fraction",
        detail=detail,
        evidence=ev,
    )


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return [judge_drops(ctx)]


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """Losses only add up: once those counted so far exceed ``max_drop_fraction`` of every
    tick the planned run can have, the fraction cannot end under the limit (a run ended
    now has fewer ticks, so a larger fraction)."""
    most = live.planned_ticks()
    if most > 0 and live.lost > crit.max_drop_fraction * most:
        why = (
            f"{live.lost} frames lost already, over {crit.max_drop_fraction:g} of the "
            f"{most:.0f} ticks the whole run can have"
        )
        return EarlyFail("drops", why)
    return None

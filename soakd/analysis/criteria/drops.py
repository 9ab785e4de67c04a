"""Frames lost: every tick the target rate asked for that did not finish (``losses.py``), as a
fraction of the ticks with a Wilson bound, and the drop rate's trend over the run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from soakd.analysis import contention as host
from soakd.analysis import stats
from soakd.analysis.criteria.base import Context, EarlyFail, Live, trend_fields
from soakd.analysis.losses import Losses, count_losses
from soakd.analysis.model import FAIL, INVALID, PASS, CriterionResult, RunData, age_window_s
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
) -> tuple[stats.Windows, np.ndarray, np.ndarray]:
    """Per-window loss rates of the post-warm-up rows: frames lost in a window over frames
    captured in it (rows + drops), from the cumulative counters ``lost_cum`` / ``drop``
    (``prev_*``: their values at the end of the warm-up). Floor, median and max all hold the
    rate. With them, each window's frames lost and captured (``window_losses``)."""
    t = ctx.data.frames["t_capture"][ctx.post]
    win = stats.window_reduce(t, lost_cum, w, t0=ctx.t0, t1=ctx.t1, medians=False)
    dwin = stats.window_reduce(t, drop, w, t0=ctx.t0, t1=ctx.t1, medians=False)
    lost, cap = window_losses(win.count, win.max, dwin.max, prev_lost, prev_drop)
    rates = loss_rates(win.t, win.count, win.max, dwin.max, w, prev_lost, prev_drop)
    return rates, lost, cap


def loss_rates(
    t: np.ndarray, count: np.ndarray, lost_max: np.ndarray, drop_max: np.ndarray, w: float,
    prev_lost: float, prev_drop: float,
) -> stats.Windows:  # fmt: skip
    """``_loss_rates`` from per-window row counts and largest running counters."""
    lost, cap = window_losses(count, lost_max, drop_max, prev_lost, prev_drop)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(cap > 0, lost / np.where(cap > 0, cap, 1.0), np.nan)
    return stats.Windows(t, count, rates, rates, rates, w)


def window_losses(
    count: np.ndarray, lost_max: np.ndarray, drop_max: np.ndarray, prev_lost: float,
    prev_drop: float,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per window: frames lost in it, and frames captured in it (rows + queue drops), from
    the running counters' largest value in each window (NaN for an empty window)."""
    lost, cap = np.full(len(count), np.nan), np.full(len(count), np.nan)
    for i in range(len(count)):
        if count[i] == 0:
            continue
        lost_i = lost_max[i] - prev_lost
        drop_i = drop_max[i] - prev_drop
        lost[i] = max(lost_i, 0.0)
        cap[i] = count[i] + max(drop_i, 0.0)
        prev_lost, prev_drop = lost_max[i], drop_max[i]
    return lost, cap


def contention(
    ctx: Context, rates: stats.Windows, lost: np.ndarray, cap: np.ndarray, loss: Losses
) -> dict[str, Any] | None:
    """The lost frames against the host: the windows in which it was contended (other
    processes held ``contended_cpu_pct`` or more of its CPUs over the window's ticks:
    soakd.analysis.contention) and the ticks the pacer missed in contended pauses
    (``contention.pauses``: soakd's process did not run on time while they held the CPUs),
    the loss rate of the quiet windows (``quiet_rate``) and the fraction the model would
    have lost at that rate (``quiet_fraction``): the rate applied to every window and to
    the contended pauses' ticks, the losses no window holds (missed ticks of a slow source
    or of a quiet pause: a SIGSTOP; frames left at the end: a hang) counted whole. None when
    the rule is off, the host was not sampled or the model's median frame does not fit the
    frame period (then the rate, not the host, loses the frames)."""
    d = ctx.data
    if not d.meta.fps or not np.isfinite(d.frame("total_ms")[ctx.measured]).any():
        return None
    if host.outpaced(d, ctx.measured):
        return None
    pct = ctx.crit.contended_cpu_pct
    half = rates.width_s / 2
    h = host.during(d, rates.t - half, rates.t + half, pct)
    if h is None:
        return None
    has = np.isfinite(cap)
    busy = has & h.busy
    quiet = has & h.quiet
    carried = _carried(ctx, rates, quiet, pct)
    windowed = float(np.nansum(lost[has]))
    unwindowed = max(float(loss.lost) - windowed, 0.0)
    p = host.pauses(d, pct)
    paused = float(loss.missed_pause or 0.0)
    excused = min(p.contended, paused, unwindowed) if p is not None else 0.0
    cap_q = float(np.nansum(cap[quiet]))
    rate_q = (float(np.nansum(lost[quiet])) - carried) / cap_q if cap_q > 0 else 0.0
    at_rate = rate_q * (float(np.nansum(cap[has])) + excused)
    frac_q = (at_rate + unwindowed - excused) / loss.ticks if loss.ticks else 0.0
    lost_busy = float(np.nansum(lost[busy])) + carried
    others = np.concatenate([h.others[busy], p.others if p is not None else []])
    others = others[np.isfinite(others)]
    return {
        "contended_cpu_pct": pct,
        "lost": float(loss.lost),
        "lost_contended": lost_busy,
        "lost_carried": carried,
        "lost_contended_share": (lost_busy + excused) / float(loss.lost) if loss.lost else None,
        "lost_unwindowed": unwindowed - excused,
        "missed_pause": loss.missed_pause,
        "missed_pause_contended": excused,
        "missed_pause_kept": paused - excused if loss.missed_pause is not None else None,
        "pause_events": p.events if p is not None else 0,
        "pause_events_contended": p.events_contended if p is not None else 0,
        "pause_events_unread": p.unread if p is not None else 0,
        "windows_contended": int(busy.sum()),
        "windows_quiet": int(quiet.sum()),
        "others_contended_pct": float(np.median(others)) if others.size else None,
        "quiet_rate": rate_q if cap_q > 0 else None,
        "quiet_fraction": frac_q,
        "quiet_fails": frac_q > ctx.crit.max_drop_fraction,
    }


def _carried(ctx: Context, rates: stats.Windows, quiet: np.ndarray, pct: float) -> float:
    """The losses the ``quiet`` windows hold that accrued while the host was contended
    (``contention.accrued``): counted on a row captured after a contended spell, lost in
    it. They are the host's, set aside with the contended windows'."""
    d, post = ctx.data, ctx.post
    busy = host.accrued(d, post, pct)
    if busy is None or not busy.any():
        return 0.0
    lost_cum, _, base, _ = _loss_counters(d, post)
    added = np.clip(np.diff(lost_cum[post], prepend=sum(base)), 0.0, None)
    at = stats.window_index(d.frames["t_capture"][post], ctx.t0, rates.width_s, rates.t.size)
    return float(added[busy & quiet[at]].sum())


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
        rates, lost_w, cap_w = _loss_rates(ctx, lost_cum[post], drop[post], w, sum(base), base[0])
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
    if status == FAIL and not dg:
        cn = contention(ctx, rates, lost_w, cap_w, loss)
        ev["contention"] = cn
        if cn is not None and not cn["quiet_fails"]:
            status = INVALID
            detail = f"{_contended_detail(cn)}; {detail}"
        elif cn is not None and (cn["lost_contended"] or cn["missed_pause_contended"]):
            detail += _quiet_detail(cn)
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


def _contended_detail(cn: dict[str, Any]) -> str:
    """Why failing losses are INVALID: their share under contention, with the figures."""
    rate = cn["quiet_rate"]
    rest = (
        f"the {cn['windows_quiet']} window(s) outside it lost {rate:.1%}"
        if rate is not None
        else "no window outside it"
    )
    med = cn["others_contended_pct"]
    return (
        f"the host was contended: {cn['lost_contended_share']:.0%} of the {cn['lost']:.0f} "
        f"lost frame(s) fell while other processes held >= {cn['contended_cpu_pct']:g} % of "
        f"the CPUs{f' (median {med:.0f} %)' if med is not None else ''}: {_set_aside(cn)}; "
        f"{rest}, "
        f"{cn['quiet_fraction']:.1%} of the ticks with the {cn['lost_unwindowed']:.0f} "
        "missed or left at the end: soak on a quiet host or pin CPUs"
    )


def _set_aside(cn: dict[str, Any]) -> str:
    """The host's share of the losses: the contended windows' and the pauses' ticks."""
    text = f"{cn['lost_contended']:.0f} lost in {cn['windows_contended']} contended window(s)"
    if cn.get("lost_carried"):
        text += f" or counted just after them ({cn['lost_carried']:.0f})"
    if cn["missed_pause"] is not None:
        text += (
            f", {cn['missed_pause_contended']:.0f} of the {cn['missed_pause']:.0f} tick(s) "
            f"the pacer missed in pauses ({cn['missed_pause_kept']:.0f} kept as the model's)"
        )
    return text


def _quiet_detail(cn: dict[str, Any]) -> str:
    """Why failing losses stay FAIL on a host contended part of the time."""
    return (
        f"; set aside as the host's (other processes held >= {cn['contended_cpu_pct']:g} % "
        f"of the CPUs): {_set_aside(cn)}, the rest alone loses {cn['quiet_fraction']:.1%}"
    )


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """Losses only add up: once those counted so far exceed ``max_drop_fraction`` of every
    tick the planned run can have, the fraction cannot end under the limit (a run ended
    now has fewer ticks, so a larger fraction). Not once a tick since the warm-up saw the
    host contended (``contention.withholds_looks``): the verdict sets the windows that lost
    frames then aside, a look cannot."""
    if host.withholds_looks(live.contended_ticks):
        return None
    most = live.planned_ticks()
    if most > 0 and live.lost > crit.max_drop_fraction * most:
        why = (
            f"{live.lost} frames lost already, over {crit.max_drop_fraction:g} of the "
            f"{most:.0f} ticks the whole run can have"
        )
        return EarlyFail("drops", why)
    return None

"""Stage time spikes against k x median (k configured or from the history of passing runs)
and, when set, over ``jitter_min_ms``: ``jitter_rule = "count"`` allows a few frames over it,
``"max"`` none; a rollout judges its presentation intervals (or its chunk times).

A host contended by other processes is never blamed on the model: when the rule fails, the
frames that ran while other processes held ``contended_cpu_pct`` or more of the host's CPUs
(soakd's own telemetry: soakd.analysis.contention) are set aside and the rule judges the
rest. Spikes among those still FAIL; when only the contended frames fail it, the criterion is
INVALID ("the host was contended"), never PASS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from soakd.analysis import contention as host
from soakd.analysis import stats
from soakd.analysis.chunks import judged_intervals
from soakd.analysis.criteria.base import (
    Context,
    EarlyFail,
    Live,
    LiveHistogram,
    generator_intervals,
)
from soakd.analysis.model import FAIL, INVALID, PASS, CriterionResult, jitter_allowed
from soakd.config import CriteriaSettings

DEFAULT_JITTER_K = 5.0  # used when jitter_k = "history" has too little history


HISTORY_MARGIN = 1.25  # k from history = margin x the largest passing ratio


class JitterSeries(NamedTuple):
    """What the jitter rule judges: the column, its values, their frame ids, the times the
    detail quotes, and when each value's work ran (``start`` .. ``end``, seconds since the
    run's start: what the contention check looks up in the host telemetry)."""

    column: str
    y: np.ndarray
    fid: np.ndarray
    t: np.ndarray
    start: np.ndarray
    end: np.ndarray


def _ended_at(col: str, y: np.ndarray, fid: np.ndarray, t: np.ndarray) -> JitterSeries:
    """A series of waits that each end at ``t`` (intervals, presentation waits)."""
    return JitterSeries(col, y, fid, t, t - y / 1e3, t)


def _presentation_source(ctx: Context) -> JitterSeries | None:
    """A rollout's waits between visible updates (``criteria.generator_interval =
    "presentation"``, chunks.judged_intervals): the stalls a viewer sees, by chunk."""
    iv = judged_intervals(ctx.data, ctx.t0, "presentation")
    return _ended_at("presentation_ms", iv.ms, iv.frame_id, iv.t) if iv.n else None


def _jitter_source(ctx: Context) -> JitterSeries | None:
    """What the jitter criterion judges: a rollout's waits between visible updates (or,
    ``generator_interval = "per_frame"``, its chunk times: each chunk is a row), else infer
    or output latency, else a generator's intervals."""
    d = ctx.data
    if d.meta.shape == "rollout" and ctx.crit.generator_interval == "presentation":
        return _presentation_source(ctx)
    ok = ctx.measured & (d.frame("has_error") == 0)
    # a session's infer_ms: the model step(s) that took the frame (soakd's hooks); its output
    # latency only when its stages were not timed
    cols = ("total_ms",) if d.meta.shape == "rollout" else ("infer_ms", "output_latency_ms")
    for col in cols:
        y = d.frame(col)[ok]
        if np.isfinite(y).any():
            keep = np.isfinite(y)
            fid = d.frames["frame_id"][ok][keep]
            t = d.frames["t_capture"][ok][keep]
            # the frame ran from its dispatch (capture + age) for its total
            start = t + np.nan_to_num(d.frame("frame_age_ms")[ok][keep]) / 1e3
            total = d.frame("total_ms")[ok][keep]
            end = start + np.where(np.isfinite(total), total, y[keep]) / 1e3
            return JitterSeries(col, y[keep], fid, t, start, end)
    if d.meta.generates:
        t, iv = generator_intervals(d, ctx.t0)
        if iv.size:
            return _ended_at("interval_ms", iv, np.arange(iv.size, dtype=np.float64), t)
    return None


def resolve_jitter_k(crit: CriteriaSettings, history: Sequence[float]) -> tuple[float, str]:
    """The k to use and a note on where it came from."""
    if crit.jitter_k != "history":
        return float(crit.jitter_k), "configured"
    hist = [h for h in history if math.isfinite(h) and h >= 1]
    if len(hist) < crit.jitter_history_min_runs:
        return DEFAULT_JITTER_K, (
            f"history: only {len(hist)} earlier passing run(s) of this config on this host "
            f"(need {crit.jitter_history_min_runs}); using the default k = {DEFAULT_JITTER_K:g}"
        )
    k = max(1.0, HISTORY_MARGIN * max(hist))
    return k, (
        f"history: {HISTORY_MARGIN:g} x the largest ratio ({max(hist):.3g}) of "
        f"{len(hist)} earlier passing runs"
    )


def _exceedances(
    ctx: Context, over: tuple[np.ndarray, np.ndarray, np.ndarray], kth: float, n: int, med: float
) -> dict[str, Any]:
    """Frames over the spike threshold (``over``: their values, frame ids and times, among
    ``n``): how many, how many the rule allows, when (first / last t), whether they recur at
    regular positions, and ``robust_ratio``: the ratio to the median of ``kth``, the
    largest frame left once the allowed ones are set aside (what the rule judges)."""
    c = ctx.crit
    y, fid, t = over
    n_over = int(y.size)
    allowed = jitter_allowed(c, n)
    robust = kth / med if med > 0 else (1.0 if kth == 0 else math.inf)
    per = stats.tail_periodicity(fid)
    ev: dict[str, Any] = {
        "rule": c.jitter_rule,
        "exceed_count": n_over,
        "exceed_allowed": allowed,
        "exceed_periodic": per.regular,
        "exceed_period": per.period,
        "robust_ratio": robust if math.isfinite(robust) else None,
    }
    if n_over:
        ev["exceed_first_t"] = float(t.min())
        ev["exceed_last_t"] = float(t.max())
    return ev


def _fails(n_over: int, allowed: int, periodic: bool) -> bool:
    """The rule on counts: more spikes than allowed, or 4 or more at regular positions."""
    return n_over > allowed or (n_over >= 4 and periodic)


def contention(ctx: Context, s: JitterSeries, cut: float) -> dict[str, Any] | None:
    """The spikes (values over ``cut``) against the host: which ran while the host was
    contended (soakd.analysis.contention), and whether the rule still fails on the other
    frames alone (``quiet_fails``). None when the rule is off or the host was not sampled
    (a run of an older soakd)."""
    c = ctx.crit
    h = host.during(ctx.data, s.start, s.end, c.contended_cpu_pct)
    if h is None:
        return None
    busy, quiet = h.busy, h.quiet
    over = s.y > cut
    over_q = over[quiet]
    n_q, n_over_q = int(quiet.sum()), int(over_q.sum())
    allowed_q = jitter_allowed(c, n_q)
    periodic_q = stats.tail_periodicity(s.fid[quiet][over_q]).regular
    n_over, n_busy = int(over.sum()), int((over & busy).sum())
    # the quiet frames' spike rate against the rate the rule allows the run: a model that
    # spikes as often off contention as on it is not excused by a few quiet frames
    rate = jitter_allowed(c, s.y.size) / s.y.size
    p_rate = _rate_p(n_over_q, n_q, rate)
    return {
        "contended_cpu_pct": c.contended_cpu_pct,
        "spikes": n_over,
        "spikes_contended": n_busy,
        "spikes_contended_share": n_busy / n_over if n_over else None,
        "others_at_spikes_pct": h.median(over),
        "others_elsewhere_pct": h.median(~over),
        "frames_contended": int(busy.sum()),
        "frames_quiet": n_q,
        "quiet_exceed_count": n_over_q,
        "quiet_exceed_allowed": allowed_q,
        "quiet_exceed_periodic": periodic_q,
        "quiet_rate_p": p_rate,
        "quiet_fails": _fails(n_over_q, allowed_q, periodic_q) or p_rate < c.alpha,
    }


def _rate_p(spikes: int, n: int, rate: float) -> float:
    """P(at least ``spikes`` among ``n`` frames | each spikes with probability ``rate``): a
    small p says the frames spike more often than the rule allows."""
    if spikes == 0:
        return 1.0
    if rate <= 0:
        return 0.0
    return float(stats.scipy_stats().binom.sf(spikes - 1, n, min(rate, 1.0)))


def _contended_detail(cn: dict[str, Any]) -> str:
    """Why a failing rule is INVALID: the spikes' share under contention, with the figures."""
    at, rest = cn["others_at_spikes_pct"], cn["others_elsewhere_pct"]
    figures = f"median {at:.0f} % at them" if at is not None else ""
    if rest is not None:
        figures += f"{', ' if figures else ''}{rest:.0f} % at the other frames"
    return (
        f"the host was contended: {cn['spikes_contended_share']:.0%} of the {cn['spikes']} "
        f"spike(s) fell while other processes held >= {cn['contended_cpu_pct']:g} % of the "
        f"CPUs ({figures}); the {cn['frames_quiet']} frame(s) outside it pass "
        f"({cn['quiet_exceed_count']} over, {cn['quiet_exceed_allowed']} allowed): soak on a "
        "quiet host or pin CPUs"
    )


def _tail(y: np.ndarray, fid: np.ndarray) -> dict[str, Any]:
    """The long tail (above a robust cut) and whether it falls at regular positions."""
    cut = stats.robust_tail_threshold(y)
    tail_pos = fid[y > cut]
    per = stats.tail_periodicity(tail_pos)
    return {
        "tail_cut_ms": cut,
        "tail_frames": int(tail_pos.size),
        "tail_periodic": per.regular,
        "tail_period": per.period,
        "tail_score": per.score,
    }


def _jitter_detail(
    col: str, mx: float, med: float, ratio: float, ex: dict[str, Any], floor: float
) -> str:
    stage = col.removesuffix("_ms")
    base = f"{stage} max {mx:.4g} ms = {ratio:.3g} x median {med:.4g} ms"
    n = ex["exceed_count"]
    over = f"k x median{f' and {floor:g} ms' if floor > 0 else ''}"
    if not n:
        return f"{base}; no frame over {over}"
    when = f"{ex['exceed_first_t']:.4g} s" + (f" to {ex['exceed_last_t']:.4g} s" if n > 1 else "")
    recur = f", recurring every {ex['exceed_period']} frames" if ex["exceed_periodic"] else ""
    return f"{base}; {n} frame(s) over {over} at {when}{recur} (allowed {ex['exceed_allowed']})"


def _no_timings(shape: str | None, title: str, k: float) -> CriterionResult:
    """Nothing to judge: n/a for a session whose stages were not timed, else INVALID."""
    if shape == "session":
        return CriterionResult.na(
            "jitter",
            title,
            threshold=k,
            unit="x median",
            detail="not applicable: the session's stages were not timed and no output came",
        )
    return CriterionResult.invalid(
        "jitter", title, threshold=k, unit="x median", detail="no infer timings after warm-up"
    )


def _measure(
    ctx: Context, src: Any, k: float, floor: float
) -> tuple[str, dict[str, float], dict[str, Any], float, dict[str, Any]]:
    """The judged column, its levels, its tail, the k-th largest value (k = frames allowed
    over) and the frames over k x median and ``floor``: from the bounded path's digest or
    from the loaded column."""
    dg = ctx.digest
    if dg and dg.jitter:
        j = dg.jitter
        y, fid, t = j.over
        big = y > floor
        ex = _exceedances(ctx, (y[big], fid[big], t[big]), j.kth, j.n, j.levels["median_ms"])
        return j.column, j.levels, j.tail, j.kth, ex
    y = src.y
    levels = {
        "median_ms": float(np.median(y)),
        "max_ms": float(y.max()),
        "p99_ms": float(np.percentile(y, 99)),
        "max_frame_id": float(src.fid[int(np.argmax(y))]),
    }
    over = y > max(k * levels["median_ms"], floor)
    kth = float(np.sort(y)[::-1][min(jitter_allowed(ctx.crit, y.size), y.size - 1)])
    ex = _exceedances(ctx, (y[over], src.fid[over], src.t[over]), kth, y.size, levels["median_ms"])
    return src.column, levels, _tail(y, src.fid), kth, ex


def judge_jitter(ctx: Context, history: Sequence[float]) -> CriterionResult:
    """Stage time spikes: frames over k x median and over ``jitter_min_ms``.
    ``jitter_rule = "count"`` (default): FAIL when more frames exceed it than allowed
    (``jitter_max_exceed``, or the ``jitter_max_exceed_fraction`` share of frames if more),
    or when 4 or more exceed at regular positions; ``"max"``: FAIL when the max alone
    exceeds it (the seed's rule). A FAIL that only the frames run while the host was
    contended make is INVALID (``contention``)."""
    d, c = ctx.data, ctx.crit
    k, k_note = resolve_jitter_k(c, history)
    title = "Infer jitter"
    if d.meta.shape == "rollout":
        by_wait = c.generator_interval == "presentation"
        title = "Presentation interval jitter" if by_wait else "Chunk time jitter"
    dg = ctx.digest
    src = None if dg else _jitter_source(ctx)
    if (dg.jitter is None) if dg else (src is None):
        return _no_timings(d.meta.shape, title, k)
    floor = c.jitter_min_ms
    cn = None
    col, levels, tail, kth, ex = _measure(ctx, src, k, floor)
    med, mx = levels["median_ms"], levels["max_ms"]
    ratio = mx / med if med > 0 else (1.0 if mx == 0 else math.inf)
    ev: dict[str, Any] = {
        "source": col,
        "median_ms": med,
        "max_ms": mx,
        "max_ratio": ratio if math.isfinite(ratio) else None,
        "p99_ms": levels["p99_ms"],
        "k": k,
        "k_source": k_note,
        "min_ms": floor,
        "max_frame_id": levels["max_frame_id"],
        **tail,
        "history_runs": len(history),
        **ex,
    }
    warnings = [k_note] if c.jitter_k == "history" and "default" in k_note else []
    # the k-th largest frame over k x median (and the floor): more frames over it than allowed
    failing = kth > max(k * med, floor) or (ex["exceed_count"] >= 4 and ex["exceed_periodic"])
    if failing and src is not None:
        cn = contention(ctx, src, max(k * med, floor))
        ev["contention"] = cn
    status = FAIL if failing else PASS
    detail = _jitter_detail(col, mx, med, ratio, ex, floor)
    if cn is not None and not cn["quiet_fails"]:
        status, detail = INVALID, f"{_contended_detail(cn)}; {detail}"
    elif cn is not None and cn["spikes_contended"]:
        detail += (
            f"; {cn['spikes_contended']} of them while other processes held >= "
            f"{cn['contended_cpu_pct']:g} % of the CPUs, the others fail the rule alone"
        )
    robust = ex["robust_ratio"] if ex["robust_ratio"] is not None else math.inf
    # value: the ratio the rule judged (the max for "max"), so history learns the same
    value = ratio if c.jitter_rule == "max" else robust
    return CriterionResult(
        criterion="jitter",
        title=title,
        status=status,
        value=value if math.isfinite(value) else None,
        threshold=k,
        unit="x median",
        detail=detail,
        evidence=ev,
        warnings=warnings,
    )


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return [judge_jitter(ctx, ctx.history)]


#: seconds between two early looks at the stage times
LOOK_EVERY_S = 10.0


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """More frames already over k x an upper confidence bound of the median (at this look's
    share of alpha, ``criteria.base.look_alpha``) than the rule allows of every frame the
    planned run can have: those frames stay over k x the final median unless the median
    rises past its bound, so the count can only grow past the allowance. Asked of a
    configured k (not ``"history"``) and the count rule's frames alone (not its recurrence
    rule, nor a generator's intervals). Nor once a tick since the warm-up saw the host
    contended (``contention.withholds_looks``): the verdict sets the frames run then aside,
    a look cannot."""
    if live.generates or crit.jitter_k == "history" or not live.stage_ms:
        return None
    if host.withholds_looks(live.contended_ticks):
        return None
    col = next((c for c, h in live.stage_ms.items() if h.n), None)
    if col is None:
        return None
    alpha = live.look("jitter", LOOK_EVERY_S, crit.alpha)
    if alpha is None:
        return None
    counts = live.stage_ms[col].snapshot()
    n = int(counts.sum())
    if n < crit.min_frames:
        return None
    # the median's upper bound: the order statistic u with P(Binomial(n, 1/2) < u) >= 1 -
    # alpha, read as the upper edge of its bin (a bound only ever too high)
    u = int(stats.scipy_stats().binom.ppf(1.0 - alpha, n, 0.5)) + 1
    if u > n:
        return None
    edges = LiveHistogram.EDGES
    ub = float(edges[int(np.searchsorted(np.cumsum(counts), u)) + 1])
    k = float(crit.jitter_k)
    # a spike must also pass the absolute floor, where the config has one (jitter_min_ms)
    level = max(k * ub, float(getattr(crit, "jitter_min_ms", None) or 0.0))
    over = int(counts[int(np.searchsorted(edges[:-1], level, side="right")) :].sum())
    allowed = jitter_allowed(crit, int(live.planned_ticks()))
    if over <= allowed:
        return None
    stage = col.removesuffix("_ms")
    return EarlyFail(
        "jitter",
        f"{over} frame(s) over {k:g} x the median's upper bound ({stage} {ub:.3g} ms, "
        f"alpha {alpha:.2g}), more than the {allowed} the whole run allows",
    )

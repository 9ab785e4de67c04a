"""Judging a run: ``judge(data, criteria, history) -> Verdict``.

Pure: RunData and the ``[criteria]`` settings in, a Verdict out. docs/verdict.md explains
every criterion, its default and why, and the INVALID / n/a rules. In short:

* every statistic uses the post-warm-up window; frames skipped as stale are counted as
  losses but never timed;
* trend criteria (frame age, memory floors, drop rate) FAIL only when the Theil–Sen slope is
  above the tolerance *and* the autocorrelation-corrected Mann–Kendall test is significant
  at ``alpha``; each reports the smallest slope the run could have detected and warns when
  the threshold is below it;
* a trend that could not be tested (too few windows, or fewer than 3 effective ones) is
  never PASS: it passes only when the range of its windows bounds the slope under the
  tolerance, and is INVALID ("untested", with the run length that would test it) otherwise;
* drops count every tick the target rate asked for that did not finish (``losses.py``);
* INVALID beats FAIL beats PASS; a criterion that cannot apply (no GPU) is ``n/a``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from soakd.analysis import devices, server, stats
from soakd.analysis.chunks import judge_generator, judged_intervals
from soakd.analysis.diagnosis import diagnose
from soakd.analysis.digest import FrameDigest, digest_run
from soakd.analysis.losses import count_losses
from soakd.analysis.model import (
    FAIL,
    FLOOR_SLACK,
    INVALID,
    MEMORY_METRICS,
    MIB,
    MIN_WINDOWS,
    NA,
    OVERALL_FAIL,
    OVERALL_INVALID,
    OVERALL_PASS,
    PASS,
    CriterionResult,
    RunData,
    Verdict,
    age_window_s,
    floor_window_s,
    jitter_allowed,
)
from soakd.analysis.thresholds import ended_by_threshold, judge_thresholds
from soakd.config import CriteriaSettings
from soakd.errors import ExitCode

__all__ = [
    "FAIL",
    "INVALID",
    "MIB",
    "NA",
    "PASS",
    "CriterionResult",
    "Verdict",
    "age_window_s",
    "floor_window_s",
    "judge",
    "resolve_jitter_k",
]

DEFAULT_JITTER_K = 5.0  # used when jitter_k = "history" has too little history
HISTORY_MARGIN = 1.25  # k from history = margin x the largest passing ratio


@dataclass(slots=True)
class _Ctx:
    data: RunData
    crit: CriteriaSettings
    t0: float
    t1: float
    measured: np.ndarray  # bool mask of frames: post-warm-up, dispatched
    post: np.ndarray  # bool mask: post-warm-up rows (dispatched or skipped)
    series: dict[str, stats.Windows]
    trends: dict[str, stats.Trend]
    #: the bounded path's streamed run (frames not loaded; ``data`` holds its telemetry view)
    digest: FrameDigest | None = None

    @property
    def span(self) -> float:
        return max(self.t1 - self.t0, 0.0)

    def minutes(self) -> str:
        m = self.span / 60
        return f"{m:.0f}-minute" if m >= 2 else f"{self.span:.0f}-second"


def _f(v: Any) -> float | None:
    """A finite float or None."""
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _trend_fields(tr: stats.Trend, per: float) -> dict[str, Any]:
    return {
        "slope": tr.slope * per,
        "p_value": tr.p,
        "z": tr.z,
        "n_windows": tr.n,
        "n_effective": tr.n_eff,
        "autocorr_inflation": tr.inflation,
        "noise": tr.noise,
        "min_detectable_slope": tr.mds * per,
    }


def _detectability(
    ctx: _Ctx, tr: stats.Trend, per: float, threshold: float, what: str, unit: str
) -> list[str]:
    mds = tr.mds * per
    if math.isfinite(mds) and threshold < mds:
        return [
            f"this {ctx.minutes()} run cannot see {what} under {mds:.3g} {unit} "
            f"(threshold {threshold:g} {unit})"
        ]
    return []


@dataclass(frozen=True, slots=True)
class _TrendCall:
    """How a trend criterion was decided: ``how`` is "rising" (FAIL), "trend" (tested,
    PASS), "bounded" (too few windows for a test, but the windows' range keeps the slope
    under the tolerance: PASS) or "untested" (INVALID). ``bound``: that largest slope."""

    status: str
    how: str
    bound: float | None = None


def _range_bound(t: np.ndarray, y: np.ndarray) -> float | None:
    """The steepest slope the series' windows allow: (max - min) / span of their times."""
    ok = np.isfinite(t) & np.isfinite(y)
    if ok.sum() < 2:
        return None
    span = float(t[ok].max() - t[ok].min())
    return float(y[ok].max() - y[ok].min()) / span if span > 0 else None


def _call_trend(
    tr: stats.Trend, t: np.ndarray, y: np.ndarray, alpha: float, tol: float
) -> _TrendCall:
    """FAIL when rising (significant and above ``tol``); else PASS when the trend was
    testable or its range bounds it under ``tol``; else untested (INVALID)."""
    if tr.rising(alpha, tol):
        return _TrendCall(FAIL, "rising")
    if tr.testable(alpha):
        return _TrendCall(PASS, "trend")
    bound = _range_bound(t, y)
    if bound is not None and bound <= tol:
        return _TrendCall(PASS, "bounded", bound)
    return _TrendCall(INVALID, "untested", bound)


def _not_significant(ctx: _Ctx, tr: stats.Trend, per: float, tol: float, unit: str) -> str:
    """For a trend that passed with its slope over the tolerance ``tol`` (not significant):
    why it passed and, from the slope this run can detect, about how long a run would decide
    it (the detectable slope falls as span^-1.5 for windows of the same noise). "" when the
    slope is within the tolerance."""
    slope, mds = tr.slope * per, tr.mds * per
    if not slope > tol:
        return ""
    words = f"; above {tol:g} {unit} but not significant at alpha = {ctx.crit.alpha:g}"
    if math.isfinite(mds) and mds > tol and ctx.span > 0:
        need = ctx.span * (mds / tol) ** (2 / 3)
        words += (
            f": this {ctx.minutes()} run sees growth over {mds:.3g} {unit}; about "
            f"{need / 60:.0f} min after the warm-up would decide it"
        )
    return words


def _span_to_test(ctx: _Ctx, tr: stats.Trend, window_s: float, min_windows: int = 0) -> float:
    """Seconds after the warm-up a run needs for a trend test of windows of ``window_s``:
    enough windows for significance and, at this run's autocorrelation, 3 effective ones."""
    need = max(stats.min_trend_points(ctx.crit.alpha), min_windows)
    if math.isfinite(tr.inflation) and tr.n >= 3:
        need = max(need, math.ceil(3 * tr.inflation) + 1)
    return need * window_s


def _untested(ctx: _Ctx, tr: stats.Trend, what: str, need_s: float) -> str:
    """The detail of an untested trend: why, and how long the run must be (no p-value: a
    test that could not be run has none worth showing)."""
    return (
        f"untested: {tr.n} windows ({tr.n_eff:.1f} effective) cannot show {what} at "
        f"alpha = {ctx.crit.alpha:g} (a test needs {stats.min_trend_points(ctx.crit.alpha)} "
        f"windows and 3 effective); run at least {need_s:.0f} s after the warm-up "
        f"(run.duration >= {ctx.t0 + need_s:.0f} s)"
    )


# --------------------------------------------------------------------------- criteria


def judge_run_validity(ctx: _Ctx) -> CriterionResult:
    d, c, dg = ctx.data, ctx.crit, ctx.digest
    n_meas = dg.n_measured if dg else int(ctx.measured.sum())
    dur = _f(d.meta.duration_s)
    if dur is None and dg:
        dur = max(dg.counters.last_capture, 0.0)
    if dur is None:
        t = d.frames["t_capture"]
        dur = float(t.max()) if t.size else 0.0
    ev = {
        "status": d.meta.status,
        "reason": d.meta.reason,
        "duration_s": dur,
        "measured_frames": n_meas,
        "min_frames": c.min_frames,
        "measured_window_s": [ctx.t0, ctx.t1],
    }
    problems = []
    if d.meta.status != "completed":
        why = f": {d.meta.reason}" if d.meta.reason else ""
        problems.append(f"run {d.meta.status}{why}")
    if dur < c.min_duration_s:
        problems.append(
            f"too short for a soak: {dur:.3g} s < {c.min_duration_s:g} s (min_duration_s)"
        )
    if n_meas < c.min_frames:
        problems.append(f"{n_meas} post-warm-up frames, fewer than min_frames = {c.min_frames}")
    hang = _hang(d)
    if hang:
        ev["in_flight_at_end"] = 1
        ev["in_flight_since_s"] = d.meta.counter("in_flight_since_s")
        problems.append(hang)
    status = INVALID if problems else PASS
    detail = "; ".join(problems) if problems else (f"{dur:.4g} s, {n_meas} post-warm-up frames")
    return CriterionResult(
        criterion="run",
        title="Run is long and complete enough",
        status=status,
        value=dur,
        threshold=c.min_duration_s,
        unit="s",
        detail=detail,
        evidence=ev,
    )


def _hang(d: RunData) -> str | None:
    """A frame dispatched and never finished when the run stopped: the workload hung, so the
    run cannot be judged (INVALID, whatever else passed)."""
    if not d.meta.counter("in_flight_at_end"):
        return None
    since = d.meta.counter("in_flight_since_s")
    at = f" at {since:.3g} s" if since is not None else ""
    stall = d.meta.counter("stall_timeout_s")
    why = f" (stall timeout {stall:g} s not reached)" if stall is not None else ""
    return f"a frame dispatched{at} never finished: the workload hung{why}"


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
    ctx: _Ctx, lost_cum: np.ndarray, drop: np.ndarray, w: float, prev_lost: float, prev_drop: float
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


def judge_drops(ctx: _Ctx) -> CriterionResult:
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
        "rate_trend": _trend_fields(tr, 60.0),
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


def _generator_intervals(d: RunData, t0: float) -> tuple[np.ndarray, np.ndarray]:
    """Chunk-to-chunk intervals of a generator run: the first emission of each chunk that
    is not the first of its request (of a rollout: every chunk but the run's first),
    post-warm-up."""
    e = d.emissions
    if len(e["t_emit"]) == 0:
        return np.empty(0), np.empty(0)
    fid, chunk, idx = e["frame_id"], e["chunk"], e["idx"]
    new_chunk = np.ones(len(fid), dtype=bool)
    new_chunk[1:] = (fid[1:] != fid[:-1]) | (chunk[1:] != chunk[:-1])
    later = (idx > 0) | (d.meta.shape == "rollout")  # a rollout's intervals span its chunks
    keep = new_chunk & later & (e["t_emit"] >= t0) & np.isfinite(e["interval_ms"])
    return e["t_emit"][keep], e["interval_ms"][keep]


def _age_series(ctx: _Ctx) -> tuple[str, str, str, np.ndarray, np.ndarray]:
    """(criterion, title, what, t, y) of the age criterion: frame age on the dispatch axis,
    or a generator's output intervals."""
    d = ctx.data
    if d.meta.generates:
        t, y = _generator_intervals(d, ctx.t0)
        return "interval", "Stable output interval", "interval growth", t, y
    # on the dispatch axis: a backlog's frames are dispatched (and aged) late
    y = d.frame("frame_age_ms")[ctx.measured]
    t = d.frames["t_capture"][ctx.measured] + y / 1000.0  # age = dispatch - capture
    return "frame_age", "Stable frame age", "frame-age growth", t, y


def _first_emit_evidence(ctx: _Ctx) -> dict[str, float]:
    fe = ctx.data.frame("first_emit_ms")[ctx.measured]
    fe = fe[np.isfinite(fe)]
    if not fe.size:
        return {}
    return {"first_emit_ms_median": float(np.median(fe)), "first_emit_ms_max": float(fe.max())}


def _backlog(ctx: _Ctx, t: np.ndarray, w: float) -> dict[str, Any] | None:
    """With ``consume = "oldest"``: the trend of the queue length (window medians on the
    dispatch axis, plus the frames still queued at the end) and the frame-age slope it
    implies (frames per second x the frame period). A growing backlog keeps aging frames
    that are never dispatched, so measured frame age alone would understate it."""
    d = ctx.data
    fps = d.meta.fps
    if d.meta.setting("run", "consume") != "oldest" or not fps:
        return None
    q = d.frame("queue_len")[ctx.measured]
    ok = np.isfinite(q) & np.isfinite(t)
    if not ok.any():
        return None
    return _backlog_trend(ctx, stats.window_reduce(t[ok], q[ok], w, t0=ctx.t0, t1=ctx.t1))


def _backlog_trend(ctx: _Ctx, win: stats.Windows) -> dict[str, Any] | None:
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
    ctx: _Ctx, call: _TrendCall, tr: stats.Trend, p95: float, backlog: dict[str, Any] | None
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
    ctx: _Ctx,
    call: _TrendCall,
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
        need = _span_to_test(ctx, tr, age_window_s(0.0, rate))
        ev["min_span_to_test_s"] = need
        return INVALID, _untested(ctx, tr, what, need)
    if call.how == "bounded" and call.bound is not None:
        return PASS, (
            f"median {med:.4g} ms; too few windows for a trend test, but their range allows "
            f"at most {call.bound * 60:.3g} ms/min"
        )
    tol = ctx.crit.max_age_slope_ms_per_min
    return PASS, (
        f"median {med:.4g} ms, slope {tr.slope * 60:+.3g} ms/min (p = {tr.p:.2g})"
        + _not_significant(ctx, tr, 60, tol, "ms/min")
    )


def judge_frame_age(ctx: _Ctx) -> CriterionResult:
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
    t, y = t[ok], y[ok]
    # windows hold ~10 values: of frames for frame age, of intervals for a generator (many
    # intervals per request, so the request rate would make the windows far too long)
    rate = y.size / ctx.span if generator and ctx.span > 0 else d.meta.fps
    w = age_window_s(ctx.span, rate)
    win = stats.window_reduce(t, y, w, t0=ctx.t0, t1=ctx.t1)
    levels = (float(np.median(y)), float(np.percentile(y, 95)), float(y.max()))
    return age_result(ctx, (name, title, what), win, levels, backlog, rate)


def _age_streamed(ctx: _Ctx, dg: FrameDigest) -> CriterionResult:
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
    ctx: _Ctx,
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
    call = _call_trend(tr, win.t[has], win.median[has], c.alpha, thr / 60)
    med, p95, mx = levels
    ev: dict[str, Any] = {
        "median_ms": med,
        "p95_ms": p95,
        "max_ms": mx,
        "window_s": win.width_s,
        "decided_by": call.how,
        **_trend_fields(tr, 60.0),
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
        warnings=_detectability(ctx, tr, 60.0, thr, what, "ms/min"),
    )


def _sawtooth(t: np.ndarray, y: np.ndarray) -> dict[str, Any]:
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


def judge_memory(ctx: _Ctx) -> list[CriterionResult]:
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
        res = _judge_memory_metric(ctx, name, title, t[ok], y[ok], w)
        if short_note:
            res.warnings.insert(0, short_note)
        out.append(res)
    if server.is_served(d.meta):
        out += judge_server_memory(ctx, w, gpu_any)
    out.append(judge_headroom(ctx, out))
    out.append(judge_oom(ctx))
    return out


def _judge_memory_metric(
    ctx: _Ctx, name: str, title: str, t: np.ndarray, y: np.ndarray, w: float
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
    call = _call_trend(tr, win.t[has], win.floor[has], c.alpha, thr / per)
    floors = win.floor[has]
    ev: dict[str, Any] = {
        "floor_window_s": w,
        "first_floor_mb": float(floors[0] / MIB),
        "last_floor_mb": float(floors[-1] / MIB),
        "peak_mb": float(y.max() / MIB),
        "sawtooth": ctx.digest.sawtooth[name]
        if ctx.digest and name in ctx.digest.sawtooth
        else _sawtooth(t, y),
        "decided_by": call.how,
        **_trend_fields(tr, per),
    }
    if call.bound is not None:
        ev["bound_slope"] = call.bound * per
    if call.how == "rising":
        detail = f"floor rising {slope:.3g} MB/min (p = {tr.p:.2g})"
    elif call.how == "untested":
        need = _span_to_test(ctx, tr, c.floor_window_s, MIN_WINDOWS)
        ev["min_span_to_test_s"] = need
        detail = _untested(ctx, tr, "leaks", need)
    elif call.how == "bounded":
        detail = (
            f"too few windows for a trend test, but the floors' range allows at most "
            f"{call.bound * per:.3g} MB/min, peak {ev['peak_mb']:.0f} MB"  # type: ignore[operator]
        )
    else:
        detail = (
            f"floor slope {slope:+.3g} MB/min (p = {tr.p:.2g}), peak {ev['peak_mb']:.0f} MB"
            + _not_significant(ctx, tr, per, thr, "MB/min")
        )
    status = call.status
    if status == PASS and w < c.floor_window_s * (1 - FLOOR_SLACK):
        status, detail = INVALID, _floor_too_short(ctx, w)
    return CriterionResult(
        criterion=name,
        title=title,
        status=status,
        value=slope,
        threshold=thr,
        unit="MB/min",
        detail=detail,
        evidence=ev,
        warnings=_detectability(ctx, tr, per, thr, "leaks", "MB/min"),
    )


def _floor_too_short(ctx: _Ctx, w: float) -> str:
    """Why a memory metric that looked flat is INVALID: its floor window had to be shortened
    below ``floor_window_s``, so an allocator sawtooth slower than that can hide growth."""
    need = MIN_WINDOWS * ctx.crit.floor_window_s
    return (
        f"too short to judge: the floor window was shortened from "
        f"{ctx.crit.floor_window_s:g} s to {w:.2g} s, where an allocator sawtooth can hide "
        f"growth; run at least {need:.0f} s after the warm-up "
        f"(run.duration >= {ctx.t0 + need:.0f} s) or lower criteria.floor_window_s"
    )


def judge_server_memory(ctx: _Ctx, w: float, gpu_any: bool) -> list[CriterionResult]:
    """A served model's server: its RSS and GPU memory, by the rule of soakd's own
    (soakd.analysis.server)."""
    d, thr = ctx.data, ctx.crit.max_memory_growth_mb_per_min
    post = d.samples["t"] >= ctx.t0
    out = []
    for name, col, title in server.SERVER_MEMORY_METRICS:
        t, y = d.samples["t"][post], d.sample(col)[post]
        ok = np.isfinite(y)
        if ok.any():
            out.append(_judge_memory_metric(ctx, name, title, t[ok], y[ok], w))
        else:
            out.append(server.memory_missing(d.meta, name, title, thr, gpu_any))
    return out


def judge_server_queue(ctx: _Ctx) -> list[CriterionResult]:
    """``server_queue``: the server's waiting requests and KV-cache use may not keep rising
    (per-window medians, the trend rule of frame age); none for an in-process model."""
    d, c = ctx.data, ctx.crit
    if not server.is_served(d.meta):
        return []
    w, _note = floor_window_s(ctx.span, c.floor_window_s)
    calls: list[tuple[server.QueueSeries, _TrendCall, stats.Trend]] = []
    ev: dict[str, Any] = {"window_s": w, "metrics": {}}
    for q in server.queue_series(d, ctx.t0, c.max_server_queue_slope_per_min,
                                 c.max_kv_cache_slope_per_min):  # fmt: skip
        win = stats.window_reduce(q.t, q.y, w, t0=ctx.t0, t1=ctx.t1)
        has = win.nonempty()
        tr = stats.trend(win.t[has], win.median[has], c.alpha)
        call = _call_trend(tr, win.t[has], win.median[has], c.alpha, q.threshold / 60)
        ctx.series[f"{server.QUEUE}:{q.metric}"] = win
        calls.append((q, call, tr))
        ev["metrics"][q.metric] = {
            "median": float(np.median(q.y)) if q.y.size else None,
            "max": float(q.y.max()) if q.y.size else None,
            "threshold_per_min": q.threshold,
            "decided_by": call.how,
            **_trend_fields(tr, 60.0),
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


def _queue_detail(ctx: _Ctx, q: server.QueueSeries, call: _TrendCall, tr: stats.Trend) -> str:
    slope = f"{tr.slope * 60:+.3g} {q.unit}"
    if call.how == "rising":
        return f"{q.metric} rising {slope} (p = {tr.p:.2g}): the server falls behind"
    if call.how == "untested":
        return f"untested: {q.metric} has too few windows for a trend test; run longer"
    if call.how == "bounded" and call.bound is not None:
        return f"{q.metric}: too few windows for a test, their range allows {call.bound * 60:.3g}"
    return f"{q.metric} median {float(np.median(q.y)):.3g}, slope {slope} (p = {tr.p:.2g})"


def judge_gpu_devices(ctx: _Ctx) -> list[CriterionResult]:
    """``memory_gpu[i]`` for each GPU sampled apart (soakd.analysis.devices): the rule of
    ``memory_gpu`` on that GPU's used memory; none for a run on one GPU."""
    w, _note = floor_window_s(ctx.span, ctx.crit.floor_window_s)
    thr = ctx.crit.max_memory_growth_mb_per_min
    return [
        _judge_memory_metric(ctx, s.name, s.title, s.t, s.y, w)
        if s.y.size
        else devices.unreported(s, thr)
        for s in devices.memory_series(ctx.data, ctx.t0)
    ]


def _memory_limit(ctx: _Ctx, name: str) -> tuple[float, str, float] | None:
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


def _hours_left(ctx: _Ctx, res: CriterionResult, headroom: float) -> float | None:
    """Hours until ``headroom`` bytes are gone at the metric's floor slope: infinite for a
    flat floor (no significant rise), the bound's rate when only a bound was possible,
    None when untested."""
    tr = ctx.trends.get(res.criterion)
    how = res.evidence.get("decided_by")
    if tr is None or how == "untested":
        return None
    if how == "bounded":
        per_s = float(res.evidence["bound_slope"]) * MIB / 60
    elif tr.p < ctx.crit.alpha and tr.slope > 0:
        per_s = tr.slope
    else:
        return math.inf
    if per_s <= 0:
        return math.inf
    return max(headroom, 0.0) / per_s / 3600


def _headroom_metrics(
    ctx: _Ctx, memory: Sequence[CriterionResult]
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
        }
        if hours is None:
            untested.append(res.criterion)
    return per_metric, untested


def judge_headroom(ctx: _Ctx, memory: Sequence[CriterionResult]) -> CriterionResult:
    """Time to exhaustion at the measured floor slope against the headroom left (limit -
    peak used), for each memory metric with a known limit; FAIL when the shortest is under
    ``min_headroom_hours``, INVALID when a metric with a limit could not be tested."""
    thr = ctx.crit.min_headroom_hours
    title = "Memory headroom"
    per_metric, untested = _headroom_metrics(ctx, memory)
    ev: dict[str, Any] = {"metrics": per_metric, "min_headroom_hours": thr}
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
    if worst and value is not None and value < thr:
        m = finite[worst]
        status = FAIL
        detail = (
            f"{worst}: {m['headroom_mb']:.0f} MB left of {m['limit_mb']:.0f} MB "
            f"({m['limit_source']}) gone in {value:.3g} h at the floor slope"
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


def _memory_missing(
    ctx: _Ctx, name: str, col: str, title: str, thr: float, gpu_any: bool
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


def judge_oom(ctx: _Ctx) -> CriterionResult:
    d = ctx.data
    n_events = int(d.event_counts.get("oom", 0))
    ooms = d.sample("torch_ooms")
    ooms = ooms[np.isfinite(ooms)]
    rise = float(ooms.max() - ooms.min()) if ooms.size else 0.0
    n = max(n_events, int(rise))
    status = FAIL if n > 0 else PASS
    detail = (
        f"{n_events} out-of-memory event(s), torch num_ooms rose by {rise:.0f}"
        if n
        else "no out-of-memory errors"
    )
    return CriterionResult(
        criterion="oom",
        title="No out-of-memory",
        status=status,
        value=float(n),
        threshold=0.0,
        unit="count",
        detail=detail,
        evidence={"oom_events": n_events, "torch_ooms_rise": rise},
    )


def _presentation_source(ctx: _Ctx) -> tuple[str, np.ndarray, np.ndarray, np.ndarray] | None:
    """A rollout's waits between visible updates (``criteria.generator_interval =
    "presentation"``, chunks.judged_intervals): the stalls a viewer sees, by chunk."""
    iv = judged_intervals(ctx.data, ctx.t0, "presentation")
    return ("presentation_ms", iv.ms, iv.frame_id, iv.t) if iv.n else None


def _jitter_source(ctx: _Ctx) -> tuple[str, np.ndarray, np.ndarray, np.ndarray] | None:
    """(column, values, frame ids, times) the jitter criterion judges: a rollout's waits
    between visible updates (or, ``generator_interval = "per_frame"``, its chunk times:
    each chunk is a row), else infer or output latency, else a generator's intervals."""
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
            return col, y[keep], fid, d.frames["t_capture"][ok][keep]
    if d.meta.generates:
        t, iv = _generator_intervals(d, ctx.t0)
        if iv.size:
            return "interval_ms", iv, np.arange(iv.size, dtype=np.float64), t
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
    ctx: _Ctx, over: tuple[np.ndarray, np.ndarray, np.ndarray], kth: float, n: int, med: float
) -> dict[str, Any]:
    """Frames over k x median (``over``: their values, frame ids and times, among ``n``):
    how many, how many the rule allows, when (first / last t), whether they recur at
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


def _jitter_detail(col: str, mx: float, med: float, ratio: float, ex: dict[str, Any]) -> str:
    stage = col.removesuffix("_ms")
    base = f"{stage} max {mx:.4g} ms = {ratio:.3g} x median {med:.4g} ms"
    n = ex["exceed_count"]
    if not n:
        return f"{base}; no frame over k x median"
    when = f"{ex['exceed_first_t']:.4g} s" + (f" to {ex['exceed_last_t']:.4g} s" if n > 1 else "")
    recur = f", recurring every {ex['exceed_period']} frames" if ex["exceed_periodic"] else ""
    return f"{base}; {n} frame(s) over k x median at {when}{recur} (allowed {ex['exceed_allowed']})"


def judge_jitter(ctx: _Ctx, history: Sequence[float]) -> CriterionResult:
    """Stage time spikes against k x median. ``jitter_rule = "count"`` (default): FAIL when
    more frames exceed k x median than allowed (``jitter_max_exceed``, or the
    ``jitter_max_exceed_fraction`` share of frames if more), or when 4 or more exceed at
    regular positions; ``"max"``: FAIL when the max alone exceeds it (the seed's rule)."""
    d, c = ctx.data, ctx.crit
    k, k_note = resolve_jitter_k(c, history)
    title = "Infer jitter"
    if d.meta.shape == "rollout":
        by_wait = c.generator_interval == "presentation"
        title = "Presentation interval jitter" if by_wait else "Chunk time jitter"
    dg = ctx.digest
    src = None if dg else _jitter_source(ctx)
    if (dg.jitter is None) if dg else (src is None):
        if d.meta.shape == "session":
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
    if dg and dg.jitter:
        j = dg.jitter
        col, levels, tail = j.column, j.levels, j.tail
        ex = _exceedances(ctx, j.over, j.kth, j.n, levels["median_ms"])
    elif src is not None:
        col, y, fid, t = src
        levels = {
            "median_ms": float(np.median(y)),
            "max_ms": float(y.max()),
            "p99_ms": float(np.percentile(y, 99)),
            "max_frame_id": float(fid[int(np.argmax(y))]),
        }
        over = y > k * levels["median_ms"]
        kth = float(np.sort(y)[::-1][min(jitter_allowed(c, y.size), y.size - 1)])
        ex = _exceedances(ctx, (y[over], fid[over], t[over]), kth, y.size, levels["median_ms"])
        tail = _tail(y, fid)
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
        "max_frame_id": levels["max_frame_id"],
        **tail,
        "history_runs": len(history),
        **ex,
    }
    warnings = [k_note] if c.jitter_k == "history" and "default" in k_note else []
    robust = ex["robust_ratio"] if ex["robust_ratio"] is not None else math.inf
    recurrent = ex["exceed_count"] >= 4 and ex["exceed_periodic"]
    status = FAIL if robust > k or recurrent else PASS
    # value: the ratio the rule judged (the max for "max"), so history learns the same
    value = ratio if c.jitter_rule == "max" else robust
    return CriterionResult(
        criterion="jitter",
        title=title,
        status=status,
        value=value if math.isfinite(value) else None,
        threshold=k,
        unit="x median",
        detail=_jitter_detail(col, mx, med, ratio, ex),
        evidence=ev,
        warnings=warnings,
    )


def judge_errors(ctx: _Ctx) -> CriterionResult:
    d, c, dg = ctx.data, ctx.crit, ctx.digest
    err = d.frame("has_error") > 0
    n_post = dg.counters.err_post if dg else int((err & ctx.post).sum())
    n_warm = dg.counters.err_warm if dg else int((err & ~ctx.post).sum())
    ev: dict[str, Any] = {
        "errors": n_post,
        "warmup_errors": n_warm,
        "messages": [{"message": m, "count": n} for m, n in d.error_messages],
    }
    warnings = [f"{n_warm} error(s) during warm-up (not judged)"] if n_warm else []
    status = FAIL if n_post > c.max_errors else PASS
    detail = f"{n_post} frame(s) raised after warm-up"
    if n_post and d.error_messages:
        detail += f", e.g. {d.error_messages[0][0][:120]}"
    return CriterionResult(
        criterion="errors",
        title="Errors",
        status=status,
        value=float(n_post),
        threshold=float(c.max_errors),
        unit="count",
        detail=detail,
        evidence=ev,
        warnings=warnings,
    )


# --------------------------------------------------------------------------- judge


def judge(data: RunData, criteria: CriteriaSettings, history: Sequence[float] = ()) -> Verdict:
    """Judge a run against ``criteria``. ``history``: jitter ratios (max/median) of earlier
    passing runs of the same config on this host, newest first (used when
    ``jitter_k = "history"``).

    A run whose rows stayed in the store (``data.source``: too long to load) is streamed
    into a ``digest.FrameDigest`` first and judged by the same criteria on it."""
    dg = None
    if data.source is not None:
        dg = digest_run(data, criteria, resolve_jitter_k(criteria, history)[0])
        data = dg.view
    t0 = dg.t0 if dg else data.warmup_end()
    t1 = dg.t1 if dg else data.window_end(t0)
    post = data.post_warmup(t0)
    measured = data.measured(t0)
    ctx = _Ctx(data, criteria, t0, t1, measured, post, {}, {}, dg)
    thresholds = judge_thresholds(data, criteria, dg)
    results = [
        judge_run_validity(ctx),
        judge_drops(ctx),
        judge_frame_age(ctx),
        *judge_memory(ctx),
        *judge_gpu_devices(ctx),
        judge_jitter(ctx, history),
        judge_errors(ctx),
        *judge_server_queue(ctx),
        *judge_generator(data, criteria, t0, t1),
        *thresholds,
    ]
    status, code, reason = _overall(results, ended_by_threshold(data, thresholds))
    warnings = [w for r in results for w in r.warnings]
    v = Verdict(
        run_id=data.meta.run_id,
        status=status,
        exit_code=code,
        reason=reason,
        criteria=results,
        warnings=warnings,
        window={
            "t0": t0,
            "t1": t1,
            "measured_frames": dg.n_measured if dg else int(measured.sum()),
        },
        series=ctx.series,
        trends=ctx.trends,
    )
    v.hints = diagnose(data, v, criteria)  # on a digest's view: the loss hints only
    if dg:
        v.frame_summary = dg.frame_summary()
        v.warnings += dg.notes
    return v


def _overall(
    results: Sequence[CriterionResult], cut: CriterionResult | None = None
) -> tuple[str, ExitCode, str]:
    """INVALID beats FAIL beats PASS, except that a run ended early by its failing
    abort_on_fail threshold ``cut`` is FAIL (the rest was cut short by that failure)."""
    if cut is not None:
        return OVERALL_FAIL, ExitCode.FAIL, f"{cut.criterion}: {cut.detail} (abort_on_fail)"
    invalid = [r for r in results if r.status == INVALID]
    failed = [r for r in results if r.status == FAIL]
    if invalid:
        return (
            OVERALL_INVALID,
            ExitCode.INVALID,
            "; ".join(f"{r.criterion}: {r.detail}" for r in invalid),
        )
    if failed:
        return OVERALL_FAIL, ExitCode.FAIL, "; ".join(f"{r.criterion}: {r.detail}" for r in failed)
    return OVERALL_PASS, ExitCode.PASS, "every applicable criterion passed"

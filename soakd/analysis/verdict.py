"""Judging a run: ``judge(data, criteria, history) -> Verdict``.

Pure: RunData and the ``[criteria]`` settings in, a Verdict out. docs/verdict.md explains
every criterion, its default and why, and the INVALID / n/a rules. In short:

* every statistic uses the post-warm-up window; frames skipped as stale are counted as
  losses but never timed;
* trend criteria (frame age, memory floors, drop rate) FAIL only when the Theil–Sen slope is
  above the tolerance *and* the autocorrelation-corrected Mann–Kendall test is significant
  at ``alpha``; each reports the smallest slope the run could have detected and warns when
  the threshold is below it;
* INVALID beats FAIL beats PASS; a criterion that cannot apply (no GPU) is ``n/a``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from soakd.analysis import stats
from soakd.analysis.diagnosis import diagnose
from soakd.analysis.model import (
    FAIL,
    INVALID,
    MIB,
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
)
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

MEMORY_METRICS: tuple[tuple[str, str, str], ...] = (
    ("memory_rss", "rss_bytes", "Process RSS"),
    ("memory_gpu", "gpu_mem_used_bytes", "GPU memory used"),
    ("memory_gpu_proc", "gpu_proc_mem_bytes", "This process's GPU memory"),
    ("memory_torch_reserved", "torch_reserved_bytes", "Torch allocator reserved"),
)


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
    if not math.isfinite(mds):
        return [f"too few windows to test {what} for a trend"]
    return []


# --------------------------------------------------------------------------- criteria


def judge_run_validity(ctx: _Ctx) -> CriterionResult:
    d, c = ctx.data, ctx.crit
    n_meas = int(ctx.measured.sum())
    dur = _f(d.meta.duration_s)
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
            f"run lasted {dur:.3g} s, shorter than min_duration_s = {c.min_duration_s:g} s"
        )
    if n_meas < c.min_frames:
        problems.append(f"{n_meas} post-warm-up frames, fewer than min_frames = {c.min_frames}")
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
    rates = np.full(len(win.t), np.nan)
    for i in range(len(win.t)):
        if win.count[i] == 0:
            continue
        lost_i = win.max[i] - prev_lost
        drop_i = dwin.max[i] - prev_drop
        cap_i = win.count[i] + max(drop_i, 0.0)
        rates[i] = max(lost_i, 0.0) / cap_i if cap_i else np.nan
        prev_lost, prev_drop = win.max[i], dwin.max[i]
    return stats.Windows(win.t, win.count, rates, rates, rates, w)


def judge_drops(ctx: _Ctx) -> CriterionResult:
    d, c = ctx.data, ctx.crit
    title = "Drop growth"
    post = ctx.post
    if not post.any():
        return CriterionResult.invalid(
            "drops",
            title,
            threshold=c.max_drop_fraction,
            unit="fraction",
            detail="no post-warm-up frames",
        )
    lost_cum, drop, base, (n_drop, n_stale, n_sess) = _loss_counters(d, post)
    rows = int(post.sum())
    captured = rows + n_drop
    frac = (n_drop + n_stale + n_sess) / captured if captured else 0.0
    w = age_window_s(ctx.span, d.meta.fps)
    rates = _loss_rates(ctx, lost_cum[post], drop[post], w, sum(base), base[0])
    ctx.series["drop_rate"] = rates
    tr = stats.trend(rates.t, rates.median, c.alpha)
    ctx.trends["drop_rate"] = tr
    end_rate = tr.intercept + tr.slope * ctx.t1 if math.isfinite(tr.intercept) else None
    accelerating = tr.z > 0 and tr.p < c.alpha and tr.slope > 0
    ev: dict[str, Any] = {
        "dropped": n_drop,
        "stale": n_stale,
        "session_dropped": n_sess,
        "captured": captured,
        "dispatched_rows": rows,
        "window_s": w,
        "accelerating": accelerating,
        "rate_at_end": end_rate,
        "rate_trend": _trend_fields(tr, 60.0),
    }
    over_end = accelerating and end_rate is not None and end_rate > c.max_drop_fraction
    status = FAIL if frac > c.max_drop_fraction or over_end else PASS
    by_session = f", {n_sess:.0f} dropped by the session" if n_sess else ""
    detail = (
        f"{n_drop + n_stale + n_sess:.0f} of {captured:.0f} frames lost "
        f"({n_drop:.0f} dropped, {n_stale:.0f} stale{by_session})"
    )
    if accelerating:
        detail += f"; drop rate rising, {end_rate:.1%} by the end" if end_rate else ""
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
    is not the first of its request, post-warm-up."""
    e = d.emissions
    if len(e["t_emit"]) == 0:
        return np.empty(0), np.empty(0)
    fid, chunk, idx = e["frame_id"], e["chunk"], e["idx"]
    new_chunk = np.ones(len(fid), dtype=bool)
    new_chunk[1:] = (fid[1:] != fid[:-1]) | (chunk[1:] != chunk[:-1])
    keep = new_chunk & (idx > 0) & (e["t_emit"] >= t0) & np.isfinite(e["interval_ms"])
    return e["t_emit"][keep], e["interval_ms"][keep]


def _age_series(ctx: _Ctx) -> tuple[str, str, str, np.ndarray, np.ndarray]:
    """(criterion, title, what, t, y) of the age criterion: frame age on the dispatch axis,
    or a generator's output intervals."""
    d = ctx.data
    if d.meta.shape == "generator":
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


def judge_frame_age(ctx: _Ctx) -> CriterionResult:
    d, c = ctx.data, ctx.crit
    generator = d.meta.shape == "generator"
    name, title, what, t, y = _age_series(ctx)
    ok = np.isfinite(y)
    thr = c.max_age_slope_ms_per_min
    if not ok.any():
        return CriterionResult.invalid(
            name,
            title,
            threshold=thr,
            unit="ms/min",
            detail=f"no {'intervals' if generator else 'frame ages'} measured",
        )
    t, y = t[ok], y[ok]
    # windows hold ~10 values: of frames for frame age, of intervals for a generator (many
    # intervals per request, so the request rate would make the windows far too long)
    rate = y.size / ctx.span if generator and ctx.span > 0 else d.meta.fps
    w = age_window_s(ctx.span, rate)
    win = stats.window_reduce(t, y, w, t0=ctx.t0, t1=ctx.t1)
    ctx.series[name] = win
    has = win.nonempty()
    tr = stats.trend(win.t[has], win.median[has], c.alpha)
    ctx.trends[name] = tr
    p95 = float(np.percentile(y, 95))
    med = float(np.median(y))
    ev: dict[str, Any] = {
        "median_ms": med,
        "p95_ms": p95,
        "max_ms": float(y.max()),
        "window_s": w,
        **_trend_fields(tr, 60.0),
    }
    if generator:
        ev.update(_first_emit_evidence(ctx))
    warnings = _detectability(ctx, tr, 60.0, thr, what, "ms/min")
    slope = tr.slope * 60
    rising = tr.rising(c.alpha, thr / 60)
    problems = []
    if rising:
        problems.append(f"rising {slope:.3g} ms/min (p = {tr.p:.2g})")
    if c.max_age_p95_ms is not None:
        ev["max_age_p95_ms"] = c.max_age_p95_ms
        if p95 > c.max_age_p95_ms:
            problems.append(f"p95 {p95:.4g} ms over {c.max_age_p95_ms:g} ms")
    status = FAIL if problems else PASS
    detail = (
        "; ".join(problems)
        if problems
        else (f"median {med:.4g} ms, slope {slope:+.3g} ms/min (p = {tr.p:.2g})")
    )
    return CriterionResult(
        criterion=name,
        title=title,
        status=status,
        value=slope,
        threshold=thr,
        unit="ms/min",
        detail=detail,
        evidence=ev,
        warnings=warnings,
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
        t, y = t[ok], y[ok]
        win = stats.window_reduce(t, y, w, t0=ctx.t0, t1=ctx.t1, medians=False)
        ctx.series[name] = win
        has = win.nonempty()
        tr = stats.trend(win.t[has], win.floor[has], c.alpha)
        ctx.trends[name] = tr
        per = 60.0 / MIB
        slope = tr.slope * per
        warnings = _detectability(ctx, tr, per, thr, "leaks", "MB/min")
        if short_note:
            warnings.insert(0, short_note)
        floors = win.floor[has]
        ev: dict[str, Any] = {
            "floor_window_s": w,
            "first_floor_mb": float(floors[0] / MIB),
            "last_floor_mb": float(floors[-1] / MIB),
            "peak_mb": float(y.max() / MIB),
            "sawtooth": _sawtooth(t, y),
            **_trend_fields(tr, per),
        }
        rising = tr.rising(c.alpha, thr / per)
        status = FAIL if rising else PASS
        detail = (
            f"floor rising {slope:.3g} MB/min (p = {tr.p:.2g})"
            if rising
            else f"floor slope {slope:+.3g} MB/min (p = {tr.p:.2g}), peak {ev['peak_mb']:.0f} MB"
        )
        out.append(
            CriterionResult(
                criterion=name,
                title=title,
                status=status,
                value=slope,
                threshold=thr,
                unit="MB/min",
                detail=detail,
                evidence=ev,
                warnings=warnings,
            )
        )
    out.append(judge_oom(ctx))
    return out


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


def _jitter_source(ctx: _Ctx) -> tuple[str, np.ndarray, np.ndarray] | None:
    d = ctx.data
    ok = ctx.measured & (d.frame("has_error") == 0)
    for col in ("infer_ms", "output_latency_ms"):
        y = d.frame(col)[ok]
        if np.isfinite(y).any():
            fid = d.frames["frame_id"][ok]
            keep = np.isfinite(y)
            return col, y[keep], fid[keep]
    if d.meta.shape == "generator":
        _, iv = _generator_intervals(d, ctx.t0)
        if iv.size:
            return "interval_ms", iv, np.arange(iv.size, dtype=np.float64)
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


def judge_jitter(ctx: _Ctx, history: Sequence[float]) -> CriterionResult:
    d, c = ctx.data, ctx.crit
    k, k_note = resolve_jitter_k(c, history)
    title = "Infer jitter"
    src = _jitter_source(ctx)
    if src is None:
        if d.meta.shape == "session":
            return CriterionResult.na(
                "jitter",
                title,
                threshold=k,
                unit="x median",
                detail="not applicable: the session model hides its stages",
            )
        return CriterionResult.invalid(
            "jitter", title, threshold=k, unit="x median", detail="no infer timings after warm-up"
        )
    col, y, fid = src
    med = float(np.median(y))
    mx = float(y.max())
    ratio = mx / med if med > 0 else (1.0 if mx == 0 else math.inf)
    cut = stats.robust_tail_threshold(y)
    tail_pos = fid[y > cut]
    per = stats.tail_periodicity(tail_pos)
    ev: dict[str, Any] = {
        "source": col,
        "median_ms": med,
        "max_ms": mx,
        "p99_ms": float(np.percentile(y, 99)),
        "k": k,
        "k_source": k_note,
        "max_frame_id": float(fid[int(np.argmax(y))]),
        "tail_cut_ms": cut,
        "tail_frames": int(tail_pos.size),
        "tail_periodic": per.regular,
        "tail_period": per.period,
        "tail_score": per.score,
        "history_runs": len(history),
    }
    warnings = [k_note] if c.jitter_k == "history" and "default" in k_note else []
    status = FAIL if ratio > k else PASS
    detail = f"{col.removesuffix('_ms')} max {mx:.4g} ms = {ratio:.3g} x median {med:.4g} ms"
    return CriterionResult(
        criterion="jitter",
        title=title,
        status=status,
        value=ratio if math.isfinite(ratio) else None,
        threshold=k,
        unit="x median",
        detail=detail,
        evidence=ev,
        warnings=warnings,
    )


def judge_errors(ctx: _Ctx) -> CriterionResult:
    d, c = ctx.data, ctx.crit
    err = d.frame("has_error") > 0
    n_post = int((err & ctx.post).sum())
    n_warm = int((err & ~ctx.post).sum())
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
    ``jitter_k = "history"``)."""
    t = data.frames["t_capture"]
    t0 = data.warmup_end()
    t1 = float(t.max()) if t.size else t0
    st = data.samples["t"]
    if st.size:
        t1 = max(t1, float(st.max()))
    warm = data.frames["warmup"] > 0
    post = ~warm & (t >= t0) if t.size else np.zeros(0, dtype=bool)
    measured = post & (data.frames["skipped"] == 0)
    ctx = _Ctx(data, criteria, t0, t1, measured, post, {}, {})
    results = [
        judge_run_validity(ctx),
        judge_drops(ctx),
        judge_frame_age(ctx),
        *judge_memory(ctx),
        judge_jitter(ctx, history),
        judge_errors(ctx),
    ]
    status, code, reason = _overall(results)
    warnings = [w for r in results for w in r.warnings]
    v = Verdict(
        run_id=data.meta.run_id,
        status=status,
        exit_code=code,
        reason=reason,
        criteria=results,
        warnings=warnings,
        window={"t0": t0, "t1": t1, "measured_frames": int(measured.sum())},
        series=ctx.series,
        trends=ctx.trends,
    )
    v.hints = diagnose(data, v, criteria)
    return v


def _overall(results: Sequence[CriterionResult]) -> tuple[str, ExitCode, str]:
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

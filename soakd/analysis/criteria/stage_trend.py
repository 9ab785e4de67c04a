"""Stage-time trend: a stage (grab, preprocess, infer, decode) whose window floors or medians
rise significantly over ``max_stage_slope_ms_per_min`` and would use up the frame budget
(1000 / fps, less the time the frame takes now) within ``criteria.horizon``. Judged like the
memory floors: per window, Theil–Sen slope, the autocorrelation-corrected trend test; and,
like them, asked while the run goes (``early_fail``, ``run.stop_on_fail``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from soakd.analysis import contention as host
from soakd.analysis import stats
from soakd.analysis.criteria.base import (
    Context,
    EarlyFail,
    Live,
    call_trend,
    look_window,
    span_to_decide,
    span_to_test,
)
from soakd.analysis.data import make_run_data
from soakd.analysis.model import (
    FAIL,
    INVALID,
    MAX_WINDOWS,
    NA,
    PASS,
    CriterionResult,
    RunMeta,
)
from soakd.config import CriteriaSettings
from soakd.records import STAGE_COLUMNS

TITLE = "Stage time trend"
#: the per-window statistics judged for each stage: the floor (what the stage needs at
#: least) and the median (what it usually takes)
STATS = ("floor", "median")


def _stage_series(ctx: Context) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each stage with measured times: (dispatch time, ms) of the measured frames."""
    d = ctx.data
    m = ctx.measured
    age = d.frame("frame_age_ms")[m]
    t = d.frames["t_capture"][m] + np.where(np.isfinite(age), age, 0.0) / 1000.0
    out = {}
    for col in STAGE_COLUMNS:
        if col == "total_ms":
            continue  # the frame's time, not a stage: the budget it leaves is judged
        y = d.frame(col)[m]
        ok = np.isfinite(y)
        if ok.sum() >= 3:
            out[col] = (t[ok], y[ok])
    return out


#: frames in a stage window at least: a floor and a median of a few frames, and windows
#: enough in a short run for the trend test
WINDOW_FRAMES = 5


def stage_window_s(span: float, fps: float) -> float:
    """The stage windows: ``WINDOW_FRAMES`` frames, longer when the run would have more than
    MAX_WINDOWS of them."""
    return max(WINDOW_FRAMES / fps, span / MAX_WINDOWS)


def _budget_left(ctx: Context, budget: float) -> float:
    """The frame budget the frames do not use yet: budget minus the median total time of
    the last tenth of the measured frames."""
    total = ctx.data.frame("total_ms")[ctx.measured]
    total = total[np.isfinite(total)]
    if not total.size:
        return budget
    last = total[-max(1, total.size // 10) :]
    return budget - float(np.median(last))


def judge_stage_trend(ctx: Context, window_s: float | None = None) -> list[CriterionResult]:
    """FAIL when a stage's window floors or medians rise significantly (each test at alpha
    over the number of tests, so the criterion's false-FAIL rate stays under alpha) over
    the tolerance and would exhaust the budget left within the horizon; n/a when a stage's
    trend could not be tested nor bounded under the tolerance (frame_age judges whether
    the run is long enough for its timing). ``window_s``: the stage window (default
    ``stage_window_s``; a running look's are longer, ``early_fail``)."""
    d, c = ctx.data, ctx.crit
    tol = c.max_stage_slope_ms_per_min
    fps = d.meta.fps
    series = _stage_series(ctx)
    if d.meta.generates or not fps or not series or ctx.digest is not None:
        return _not_applicable(ctx, tol, series)
    budget = 1000.0 / fps
    left = _budget_left(ctx, budget)
    alpha = c.alpha / (len(STATS) * len(series))
    w = window_s if window_s is not None else stage_window_s(ctx.span, fps)
    rows: dict[str, dict[str, Any]] = {}
    worst: tuple[float, str] | None = None  # (hours to exhaustion, stage stat)
    open_: list[str] = []
    for col, (t, y) in series.items():
        win = stats.window_reduce(t, y, w, t0=ctx.t0, t1=ctx.t1)
        has = win.nonempty()
        for stat in STATS:
            vals = getattr(win, stat)[has]
            tr = stats.trend(win.t[has], vals, alpha)
            call = call_trend(tr, win.t[has], vals, alpha, tol / 60)
            key = f"{col} {stat}"
            slope = tr.slope * 60
            hours = max(left, 0.0) / slope / 60 if slope > 0 else math.inf
            rows[key] = {"slope": slope, "p_value": tr.p, "decided_by": call.how,
                         "hours_to_budget": hours if math.isfinite(hours) else None}  # fmt: skip
            if tr.p < alpha and slope > 0 and hours * 3600 <= c.horizon:
                rows[key]["certain"] = True  # significant, toward the budget in the horizon
            if call.status == FAIL and hours * 3600 <= c.horizon:
                if worst is None or hours < worst[0]:
                    worst = (hours, key)
            elif call.status == INVALID:  # untested, or undecided: over tol, not significant
                open_.append(key)
                rows[key]["span_to_test_s"] = span_to_decide(ctx, tr, 60.0, tol) or span_to_test(
                    ctx, tr, w
                )
    ev: dict[str, Any] = {"budget_ms": budget, "budget_left_ms": left, "window_s": w,
                          "alpha_per_test": alpha, "horizon_h": c.horizon / 3600,
                          "stages": rows}  # fmt: skip
    return [_result(ctx, tol, rows, worst, open_, ev)]


def _result(
    ctx: Context,
    tol: float,
    rows: dict[str, dict[str, Any]],
    worst: tuple[float, str] | None,
    open_: list[str],
    ev: dict[str, Any],
) -> CriterionResult:
    steepest = max(rows, key=lambda k: rows[k]["slope"])
    value = rows[steepest]["slope"]
    budget, left = ev["budget_ms"], ev["budget_left_ms"]
    if worst is not None:
        hours, key = worst
        r = rows[key]
        stage = key.split("_ms")[0]
        detail = (
            f"stage {stage} slows down: its window {key.split()[1]}s rise {r['slope']:.3g} "
            f"ms/min (p = {r['p_value']:.2g}); "
            + (
                f"the {left:.3g} ms left of the {budget:.3g} ms frame budget (1000 / fps) is "
                f"gone in {_hours(hours)}, within the horizon ({ev['horizon_h']:.3g} h)"
                if left > 0
                else f"the frames already take longer than the {budget:.3g} ms frame budget"
            )
        )
        busy = _contended_share(ctx)
        if busy is not None:  # the host, not only the model, may have slowed the stage
            ev["contended_share"] = busy
            return _row(INVALID, rows[key]["slope"], tol, _contended_words(ctx, busy, detail), ev)
        return _row(FAIL, rows[key]["slope"], tol, detail, ev)
    if open_:
        # n/a, not INVALID: a run this short has its timing judged by frame_age's own
        # rules; this criterion only adds the stage that slows (docs/verdict.md)
        return _row(NA, value, tol, _open_detail(ctx, tol, rows, open_, ev["alpha_per_test"]), ev)
    res = _row(PASS, value, tol, "", ev)
    res.warnings = [
        f"stage_trend: {k} rises {r['slope']:.3g} ms/min for certain (p = {r['p_value']:.2g}), "
        f"under the tolerance {tol:g} ms/min: the {left:.3g} ms left of the {budget:.3g} ms "
        f"frame budget is gone in {_hours(r['hours_to_budget'])}, within the horizon"
        for k, r in rows.items()
        if r.get("certain")
    ]
    res.detail = (
        f"no stage rises over {tol:g} ms/min toward the {budget:.3g} ms frame budget "
        f"({left:.3g} ms left); steepest: {steepest} {value:+.3g} ms/min "
        f"(p = {rows[steepest]['p_value']:.2g})"
    )
    return res


def _open_detail(
    ctx: Context, tol: float, rows: dict[str, dict[str, Any]], open_: list[str], alpha: float
) -> str:
    """Why no stage could be judged: too few windows (untested), or a rise over ``tol``
    the test could not confirm (undecided), with the run length that would decide."""
    need = max(rows[k]["span_to_test_s"] for k in open_)
    undecided = [k for k in open_ if rows[k]["decided_by"] == "undecided"]
    untested = [k for k in open_ if k not in undecided]
    why = []
    if untested:
        why.append(
            f"untested, {', '.join(untested)} cannot show a stage slowing down (too few "
            f"windows, and their range allows more than {tol:g} ms/min)"
        )
    if undecided:
        why.append(
            "undecided, "
            + ", ".join(
                f"{k} {rows[k]['slope']:+.3g} ms/min (p = {rows[k]['p_value']:.2g})"
                for k in undecided
            )
            + f" over {tol:g} ms/min but not significant (alpha = {alpha:.2g} a test)"
        )
    return (
        f"not applicable: {'; '.join(why)}; run at least {need:.0f} s after the warm-up "
        f"(run.duration >= {ctx.t0 + need:.0f} s)"
    )


#: the share of the measured window other processes may hold the CPUs before a stage
#: slowing down cannot be told from the host slowing it
CONTENDED_SHARE = 0.1


def _contended_share(ctx: Context) -> float | None:
    """The share of the measured window's telemetry ticks that were contended (other
    processes held ``criteria.contended_cpu_pct`` % of the host's CPUs or more:
    soakd.analysis.contention), when over ``CONTENDED_SHARE`` (None: a quiet host, no host
    samples, or the rule off at 100)."""
    h = host.ticks(ctx.data, ctx.t0, ctx.t1, ctx.crit.contended_cpu_pct)
    share = h.share() if h is not None else 0.0
    return share if share > CONTENDED_SHARE else None


def _contended_words(ctx: Context, share: float, detail: str) -> str:
    return (
        f"the host was contended: other processes held >= {ctx.crit.contended_cpu_pct:g} % "
        f"of the CPUs in {share:.0%} of the measured window, so a stage slowing down is not "
        f"the model's alone; soak on a quiet host or pin CPUs ({detail})"
    )


def _hours(h: float) -> str:
    return f"{h * 60:.3g} min" if h < 1 else f"{h:.3g} h"


def _row(status: str, value: float, tol: float, detail: str, ev: dict[str, Any]) -> CriterionResult:
    return CriterionResult(
        criterion="stage_trend",
        title=TITLE,
        status=status,
        value=value,
        threshold=tol,
        unit="ms/min",
        detail=detail,
        evidence=ev,
    )


def _not_applicable(
    ctx: Context, tol: float, series: dict[str, tuple[np.ndarray, np.ndarray]]
) -> list[CriterionResult]:
    d = ctx.data
    if d.meta.generates:
        why = "a frame generator is judged on its output intervals"
    elif not d.meta.fps:
        why = "no target frame rate, so no frame budget"
    elif ctx.digest is not None:
        why = "a run streamed from the store (too long to load) keeps no stage windows"
    else:
        why = "no stage times measured"
    return [
        CriterionResult.na(
            "stage_trend", TITLE, threshold=tol, unit="ms/min", detail=f"not applicable: {why}"
        )
    ]


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return judge_stage_trend(ctx)


#: seconds between two looks at the stage times while a run goes
LOOK_EVERY_S = 10.0


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """A stage slowing toward the frame budget, by the verdict's own rule
    (``judge_stage_trend``, at most LOOK_MAX_WINDOWS windows) on the stage times so far
    (``Live.frames``), at this look's share of alpha (``criteria.base.look_alpha``, over
    the planned run; divided over the stages' tests as the verdict divides it): a FAIL
    now is a rise significant at the alpha the looks may spend by now. Not for a generator
    (judged on output intervals), nor once a tick since the warm-up saw the host contended
    (``contention.withholds_looks``): the host may have slowed the stage, and the verdict
    judges that."""
    if live.generates or live.frames is None or not live.fps:
        return None
    if host.withholds_looks(live.contended_ticks):
        return None
    alpha = live.look("stage_trend", LOOK_EVERY_S, crit.alpha)
    if alpha is None or live.t0 is None:
        return None
    cols = live.frames.snapshot()
    t = cols.pop("t")
    if t.size < 3:
        return None
    frames = {"t_capture": t, "frame_age_ms": np.zeros(t.size), **cols}  # dispatched at t
    data = make_run_data(RunMeta("live", fps=live.fps), frames=frames)
    every = np.ones(t.size, dtype=bool)
    look = crit.model_copy(update={"alpha": alpha})
    ctx = Context(data, look, live.t0, live.now, every, every, {}, {})
    window = look_window(ctx.span, stage_window_s(ctx.span, live.fps))
    [res] = judge_stage_trend(ctx, window)
    if res.status != FAIL:
        return None
    at = f"alpha {alpha:.2g} at {live.fraction:.0%} of the run"
    return EarlyFail("stage_trend", f"{res.detail}, significant at this look's {at}")

"""Judging a run: ``judge(data, criteria, history) -> Verdict``, composing the criteria of
soakd.analysis.criteria (one module each) in ``CRITERIA`` order.

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
* INVALID beats FAIL beats PASS (a trend left undecided does not hide a FAIL); a criterion
  that cannot apply (no GPU) is ``n/a``;
* a tested trend whose slope is over its tolerance but not significant is INVALID
  "undecided", never PASS.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from soakd.analysis.criteria import (
    audio,
    drops,
    errors,
    frame_age,
    gpu_devices,
    headroom,
    intervals,
    jitter,
    memory,
    oom,
    server_queue,
    stage_trend,
    thresholds,
    validity,
)
from soakd.analysis.criteria.base import EARLY_STOP_EVENT, Context
from soakd.analysis.criteria.jitter import resolve_jitter_k
from soakd.analysis.diagnosis import diagnose
from soakd.analysis.digest import digest_run
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
from soakd.analysis.thresholds import ended_by_threshold
from soakd.config import CriteriaSettings
from soakd.errors import ExitCode

__all__ = [
    "CRITERIA",
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
]

#: the criteria in the order they are judged and listed; a later one may read an earlier
#: one's results (headroom reads memory's)
CRITERIA: tuple[ModuleType, ...] = (
    validity,
    drops,
    frame_age,
    stage_trend,
    memory,
    headroom,
    oom,
    gpu_devices,
    jitter,
    errors,
    server_queue,
    intervals,
    audio,
    thresholds,
)


def _name(module: ModuleType) -> str:
    return module.__name__.rpartition(".")[2]


# --------------------------------------------------------------------------- judge


def judge(data: RunData, criteria: CriteriaSettings, history: Sequence[float] = ()) -> Verdict:
    """Judge a run against ``criteria``. ``history``: jitter ratios (max/median) of earlier
    passing runs of the same config on this host, newest first (used when
    ``jitter_k = "history"``).

    A run whose rows stayed in the store (``data.source``: too long to load) is streamed
    into a ``digest.FrameDigest`` first and judged by the same criteria on it."""
    ctx = context(data, criteria, history)
    data, dg, t0, t1, measured = ctx.data, ctx.digest, ctx.t0, ctx.t1, ctx.measured
    for module in CRITERIA:
        ctx.results[_name(module)] = module.judge(ctx)
    results = [r for rs in ctx.results.values() for r in rs]
    status, code, reason = _overall(results, ended_early(data, results))
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


def context(data: RunData, criteria: CriteriaSettings, history: Sequence[float] = ()) -> Context:
    """What every criterion judges from: the measured window (``t0`` .. ``t1``) and masks of
    ``data`` or, for a run whose rows stayed in the store, of its streamed digest."""
    dg = None
    if data.source is not None:
        dg = digest_run(data, criteria, resolve_jitter_k(criteria, history)[0])
        data = dg.view
    t0 = dg.t0 if dg else data.warmup_end()
    t1 = dg.t1 if dg else data.window_end(t0)
    # a run stopped early is judged up to its stop: what its shutdown stored after the
    # decision is no evidence (a leak that ends with the run reads as growth that stopped)
    stops = [e["t"] for e in data.events if e.get("kind") == EARLY_STOP_EVENT and e.get("t")]
    if stops:
        t1 = max(t0, min(t1, float(stops[0])))
    post, measured = data.post_warmup(t0), data.measured(t0)
    return Context(data, criteria, t0, t1, measured, post, {}, {}, dg, history)


def ended_early(data: RunData, results: Sequence[CriterionResult]) -> CriterionResult | None:
    """The criterion that ended this run early, when the judgement of everything stored
    confirms it FAILs: the one an ``early_stop`` event names (``run.stop_on_fail``, an
    ``abort_on_fail`` threshold), or for a run of an older soakd the failing abort_on_fail
    threshold of its ``threshold_abort`` event. None otherwise: a run cut short and not
    confirmed stays INVALID (aborted), never PASS."""
    if data.meta.status != "aborted":
        return None
    named = [
        (e.get("data") or {}).get("criterion")
        for e in data.events
        if e.get("kind") == EARLY_STOP_EVENT
    ]
    if named:
        return next((r for r in results if r.criterion == named[0] and r.status == FAIL), None)
    return ended_by_threshold(data, results)


def _overall(
    results: Sequence[CriterionResult], cut: CriterionResult | None = None
) -> tuple[str, ExitCode, str]:
    """INVALID beats FAIL beats PASS, except that a run ended early by a criterion ``cut``
    that FAILs is FAIL (the rest was cut short by that failure), and that a trend left
    undecided (its slope over the tolerance, not significant: ``call_trend``) does not hide
    a FAIL (it found no fault the failure could be an artefact of; it is named beside it).
    An INVALID reason also names the criteria that failed: a run whose every frame raised
    cannot judge jitter, and its reason must still say the errors failed."""
    if cut is not None:
        return OVERALL_FAIL, ExitCode.FAIL, f"{cut.criterion}: {cut.detail} (stopped early)"
    invalid = [r for r in results if r.status == INVALID]
    failed = [r for r in results if r.status == FAIL]
    if failed and all(r.evidence.get("decided_by") == "undecided" for r in invalid):
        reason = "; ".join(f"{r.criterion}: {r.detail}" for r in failed)
        if invalid:
            reason += "; undecided too: " + "; ".join(f"{r.criterion}" for r in invalid)
        return OVERALL_FAIL, ExitCode.FAIL, reason
    if invalid:
        reason = "; ".join(f"{r.criterion}: {r.detail}" for r in invalid)
        if failed:  # what could be judged and failed is named too (errors on every frame)
            reason += "; failing too: " + "; ".join(f"{r.criterion}: {r.detail}" for r in failed)
        return OVERALL_INVALID, ExitCode.INVALID, reason
    return OVERALL_PASS, ExitCode.PASS, "every applicable criterion passed"

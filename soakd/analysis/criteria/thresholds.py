"""The k6-style ``thresholds`` expressions, each its own criterion (soakd.analysis.thresholds)."""

from __future__ import annotations

from soakd.analysis.criteria.base import Context, EarlyFail, Live
from soakd.analysis.model import CriterionResult
from soakd.analysis.thresholds import (
    ABORT_MIN_VALUES,
    abort_reason,
    can_no_longer_pass,
    judge_thresholds,
    rate,
    statistic,
)
from soakd.config import CriteriaSettings, Threshold


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return judge_thresholds(ctx.data, ctx.crit, ctx.digest)


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """The first ``abort_on_fail`` threshold that can no longer pass on the data so far
    (``can_no_longer_pass``: exactly for a max or count over its limit, on enough values
    for a percentile, average or rate)."""
    min_values = max(crit.min_frames, ABORT_MIN_VALUES)
    for th in (t.parsed() for t in crit.thresholds if t.abort_on_fail):
        value, n = _so_far(live, th)
        if value is not None and can_no_longer_pass(th, value, n, min_values):
            return EarlyFail(th.id, abort_reason(th, value), by="abort_on_fail")
    return None


def _so_far(live: Live, th: Threshold) -> tuple[float | None, float]:
    """The threshold's statistic on the data so far, and how many values it is over."""
    if th.source != "rate":
        vals = live.values_now(th.column)
        return statistic(th, vals), float(vals.size)
    captured = float(live.rows + live.dropped)
    lost = {"drops": live.dropped, "stale": live.stale, "errors": live.errors}[th.column]
    return rate(float(lost), captured), captured

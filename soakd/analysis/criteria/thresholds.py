"""The k6-style ``thresholds`` expressions, each its own criterion (soakd.analysis.thresholds)."""

from __future__ import annotations

from soakd.analysis.criteria.base import Context
from soakd.analysis.model import CriterionResult
from soakd.analysis.thresholds import judge_thresholds


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return judge_thresholds(ctx.data, ctx.crit, ctx.digest)

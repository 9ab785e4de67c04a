"""A generator's output: ``content_fps`` on the judged interval p95 and
``max_first_output_ms`` (soakd.analysis.chunks)."""

from __future__ import annotations

from soakd.analysis.chunks import judge_generator
from soakd.analysis.criteria.base import Context
from soakd.analysis.model import CriterionResult


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return judge_generator(ctx.data, ctx.crit, ctx.t0, ctx.t1)

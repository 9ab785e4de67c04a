"""Workload errors over the measured window against ``max_errors``."""

from __future__ import annotations

from typing import Any

from soakd.analysis.criteria.base import Context, EarlyFail, Live
from soakd.analysis.model import FAIL, PASS, CriterionResult
from soakd.config import CriteriaSettings


def judge_errors(ctx: Context) -> CriterionResult:
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


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return [judge_errors(ctx)]


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """Errors only add up: past ``max_errors`` the criterion can no longer pass."""
    if live.errors > crit.max_errors:
        why = f"{live.errors} frame(s) raised after warm-up (max_errors {crit.max_errors})"
        return EarlyFail("errors", why)
    return None

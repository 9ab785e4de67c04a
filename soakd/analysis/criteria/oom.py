"""Out-of-memory: OOM events and the torch allocator's OOM counter; any is a FAIL."""

from __future__ import annotations

import numpy as np

from soakd.analysis.criteria.base import Context, EarlyFail, Live
from soakd.analysis.model import FAIL, PASS, CriterionResult
from soakd.config import CriteriaSettings


def judge_oom(ctx: Context) -> CriterionResult:
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


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return [judge_oom(ctx)]


def early_fail(live: Live, crit: CriteriaSettings) -> EarlyFail | None:
    """One out-of-memory error fails the criterion, whatever follows."""
    return EarlyFail("oom", f"{live.ooms} out-of-memory error(s)") if live.ooms else None

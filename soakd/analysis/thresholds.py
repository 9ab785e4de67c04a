"""``criteria.thresholds``: k6-style ``STAT(COLUMN) OP NUMBER`` checks, each its own
criterion (``threshold:p95(total_ms)<80``).

Pure: RunData and the parsed thresholds (``soakd.config.Threshold``) in, CriterionResults
out. Frame columns are judged over the measured frames (``RunData.measured``), sample
columns over the samples after the warm-up, ``rate(drops|stale|errors)`` as a fraction of
the frames captured after the warm-up (``losses.count_losses``). A threshold whose column
has no data is INVALID, never passed. The run's live early stop
(``soakd/run/early_stop.py``, through ``criteria/thresholds.py: early_fail``) judges
``abort_on_fail`` with the same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from soakd.analysis.losses import count_losses
from soakd.analysis.model import FAIL, PASS, CriterionResult, RunData
from soakd.config import CriteriaSettings, Threshold

if TYPE_CHECKING:
    from soakd.analysis.digest import FrameDigest

#: the event an older soakd stored when an ``abort_on_fail`` threshold ended the run (now:
#: criteria.base.EARLY_STOP_EVENT)
ABORT_EVENT = "threshold_abort"
#: percentiles, averages and rates abort a run only once this many values (or captured
#: frames, for a rate) are in, and never before ``criteria.min_frames``
ABORT_MIN_VALUES = 20

_REDUCE: dict[str, Callable[[np.ndarray], Any]] = {
    "avg": np.mean,
    "mean": np.mean,
    "med": np.median,
    "min": np.min,
    "max": np.max,
}


def statistic(th: Threshold, values: np.ndarray) -> float | None:
    """``th.stat`` of the finite ``values``; None when there are none (no data)."""
    v = values[np.isfinite(values)]
    if not v.size:
        return None
    if th.stat == "count":
        return float(v.size)
    if th.q is not None:
        return float(np.percentile(v, th.q))
    return float(_REDUCE[th.stat](v))


def rate(lost: float, captured: float) -> float | None:
    """``lost / captured``; None when nothing was captured."""
    return lost / captured if captured > 0 else None


def can_no_longer_pass(th: Threshold, value: float, n: float, min_n: int) -> bool:
    """Whether ``value`` (over ``n`` values so far) already decides the threshold failed:
    exactly for a max or count that must stay under (they only grow) and a min that must
    stay over (it only falls); for the other statistics, on the data so far once ``n``
    reaches ``min_n``; never for a monotone statistic that could still come back."""
    if th.holds(value):
        return False
    if th.stat in ("max", "count"):
        return th.op in ("<", "<=")
    if th.stat == "min":
        return th.op in (">", ">=")
    return n >= min_n


def abort_reason(th: Threshold, value: float) -> str:
    """The run's stop reason when ``th`` ended it."""
    return f"threshold {th.text} failed: {th.stat}({th.column}) = {value:.4g} (abort_on_fail)"


def _unit(th: Threshold) -> str:
    if th.source == "rate":
        return "fraction"
    if th.stat == "count":
        return "frames" if th.source == "frames" else "samples"
    for suffix, unit in (("_ms", "ms"), ("_bytes", "bytes"), ("_pct", "%")):
        if th.column.endswith(suffix):
            return unit
    return "frames" if th.column == "queue_len" else "count"


def _measure(data: RunData, th: Threshold) -> tuple[float | None, float, str]:
    """(value, how many it is over, what they are) on the measured window."""
    t0 = data.warmup_end()
    if th.source == "frames":
        values = data.frame(th.column)[data.measured(t0)]
        n = float(np.isfinite(values).sum())
        return statistic(th, values), n, "measured frames"
    if th.source == "samples":
        values = data.sample(th.column)[data.samples["t"] >= t0]
        n = float(np.isfinite(values).sum())
        return statistic(th, values), n, "samples after the warm-up"
    post = data.post_warmup(t0)
    loss = count_losses(data, post)
    captured = loss.ticks - (loss.counts["missed_ticks"] or 0.0)
    lost = {
        "drops": loss.counts["dropped"] or 0.0,
        "stale": loss.counts["stale"] or 0.0,
        "errors": float(((data.frame("has_error") > 0) & post).sum()),
    }[th.column]
    return rate(lost, captured), captured, "frames captured after the warm-up"


def _measure_streamed(
    data: RunData, th: Threshold, dg: FrameDigest
) -> tuple[float | None, float, str]:
    """``_measure`` on a streamed run: frame columns from their exact order statistics,
    a sample column's min / max from the per-window view (its other statistics need every
    sample: not computed there, so the threshold is INVALID), rates from the counters."""
    if th.source == "frames":
        q = dg.quantiles.get(th.column)
        if q is None or not q.n:
            return None, 0.0, "measured frames"
        by = {"count": float(q.n), "min": q.min, "max": q.max, "avg": q.mean, "mean": q.mean}
        value = q.percentile(th.q) if th.q is not None else by.get(th.stat)
        return (q.median() if th.stat == "med" else value), float(q.n), "measured frames"
    if th.source == "samples":
        if th.stat not in ("min", "max"):
            return None, 0.0, "samples after the warm-up (only min / max on the bounded path)"
        values = data.sample(th.column)[data.samples["t"] >= dg.t0]
        return statistic(th, values), float(np.isfinite(values).sum()), "sample windows"
    loss = dg.loss
    captured = loss.ticks - (loss.counts["missed_ticks"] or 0.0)
    lost = {
        "drops": loss.counts["dropped"] or 0.0,
        "stale": loss.counts["stale"] or 0.0,
        "errors": float(dg.counters.err_post),
    }[th.column]
    return rate(lost, captured), captured, "frames captured after the warm-up"


def judge_threshold(
    data: RunData, th: Threshold, digest: FrameDigest | None = None
) -> CriterionResult:
    """One threshold as a criterion: PASS when it holds, FAIL when not, INVALID on no data
    (``digest``: the run was streamed, see ``_measure_streamed``)."""
    title = f"Threshold {th.text}"
    value, n, over = _measure_streamed(data, th, digest) if digest else _measure(data, th)
    if value is None:
        return CriterionResult.invalid(
            th.id, title, threshold=th.limit, unit=_unit(th),
            detail=f"no data for {th.column} ({over}: none with a value)",
        )  # fmt: skip
    ok = th.holds(value)
    verb = "within" if ok else "breaks"
    return CriterionResult(
        criterion=th.id,
        title=title,
        status=PASS if ok else FAIL,
        value=value,
        threshold=th.limit,
        unit=_unit(th),
        detail=f"{th.stat}({th.column}) = {value:.4g} over {n:.0f} {over}, {verb} {th.op} "
        f"{th.limit_text}",
        evidence={"expr": th.expr, "n": n, "abort_on_fail": th.abort_on_fail},
    )


def judge_thresholds(
    data: RunData, criteria: CriteriaSettings, digest: FrameDigest | None = None
) -> list[CriterionResult]:
    """Every ``criteria.thresholds`` item, in order."""
    return [judge_threshold(data, t.parsed(), digest) for t in criteria.thresholds]


def ended_by_threshold(data: RunData, results: Sequence[CriterionResult]) -> CriterionResult | None:
    """The failing ``abort_on_fail`` threshold that ended this run early, if one did."""
    if data.meta.status != "aborted" or not data.event_counts.get(ABORT_EVENT):
        return None
    return next((r for r in results if r.status == FAIL and r.evidence.get("abort_on_fail")), None)

"""The run as a whole: long enough, enough measured frames, ended cleanly (no hang, no stall,
no signal)."""

from __future__ import annotations

from typing import Any

import numpy as np

from soakd.analysis.criteria.base import DECIDED_EVENT, Context, finite
from soakd.analysis.model import INVALID, PASS, CriterionResult, RunData, Verdict
from soakd.records import OBSERVER_FAILED_EVENT


def judge_run_validity(ctx: Context) -> CriterionResult:
    d, c, dg = ctx.data, ctx.crit, ctx.digest
    n_meas = dg.n_measured if dg else int(ctx.measured.sum())
    dur = finite(d.meta.duration_s)
    if dur is None and dg:
        dur = max(dg.counters.last_capture, 0.0)
    if dur is None:
        t = d.frames["t_capture"]
        dur = float(t.max()) if t.size else 0.0
    ev: dict[str, Any] = {
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
    bad = _non_finite(ctx)
    if bad:
        ev["non_finite"] = bad
        problems.append(
            "a measurement that is not a finite number: "
            + ", ".join(f"{col} in {n} row(s)" for col, n in bad.items())
            + " (infinite: soakd never stores one; the data cannot be judged)"
        )
    hang = _hang(d)
    if hang:
        ev["in_flight_at_end"] = 1
        ev["in_flight_since_s"] = d.meta.counter("in_flight_since_s")
        problems.append(hang)
    status = INVALID if problems else PASS
    detail = "; ".join(problems) if problems else (f"{dur:.4g} s, {n_meas} post-warm-up frames")
    decided = _decided(d)
    if decided:
        ev["decided_after_s"], ev["detectable"] = decided
        detail += "; " + _decided_words(*decided)
    return CriterionResult(
        criterion="run",
        title="Run is long and complete enough",
        status=status,
        value=dur,
        threshold=c.min_duration_s,
        unit="s",
        detail=detail,
        evidence=ev,
        warnings=observer_failures(d),
    )


def observer_failures(d: RunData) -> list[str]:
    """A warning for each ``observer_failed`` event: an observer that raised and was
    dropped; one that decided early (the early stop, duration = "auto") says that no early
    decision could come from then on."""
    out = []
    for e in d.events:
        if e.get("kind") != OBSERVER_FAILED_EVENT:
            continue
        data, t = e.get("data") or {}, finite(e.get("t")) or 0.0
        if data.get("decides"):
            out.append(f"no early decision after {t:.0f} s: {e.get('message')}")
        else:
            out.append(f"an observer failed at {t:.0f} s: {e.get('message')}")
    return out


#: the frame columns holding a measurement (ms): NaN is a stage that did not run (NULL);
#: an infinite value is no measurement at all, and every statistic would skip it silently
MEASURED_COLUMNS = (
    "grab_ms", "pre_ms", "infer_ms", "decode_ms", "total_ms", "frame_age_ms", "lateness_ms",
    "first_emit_ms", "output_latency_ms", "consume_ms", "consume_output_ms",
)  # fmt: skip


def _non_finite(ctx: Context) -> dict[str, int]:
    """Each measured frame column and telemetry column holding ±inf, with how many rows:
    evidence no criterion can judge (the bounded path's digest drops them: not seen there)."""
    d, out = ctx.data, {}
    for col in MEASURED_COLUMNS:
        a = d.frames.get(col)
        if a is not None and a.size == ctx.measured.size:
            n = int(np.isinf(a[ctx.measured]).sum())
            if n:
                out[col] = n
    for col, a in d.samples.items():
        n = int(np.isinf(a).sum()) if col != "t" and a.dtype.kind == "f" else 0
        if n:
            out[f"samples.{col}"] = n
    return out


def _decided(d: RunData) -> tuple[float, dict[str, str]] | None:
    """A ``run.duration = "auto"`` run's ``decided`` event: when, and each trend's smallest
    detectable slope then, in words (``"0.42 MB/min"``)."""
    for e in d.events:
        if e.get("kind") == DECIDED_EVENT:
            data = e.get("data") or {}
            seen = (data.get("detectable") or {}).items()
            detect = {
                k: f"{float(v['slope']):.3g} {v.get('unit') or ''}".strip()
                for k, v in seen
                if isinstance(v, dict) and v.get("slope") is not None
            }
            return float(data.get("after_s", e.get("t") or 0.0)), detect
    return None


def _decided_words(after_s: float, detectable: dict[str, str]) -> str:
    """``decided after 6 min 12 s (memory_rss could see 0.42 MB/min, ...)``."""
    m, sec = divmod(round(after_s), 60)
    when = f"{m} min {sec} s" if m else f"{sec} s"
    seen = ", ".join(f"{k} could see {v}" for k, v in sorted(detectable.items()))
    return f"decided after {when}" + (f" ({seen})" if seen else "")


def convergence(v: Verdict) -> str:
    """How a ``run.duration = "auto"`` run ended, in words: "decided after 62 s
    (memory_rss could see 0.42 MB/min)", or the criteria still undecided at
    ``max_duration``; "" for a run of fixed length (or one stopped early: its reason says
    why)."""
    run = v.get("run")
    ev = run.evidence if run is not None else {}
    if ev.get("decided_after_s") is not None:
        return _decided_words(float(ev["decided_after_s"]), dict(ev.get("detectable") or {}))
    still = [c.criterion for c in v.invalid if c.detail.startswith("undecided")]
    return f"undecided at run.max_duration: {', '.join(still)}" if still else ""


def _hang(d: RunData) -> str | None:
    """A frame dispatched and never finished when the run stopped: the workload hung, so the
    run cannot be judged (INVALID, whatever else passed)."""
    if not d.meta.counter("in_flight_at_end"):
        return None
    since = d.meta.counter("in_flight_since_s")
    at = f" at {since:.3g} s" if since is not None else ""
    stall = d.meta.counter("stall_timeout_s")
    reached = "reached: the run was stopped" if d.meta.reason == "stalled" else "not reached"
    why = f" (stall timeout {stall:g} s {reached})" if stall is not None else ""
    return f"a frame dispatched{at} never finished: the workload hung{why}"


def judge(ctx: Context) -> list[CriterionResult]:
    """This criterion's results (the protocol of soakd.analysis.criteria)."""
    return [judge_run_validity(ctx)]

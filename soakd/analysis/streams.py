"""Judging a run of several paced sources (``run.streams = N``): each stream alone, and all
of them together.

* ``stream_view(data, s)``: stream ``s`` as a run of its own: its rows only (frame ids
  back to its own capture index, ``id // N``), its own counters from ``runs.summary
  ["streams"][s]`` (a counter it lacks is unknown, never the run's total), the telemetry
  shared by all streams.
* ``overall_view(data)``: every row as one stream: the per-stream cumulative drop and stale
  counters summed into one running total (``losses.running_total``), the target rate
  ``N x run.fps``.
* ``judge_streams``: judges the overall view and every stream with ``verdict.judge`` and
  adds the criterion ``streams``: PASS when every stream passes, else FAIL (INVALID when a
  stream is INVALID: INVALID beats FAIL). The run's verdict is the worst of the overall one
  and that criterion; its evidence holds each stream's result (stored in ``verdicts``, read
  by the reports and ``soakd show``).

A run of one stream is judged exactly as before: ``judge_streams`` is ``judge``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from soakd.analysis.losses import running_total
from soakd.analysis.model import (
    FAIL,
    INVALID,
    OVERALL_FAIL,
    OVERALL_INVALID,
    OVERALL_PASS,
    PASS,
    CriterionResult,
    RunData,
    Verdict,
)
from soakd.errors import ExitCode

if TYPE_CHECKING:
    from soakd.config import CriteriaSettings

CRITERION = "streams"
#: ``runs.summary`` keys each stream has its own value of (``summary["streams"][s]``)
STREAM_COUNTERS: tuple[str, ...] = (
    "frames_captured",
    "drops",
    "stale",
    "pacer_missed_ticks",
    "pacer_ticks",
    "missed_ticks_source",
    "missed_ticks_pause",
    "queued_at_end",
    "in_flight_at_end",
    "in_flight_since_s",
)
#: run totals that say nothing about one stream: left out of a stream's view
_RUN_TOTALS: tuple[str, ...] = ("frames_dispatched", "frames_done", "errors", "ooms")
_RANK = {OVERALL_PASS: 0, OVERALL_FAIL: 1, OVERALL_INVALID: 2}
_CODE = {
    OVERALL_PASS: ExitCode.PASS,
    OVERALL_FAIL: ExitCode.FAIL,
    OVERALL_INVALID: ExitCode.INVALID,
}


def stream_count(data: RunData) -> int:
    """How many paced sources the run had (``run.streams`` as stored; 1 when absent)."""
    n = data.meta.setting("run", "streams")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def _stream_ids(data: RunData) -> np.ndarray:
    return np.nan_to_num(data.frame("stream")).astype(np.int64)


def stream_view(data: RunData, s: int) -> RunData:
    """Stream ``s`` of the run as a run of its own (see the module docstring)."""
    n = stream_count(data)
    mask = _stream_ids(data) == s
    frames = {k: v[mask] for k, v in data.frames.items()}
    frames["frame_id"] = frames["frame_id"] // n
    summary = {
        k: v for k, v in data.meta.summary.items() if k not in (*STREAM_COUNTERS, *_RUN_TOTALS)
    }
    per = data.meta.summary.get("streams")
    own = per[s] if isinstance(per, list) and s < len(per) and isinstance(per[s], dict) else {}
    summary.update({k: own[k] for k in STREAM_COUNTERS if k in own})
    summary.pop("streams", None)
    meta = dataclasses.replace(data.meta, summary=summary)
    return dataclasses.replace(data, meta=meta, frames=frames)


def overall_view(data: RunData) -> RunData:
    """Every stream's rows as one stream (see the module docstring)."""
    n = stream_count(data)
    stream = data.frame("stream")
    frames = dict(data.frames)
    for name in ("drop_count", "stale_count"):
        frames[name] = running_total(stream, data.frame(name))
    frames["stream"] = np.zeros(data.n_frames)  # one stream now: the totals are its counters
    fps = data.meta.fps * n if data.meta.fps else data.meta.fps
    meta = dataclasses.replace(data.meta, fps=fps)
    return dataclasses.replace(data, meta=meta, frames=frames)


def judge_streams(
    data: RunData, criteria: CriteriaSettings, history: Sequence[float] = ()
) -> tuple[RunData, Verdict]:
    """The run's verdict, per stream and together (see the module docstring), and the data
    it was judged on (the overall view; ``data`` itself for one stream)."""
    # the verdict engine (and the config's models under it) only to judge: `soakd show`
    # reads a judged run's streams with stored_streams
    from soakd.analysis.verdict import judge

    n = stream_count(data)
    if n == 1:
        return data, judge(data, criteria, history)
    whole = overall_view(data)
    verdict = judge(whole, criteria, history)
    views = [stream_view(data, s) for s in range(n)]
    results = [_stream_result(s, v, judge(v, criteria, history)) for s, v in enumerate(views)]
    _fold(verdict, streams_criterion(results))
    for r in results:
        verdict.hints += [f"stream {r['stream']}: {h}" for h in r.pop("hints")]
    return whole, verdict


def _stream_result(s: int, view: RunData, v: Verdict) -> dict[str, Any]:
    """One stream's row of the ``streams`` evidence."""
    drops, errors, age = v.get("drops"), v.get("errors"), v.get("frame_age")
    return {
        "stream": s,
        "status": v.status,
        "reason": v.reason,
        "frames": view.n_frames,
        "measured_frames": v.window.get("measured_frames"),
        "lost": drops.evidence.get("lost") if drops else None,
        "dropped": drops.evidence.get("dropped") if drops else None,
        "ticks": drops.evidence.get("ticks") if drops else None,
        "loss_fraction": drops.value if drops else None,
        "errors": errors.value if errors else None,
        "frame_age_p95_ms": age.evidence.get("p95_ms") if age else None,
        "failed": [c.criterion for c in v.failed],
        "invalid": [c.criterion for c in v.invalid],
        "hints": v.hints[:1] if v.status != OVERALL_PASS else [],
    }


def streams_criterion(results: Sequence[dict[str, Any]]) -> CriterionResult:
    """``streams``: PASS when every stream's own verdict passes; INVALID when one is
    INVALID, else FAIL when one fails. Value: the streams that pass, of ``threshold``."""
    n = len(results)
    bad = [r for r in results if r["status"] != OVERALL_PASS]
    worst = max((r["status"] for r in results), key=lambda st: _RANK.get(st, 2))
    status = {OVERALL_PASS: PASS, OVERALL_FAIL: FAIL}.get(worst, INVALID)
    detail = f"{n - len(bad)} of {n} streams pass"
    if bad:
        shown = "; ".join(f"stream {r['stream']} {r['status']}: {r['reason']}" for r in bad[:3])
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        detail += f" ({shown}{more})"
    return CriterionResult(
        criterion=CRITERION,
        title="Every stream passes on its own",
        status=status,
        value=float(n - len(bad)),
        threshold=float(n),
        unit="streams",
        detail=detail,
        evidence={"streams": list(results)},
    )


def _fold(verdict: Verdict, crit: CriterionResult) -> None:
    """Add ``crit`` to ``verdict``; the verdict becomes the worse of the two."""
    verdict.criteria.append(crit)
    status = {PASS: OVERALL_PASS, FAIL: OVERALL_FAIL}.get(crit.status, OVERALL_INVALID)
    if _RANK[status] <= _RANK.get(verdict.status, 2):
        return
    why = f"{crit.criterion}: {crit.detail}"
    verdict.reason = why if verdict.status == OVERALL_PASS else f"{verdict.reason}; {why}"
    verdict.status, verdict.exit_code = status, _CODE[status]


def streams_of(verdict: Verdict) -> list[dict[str, Any]]:
    """Each stream's result (the ``streams`` criterion's evidence); [] for one stream."""
    crit = verdict.get(CRITERION)
    found = crit.evidence.get("streams") if crit is not None else None
    return list(found) if isinstance(found, list) else []


def stored_streams(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same from a run's stored ``verdicts`` rows (dicts with ``criterion`` and a
    decoded ``evidence``)."""
    for r in rows:
        if r.get("criterion") == CRITERION:
            found = (r.get("evidence") or {}).get("streams")
            return list(found) if isinstance(found, list) else []
    return []

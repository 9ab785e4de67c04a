"""Generators judged as real time: the playback rate, the first output, and a rollout's
named chunk stages.

Pure: RunData in, criteria and numbers out (docs/verdict.md, "Generators").

* ``output_intervals``: each emitted frame's interval (amortised over its emit, see
  soakd/run/drivers/emitting.py) after the warm-up, with its emit's position in its row
  (``chunk``) and its row (``frame_id``);
* ``presentation_intervals``: the time between frames as they become visible: an emit's
  first frame carries the whole gap since the emit before it (its amortised interval x its
  frames), the other frames of the same emit 0 (shown at once). ``output_intervals`` is the
  per-frame average (the gap spread over the emit's frames), what a player that buffers a
  whole chunk sees;
* ``judged_intervals``: what ``content_fps`` and the generators' jitter judge, chosen by
  ``criteria.generator_interval``: ``"presentation"`` (default) the waits between visible
  updates (the presentation intervals of each emit's first frame: a chunk of 12 frames out
  at once is one wait, the chunk gap), ``"per_frame"`` the per-frame average;
* ``judge_content_fps``: ``criteria.content_fps`` is the rate a player shows the frames
  at, so the judged interval's p95 must be at most 1000 / content_fps ms (FAIL above;
  INVALID with no interval; n/a when unset, the levels still in its evidence);
* ``judge_first_output``: the run's first output (the first emission's latency from the
  start of the session, or of the first request) against ``criteria.max_first_output_ms``;
* ``stage_shares`` / ``dominant_stage``: a rollout's named stages' shares of their chunks,
  and the one that takes most of a chunk (the reports' stage table is
  ``soakd.report.summary``'s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from soakd.analysis.model import FAIL, INVALID, NA, PASS, CriterionResult, RunData

#: a named stage that takes at least this share of a chunk (median) is named as dominating
DOMINANT_SHARE = 1 / 3
#: the chunks the interval tail falls in most, listed in the evidence
TAIL_TOP = 5


@dataclass(frozen=True, slots=True)
class Intervals:
    """Per emitted frame after the warm-up: time, interval (ms), emit position in its
    row, and the row (request or chunk)."""

    t: np.ndarray
    ms: np.ndarray
    position: np.ndarray
    frame_id: np.ndarray

    @property
    def n(self) -> int:
        return int(self.ms.size)


def _kept(d: RunData, t0: float) -> np.ndarray:
    """Emissions with an interval after the warm-up (a request's first emit is its
    latency, never an interval)."""
    e = d.emissions
    keep = np.isfinite(e["interval_ms"]) & (e["t_emit"] >= t0)
    if d.meta.shape == "generator":
        keep &= e["idx"] > 0
    return keep


def _emits(d: RunData) -> tuple[np.ndarray, np.ndarray]:
    """(first, size) per emission: whether it is the first frame of its emit (the rows of
    one emit are consecutive: same row, same emit number) and how many frames the emit
    handed over."""
    e = d.emissions
    n = len(e["t_emit"])
    first = np.ones(n, dtype=bool)
    first[1:] = (e["frame_id"][1:] != e["frame_id"][:-1]) | (e["chunk"][1:] != e["chunk"][:-1])
    lengths = np.diff(np.append(np.flatnonzero(first), n))
    return first, np.repeat(lengths, lengths)


def _intervals(d: RunData, keep: np.ndarray, ms: np.ndarray) -> Intervals:
    e = d.emissions
    return Intervals(e["t_emit"][keep], ms[keep], e["chunk"][keep], e["frame_id"][keep])


def output_intervals(d: RunData, t0: float) -> Intervals:
    """The per-frame average: each frame's interval amortised over its emit."""
    return _intervals(d, _kept(d, t0), d.emissions["interval_ms"])


def presentation_intervals(d: RunData, t0: float) -> Intervals:
    """Per emitted frame after the warm-up: the time since the frame shown before it (an
    emit's first frame: the gap since the previous emit; the rest of the emit: 0)."""
    first, size = _emits(d)
    gap = np.where(first, d.emissions["interval_ms"] * size, 0.0)
    return _intervals(d, _kept(d, t0), gap)


def judged_intervals(d: RunData, t0: float, basis: str) -> Intervals:
    """What content_fps and a generator's jitter judge (``criteria.generator_interval``):
    ``"presentation"``: the waits between visible updates (each emit's first frame's
    presentation interval); ``"per_frame"``: every frame's per-frame average."""
    if basis != "presentation":
        return output_intervals(d, t0)
    first, size = _emits(d)
    return _intervals(d, _kept(d, t0) & first, d.emissions["interval_ms"] * size)


def levels(values: np.ndarray) -> dict[str, float | int | None]:
    """n, p50, p95, p99, max (ms) of finite ``values``."""
    v = values[np.isfinite(values)]
    if not v.size:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = (float(x) for x in np.percentile(v, [50, 95, 99]))
    return {"n": int(v.size), "p50": p50, "p95": p95, "p99": p99, "max": float(v.max())}


def interval_tail(iv: Intervals, cut: float) -> dict[str, Any]:
    """Where the intervals at or above ``cut`` (the p95) fall: counted by emit position in
    the row, and by row (how many chunks hold them, the ones holding most)."""
    over = iv.ms >= cut
    pos, n_pos = np.unique(iv.position[over], return_counts=True)
    rows, n_rows = np.unique(iv.frame_id[over], return_counts=True)
    top = np.argsort(-n_rows, kind="stable")[:TAIL_TOP]
    return {
        "tail_cut_ms": cut,
        "tail_intervals": int(over.sum()),
        "tail_by_position": {str(int(p)): int(k) for p, k in zip(pos, n_pos, strict=True)},
        "tail_chunks": int(rows.size),
        "tail_top_chunks": [[int(rows[i]), int(n_rows[i])] for i in top],
    }


def first_output_ms(d: RunData) -> float | None:
    """The run's first output: the summary's ``first_output_ms`` (the session's first
    emission from its start, or the first request's first frame), else the first
    dispatched row's ``first_emit_ms``."""
    known = d.meta.counter("first_output_ms")
    if known is not None:
        return known
    fe = d.frame("first_emit_ms")[d.frames["skipped"] == 0] if d.n_frames else np.empty(0)
    fe = fe[np.isfinite(fe)]
    return float(fe[0]) if fe.size else None


def judge_content_fps(d: RunData, crit: Any, t0: float, t1: float) -> CriterionResult:
    fps = crit.content_fps
    title = "Real-time playback"
    thr = 1000.0 / fps if fps else None
    basis = getattr(crit, "generator_interval", "presentation")
    iv = judged_intervals(d, t0, basis)
    if not iv.n:
        why = "no intervals measured (a generator must emit more than once)"
        if fps is None:
            return CriterionResult.na(
                "content_fps", title, threshold=None, unit="ms", detail=f"not judged; {why}"
            )
        return CriterionResult.invalid("content_fps", title, threshold=thr, unit="ms", detail=why)
    lv = levels(iv.ms)
    p95 = float(lv["p95"])  # type: ignore[arg-type]
    span = max(t1 - t0, 0.0)
    ev: dict[str, Any] = {
        "content_fps": fps,
        "basis": basis,
        **{f"interval_{k}_ms" if k != "n" else "intervals": v for k, v in lv.items()},
        "sustained_fps_p95": 1000.0 / p95 if p95 > 0 else None,
        "emitted_fps": output_intervals(d, t0).n / span if span > 0 else None,
        **interval_tail(iv, p95),
    }
    sustained = f"{1000.0 / p95:.3g} fps" if p95 > 0 else "unbounded"
    base = f"per-frame interval p95 {p95:.4g} ms ({sustained} sustained)"
    if basis == "presentation":
        base = (
            f"presentation interval p95 {p95:.4g} ms ({sustained} sustained) over its "
            f"{iv.n} waits between visible updates"
        )
    base += f", p50 {lv['p50']:.4g} ms"
    if fps is None or thr is None:
        return CriterionResult(
            criterion="content_fps", title=title, status=NA, value=p95, threshold=None,
            unit="ms", detail=f"not judged (criteria.content_fps unset): {base}", evidence=ev,
        )  # fmt: skip
    status = FAIL if p95 > thr else PASS
    verb = "over" if status == FAIL else "within"
    detail = f"{base}: {verb} {thr:.4g} ms = 1000 / content_fps {fps:g}"
    return CriterionResult(
        criterion="content_fps", title=title, status=status, value=p95, threshold=thr,
        unit="ms", detail=detail, evidence=ev,
    )  # fmt: skip


def judge_first_output(d: RunData, crit: Any) -> CriterionResult:
    thr = crit.max_first_output_ms
    title = "First output"
    first = first_output_ms(d)
    if first is None:
        status = INVALID if thr is not None else NA
        detail = "no output: the generator never emitted a frame"
        if status == INVALID:
            return CriterionResult.invalid(
                "first_output", title, threshold=thr, unit="ms", detail=detail
            )
        return CriterionResult.na("first_output", title, threshold=None, unit="ms", detail=detail)
    ev = {"first_output_ms": first, "max_first_output_ms": thr}
    if thr is None:
        return CriterionResult(
            criterion="first_output", title=title, status=NA, value=first, threshold=None,
            unit="ms", evidence=ev,
            detail=f"not judged (criteria.max_first_output_ms unset): {first:.4g} ms",
        )  # fmt: skip
    status = FAIL if first > thr else PASS
    detail = f"first output after {first:.4g} ms ({'over' if status == FAIL else 'within'} {thr:g})"
    return CriterionResult(
        criterion="first_output", title=title, status=status, value=first, threshold=thr,
        unit="ms", detail=detail, evidence=ev,
    )  # fmt: skip


def judge_generator(d: RunData, crit: Any, t0: float, t1: float) -> list[CriterionResult]:
    """The generator criteria (none for a model that does not generate frames)."""
    if not d.meta.generates:
        return []
    return [judge_content_fps(d, crit, t0, t1), judge_first_output(d, crit)]


def stage_shares(d: RunData, measured: np.ndarray) -> dict[str, float]:
    """Each named stage's median share of its chunk's wall time (``total_ms``)."""
    total = d.frame("total_ms")[measured]
    out: dict[str, float] = {}
    for name, col in d.stages.items():
        y = col[measured]
        ok = np.isfinite(y) & np.isfinite(total) & (total > 0)
        if ok.any():
            out[name] = float(np.median(y[ok] / total[ok]))
    return out


def dominant_stage(d: RunData, measured: np.ndarray) -> tuple[str, float, float] | None:
    """(name, median share of the chunk, median ms) of the named stage that takes most of
    a chunk, when it takes at least DOMINANT_SHARE of it."""
    shares = stage_shares(d, measured)
    if not shares:
        return None
    name = max(shares, key=lambda k: shares[k])
    if shares[name] < DOMINANT_SHARE or not math.isfinite(shares[name]):
        return None
    y = d.stages[name][measured]
    return name, shares[name], float(np.nanmedian(y))

"""Filling ``RunData`` (defined in soakd.analysis.model): everything the verdict looks at,
as numpy columns.

``load_run_data(conn, run_id)`` fills it from the run database (through
``soakd.store.rundata``, the only place with SQL); tests build it directly with
``make_run_data(...)``. Times are seconds since the run's start, durations milliseconds,
memory bytes (NaN where the database has NULL). This is the analysis package's loading
glue; the pure modules (model, stats, verdict, diagnosis) never import it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from soakd.analysis.model import GENERATOR_SHAPES, RunData, RunMeta
from soakd.store import rundata as q
from soakd.store.chunk_stages import load_stage_columns
from soakd.store.gpu_samples import load_gpu_columns
from soakd.store.runs import RunRow, get_run
from soakd.store.server_metrics import load_server_metrics

__all__ = ["RunData", "RunMeta", "load_run_data", "make_run_data"]

_EMPTY = np.empty(0)


def make_run_data(
    meta: RunMeta | None = None,
    *,
    frames: dict[str, Any] | None = None,
    samples: dict[str, Any] | None = None,
    emissions: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
    error_messages: list[tuple[str, int]] | None = None,
    stages: dict[str, Any] | None = None,
    server: dict[str, tuple[Any, Any]] | None = None,
) -> RunData:
    """Build RunData from plain arrays; missing frame/sample columns are NaN (flags 0),
    ``frame_id`` defaults to 0..n-1; ``stages``: named chunk stages, one value per frame;
    ``server``: a served model's server metrics, name -> (t, value)."""
    frames = dict(frames or {})
    n = len(np.asarray(frames.get("t_capture", _EMPTY)))
    fcols: dict[str, np.ndarray] = {}
    for name in q.FRAME_FIELDS:
        if name in frames:
            fcols[name] = np.asarray(frames[name], dtype=np.float64)
        elif name == "frame_id":
            fcols[name] = np.arange(n, dtype=np.float64)
        elif name in ("warmup", "skipped", "has_error", "drop_count", "stale_count"):
            fcols[name] = np.zeros(n)
        else:
            fcols[name] = np.full(n, np.nan)
    samples = dict(samples or {})
    m = len(np.asarray(samples.get("t", _EMPTY)))
    scols = {"t": np.asarray(samples.get("t", _EMPTY), dtype=np.float64)}
    for name in q.SAMPLE_METRICS:
        v = samples.get(name)
        scols[name] = np.full(m, np.nan) if v is None else np.asarray(v, dtype=np.float64)
    emissions = dict(emissions or {})
    k = len(np.asarray(emissions.get("t_emit", _EMPTY)))
    ecols = {
        name: np.asarray(emissions[name], dtype=np.float64) if name in emissions else np.zeros(k)
        for name in q.EMISSION_FIELDS
    }
    evs = list(events or [])
    counts: dict[str, int] = {}
    for e in evs:
        counts[e["kind"]] = counts.get(e["kind"], 0) + 1
    named = {k: np.asarray(v, dtype=np.float64) for k, v in (stages or {}).items()}
    metrics = {
        k: (np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64))
        for k, (t, v) in (server or {}).items()
    }
    return RunData(
        meta or RunMeta("test"), fcols, scols, ecols, evs, counts, list(error_messages or []),
        stages=named, server=metrics,
    )  # fmt: skip


def _meta_from_row(row: RunRow) -> RunMeta:
    config = row.config  # RunRow decodes JSON ({} when NULL or unreadable)
    wl = config.get("workload") if isinstance(config.get("workload"), dict) else {}
    run = config.get("run") if isinstance(config.get("run"), dict) else {}
    device = wl.get("device") if isinstance(wl, dict) else None
    warm = run.get("warmup_s") if isinstance(run, dict) else None
    kind = row.workload_kind or (wl.get("kind") if wl else None)
    shape = row.workload.get("shape")
    if shape not in ("staged", "session", *GENERATOR_SHAPES):  # runs before "shape" was
        shape = kind if kind in ("session", "generator") else "staged"
    return RunMeta(
        run_id=str(row.id),
        status=str(row.status or "completed"),
        reason=row.reason,
        name=row.name,
        duration_s=row.duration_s,
        fps=row.fps,
        workload_kind=kind,
        shape=str(shape),
        device=str(device) if device is not None else None,
        host=row.host,
        config_hash=str(row.config_hash or ""),
        started_unix=float(row.started_unix or 0.0),
        started_at=row.started_at,
        mode=str(row.mode or "soak"),
        warmup_s=float(warm) if isinstance(warm, int | float) else None,
        config=config,
        summary=row.summary if isinstance(row.summary, dict) else {},
        environment=row.environment if isinstance(row.environment, dict) else {},
    )


#: runs with more frame + telemetry rows than this are judged on the bounded path (their
#: rows streamed, never loaded whole: ``soakd.analysis.digest``); 4 M rows is about 28
#: hours at 30 fps with samples every 100 ms, some 700 MB as arrays
BOUNDED_ROWS = 4_000_000


def use_bounded(meta: RunMeta, frames: int, samples: int) -> bool:
    """The documented switch: more than BOUNDED_ROWS rows, and a run the bounded path
    covers (one stream, not a generator: those are always loaded whole)."""
    streams = meta.setting("run", "streams")
    one_stream = not isinstance(streams, int) or streams <= 1
    return frames + samples > BOUNDED_ROWS and not meta.generates and one_stream


class StoreSource:
    """A run's rows left in the store, read on demand (``digest.RowSource``). The
    connection must stay open until the run is judged."""

    def __init__(self, conn: sqlite3.Connection, run_id: str) -> None:
        self.conn, self.run_id = conn, run_id

    def frame_chunks(self, names: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
        return q.frame_chunks(self.conn, self.run_id, names)

    def first_post_id(self, t0: float) -> float | None:
        return q.first_post_id(self.conn, self.run_id, t0)

    def measured_matching(
        self,
        t0: float,
        names: Sequence[str],
        ranges: Sequence[tuple[str, float, float]],
        over: tuple[str, float] | None,
    ) -> Iterator[dict[str, np.ndarray]]:
        return q.measured_matching(self.conn, self.run_id, t0, names, ranges, over)

    def measured_over(
        self, t0: float, column: str, cut: float, limit: int
    ) -> dict[str, np.ndarray]:
        return q.measured_over(self.conn, self.run_id, t0, column, cut, limit)

    def extent(self) -> tuple[float | None, float | None, float | None]:
        return q.run_extent(self.conn, self.run_id)

    def sample_windows(
        self, t0: float, t1: float, width: float, nwin: int
    ) -> dict[str, np.ndarray]:
        return q.sample_windows(self.conn, self.run_id, t0, t1, width, nwin)

    def sample_series_chunks(
        self, column: str, t0: float
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return q.sample_series_chunks(self.conn, self.run_id, column, t0)


def load_run_data(conn: sqlite3.Connection, run_id: str, *, bounded: bool | None = None) -> RunData:
    """Read one run's rows into RunData (raises soakd.store.runs.RunNotFound). A run over
    BOUNDED_ROWS (``use_bounded``; ``bounded`` forces either path) keeps its frames and
    samples in the store: ``RunData.source`` reads them while it is judged."""
    meta = _meta_from_row(get_run(conn, run_id))
    if bounded is None:
        bounded = use_bounded(meta, *q.count_rows(conn, run_id, BOUNDED_ROWS + 1))
    if bounded:
        return _bounded_run_data(conn, run_id, meta)
    extra = {
        "session": (
            *("output_latency_ms", "session_dropped", "consume_ms", "consume_output_ms"),
            "lateness_ms",  # the pacer's, against the session's pacing_baseline (diagnosis)
        ),
        "generator": ("first_emit_ms",),
        "rollout": ("first_emit_ms",),
    }
    served = meta.workload_kind == "openai"
    cols = (*extra.get(meta.shape, ()), *(("out_tokens",) if served else ()))
    frames = q.load_frame_columns(conn, run_id, cols)
    if served:  # a served model's per-request chunk gaps
        frames.update(q.load_extra_keys(conn, run_id, ("itl_p50_ms", "itl_p95_ms", "itl_max_ms")))
    samples = q.load_sample_columns(conn, run_id)
    emissions = q.load_emission_columns(conn, run_id)
    events, counts = q.load_events(conn, run_id)
    errors = q.load_error_messages(conn, run_id)
    gpus = load_gpu_columns(conn, run_id)  # per GPU, when the run sampled several
    stages = load_stage_columns(conn, run_id, frames["frame_id"])  # a rollout's named stages
    return RunData(
        meta, frames, samples, emissions, events, counts, errors, gpus, stages=stages,
        server=load_server_metrics(conn, run_id),  # a served model's server, else empty
        error_kinds=q.load_error_kinds(conn, run_id) if served else {},
        turns=_turns(conn, run_id, meta), pauses=q.load_pause_columns(conn, run_id),
    )  # fmt: skip


def _turns(conn: sqlite3.Connection, run_id: str, meta: RunMeta) -> dict[str, np.ndarray]:
    """A realtime session's answered turns; empty for every other kind."""
    return q.load_turn_columns(conn, run_id) if meta.workload_kind == "realtime" else {}


def _bounded_run_data(conn: sqlite3.Connection, run_id: str, meta: RunMeta) -> RunData:
    """RunData with empty frame and sample columns and a StoreSource."""
    empty = make_run_data(meta)
    events, counts = q.load_events(conn, run_id)
    return RunData(
        meta, empty.frames, empty.samples, empty.emissions, events, counts,
        q.load_error_messages(conn, run_id), load_gpu_columns(conn, run_id),
        source=StoreSource(conn, run_id), server=load_server_metrics(conn, run_id),
        error_kinds=q.load_error_kinds(conn, run_id) if meta.workload_kind == "openai" else {},
        turns=_turns(conn, run_id, meta), pauses=q.load_pause_columns(conn, run_id),
    )  # fmt: skip

"""``RunData``: everything the verdict looks at, as numpy columns.

``load_run_data(conn, run_id)`` fills it from the run database (through
``soakd.store.rundata``, the only place with SQL); tests build it directly with
``make_run_data(...)``. Times are seconds since the run's start, durations milliseconds,
memory bytes (NaN where the database has NULL).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from soakd.store import rundata as q

_EMPTY = np.empty(0)


@dataclass(slots=True)
class RunMeta:
    """The ``runs`` row fields the verdict and the reports use."""

    run_id: str
    status: str = "completed"  # running | completed | aborted | crashed
    reason: str | None = None
    name: str | None = None
    duration_s: float | None = None
    fps: float | None = None
    workload_kind: str | None = None
    shape: str = "staged"  # staged | session | generator: the workload's calling convention
    device: str | None = None  # workload.device from the config ("cpu", "cuda:0", ...)
    host: str | None = None
    config_hash: str = ""
    started_unix: float = 0.0
    started_at: str | None = None
    mode: str = "soak"
    warmup_s: float | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return bool(self.device) and str(self.device).startswith("cuda")


@dataclass(slots=True)
class RunData:
    """A run's frames (``frames[name]`` arrays named as rundata.FRAME_FIELDS, one element
    per row ordered by frame_id), telemetry (``samples``: ``t`` and SAMPLE_METRICS),
    generator emissions (``emissions``), events and error messages."""

    meta: RunMeta
    frames: dict[str, np.ndarray]
    samples: dict[str, np.ndarray]
    emissions: dict[str, np.ndarray]
    events: list[dict[str, Any]] = field(default_factory=list)
    event_counts: dict[str, int] = field(default_factory=dict)
    error_messages: list[tuple[str, int]] = field(default_factory=list)

    @property
    def n_frames(self) -> int:
        return len(self.frames["t_capture"])

    def frame(self, name: str) -> np.ndarray:
        return self.frames.get(name, np.full(self.n_frames, np.nan))

    def sample(self, name: str) -> np.ndarray:
        return self.samples.get(name, np.full(len(self.samples["t"]), np.nan))

    def warmup_end(self) -> float:
        """Seconds since start at which the measured window begins."""
        for e in self.events:
            if e.get("kind") == "warmup_end" and e.get("t") is not None:
                return float(e["t"])
        t = self.frames["t_capture"]
        if t.size == 0:
            return 0.0
        warm = self.frames["warmup"] > 0
        if (~warm).any():
            return float(t[~warm].min())
        return float(t.max())  # every frame is a warm-up frame: nothing measured


def make_run_data(
    meta: RunMeta | None = None,
    *,
    frames: dict[str, Any] | None = None,
    samples: dict[str, Any] | None = None,
    emissions: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
    error_messages: list[tuple[str, int]] | None = None,
) -> RunData:
    """Build RunData from plain arrays; missing frame/sample columns are NaN (flags 0),
    ``frame_id`` defaults to 0..n-1."""
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
    return RunData(
        meta or RunMeta("test"), fcols, scols, ecols, evs, counts, list(error_messages or [])
    )


def _meta_from_row(row: dict[str, Any]) -> RunMeta:
    try:
        config = json.loads(row.get("config") or "{}")
    except (TypeError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}
    wl = config.get("workload") if isinstance(config.get("workload"), dict) else {}
    run = config.get("run") if isinstance(config.get("run"), dict) else {}
    device = wl.get("device") if isinstance(wl, dict) else None
    warm = run.get("warmup_s") if isinstance(run, dict) else None
    kind = row.get("workload_kind") or (wl.get("kind") if wl else None)
    try:
        described = json.loads(row.get("workload") or "{}")
    except (TypeError, ValueError):
        described = {}
    shape = described.get("shape") if isinstance(described, dict) else None
    if shape not in ("staged", "session", "generator"):  # runs stored before "shape" was
        shape = kind if kind in ("session", "generator") else "staged"
    return RunMeta(
        run_id=str(row["id"]),
        status=str(row.get("status") or "completed"),
        reason=row.get("reason"),
        name=row.get("name"),
        duration_s=row.get("duration_s"),
        fps=row.get("fps"),
        workload_kind=kind,
        shape=str(shape),
        device=str(device) if device is not None else None,
        host=row.get("host"),
        config_hash=str(row.get("config_hash") or ""),
        started_unix=float(row.get("started_unix") or 0.0),
        started_at=row.get("started_at"),
        mode=str(row.get("mode") or "soak"),
        warmup_s=float(warm) if isinstance(warm, int | float) else None,
        config=config,
    )


def load_run_data(conn: sqlite3.Connection, run_id: str) -> RunData:
    """Read one run's rows into RunData (raises rundata.RunNotFound)."""
    meta = _meta_from_row(q.load_run_row(conn, run_id))
    extra = {"session": ("output_latency_ms", "session_dropped"), "generator": ("first_emit_ms",)}
    frames = q.load_frame_columns(conn, run_id, extra.get(meta.shape, ()))
    samples = q.load_sample_columns(conn, run_id)
    emissions = q.load_emission_columns(conn, run_id)
    events, counts = q.load_events(conn, run_id)
    errors = q.load_error_messages(conn, run_id)
    return RunData(meta, frames, samples, emissions, events, counts, errors)

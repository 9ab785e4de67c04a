"""The SQL behind ``soakd profile``, ``sweep`` and ``compare`` (run rows, run lookup and
baselines are ``soakd.store.runs``).

Every function takes an open connection (``soakd.store.db.connect``) and returns plain
Python values or numpy arrays; nothing here interprets the numbers (that is
``soakd.studies.profiling`` and ``soakd.studies.compare``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import numpy as np

from soakd.records import STAGE_COLUMNS

_FRAME_VALUE_COLUMNS = frozenset(
    (
        *STAGE_COLUMNS,
        "frame_age_ms",
        "e2e_ms",
        "out_tokens",
        "vision_tokens",
        "audio_tokens",
        "first_emit_ms",
        "emitted",
        "lateness_ms",
        "output_latency_ms",
        "t_consumed",
    )
)
_MEMORY_COLUMNS = frozenset(
    (
        "rss_bytes",
        "gpu_mem_used_bytes",
        "gpu_proc_mem_bytes",
        "torch_reserved_bytes",
        "torch_allocated_bytes",
    )
)


def frame_values(
    conn: sqlite3.Connection, run_id: str, columns: Sequence[str], *, profile: bool = False
) -> dict[str, np.ndarray]:
    """Per-frame values of ``columns`` (float arrays, NaN where NULL), one entry per frame in
    frame order, for frames that were dispatched and did not raise.

    Soak runs (``profile=False``) use the post-warm-up frames (``measured_frames``); profile
    runs use every frame but the first, whatever the warm-up flag says."""
    bad = [c for c in columns if c not in _FRAME_VALUE_COLUMNS]
    if bad:
        raise ValueError(f"not a per-frame value column: {bad[0]}")
    where = "first = 0 AND skipped = 0" if profile else "warmup = 0 AND skipped = 0"
    cols = ", ".join(columns)
    rows = conn.execute(
        f"SELECT {cols} FROM frames WHERE run_id = ? AND {where} AND error IS NULL"
        " ORDER BY frame_id",
        (run_id,),
    ).fetchall()
    arr = np.array(
        [[np.nan if v is None else v for v in r] for r in rows], dtype=np.float64
    ).reshape(len(rows), len(columns))
    return {c: arr[:, i] for i, c in enumerate(columns)}


def first_frame(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """The first dispatched frame's stage times, tokens and error (None if no frame)."""
    row = conn.execute(
        "SELECT frame_id, grab_ms, pre_ms, infer_ms, decode_ms, total_ms, out_tokens,"
        " first_emit_ms, error FROM frames WHERE run_id = ? AND skipped = 0"
        " ORDER BY first DESC, frame_id LIMIT 1",
        (run_id,),
    ).fetchone()
    if row is None:
        return None
    keys = (
        "frame_id",
        "grab_ms",
        "pre_ms",
        "infer_ms",
        "decode_ms",
        "total_ms",
        "out_tokens",
        "first_emit_ms",
        "error",
    )
    return dict(zip(keys, tuple(row), strict=True))


def frame_counts(conn: sqlite3.Connection, run_id: str) -> dict[str, int]:
    """Counts of the run's frames: all rows, dispatched, errors, queue drops and stale skips
    (from the cumulative counters) and the same after warm-up (``post_*``, ``measured``)."""
    row = conn.execute(
        """
        SELECT count(*),
               coalesce(sum(skipped = 0), 0),
               coalesce(sum(error IS NOT NULL), 0),
               coalesce(sum(warmup = 0), 0),
               coalesce(sum(warmup = 0 AND skipped = 0), 0),
               coalesce(max(drop_count), 0),
               coalesce(max(CASE WHEN warmup = 1 THEN drop_count END), 0),
               coalesce(max(stale_count), 0),
               coalesce(max(CASE WHEN warmup = 1 THEN stale_count END), 0)
        FROM frames WHERE run_id = ?
        """,
        (run_id,),
    ).fetchone()
    return {
        "rows": int(row[0]),
        "dispatched": int(row[1]),
        "errors": int(row[2]),
        "post_rows": int(row[3]),
        "measured": int(row[4]),
        "post_drops": int(row[5]) - int(row[6]),
        "post_stale": int(row[7]) - int(row[8]),
        "drops": int(row[5]),
        "stale": int(row[7]),
    }


def sample_series(
    conn: sqlite3.Connection, run_id: str, column: str, *, t_min: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(t, value) arrays of one memory column's non-NULL samples at ``t >= t_min``."""
    if column not in _MEMORY_COLUMNS:
        raise ValueError(f"not a memory column: {column}")
    rows = conn.execute(
        f"SELECT t, {column} FROM samples WHERE run_id = ? AND t >= ? AND {column} IS NOT NULL"
        " ORDER BY seq",
        (run_id, t_min),
    ).fetchall()
    a = np.array(rows, dtype=np.float64).reshape(len(rows), 2)
    return a[:, 0], a[:, 1]


def peak_memory(conn: sqlite3.Connection, run_id: str) -> dict[str, int | None]:
    """The largest value each memory column reached during the run (None: never sampled)."""
    cols = sorted(_MEMORY_COLUMNS)
    row = conn.execute(
        f"SELECT {', '.join(f'max({c})' for c in cols)} FROM samples WHERE run_id = ?",
        (run_id,),
    ).fetchone()
    return {c: (None if v is None else int(v)) for c, v in zip(cols, tuple(row), strict=True)}


def verdict_rows(conn: sqlite3.Connection, run_id: str) -> dict[str, dict[str, Any]]:
    """The run's criterion outcomes by criterion name (empty when not judged)."""
    rows = conn.execute(
        "SELECT criterion, status, value, threshold, unit, detail FROM verdicts"
        " WHERE run_id = ? ORDER BY criterion",
        (run_id,),
    ).fetchall()
    return {
        r[0]: {"status": r[1], "value": r[2], "threshold": r[3], "unit": r[4], "detail": r[5]}
        for r in rows
    }


def emission_intervals(
    conn: sqlite3.Connection, run_id: str, *, profile: bool = False
) -> np.ndarray:
    """Inter-output intervals (ms) of a generator run. Outputs with a NULL interval (each
    request's first chunk, or a rollout's very first output: its time is the first-output
    latency) are left out, so one-time cost never enters the intervals. Soak runs keep only
    requests after warm-up; profile runs drop only the first request."""
    where = "f.first = 0" if profile else "f.warmup = 0"
    rows = conn.execute(
        "SELECT e.interval_ms FROM emissions e JOIN frames f"
        " ON f.run_id = e.run_id AND f.frame_id = e.frame_id"
        f" WHERE e.run_id = ? AND e.interval_ms IS NOT NULL AND {where}"
        " ORDER BY e.frame_id, e.idx",
        (run_id,),
    ).fetchall()
    return np.array([r[0] for r in rows], dtype=np.float64)

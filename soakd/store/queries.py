"""Read-side queries behind ``soakd show`` and the end-of-run summary: stage statistics,
events, telemetry peaks. Run rows and run lookup are ``soakd.store.runs``."""

from __future__ import annotations

import sqlite3
from typing import Any

import numpy as np

from soakd.records import SAMPLE_FIELDS, STAGE_COLUMNS

SHOW_COLUMNS = (*STAGE_COLUMNS, "frame_age_ms", "e2e_ms", "output_latency_ms")


def stage_stats(conn: sqlite3.Connection, run_id: str) -> dict[str, dict[str, float | None]]:
    """first frame, p50, p95, p99 and max of each stage over post-warm-up dispatched
    frames."""
    cols = ", ".join(SHOW_COLUMNS)
    first = conn.execute(
        f"SELECT {cols} FROM frames WHERE run_id = ? AND first = 1", (run_id,)
    ).fetchone()
    rows = conn.execute(
        f"SELECT {cols} FROM measured_frames WHERE run_id = ?", (run_id,)
    ).fetchall()
    arr = np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)
    out: dict[str, dict[str, float | None]] = {}
    with np.errstate(invalid="ignore"):  # an infinite value (written by hand) reads as is
        for i, name in enumerate(SHOW_COLUMNS):
            col = arr[:, i] if len(arr) else np.array([])
            out[name.removesuffix("_ms")] = _stats(col, first, i)
    return out


def _stats(col: np.ndarray, first: Any, i: int) -> dict[str, float | None]:
    col = col[~np.isnan(col)]
    return {
        "first": None if first is None or first[i] is None else float(first[i]),
        "p50": float(np.median(col)) if col.size else None,
        "p95": float(np.percentile(col, 95)) if col.size else None,
        "p99": float(np.percentile(col, 99)) if col.size else None,
        "max": float(col.max()) if col.size else None,
        "n": int(col.size),
    }


def events(
    conn: sqlite3.Connection, run_id: str, kinds: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    sql = "SELECT t, kind, frame_id, message, data FROM events WHERE run_id = ?"
    args: list[Any] = [run_id]
    if kinds:
        sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
        args += list(kinds)
    return [dict(r) for r in conn.execute(sql + " ORDER BY id", args)]


def peak(conn: sqlite3.Connection, run_id: str, column: str) -> float | None:
    """The maximum of one telemetry column over a run (None when never sampled)."""
    if column not in SAMPLE_FIELDS:
        raise ValueError(f"not a samples column: {column}")
    row = conn.execute(f"SELECT max({column}) FROM samples WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else row[0]

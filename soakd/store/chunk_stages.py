"""The ``chunk_stages`` table: the named stages of each chunk of a rollout generator, keyed
``(run_id, frame_id, name)``; ``frame_id`` joins with the chunk's ``frames`` row.

A rollout workload times its stages with ``run.stage(name)`` (free-form ``[a-z0-9_]+``
names: "context", "denoise", "kv_write", "vae_decode", "memory_bank" ...); the rollout driver
hands one ``ChunkStage`` per name and chunk to the run's one writer
(``soakd.store.db.StoreWriter``), batched with the rest. ``load_stage_columns`` reads them
back for the analysis as one array per name aligned with the run's frames rows.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import numpy as np

from soakd.records import ChunkStage

TABLE = "chunk_stages"
CHUNK_STAGE_COLUMNS: tuple[str, ...] = ("run_id", "frame_id", "name", "ms")


def chunk_stage_values(c: ChunkStage) -> tuple[Any, ...]:
    """A chunk stage's values in the table's column order after ``run_id``."""
    return (c.frame_id, c.name, c.ms)


def load_stage_columns(
    conn: sqlite3.Connection, run_id: str, frame_ids: np.ndarray
) -> dict[str, np.ndarray]:
    """Per stage name (in order of first appearance): its ms per frames row, aligned with
    ``frame_ids`` (the run's frames rows in order), NaN where the chunk has no such stage.
    Empty for a run without named stages."""
    rows = conn.execute(
        "SELECT frame_id, name, ms FROM chunk_stages WHERE run_id = ? ORDER BY frame_id",
        (run_id,),
    ).fetchall()
    if not rows:
        return {}
    ids = np.asarray(frame_ids, dtype=np.float64)
    order = np.argsort(ids, kind="stable")
    out: dict[str, np.ndarray] = {}
    for fid, name, ms in rows:
        col = out.get(name)
        if col is None:
            col = out[name] = np.full(ids.size, np.nan)
        pos = int(np.searchsorted(ids, float(fid), sorter=order))
        if pos < ids.size and ids[order[pos]] == float(fid):
            col[order[pos]] = float(ms)
    return out


def chunk_stage_stats(conn: sqlite3.Connection, run_id: str) -> dict[str, dict[str, Any]]:
    """Per stage name: n, p50, p95, p99 and max (ms) over the run's measured chunks
    (``measured_frames``: post-warm-up, dispatched), for ``soakd show``."""
    rows = conn.execute(
        "SELECT c.name, c.ms FROM chunk_stages c JOIN measured_frames f"
        " ON f.run_id = c.run_id AND f.frame_id = c.frame_id WHERE c.run_id = ?"
        " ORDER BY c.frame_id",
        (run_id,),
    ).fetchall()
    by: dict[str, list[float]] = {}
    for name, ms in rows:
        by.setdefault(str(name), []).append(float(ms))
    out: dict[str, dict[str, Any]] = {}
    for name, values in by.items():
        v = np.asarray(values)
        p50, p95, p99 = (float(x) for x in np.percentile(v, [50, 95, 99]))
        out[name] = {"n": int(v.size), "p50": p50, "p95": p95, "p99": p99, "max": float(v.max())}
    return out

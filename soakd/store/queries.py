"""Read-side queries used by ``soakd runs`` / ``soakd show`` and the CLI's run lookup."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import numpy as np

from soakd.errors import UsageError
from soakd.records import STAGE_COLUMNS

SHOW_COLUMNS = (*STAGE_COLUMNS, "frame_age_ms", "e2e_ms")


def list_runs(
    conn: sqlite3.Connection, *, limit: int = 20, mode: str | None = None
) -> list[dict[str, Any]]:
    sql = (
        "SELECT run_id, name, mode, status, verdict, workload_kind, fps, started_at,"
        " duration_s, frames, measured_frames, drops, stale, errors FROM run_summary"
    )
    args: list[Any] = []
    if mode:
        sql += " WHERE mode = ?"
        args.append(mode)
    sql += " ORDER BY started_at DESC, run_id DESC LIMIT ?"
    args.append(limit)
    return [dict(r) for r in conn.execute(sql, args)]


def resolve_run_id(
    conn: sqlite3.Connection, ref: str | None, *, latest: bool = False, mode: str | None = "soak"
) -> str:
    """A full run id, a unique prefix of one, or the latest run (of ``mode``)."""
    if latest or ref in (None, "latest", "--latest"):
        sql = "SELECT id FROM runs"
        args: tuple[Any, ...] = ()
        if mode:
            sql += " WHERE mode = ?"
            args = (mode,)
        row = conn.execute(sql + " ORDER BY started_unix DESC, id DESC LIMIT 1", args).fetchone()
        if row is None:
            raise UsageError("no runs in this database yet")
        return str(row[0])
    assert ref is not None
    rows = conn.execute(
        "SELECT id FROM runs WHERE id = ? OR id LIKE ? ESCAPE '\\' LIMIT 3",
        (ref, ref.replace("%", "\\%").replace("_", "\\_") + "%"),
    ).fetchall()
    exact = [r[0] for r in rows if r[0] == ref]
    if exact:
        return str(exact[0])
    if not rows:
        raise UsageError(f"no run {ref!r} in this database")
    if len(rows) > 1:
        raise UsageError(f"run id prefix {ref!r} is ambiguous")
    return str(rows[0][0])


def get_run(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise UsageError(f"no run {run_id!r} in this database")
    d = dict(row)
    for k in ("config", "workload", "environment", "summary"):
        if d.get(k):
            d[k] = json.loads(d[k])
    return d


def stage_stats(conn: sqlite3.Connection, run_id: str) -> dict[str, dict[str, float | None]]:
    """first frame, p50, p95 and max of each stage over post-warm-up dispatched frames."""
    cols = ", ".join(SHOW_COLUMNS)
    first = conn.execute(
        f"SELECT {cols} FROM frames WHERE run_id = ? AND first = 1", (run_id,)
    ).fetchone()
    rows = conn.execute(
        f"SELECT {cols} FROM measured_frames WHERE run_id = ?", (run_id,)
    ).fetchall()
    arr = np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)
    out: dict[str, dict[str, float | None]] = {}
    for i, name in enumerate(SHOW_COLUMNS):
        col = arr[:, i] if len(arr) else np.array([])
        col = col[~np.isnan(col)]
        key = name.removesuffix("_ms")
        out[key] = {
            "first": None if first is None or first[i] is None else float(first[i]),
            "p50": float(np.median(col)) if col.size else None,
            "p95": float(np.percentile(col, 95)) if col.size else None,
            "max": float(col.max()) if col.size else None,
            "n": int(col.size),
        }
    return out


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
    from soakd.records import SAMPLE_FIELDS

    if column not in SAMPLE_FIELDS:
        raise ValueError(f"not a samples column: {column}")
    row = conn.execute(f"SELECT max({column}) FROM samples WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else row[0]

"""The SQL behind ``soakd profile``, ``sweep``, ``compare`` and ``baseline``.

Every function takes an open connection (``soakd.store.db.connect``) and returns plain
Python values or numpy arrays; nothing here interprets the numbers (that is
``soakd.studies.profiling`` and ``soakd.studies.compare``).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from soakd.errors import UsageError
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
        "vision_tokens",
        "audio_tokens",
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


@dataclass(frozen=True, slots=True)
class RunRow:
    """The ``runs`` row of one run, with its JSON columns decoded."""

    id: str
    name: str | None
    mode: str
    status: str
    reason: str | None
    started_at: str
    duration_s: float | None
    workload_kind: str | None
    fps: float | None
    config: dict[str, Any]
    config_hash: str
    workload: dict[str, Any]
    summary: dict[str, Any]
    verdict: str | None


def _loads(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        v = json.loads(text)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def get_run(conn: sqlite3.Connection, run_id: str) -> RunRow | None:
    """The run with exactly this id, or None."""
    row = conn.execute(
        "SELECT id, name, mode, status, reason, started_at, duration_s, workload_kind, fps,"
        " config, config_hash, workload, summary, verdict FROM runs WHERE id = ?",
        (run_id,),
    ).fetchone()
    if row is None:
        return None
    return RunRow(
        id=row[0],
        name=row[1],
        mode=row[2],
        status=row[3],
        reason=row[4],
        started_at=row[5],
        duration_s=row[6],
        workload_kind=row[7],
        fps=row[8],
        config=_loads(row[9]),
        config_hash=row[10],
        workload=_loads(row[11]),
        summary=_loads(row[12]),
        verdict=row[13],
    )


def resolve_run(conn: sqlite3.Connection, ref: str) -> str:
    """A run id from what a person typed: an exact run id, ``baseline:NAME``, a bare baseline
    name, ``latest``, or a unique prefix of a run id. Raises UsageError naming the problem."""
    ref = ref.strip()
    if ref.startswith("baseline:"):
        name = ref.removeprefix("baseline:")
        rid = get_baseline(conn, name)
        if rid is None:
            raise UsageError(f"{ref}: no baseline named {name!r} (see `soakd baseline list`)")
        return rid
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (ref,)).fetchone():
        return ref
    rid = get_baseline(conn, ref)
    if rid is not None:
        return rid
    if ref == "latest":
        row = conn.execute(
            "SELECT id FROM runs WHERE mode = 'soak' ORDER BY started_unix DESC LIMIT 1"
        ).fetchone()
        if row is None:
            raise UsageError("latest: the run database holds no soak run yet")
        return str(row[0])
    rows = conn.execute(
        "SELECT id FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY id LIMIT 3",
        (ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
    ).fetchall()
    if len(rows) == 1:
        return str(rows[0][0])
    if rows:
        raise UsageError(f"{ref}: ambiguous run id prefix ({', '.join(r[0] for r in rows)}...)")
    raise UsageError(f"{ref}: no run or baseline with this id or name")


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
    request's first chunk, whose time is the first-output latency) are left out, so one-time
    cost never enters the intervals. Soak runs keep only requests after warm-up; profile
    runs drop only the first request."""
    where = "f.first = 0" if profile else "f.warmup = 0"
    rows = conn.execute(
        "SELECT e.interval_ms FROM emissions e JOIN frames f"
        " ON f.run_id = e.run_id AND f.frame_id = e.frame_id"
        f" WHERE e.run_id = ? AND e.idx > 0 AND e.interval_ms IS NOT NULL AND {where}"
        " ORDER BY e.frame_id, e.idx",
        (run_id,),
    ).fetchall()
    return np.array([r[0] for r in rows], dtype=np.float64)


# --- baselines


def set_baseline(conn: sqlite3.Connection, name: str, run_id: str) -> None:
    """Mark ``run_id`` as the baseline ``name`` (replacing an earlier one of that name)."""
    conn.execute(
        "INSERT INTO baselines (name, run_id, created_at) VALUES (?, ?, ?)"
        " ON CONFLICT(name) DO UPDATE SET run_id = excluded.run_id,"
        " created_at = excluded.created_at",
        (name, run_id, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
    )


def get_baseline(conn: sqlite3.Connection, name: str) -> str | None:
    """The run id of baseline ``name``, or None."""
    row = conn.execute("SELECT run_id FROM baselines WHERE name = ?", (name,)).fetchone()
    return None if row is None else str(row[0])


def list_baselines(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every baseline with its run's mode, verdict, workload and start time."""
    rows = conn.execute(
        "SELECT b.name, b.run_id, b.created_at, r.mode, r.verdict, r.workload_kind,"
        " r.started_at FROM baselines b LEFT JOIN runs r ON r.id = b.run_id ORDER BY b.name"
    ).fetchall()
    keys = ("name", "run_id", "created_at", "mode", "verdict", "workload_kind", "started_at")
    return [dict(zip(keys, tuple(r), strict=True)) for r in rows]

"""Read one run's raw rows (frames, samples, gpu_samples, emissions, chunk_stages,
server_metrics) for ``soakd export``, in chunks.

The columns come from the table itself (``PRAGMA table_info``), so a column a migration adds
is exported without a change here; ``run_id`` is left out (every row has the same one).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Generator
from typing import Any

#: the tables ``soakd export --table`` can write, and the key that orders their rows
EXPORT_TABLES: dict[str, str] = {
    "frames": "frame_id",
    "samples": "seq",
    "emissions": "frame_id, idx",
    "gpu_samples": "seq, gpu",  # one row per GPU per tick (runs on several GPUs)
    "chunk_stages": "frame_id, name",  # one row per named stage per rollout chunk
    "server_metrics": "seq, name, labels",  # a served model's server metrics, per tick
}
CHUNK_ROWS = 5000


def columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    """(name, declared SQLite type) of each exported column of ``table``, in table order."""
    _check(table)
    rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
    return [(str(r[1]), str(r[2]).upper()) for r in rows if r[1] != "run_id"]


def count_rows(conn: sqlite3.Connection, table: str, run_id: str) -> int:
    """How many rows ``iter_chunks`` yields for this run."""
    _check(table)
    row = conn.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", (run_id,)).fetchone()
    return int(row[0])


def iter_chunks(
    conn: sqlite3.Connection, table: str, run_id: str, *, chunk_rows: int = CHUNK_ROWS
) -> Generator[list[tuple[Any, ...]], None, None]:
    """The run's rows of ``table`` in key order, ``chunk_rows`` at a time (never all at
    once); each row's values follow ``columns(conn, table)``. Close it (``contextlib.
    closing``) before the connection when not read to the end: its cursor closes then."""
    names = ", ".join(name for name, _ in columns(conn, table))
    cur = conn.execute(
        f"SELECT {names} FROM {table} WHERE run_id = ? ORDER BY {EXPORT_TABLES[table]}",
        (run_id,),
    )
    try:
        while chunk := cur.fetchmany(chunk_rows):
            yield [tuple(r) for r in chunk]
    finally:
        cur.close()


def _check(table: str) -> None:
    if table not in EXPORT_TABLES:
        raise ValueError(f"not an exportable table: {table!r} (one of {', '.join(EXPORT_TABLES)})")

"""Deleting old runs and giving their space back to the disk (``soakd prune``).

The rules, in the order they apply:

* **In scope**: the runs of ``mode`` (None: every mode).
* **Kept by a rule**: ``keep_days`` keeps a run that started within the last N days
  (``runs.started_unix``); ``keep_runs`` keeps the newest N runs of each mode (so a sweep
  of many profile runs never pushes the soaks out). With both, a run goes only when both
  rules let it go: the kept sets are joined.
* **Never deleted**: a run still ``running`` whose process is alive (an orphaned one is a
  crashed run and goes by the rules), and a run a baseline names.
* **Whole runs**: a run's rows go from every table that refers to ``runs`` (found in
  ``sqlite_master``, so a table added by a later migration is not forgotten), then its
  ``runs`` row, in one transaction per batch of runs: a prune killed half-way leaves whole
  runs, never half of one.
* **VACUUM** rewrites the file without the freed pages, then a ``TRUNCATE`` checkpoint
  moves it out of the WAL so the file really shrinks. It takes the write lock for its whole
  length: a soak writing the same file waits (its writer keeps rows in memory past the busy
  timeout, see ``StoreWriter``) and loses nothing. When the lock is not free within the
  busy timeout, the rows stay deleted and the file keeps its size until a later prune.

soakd databases have ``auto_vacuum = NONE`` (SQLite's default; ``connect`` never changes
it), so ``PRAGMA incremental_vacuum`` does nothing on them, and switching an existing file
to incremental mode needs a full VACUUM anyway. Prune therefore always runs a full VACUUM:
one rewrite that also defragments, against incremental mode's pointer-map pages kept up to
date on every insert of every run.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from soakd.store.db import BUSY_TIMEOUT_MS, atomic, is_locked
from soakd.store.runs import find_orphaned_runs

#: frames + samples deleted per transaction (whole runs: at least one run per batch), and
#: at most this many runs (their ids are bound in one statement)
BATCH_ROWS = 100_000
_MAX_IDS = 500
#: pause between batches while a run is live, so its writer gets the lock in (SQLite's busy
#: handler polls every 100 ms at most)
LIVE_PAUSE_S = 0.1
#: how long VACUUM and the checkpoint wait for the write lock
VACUUM_BUSY_TIMEOUT_S = BUSY_TIMEOUT_MS / 1000
_DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Policy:
    """What to keep: runs started in the last ``keep_days`` days, and/or the newest
    ``keep_runs`` runs of each mode, among the runs of ``mode`` (None: any)."""

    keep_days: float | None = None
    keep_runs: int | None = None
    mode: str | None = None

    def __post_init__(self) -> None:
        if self.keep_days is None and self.keep_runs is None:
            raise ValueError("give keep_days or keep_runs (or both)")
        if (self.keep_days or 0) < 0 or (self.keep_runs or 0) < 0:
            raise ValueError("keep_days and keep_runs must be >= 0")


@dataclass(frozen=True, slots=True)
class PrunedRun:
    """A run the policy deletes, with the rows it holds."""

    id: str
    mode: str
    status: str
    started_at: str
    frames: int
    samples: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What a prune deletes and which runs the rules would delete but it keeps."""

    delete: list[PrunedRun]  # oldest first
    kept_baseline: list[str]  # the rules would delete them; a baseline names them
    kept_running: list[str]  # the rules would delete them; they are still being written
    live: list[str]  # every run still being written, of any mode


@dataclass(frozen=True, slots=True)
class Vacuum:
    """How the VACUUM went: ``done``; or not needed (no free page: neither done nor
    skipped); or ``skipped``, saying why (a warning). ``checkpointed`` is false when a
    reader kept the WAL from being emptied (the file shrinks at a later checkpoint)."""

    done: bool
    skipped: str | None = None
    checkpointed: bool = False


# --- what goes


def plan(conn: sqlite3.Connection, policy: Policy, *, now: float | None = None) -> Plan:
    """The runs ``policy`` deletes, oldest first, and the ones it keeps that the rules
    alone would delete (named by a baseline, still running). Reads only."""
    runs = _runs_newest_first(conn, policy.mode)
    keep = _kept_by_rules(runs, policy, time.time() if now is None else now)
    live, named = live_runs(conn), _baseline_runs(conn)
    doomed = [r for r in reversed(runs) if r.id not in keep]
    return Plan(
        delete=[_pruned(conn, r) for r in doomed if r.id not in named and r.id not in live],
        kept_baseline=[r.id for r in doomed if r.id in named],
        kept_running=[r.id for r in doomed if r.id in live and r.id not in named],
        live=live,
    )


def live_runs(conn: sqlite3.Connection) -> list[str]:
    """Runs of any mode still ``running`` whose process is alive, or on another host (where
    this one cannot tell): they are being written."""
    orphans = set(find_orphaned_runs(conn))
    rows = conn.execute("SELECT id FROM runs WHERE status = 'running' ORDER BY id")
    return [str(r[0]) for r in rows if r[0] not in orphans]


@dataclass(frozen=True, slots=True)
class _Run:
    """What the rules look at in a ``runs`` row."""

    id: str
    mode: str
    status: str
    started_at: str
    started_unix: float


def _runs_newest_first(conn: sqlite3.Connection, mode: str | None) -> list[_Run]:
    sql = "SELECT id, mode, status, started_at, started_unix FROM runs"
    args: tuple[str, ...] = ()
    if mode:
        sql, args = sql + " WHERE mode = ?", (mode,)
    rows = conn.execute(sql + " ORDER BY started_unix DESC, id DESC", args).fetchall()
    return [_Run(str(a), str(b), str(c), str(d), float(e)) for a, b, c, d, e in rows]


def _kept_by_rules(runs: Sequence[_Run], policy: Policy, now: float) -> set[str]:
    """Ids of the runs either rule keeps (``runs`` newest first): started in the last
    ``keep_days`` days, or among the newest ``keep_runs`` of their mode."""
    keep: set[str] = set()
    if policy.keep_days is not None:
        since = now - policy.keep_days * _DAY_S
        keep |= {r.id for r in runs if r.started_unix >= since}
    if policy.keep_runs is not None:
        rank: Counter[str] = Counter()
        for r in runs:
            rank[r.mode] += 1
            if rank[r.mode] <= policy.keep_runs:
                keep.add(r.id)
    return keep


def _baseline_runs(conn: sqlite3.Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT DISTINCT run_id FROM baselines")}


def _pruned(conn: sqlite3.Connection, r: _Run) -> PrunedRun:
    frames, samples = _count(conn, "frames", r.id), _count(conn, "samples", r.id)
    return PrunedRun(r.id, r.mode, r.status, r.started_at, frames, samples)


def _count(conn: sqlite3.Connection, table: str, run_id: str) -> int:
    return int(
        conn.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", (run_id,)).fetchone()[0]
    )


# --- deleting whole runs


def run_tables(conn: sqlite3.Connection) -> list[tuple[str, list[str]]]:
    """Every table that refers to ``runs`` and its columns that do (a foreign key to
    ``runs``, or a column named ``run_id``), from ``sqlite_master``: what deleting a run
    must empty, including tables later migrations add."""
    names = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        " AND name != 'runs' ORDER BY name"
    ).fetchall()
    out = []
    for (name,) in names:
        cols = {
            str(fk[3]) for fk in conn.execute(f"PRAGMA foreign_key_list({name})") if fk[2] == "runs"
        }
        cols |= {str(c[1]) for c in conn.execute(f"PRAGMA table_info({name})") if c[1] == "run_id"}
        if cols:
            out.append((str(name), sorted(cols)))
    return out


def delete_runs(
    conn: sqlite3.Connection,
    runs: Sequence[PrunedRun],
    *,
    batch_rows: int = BATCH_ROWS,
    pause_s: float = 0.0,
) -> list[str]:
    """Delete ``runs`` whole, one transaction per batch of about ``batch_rows`` frames and
    samples, pausing ``pause_s`` between batches; returns the ids deleted. A run a baseline
    came to name since the plan was made is left alone (checked under the write lock)."""
    tables = run_tables(conn)
    deleted: list[str] = []
    for k, batch in enumerate(_batches(runs, batch_rows)):
        if k and pause_s:
            time.sleep(pause_s)
        with atomic(conn):
            ids = sorted({r.id for r in batch} - _baseline_runs(conn))
            if ids:
                _delete_ids(conn, tables, ids)
        deleted += ids
    return deleted


def _delete_ids(
    conn: sqlite3.Connection, tables: list[tuple[str, list[str]]], ids: list[str]
) -> None:
    marks = ", ".join("?" * len(ids))
    for table, cols in tables:
        for col in cols:
            conn.execute(f"DELETE FROM {table} WHERE {col} IN ({marks})", ids)
    conn.execute(f"DELETE FROM runs WHERE id IN ({marks})", ids)


def _batches(runs: Sequence[PrunedRun], batch_rows: int) -> Iterator[list[PrunedRun]]:
    """Consecutive runs, as many per batch as fit in ``batch_rows`` rows (at least one)."""
    batch: list[PrunedRun] = []
    rows = 0
    for r in runs:
        size = r.frames + r.samples
        if batch and (rows + size > batch_rows or len(batch) >= _MAX_IDS):
            yield batch
            batch, rows = [], 0
        batch.append(r)
        rows += size
    if batch:
        yield batch


# --- giving the space back


def vacuum(conn: sqlite3.Connection, *, busy_timeout_s: float = VACUUM_BUSY_TIMEOUT_S) -> Vacuum:
    """VACUUM, then empty the WAL into the shrunk file (``wal_checkpoint(TRUNCATE)``), each
    waiting at most ``busy_timeout_s`` for the lock. Not needed when no page is free.
    Skipped, with the reason, when the folder has less free space than twice the live data
    (the copy SQLite builds plus the WAL it writes: a full disk would fail the soak writing
    beside it) or when the lock is not free in time (the rows stay deleted, the file keeps
    its size)."""
    path = Path(conn.execute("PRAGMA database_list").fetchone()[2])
    page_size, pages, free = (
        int(conn.execute(f"PRAGMA {p}").fetchone()[0])
        for p in ("page_size", "page_count", "freelist_count")
    )
    if free == 0:
        return Vacuum(False)
    need = 2 * (pages - free) * page_size
    if shutil.disk_usage(path.parent).free < need:
        return Vacuum(False, f"under {need / 1e6:.0f} MB free beside {path} (twice its live data)")
    with _busy_timeout(conn, busy_timeout_s):
        try:
            conn.execute("VACUUM")
        except sqlite3.OperationalError as exc:
            if not is_locked(exc):
                raise
            return Vacuum(False, f"the write lock was not free within {busy_timeout_s:g} s")
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    return Vacuum(True, checkpointed=not busy)


@contextmanager
def _busy_timeout(conn: sqlite3.Connection, seconds: float) -> Iterator[None]:
    """The connection's busy timeout set to ``seconds`` for the block, then back to soakd's."""
    conn.execute(f"PRAGMA busy_timeout={int(seconds * 1000)}")
    try:
        yield
    finally:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")


def file_bytes(path: Path) -> int:
    """What the database takes on disk: the file and its ``-wal``."""
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

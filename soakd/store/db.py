"""Opening the run database and writing to it.

* ``connect(path)`` opens (creating and migrating as needed) a connection in WAL mode with a
  busy timeout, so readers such as ``sqlite-utils query`` never make the run fail, and marks
  runs left ``running`` by a process that no longer exists as ``crashed``
  (``soakd.store.runs.mark_orphaned_runs``).
* ``atomic(conn)`` is the one transaction helper (nestable: BEGIN IMMEDIATE / SAVEPOINT).
* ``StoreWriter`` is the one writer thread of a run: records are handed to it through a
  queue and inserted in batches, one transaction per flush, at least every
  ``flush_interval_s`` (a crash loses at most that).
"""

from __future__ import annotations

import errno
import itertools
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from soakd.records import SAMPLE_FIELDS, Emission, Event, FrameRecord, Sample
from soakd.store.runs import mark_orphaned_runs
from soakd.store.schema import (
    EMISSION_COLUMNS,
    EVENT_COLUMNS,
    FRAME_COLUMNS,
    SAMPLE_COLUMNS,
    migrate,
)

BUSY_TIMEOUT_MS = 10_000


class StoreError(RuntimeError):
    """The run database cannot be opened or written (path, permissions, disk full)."""


_savepoints = itertools.count(1)


def _undo(conn: sqlite3.Connection, *statements: str) -> None:
    """Roll back after an error without masking it: SQLite may already have rolled the whole
    transaction back (SQLITE_FULL, SQLITE_IOERR, SQLITE_NOMEM do), and then there is nothing
    left to undo and ROLLBACK itself would fail."""
    if not conn.in_transaction:
        return
    try:
        for sql in statements:
            conn.execute(sql)
    except sqlite3.Error:
        pass


@contextmanager
def atomic(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One transaction around the block, nestable (like sqlite-utils' ``conn``-level
    transactions): the outermost is ``BEGIN IMMEDIATE`` ... ``COMMIT``, an inner one a
    ``SAVEPOINT`` that is released, or rolled back to on an exception, leaving the outer
    transaction going. An exception rolls back and propagates unchanged, even when SQLite
    already rolled back by itself. Needs a connection opened with ``isolation_level=None``
    (``connect`` does) or one outside any implicit transaction."""
    if conn.in_transaction:
        name = f"soakd_sp{next(_savepoints)}"
        conn.execute(f"SAVEPOINT {name}")
        try:
            yield conn
            conn.execute(f"RELEASE {name}")
        except BaseException:
            _undo(conn, f"ROLLBACK TO {name}", f"RELEASE {name}")
            raise
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        _undo(conn, "ROLLBACK")
        raise


def _describe_os_error(path: Path, exc: BaseException) -> str:
    msg = str(exc)
    if isinstance(exc, sqlite3.OperationalError):
        low = msg.lower()
        if "readonly" in low or "read-only" in low:
            return f"{path}: the run database is read-only"
        if "unable to open" in low:
            return (
                f"{path}: cannot open the run database (does the folder exist and is it writable?)"
            )
        if "disk is full" in low or "database or disk is full" in low:
            return f"{path}: disk full while writing the run database"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"{path}: disk full while writing the run database"
    return f"{path}: {msg}"


def connect(
    path: str | Path, *, readonly: bool = False, mark_orphans: bool = True
) -> sqlite3.Connection:
    """Open the run database (WAL, busy timeout, migrations applied).

    Runs whose status is still ``running`` but whose process is gone are marked
    ``crashed`` (the process was killed, or the machine lost power).
    """
    p = Path(path)
    if readonly:
        if not p.exists():
            raise StoreError(f"{p}: no run database here")
        uri = f"file:{p}?mode=ro"
        try:
            conn = sqlite3.connect(
                uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("SELECT 1 FROM runs LIMIT 1")
        except sqlite3.Error as exc:
            raise StoreError(_describe_os_error(p, exc)) from None
        conn.row_factory = sqlite3.Row
        return conn
    if p.parent and not p.parent.exists():
        raise StoreError(f"{p}: folder {p.parent} does not exist")
    try:
        conn = sqlite3.connect(
            p, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StoreError(f"{p}: cannot switch the run database to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        migrate(conn)
        if mark_orphans:
            with atomic(conn):
                mark_orphaned_runs(conn)
    except sqlite3.DatabaseError as exc:
        if "file is not a database" in str(exc):
            raise StoreError(f"{p}: not an SQLite database") from None
        raise StoreError(_describe_os_error(p, exc)) from None
    conn.row_factory = sqlite3.Row
    return conn


def _json(v: Any) -> str | None:
    return None if v is None else json.dumps(v, default=str, separators=(",", ":"))


def frame_row(run_id: str, r: FrameRecord) -> tuple[Any, ...]:
    return (
        run_id,
        r.frame_id,
        r.t_sched,
        r.t_capture,
        r.t_dispatch,
        r.t_done,
        r.lateness_ms,
        r.grab_ms,
        r.pre_ms,
        r.infer_ms,
        r.decode_ms,
        r.total_ms,
        r.queue_len,
        r.frame_age_ms,
        r.e2e_ms,
        r.drop_count,
        r.stale_count,
        r.out_tokens,
        r.vision_tokens,
        r.audio_tokens,
        r.error,
        int(r.first),
        int(r.warmup),
        int(r.skipped),
        r.session_dropped,
        r.pending,
        r.output_kind,
        r.output_latency_ms,
        r.first_emit_ms,
        r.emitted,
        _json(r.extra),
    )


def sample_row(run_id: str, s: Sample) -> tuple[Any, ...]:
    v = s.values
    return (run_id, s.seq, s.t, s.wall, s.lag_ms, s.tick_ms, *(v.get(k) for k in SAMPLE_FIELDS))


def emission_row(run_id: str, e: Emission) -> tuple[Any, ...]:
    return (run_id, e.frame_id, e.idx, e.t_emit, e.interval_ms, e.chunk, e.chunk_frames, e.chunk_ms)


def event_row(run_id: str, e: Event) -> tuple[Any, ...]:
    return (run_id, e.t, e.wall, e.kind, e.frame_id, e.message, _json(e.data))


def _insert_sql(table: str, cols: Iterable[str]) -> str:
    cols = list(cols)
    return (
        f"INSERT OR REPLACE INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    )


_SQL = {
    FrameRecord: _insert_sql("frames", FRAME_COLUMNS),
    Sample: _insert_sql("samples", SAMPLE_COLUMNS),
    Emission: _insert_sql("emissions", EMISSION_COLUMNS),
    Event: _insert_sql("events", EVENT_COLUMNS),
}
_ROW: dict[type, Callable[[str, Any], tuple[Any, ...]]] = {
    FrameRecord: frame_row,
    Sample: sample_row,
    Emission: emission_row,
    Event: event_row,
}


class StoreWriter:
    """The one writer thread. ``put`` never blocks the caller and never touches SQLite."""

    _STOP = object()

    def __init__(
        self, path: str | Path, run_id: str, *, flush_interval_s: float = 0.5, max_batch: int = 5000
    ) -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="soakd-store", daemon=True)
        self.error: BaseException | None = None
        self.rows_written = 0
        self.flushes = 0

    def start(self) -> None:
        self._thread.start()

    def put(self, record: FrameRecord | Sample | Emission | Event) -> None:
        self._q.put(record)

    def close(self, timeout: float = 30.0) -> None:
        """Flush everything queued and stop the thread."""
        self._q.put(self._STOP)
        self._thread.join(timeout)

    def _loop(self) -> None:
        conn = None
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA synchronous=NORMAL")
            batch: list[Any] = []
            deadline = time.monotonic() + self.flush_interval_s
            stopping = False
            while not stopping:
                timeout = max(0.0, deadline - time.monotonic())
                try:
                    item = self._q.get(timeout=timeout)
                    if item is self._STOP:
                        stopping = True
                    else:
                        batch.append(item)
                        # drain without waiting
                        while len(batch) < self.max_batch:
                            try:
                                item = self._q.get_nowait()
                            except queue.Empty:
                                break
                            if item is self._STOP:
                                stopping = True
                                break
                            batch.append(item)
                except queue.Empty:
                    pass
                now = time.monotonic()
                if batch and (stopping or now >= deadline or len(batch) >= self.max_batch):
                    self._flush(conn, batch)
                    batch = []
                if now >= deadline:
                    deadline = now + self.flush_interval_s
        except BaseException as exc:  # recorded and re-raised by the runner
            self.error = StoreError(_describe_os_error(self.path, exc))
        finally:
            if conn is not None:
                conn.close()

    def _flush(self, conn: sqlite3.Connection, batch: list[Any]) -> None:
        grouped: dict[type, list[tuple[Any, ...]]] = {}
        rid = self.run_id
        for rec in batch:
            t = type(rec)
            grouped.setdefault(t, []).append(_ROW[t](rid, rec))
        # atomic keeps the real error when SQLite already rolled back (SQLITE_FULL does)
        with atomic(conn):
            for t, rows in grouped.items():
                conn.executemany(_SQL[t], rows)
        self.rows_written += len(batch)
        self.flushes += 1

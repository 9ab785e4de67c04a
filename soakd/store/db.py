"""Opening the run database and writing to it.

* ``connect(path)`` opens (creating and migrating as needed) a connection in WAL mode with a
  busy timeout, so readers such as ``sqlite-utils query`` never make the run fail, and marks
  runs left ``running`` by a process that no longer exists as ``crashed``
  (``soakd.store.runs.mark_orphaned_runs``).
* ``atomic(conn)`` is the one transaction helper (nestable: BEGIN IMMEDIATE / SAVEPOINT).
* ``StoreWriter`` is the one writer thread of a run: records are handed to it through a
  queue and inserted in batches, one transaction per flush, at least every
  ``flush_interval_s`` and whenever ``flush_soon()`` asks (a run's monitor, once a second):
  a crash loses at most what came since.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
import math
import operator
import pickle
import queue
import sqlite3
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from soakd import redact
from soakd.records import (
    SAMPLE_FIELDS,
    ChunkStage,
    DeviceSample,
    Emission,
    Event,
    FrameRecord,
    Sample,
    ServerMetric,
)
from soakd.store.chunk_stages import CHUNK_STAGE_COLUMNS, chunk_stage_values
from soakd.store.gpu_samples import GPU_SAMPLE_COLUMNS, gpu_sample_values
from soakd.store.runs import mark_orphaned_runs
from soakd.store.schema import (
    EMISSION_COLUMNS,
    EVENT_COLUMNS,
    FRAME_COLUMNS,
    SAMPLE_COLUMNS,
    ChangedSchemaError,
    NewerSchemaError,
    check_columns,
    check_schema,
    migrate,
    stand_in_older_schema,
)
from soakd.store.server_metrics import SERVER_METRIC_COLUMNS, server_metric_values

BUSY_TIMEOUT_MS = 10_000
SQLITE_BUSY, SQLITE_LOCKED = 5, 6
#: how many records the writer turns into rows at a time, holding the GIL (about 0.3 ms),
#: and its shortest sleep between two looks at its queue: it sleeps until about a chunk has
#: gathered at the rate records came since its last look, at least this long, at most until
#: the next flush (``flush_interval_s``; while the database is locked, this long). A served
#: run's few records a second wake it twice a second, not 20 times (each wake costs the
#: process CPU: docs/benchmarks.md, issue 34); a fast run's queue holds about a chunk
DRAIN_INTERVAL_S = 0.05
DRAIN_CHUNK = 256
# rows a writer keeps while another connection holds the lock (measured 0.35-0.41 KB each
# in memory: about 400 MB at the bound)
MAX_PENDING = 1_000_000
# rows a writer keeps in memory while it waits for the lock; past this they move to a spill
# file on disk (``_Spill``) and come back at the flush, so what waits for the lock costs
# soakd's RSS, which memory_rss judges as the model's, ~0.1 MB (with one drained chunk)
# however long the lock
SPILL_ROWS = 128
#: how long one of the writer's flushes waits in SQLite's busy handler for another
#: connection's lock. Short: between two tries the writer goes back to its queue, so what a
#: held lock keeps waiting is the pending rows (spilled past ``SPILL_ROWS``), never the
#: queue (a flush waiting out the 10 s busy timeout left 10 s of records queued in memory:
#: soakd's RSS rose 0.7 MB under an 18 s lock and stayed, docs/verdict.md). A lock held
#: for the busy timeout is an episode, as before: a warning, a ``store_locked`` event
ATTEMPT_WAIT_S = 0.1


def _log() -> Any:
    """soakd.store's logger. structlog (asyncio and rich under it, ~0.2 s of CPU) is imported
    at the first warning, not by every command that only reads the database."""
    import structlog

    return structlog.get_logger("soakd.store")


# Binding None is the writer's most expensive step without this: CPython's sqlite3 (3.11)
# has no adapter registered for NoneType, so each NULL parameter goes through a failed
# adapter look-up (a key tuple, a dict miss, two attribute look-ups that raise and clear
# AttributeError) before it binds NULL: about 0.4 µs, with the GIL held, and a frame row
# has a dozen NULLs. With an adapter that returns None for None (an empty dict's ``get``, a
# C call) the look-up hits at once and the same NULL is bound. Process-wide, and an
# identity: every caller of sqlite3 in the process still binds NULL for None.
_NOTHING: dict[None, None] = {}
sqlite3.register_adapter(type(None), _NOTHING.get)
# bool is not an exact int either and takes the same slow path; ``int`` binds it as 0 or 1,
# as the failed look-up then did (a frame row has three flags)
sqlite3.register_adapter(bool, int)


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


def is_locked(exc: BaseException) -> bool:
    """SQLITE_BUSY / SQLITE_LOCKED (any extended code): another connection holds the lock."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED)
    return "is locked" in str(exc)


def describe_store_error(path: Path, exc: BaseException) -> str:
    """One line naming what went wrong with the run database at ``path`` (locked,
    read-only, disk full, damaged, ...), for whichever step met ``exc``."""
    msg = str(exc)
    if is_locked(exc):
        return (
            f"{path}: the run database is locked by another connection"
            " (a reader in a write transaction?); try again when it is done"
        )
    if isinstance(exc, sqlite3.DatabaseError):
        low = msg.lower()
        if "readonly" in low or "read-only" in low:
            return f"{path}: the run database is read-only"
        if "unable to open" in low:
            return (
                f"{path}: cannot open the run database (does the folder exist and is it writable?)"
            )
        if "disk is full" in low or "database or disk is full" in low:
            return f"{path}: disk full while writing the run database"
        if "file is not a database" in low:
            return f"{path}: not an SQLite database"
        if "malformed" in low:
            return corrupt_message(path, exc)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"{path}: disk full while writing the run database"
    return f"{path}: {msg}"


#: how long ``check_damage`` may read a database before a run (a page cache reads some
#: hundreds of MB a second): a larger file is checked only this long
DAMAGE_CHECK_S = 10.0


def check_damage(conn: sqlite3.Connection, path: Path, budget_s: float = DAMAGE_CHECK_S) -> bool:
    """``PRAGMA quick_check`` before a run writes into the file: a damaged one is refused
    (StoreError, ``corrupt_message``) as every read command refuses it, not found by the
    writer mid-run. False when the check ran out of ``budget_s`` (nothing found so far)."""
    deadline = time.monotonic() + budget_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        row = conn.execute("PRAGMA quick_check(1)").fetchone()
    except sqlite3.OperationalError as exc:
        if "interrupt" in str(exc):
            return False
        raise StoreError(describe_store_error(path, exc)) from None
    except sqlite3.DatabaseError as exc:
        raise StoreError(corrupt_message(path, exc)) from None
    finally:
        conn.set_progress_handler(None, 0)
    if row is not None and row[0] != "ok":
        found = " ".join(str(row[0]).replace("*** in database main ***", "").split())
        raise StoreError(corrupt_message(path, Exception(f"quick_check: {found}")))
    return True


def corrupt_message(path: Path, exc: BaseException) -> str:
    """One line for a damaged database file, with the command that shows the damage."""
    return (
        f"{path}: the run database is damaged ({exc}); check it with"
        f" `sqlite3 {path} 'PRAGMA quick_check'`"
    )


def _check_schema(conn: sqlite3.Connection, p: Path) -> None:
    """Refuse a database from a newer soakd, or one whose tables were changed by hand: the
    run would fail at its first write, the report at its first query."""
    try:
        check_columns(conn, check_schema(conn))
    except NewerSchemaError as exc:
        raise StoreError(f"{p}: {exc}") from None
    except ChangedSchemaError as exc:
        raise StoreError(f"{p}: {changed_schema_message(exc)}") from None


def changed_schema_message(exc: ChangedSchemaError) -> str:
    """The one line after the path for a schema changed outside soakd."""
    return (
        f"{exc}: the schema was changed outside soakd (no migration records it); restore"
        " it, or give another database file"
    )


def _check_writable(conn: sqlite3.Connection) -> None:
    """A real write, rolled back: a file SQLite opened read-only (0444, read-only mount) or
    one locked by another connection fails here, at start, not at the run's first write."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE _soakd_write_check (x)")
    finally:
        _undo(conn, "ROLLBACK")


def sqlite_uri(path: Path, flag: str = "") -> str:
    """The ``file:`` URI of ``path`` (resolved, percent-quoted so ``?``, ``#`` and ``%`` in
    a path stay part of it) with an optional ``?flag`` (``mode=ro``, ``immutable=1``)."""
    return f"file:{quote(str(path.resolve()))}" + (f"?{flag}" if flag else "")


def _connect_readonly(p: Path) -> sqlite3.Connection:
    """``mode=ro``; in a folder this user cannot write, with no live WAL (no soakd writing
    it), SQLite cannot create the ``-shm`` file that mode needs: then ``immutable=1``."""
    last: sqlite3.Error | None = None
    for flag in ("mode=ro", "immutable=1"):
        wal = p.with_name(p.name + "-wal")
        if flag == "immutable=1" and wal.exists() and wal.stat().st_size > 0:
            break  # a writer's WAL holds rows an immutable open would not see
        conn = sqlite3.connect(
            sqlite_uri(p, flag), uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA query_only=1")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            last = exc
            if "readonly" not in str(exc).lower() and "unable to open" not in str(exc).lower():
                break
    assert last is not None
    raise last


def is_readonly(conn: sqlite3.Connection) -> bool:
    """Whether ``conn`` was opened by ``connect(readonly=True)`` (it must not write)."""
    return bool(conn.execute("PRAGMA query_only").fetchone()[0])


def _wal(conn: sqlite3.Connection) -> str:
    """Switch to WAL mode; returns the mode now set. The switch needs the file to itself and
    SQLite answers "locked" at once, without the busy handler, while another process opens
    the same new file: it is tried again until the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if not is_locked(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def connect(
    path: str | Path, *, readonly: bool = False, mark_orphans: bool = True
) -> sqlite3.Connection:
    """Open the run database (WAL, busy timeout, migrations applied, writability checked).

    Runs whose status is still ``running`` but whose process is gone are marked
    ``crashed`` (the process was killed, or the machine lost power). ``readonly=True`` opens
    without writing anything (no migration, no orphan marking; ``is_readonly`` is then
    true). Either way a database written by a newer soakd is refused (StoreError).
    """
    p = Path(path)
    if readonly:
        if not p.exists():
            raise StoreError(f"{p}: no run database here")
        try:
            conn = _connect_readonly(p)
            _check_schema(conn, p)
            conn.execute("SELECT 1 FROM runs LIMIT 1")
            stand_in_older_schema(conn)  # an older schema, not migrated here
        except sqlite3.Error as exc:
            raise StoreError(describe_store_error(p, exc)) from None
        conn.row_factory = sqlite3.Row
        return conn
    if p.parent and not p.parent.exists():
        raise StoreError(f"{p}: folder {p.parent} does not exist")
    try:
        conn = sqlite3.connect(
            p, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        _check_schema(conn, p)
        mode = _wal(conn)
        if mode.lower() != "wal":
            raise StoreError(f"{p}: cannot switch the run database to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        migrate(conn)
        _check_writable(conn)
        if mark_orphans:
            with atomic(conn):
                mark_orphaned_runs(conn)
    except sqlite3.DatabaseError as exc:
        if "file is not a database" in str(exc):
            raise StoreError(f"{p}: not an SQLite database") from None
        raise StoreError(describe_store_error(p, exc)) from None
    conn.row_factory = sqlite3.Row
    return conn


def _json(v: Any) -> str | None:
    return None if v is None else json.dumps(v, default=str, separators=(",", ":"))


def frame_values(r: FrameRecord) -> tuple[Any, ...]:
    """A frame's values in the frames table's column order after ``run_id``: the record
    itself (a tuple in that order), with ``extra`` as JSON text and its ``error`` text
    through the redaction layer (soakd.redact: no secret is stored)."""
    if r.extra is None and r.error is None:
        return r
    values = list(r)
    values[_EXTRA] = _json(redact.data(r.extra))
    values[_ERROR] = redact.text(r.error) if r.error is not None else None
    return tuple(values)


_EXTRA = FrameRecord._fields.index("extra")
_ERROR = FrameRecord._fields.index("error")


def frame_row(run_id: str, r: FrameRecord) -> tuple[Any, ...]:
    """A whole frames row, ``run_id`` first."""
    return (run_id, *frame_values(r))


def sample_values(s: Sample) -> tuple[Any, ...]:
    v = s.values
    return (s.seq, s.t, s.wall, s.lag_ms, s.tick_ms, *(v.get(k) for k in SAMPLE_FIELDS))


def sample_row(run_id: str, s: Sample) -> tuple[Any, ...]:
    """A whole samples row, ``run_id`` first."""
    return (run_id, *sample_values(s))


def emission_values(e: Emission) -> tuple[Any, ...]:
    return (e.frame_id, e.idx, e.t_emit, e.interval_ms, e.chunk, e.chunk_frames, e.chunk_ms)


def event_values(e: Event) -> tuple[Any, ...]:
    return (e.t, e.wall, e.kind, e.frame_id, redact.text(e.message), _json(redact.data(e.data)))


#: rows per multi-row INSERT statement. sqlite3 releases the GIL around each statement's
#: step, and a writer thread that wants it back waits up to the interpreter's switch
#: interval (5 ms) behind a busy driver thread: with one statement per row
#: (``executemany``) the writer fell behind by that wait on every row (a 5000-row flush took
#: seconds while frames came). More rows per statement hold the GIL longer while bound (tens
#: of µs for 32 frame rows: the driver waits that long). A flush's rows go 32 at a time,
#: and the rest (fewer than 32: all of them at a paced 30 fps) one statement each as before,
#: so each table has two statement shapes, prepared once (about 0.1 MB for the frames
#: table's 32-row one): a shape prepared in the middle of a run would read as memory growth.
ROWS_PER_STATEMENT = 32

_TABLES: dict[type, tuple[str, tuple[str, ...]]] = {
    FrameRecord: ("frames", tuple(FRAME_COLUMNS)),
    Sample: ("samples", tuple(SAMPLE_COLUMNS)),
    Emission: ("emissions", tuple(EMISSION_COLUMNS)),
    Event: ("events", tuple(EVENT_COLUMNS)),
    DeviceSample: ("gpu_samples", GPU_SAMPLE_COLUMNS),
    ChunkStage: ("chunk_stages", CHUNK_STAGE_COLUMNS),
    ServerMetric: ("server_metrics", SERVER_METRIC_COLUMNS),
}


@functools.lru_cache(maxsize=16)
def _insert_sql(table: str, cols: tuple[str, ...], rows: int) -> str:
    """``INSERT OR REPLACE`` of ``rows`` rows in one statement (rows apply in order, as
    one statement each would). ``cols[0]`` is ``run_id``, bound once as ``?1``; each row's
    values (the other columns) follow in numbered parameters."""
    k = len(cols) - 1
    values = ", ".join(
        "(?1, " + ", ".join(f"?{2 + r * k + c}" for c in range(k)) + ")" for r in range(rows)
    )
    return f"INSERT OR REPLACE INTO {table} ({', '.join(cols)}) VALUES {values}"


def insert_rows(
    conn: sqlite3.Connection, kind: type, run_id: str, rows: Collection[tuple[Any, ...]]
) -> None:
    """Insert the value rows (no ``run_id``) of a record ``kind`` for ``run_id``, in order:
    ROWS_PER_STATEMENT at a time, the rest one by one."""
    table, cols = _TABLES[kind]
    per = max(1, min(ROWS_PER_STATEMENT, (_max_variables(conn) - 1) // (len(cols) - 1)))
    it = iter(rows)
    head = (run_id,)
    for _ in range(len(rows) // per if per > 1 else 0):
        params = list(itertools.chain(head, *itertools.islice(it, per)))
        conn.execute(_insert_sql(table, cols, per), params)
    conn.executemany(_insert_sql(table, cols, 1), ((run_id, *r) for r in it))


def prepare_shapes(conn: sqlite3.Connection) -> None:
    """Compile every table's ROWS_PER_STATEMENT-row insert now, at the writer's start: a
    flush reaches that shape only with 32 rows of a table at once (after a lock, at a high
    frame rate), and a statement compiled then is a step in soakd's RSS mid-run. Run with
    no parameters, each is compiled and cached, and refused before it touches a row."""
    for table, cols in _TABLES.values():
        k = len(cols) - 1
        per = max(1, min(ROWS_PER_STATEMENT, (_max_variables(conn) - 1) // k))
        if per > 1:
            with contextlib.suppress(sqlite3.ProgrammingError):
                conn.execute(_insert_sql(table, cols, per), ())


def _max_variables(conn: sqlite3.Connection) -> int:
    """How many ``?`` parameters one statement may have on this SQLite build."""
    return conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)


#: a record's values, in its table's column order after ``run_id``
_VALUES: dict[type, Callable[[Any], tuple[Any, ...]]] = {
    FrameRecord: frame_values,
    Sample: sample_values,
    Emission: emission_values,
    Event: event_values,
    DeviceSample: gpu_sample_values,
    ChunkStage: chunk_stage_values,
    ServerMetric: server_metric_values,
}


# when the pending rows reach their bound during a lock, these go first (oldest first):
# telemetry, then emissions, then chunk stages, then frames; events (a few per run, each one
# telling) never
_DROP_ORDER: tuple[type, ...] = (
    ServerMetric, DeviceSample, Sample, Emission, ChunkStage, FrameRecord,
)  # fmt: skip
_KIND = {
    FrameRecord: "frames",
    Sample: "samples",
    Emission: "emissions",
    Event: "events",
    DeviceSample: "gpu_samples",
    ChunkStage: "chunk_stages",
    ServerMetric: "server_metrics",
}


class _Pending:
    """Rows not yet committed, by record type, at most ``limit`` of them; what had to be
    dropped to stay within the bound is counted by kind. Records become value rows as they
    are added (a frame record already is one, unless it has ``extra``): a row of plain
    values is one object the garbage collector stops scanning, where a record waiting for
    the flush would be scanned by every collection until then."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.rows: dict[type, deque[tuple[Any, ...]]] = {t: deque() for t in _VALUES}
        self.n = 0
        self.dropped: Counter[str] = Counter()

    def add(self, rec: Any) -> None:
        kind = type(rec)
        self.rows[kind].append(_VALUES[kind](rec))
        self.n += 1
        if self.n > self.limit:
            self._shed()

    def add_frames(self, batch: list[FrameRecord]) -> None:
        """A driver's batch of frame records, in order."""
        self.rows[FrameRecord].extend(
            r if r.extra is None and r.error is None else frame_values(r) for r in batch
        )
        self.n += len(batch)
        while self.n > self.limit and self._shed():
            pass

    def _shed(self) -> bool:
        """Drop the oldest row of the first kind in _DROP_ORDER that has one (False when
        only events are left: those are never dropped)."""
        for t in _DROP_ORDER:
            if self.rows[t]:
                self.rows[t].popleft()
                self.n -= 1
                self.dropped[_KIND[t]] += 1
                return True
        return False

    def clear(self) -> None:
        for d in self.rows.values():
            d.clear()
        self.n = 0


class _Spill:
    """Pending rows moved to disk while the database is locked: pickled chunks of value rows
    in an anonymous temporary file (gone when closed), read back in order by every flush
    attempt until one commits them. Nothing is dropped: the disk holds what memory would."""

    _TYPES = tuple(_VALUES)

    def __init__(self) -> None:
        self._file: Any = None
        self.n = 0  # rows on disk
        self.chunks = 0

    def add(self, pending: _Pending) -> None:
        """Move every pending row to the file (``pending`` is left empty)."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="soakd-spill-")  # noqa: SIM115 (closed by close())
        chunk = [(self._TYPES.index(t), list(rows)) for t, rows in pending.rows.items() if rows]
        self._file.seek(0, 2)
        pickle.dump(chunk, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self.n += pending.n
        self.chunks += 1
        pending.clear()

    def read(self) -> Iterator[tuple[type, list[tuple[Any, ...]]]]:
        """Every spilled (record type, rows), in the order they were spilled."""
        if not self.chunks:
            return
        self._file.flush()
        self._file.seek(0)
        for _ in range(self.chunks):
            for i, rows in pickle.load(self._file):
                yield self._TYPES[i], rows

    def clear(self) -> None:
        if self._file is not None:
            self._file.seek(0)
            self._file.truncate()
        self.n = self.chunks = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


#: each record type's run time (seconds since the run's start), for ``StoreWriter._track_time``
_RUN_TIME: dict[type, Callable[[Any], float | None]] = {
    FrameRecord: operator.attrgetter("t_capture"),
    Sample: operator.attrgetter("t"),
    Emission: operator.attrgetter("t_emit"),
    Event: operator.attrgetter("t"),
    DeviceSample: operator.attrgetter("t"),
    ChunkStage: lambda rec: None,  # no time of its own: its chunk's frames row has one
    ServerMetric: operator.attrgetter("t"),
}


#: the run writer's page cache (KiB). It only appends, so a small cache costs it nothing
#: (bench/store.py: the same rows/s), and soakd's RSS, which the memory criteria judge,
#: stops growing as the database grows once it is full: SQLite's default (2 MB) took the
#: first minutes of a soak to fill (bench/leak.py --quick: 545 KB of growth in 1 min at
#: 60 fps with it, 135 KB with this)
WRITER_CACHE_KIB = 256


def writer_connection(path: str | Path, busy_timeout_s: float) -> sqlite3.Connection:
    """The run writer's connection: autocommit (it opens its own transactions), the busy
    timeout, ``synchronous = NORMAL`` under WAL, a ``WRITER_CACHE_KIB`` page cache."""
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
    return conn


class StoreWriter:
    """The one writer thread. ``put`` never blocks the caller and never touches SQLite.

    When another connection holds the database's write lock for longer than the busy
    timeout (a reader's ``BEGIN EXCLUSIVE``, a long ``sqlite-utils`` write), the rows are
    kept (past ``spill_rows`` in a spill file on disk, so that soakd's RSS does not grow
    with the lock; at most ``max_pending`` in memory should the disk refuse them, beyond
    that the oldest samples go first, counted) and the flush retried with backoff until the
    lock clears; then a ``store_locked`` event (and a
    ``store_overflow`` event if rows were dropped) is written. Only a genuine error (disk
    full, read-only, corrupt) ends the writer: ``error`` is then set with its message."""

    _STOP = object()

    def __init__(
        self,
        path: str | Path,
        run_id: str,
        *,
        flush_interval_s: float = 0.5,
        max_batch: int = 5000,
        busy_timeout_s: float | None = None,
        max_pending: int = MAX_PENDING,
        max_backoff_s: float = 2.0,
        spill_rows: int = SPILL_ROWS,
    ) -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.busy_timeout_s = BUSY_TIMEOUT_MS / 1000 if busy_timeout_s is None else busy_timeout_s
        self.max_backoff_s = max_backoff_s
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending = _Pending(max_pending)
        self._spill = _Spill()
        self._spill_ok = True  # until the disk refuses a chunk
        self.spill_rows = spill_rows
        self.spilled = 0  # rows that went through the spill file
        self._thread = threading.Thread(target=self._loop, name="soakd-store", daemon=True)
        self._abandon = threading.Event()
        self._wake = threading.Event()  # set by close() (the sentinel is queued), flush_soon()
        self._kicked = False  # flush_soon(): commit what is queued at the next look
        self.error: BaseException | None = None
        self.rows_written = 0
        self.flushes = 0
        self.lock_episodes = 0
        self.lock_retries = 0
        self._locked_since: float | None = None
        self._episode = False  # the lock has been held for the busy timeout
        self._backoff = 0.0
        self._last_t: float | None = None
        self._sleep_s = DRAIN_INTERVAL_S  # the next sleep before a look at the queue
        self._looked = time.monotonic()  # when the queue was last looked at

    def start(self) -> None:
        self._thread.start()

    def put(
        self,
        record: FrameRecord | Sample | Emission | Event | DeviceSample | ChunkStage | ServerMetric,
    ) -> None:
        self._q.put(record)

    def put_frames(self, batch: list[FrameRecord]) -> None:
        """A driver's batch of frame records, in order (one queue item for the batch)."""
        self._q.put(batch)

    def flush_soon(self) -> None:
        """Wake the writer now to commit what is queued (the run's monitor calls it on each
        of its ticks, once it has handed on the sink's frames: the writer then wakes with the
        monitor, once a second, instead of on a timer of its own; issue 34)."""
        self._kicked = True
        self._wake.set()

    def close(self, timeout: float = 30.0) -> None:
        """Flush everything queued and stop the thread. If the database is still locked
        ``timeout`` seconds later, give up and set ``error``: those rows are lost."""
        self._q.put(self._STOP)
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abandon.set()
            self._thread.join(self.busy_timeout_s + 1.0)
            if self.error is None:
                self.error = StoreError(
                    f"{self.path}: the run database was still locked by another connection"
                    f" {timeout:g} s after the run ended; {self.waiting} rows not written"
                )

    def _loop(self) -> None:
        conn = None
        try:
            conn = writer_connection(self.path, self.busy_timeout_s)
            prepare_shapes(conn)
            conn.execute(
                f"PRAGMA busy_timeout={int(min(self.busy_timeout_s, ATTEMPT_WAIT_S) * 1000)}"
            )
            self._run(conn)
        except BaseException as exc:  # recorded and re-raised by the runner
            self.error = StoreError(describe_store_error(self.path, exc))
        finally:
            if conn is not None:
                conn.close()
            self._spill.close()

    def _run(self, conn: sqlite3.Connection) -> None:
        deadline = time.monotonic() + self.flush_interval_s
        stopping = False
        while True:
            if not stopping:
                stopping = self._collect(deadline)
                self._spill_if_waiting()
            elif self._locked_since is not None:
                self._abandon.wait(max(0.0, deadline - time.monotonic()))
            now = time.monotonic()
            waiting = self.waiting
            kicked, self._kicked = self._kicked, False
            due = stopping or kicked or now >= deadline or waiting >= self.max_batch
            if waiting and due and (self._locked_since is None or now >= deadline):
                self._attempt(conn)
                now = time.monotonic()
                if self._locked_since is not None:
                    deadline = now + self._backoff
            if stopping and (not self.waiting or self._abandon.is_set()):
                return
            if now >= deadline:
                deadline = now + self.flush_interval_s

    def _collect(self, deadline: float) -> bool:
        """Move up to DRAIN_CHUNK queued records into the pending rows, after sleeping
        (until ``deadline``, at most ``_sleep_s``) when none is queued; True once the
        stop sentinel came. During a lock everything is drained, chunk by chunk, so the
        bound on pending rows holds.

        The writer sleeps rather than wait for the next record: woken by every record, it
        would ask for the GIL once per frame, and the driver would wait for its turn each
        time. Between two chunks it lets go of the GIL (``sleep(0)``), so that the driver
        never waits for more than one chunk's conversion."""
        if self._q.empty() and not self._kicked:
            if self._wake.wait(max(0.0, min(deadline - time.monotonic(), self._sleep_s))):
                self._wake.clear()  # what it says is in _kicked, or the sentinel is queued
        else:
            time.sleep(0)
        get, taken = self._q.get_nowait, 0
        while taken < DRAIN_CHUNK:
            try:
                item = get()
            except queue.Empty:
                self._pace(taken)
                return False
            if item is self._STOP:
                return True
            if type(item) is list:  # a batch of frame records (put_frames)
                self._track_time(max(r.t_capture for r in item))
                self._pending.add_frames(item)
                taken += len(item)
            else:
                self._track_time(_RUN_TIME[type(item)](item))
                self._pending.add(item)
                taken += 1
            if self._pending.n >= self.max_batch and self._locked_since is None:
                return False
        self._pace(taken)
        return False

    def _pace(self, taken: int) -> None:
        """The next sleep: until about DRAIN_CHUNK records gather at the rate of the
        ``taken`` since the last look; DRAIN_INTERVAL_S while the database is locked."""
        now = time.monotonic()
        rate = taken / max(now - self._looked, 1e-3)
        self._looked = now
        gather_s = DRAIN_CHUNK / rate if rate else math.inf
        locked = self._locked_since is not None
        self._sleep_s = DRAIN_INTERVAL_S if locked else max(DRAIN_INTERVAL_S, gather_s)

    @property
    def waiting(self) -> int:
        """Rows not yet committed: pending in memory and spilled to disk."""
        return self._pending.n + self._spill.n

    def _spill_if_waiting(self) -> None:
        """While the lock is held, move the pending rows to disk once there are
        ``spill_rows``; a disk that refuses them keeps them in memory from then on."""
        if self._locked_since is None or not self._spill_ok:
            return
        if self._pending.n < self.spill_rows:
            return
        n = self._pending.n
        try:
            self._spill.add(self._pending)
        except OSError as exc:
            _log().warning("cannot spill rows to disk; keeping them in memory", error=str(exc))
            self._spill_ok = False
            return
        self.spilled += n

    def _track_time(self, t: float | None) -> None:
        """Keep the newest run time seen (the time of a ``store_locked`` event)."""
        if t is not None and (self._last_t is None or t > self._last_t):
            self._last_t = t

    def _attempt(self, conn: sqlite3.Connection) -> None:
        """One flush of every pending row; a lock held past the busy timeout keeps them."""
        try:
            self._flush(conn)
        except sqlite3.OperationalError as exc:
            if not is_locked(exc):
                raise
            self._on_locked()
            return
        if self._locked_since is not None:
            self._on_unlocked()

    def _on_locked(self) -> None:
        """A flush found the lock held: the rows wait (the queue drained between tries);
        once held for the busy timeout it is an episode, retried with a growing backoff."""
        self.lock_retries += 1
        now = time.monotonic()
        if self._locked_since is None:
            self._locked_since = now - min(self.busy_timeout_s, ATTEMPT_WAIT_S)
            self._backoff = DRAIN_INTERVAL_S
        elif self._episode:
            self._backoff = min(self._backoff * 2, self.max_backoff_s)
        if not self._episode and now - self._locked_since >= self.busy_timeout_s:
            self._episode = True
            self.lock_episodes += 1
            _log().warning(
                "run database locked by another connection: keeping rows, retrying",
                path=str(self.path),
                run_id=self.run_id,
                busy_timeout_s=self.busy_timeout_s,
                pending=self.waiting,
            )

    def _on_unlocked(self) -> None:
        """The lock cleared: record the episode (and any overflow) as events of the run."""
        assert self._locked_since is not None
        locked_s = round(time.monotonic() - self._locked_since, 3)
        self._locked_since = None
        if not (self._episode or self._pending.dropped):
            return  # shorter than the busy timeout, nothing lost: as if SQLite had waited
        self._episode = False
        data = {"locked_s": locked_s, "retries": self.lock_retries}
        msg = f"run database locked by another connection for about {locked_s:g} s; rows kept"
        t = self._last_t if self._last_t is not None else 0.0  # run time of the newest row
        self._pending.add(Event("store_locked", t, time.time(), msg, data=data))
        dropped = dict(self._pending.dropped)
        if dropped:
            self._pending.dropped.clear()
            lost = ", ".join(f"{n} {k}" for k, n in sorted(dropped.items()))
            overflow = {**dropped, "max_pending": self._pending.limit, "locked_s": locked_s}
            self._pending.add(
                Event(
                    "store_overflow",
                    t,
                    time.time(),
                    f"{lost} dropped: more than {self._pending.limit} rows waited for the lock",
                    data=overflow,
                )
            )
        _log().warning("run database writable again", path=str(self.path), **data, dropped=dropped)

    def _flush(self, conn: sqlite3.Connection) -> None:
        # atomic keeps the real error when SQLite already rolled back (SQLITE_FULL does)
        with atomic(conn):
            for kind, spilled in self._spill.read():
                insert_rows(conn, kind, self.run_id, spilled)
            for t, rows in self._pending.rows.items():
                if rows:
                    insert_rows(conn, t, self.run_id, rows)
        self.rows_written += self.waiting
        self.flushes += 1
        self._pending.clear()
        self._spill.clear()

"""Merging run databases (``soakd merge OUT IN...``): the one owner of copying runs between
databases.

* Every input is checked before anything is written: it exists, is an SQLite file, is a
  soakd run database (``_migrations`` and ``runs``), records exactly this soakd's migrations
  and is not the output itself (same resolved path or same inode). A refusal
  (``MergeRefused``, exit 2) is one line naming the file.
* Each input is ATTACHed read-only (``mode=ro``; ``immutable=1`` only where SQLite cannot
  make the ``-shm`` file and no live WAL exists, as ``db.connect(readonly=True)``), so a live
  database another soakd is writing is neither blocked (WAL readers never are) nor changed,
  and is read from one snapshot. All of one input's rows are copied with set-based
  ``INSERT ... SELECT`` inside one ``atomic()`` transaction: an interrupted merge leaves the
  output as it was before that input.
* A run is copied whole (its row and its rows in every table with a ``run_id``: labels,
  frames, samples, gpu_samples, emissions, events, verdicts, and any table a later migration
  adds, found in ``sqlite_master``) or not at all; events get new ids in the output (ids are
  per database), in their order.
* Idempotent: a run already in the output is judged by ``_outcome``: an identical copy, or
  an older copy of one the output holds further along, is unchanged; a later copy of a run
  the output holds unfinished (still ``running``, or ended without a verdict, or with fewer
  rows) replaces the output's rows of that run entirely; two different finished copies,
  or two different runs under one id, are a conflict: the output's is kept, with a warning.
* Baselines are copied when their name is free in the output; a name bound to another run
  there is kept and warned about.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from soakd.errors import ExitCode, SoakdError, UsageError
from soakd.store import db as store
from soakd.store.prune import run_tables
from soakd.store.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    ChangedSchemaError,
    check_columns,
    schema_version,
)

#: a run's rows besides its ``runs`` row, in the order they are copied (then any other table
#: with a ``run_id``, by name: ``child_tables``)
CHILD_TABLES: tuple[str, ...] = ("labels", "frames", "samples", "emissions", "events", "verdicts")
#: tables with a ``run_id`` that are not a run's own rows: a baseline is merged by its name
_NOT_CHILDREN = frozenset({"baselines"})
ADDED, UPDATED, UNCHANGED, CONFLICTING = "added", "updated", "unchanged", "conflicting"
OUTCOMES: tuple[str, ...] = (ADDED, UPDATED, UNCHANGED, CONFLICTING)
#: fixed when the run row is opened: copies that differ here are two different runs
_IDENTITY: tuple[str, ...] = ("mode", "started_unix", "host", "pid", "pid_start", "config_hash")
_KNOWN = {name for name, _ in MIGRATIONS}


class MergeRefused(UsageError):
    """An input (or the output) that cannot be merged; nothing was written for it (exit 2)."""


class MergeFailed(SoakdError):
    """Copying failed midway (disk full, I/O error): that input's transaction was rolled back
    (exit 4)."""

    exit_code = ExitCode.INTERNAL


@dataclass
class MergeResult:
    """What merging one input did: run ids by outcome, baselines added, warnings (one line
    each, naming the run or baseline), and how many runs the output holds afterwards."""

    source: Path
    runs: dict[str, list[str]] = field(default_factory=lambda: {o: [] for o in OUTCOMES})
    baselines_added: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    out_runs: int = 0

    def count(self, outcome: str) -> int:
        return len(self.runs[outcome])

    def as_dict(self) -> dict[str, Any]:
        return {
            "db": str(self.source),
            **{o: self.count(o) for o in OUTCOMES},
            "runs": self.runs,
            "baselines_added": self.baselines_added,
            "warnings": self.warnings,
        }


def merge(out: Path, inputs: Sequence[Path]) -> Iterator[MergeResult]:
    """Merge each of ``inputs`` into ``out`` (created and migrated if missing), one
    transaction per input, yielding each input's result once it is committed. Every input
    is checked first: a refusal (MergeRefused) comes before anything is written."""
    check_output(out)
    for path in inputs:
        check_input(out, path)
    conn = _open_output(out)
    try:
        for path in inputs:
            yield _merge_one(conn, out, path)
    finally:
        conn.close()


# --- checks


def check_output(out: Path) -> None:
    """The output may be missing, an empty file, or a soakd run database of this or an
    older schema (it is migrated); anything else is refused."""
    if not out.exists():
        return
    if out.is_dir():
        raise MergeRefused(
            f"{out}: OUT is a directory, not a database file: name the merged database's"
            f" file, e.g. {out / 'soakd.db'}"
        )
    tables, done = _inspect(out)
    if tables and not {"_migrations", "runs"} <= tables:
        raise MergeRefused(f"{out}: not a soakd run database (no _migrations or runs table)")
    if done - _KNOWN:
        raise MergeRefused(_newer(out, done))


def check_input(out: Path, path: Path) -> None:
    """Refuse (MergeRefused, one line) an input that cannot be merged into ``out``."""
    if _same_file(path, out):
        raise MergeRefused(f"{path}: is the output database {out} itself")
    if not path.exists():
        raise MergeRefused(f"{path}: no such file")
    if path.is_dir():
        raise MergeRefused(f"{path}: is a directory, not a run database file")
    if not path.is_file():
        raise MergeRefused(f"{path}: not a file")
    with closing(sqlite3.connect(":memory:", uri=True, isolation_level=None)) as conn:
        _attach(conn, path)
        try:
            _check_source(conn, path)
            _check_pages(conn, path)
        except sqlite3.DatabaseError as exc:
            raise MergeRefused(_unreadable(path, exc)) from None


def _inspect(path: Path) -> tuple[set[str], set[str]]:
    """The tables and recorded migrations of ``path``, opened read-only."""
    with closing(sqlite3.connect(":memory:", uri=True, isolation_level=None)) as conn:
        _attach(conn, path)
        try:
            return _tables(conn), _migrations(conn)
        except sqlite3.DatabaseError as exc:
            raise MergeRefused(_unreadable(path, exc)) from None


def _unreadable(path: Path, exc: sqlite3.DatabaseError) -> str:
    """The one line for a file SQLite cannot open or read: damaged (SQLITE_CORRUPT, which
    an ATTACH reports as "unable to open database"), not SQLite, or why it cannot be read."""
    code = getattr(exc, "sqlite_errorname", "")
    if code.startswith("SQLITE_CORRUPT") or "malformed" in str(exc):
        return store.corrupt_message(
            path, sqlite3.DatabaseError("database disk image is malformed")
        )
    if code == "SQLITE_NOTADB" or "not a database" in str(exc):
        return f"{path}: not an SQLite database"
    if not os.access(path, os.R_OK):
        return f"{path}: permission denied: this user may not read it"
    return f"{path}: cannot open read-only: {exc}"


def _same_file(a: Path, b: Path) -> bool:
    """Same file: same inode when both exist (a hard link, another spelling), else the same
    resolved path."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _check_source(conn: sqlite3.Connection, path: Path) -> None:
    """The input attached as ``src`` is a soakd run database of exactly this soakd's schema,
    every table and column of it there (none renamed or dropped by hand)."""
    tables, done = _tables(conn), _migrations(conn)
    if not {"_migrations", "runs"} <= tables:
        raise MergeRefused(f"{path}: not a soakd run database (no _migrations or runs table)")
    if done - _KNOWN:
        raise MergeRefused(_newer(path, done))
    missing = sorted(_KNOWN - done)
    if missing:
        raise MergeRefused(
            f"{path}: schema version {schema_version(done)} (lacks {', '.join(missing)}),"
            f" this soakd's is {SCHEMA_VERSION}: {_upgrade_advice(path)}"
        )
    try:
        check_columns(conn, done, "src")
    except ChangedSchemaError as exc:
        raise MergeRefused(f"{path}: {store.changed_schema_message(exc)}") from None


def _check_pages(conn: sqlite3.Connection, path: Path) -> None:
    """``PRAGMA quick_check`` of the input attached as ``src``: a damaged page anywhere in
    it is refused before any input is written (the copy reads every page anyway)."""
    row = conn.execute("PRAGMA src.quick_check(1)").fetchone()
    if row is not None and row[0] != "ok":
        found = " ".join(str(row[0]).replace("*** in database src ***", "").split())
        raise MergeRefused(store.corrupt_message(path, Exception(f"quick_check: {found}")))


def _upgrade_advice(path: Path) -> str:
    """How to upgrade an input of an older schema: open it once with this soakd, which
    migrates it; where it cannot be written (read-only storage, another user's file), a
    copy of it."""
    if _writable(path):
        return f"upgrade it first by opening it once with this soakd, e.g. `soakd runs --db {path}`"
    return (
        "it cannot be upgraded where it is (read-only here): upgrade a copy, e.g."
        f" `cp {path} /tmp/{path.name} && soakd runs --db /tmp/{path.name}`"
        " (opening it with this soakd migrates it), then merge that copy"
    )


def _writable(path: Path) -> bool:
    """Whether this process may write ``path`` and its folder, on storage mounted
    read-write (root passes every permission check, not a read-only mount)."""
    try:
        ro = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        ro = True
    return not ro and os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _newer(path: Path, done: set[str]) -> str:
    return (
        f"{path}: schema version {schema_version(done)} (written by a newer soakd:"
        f" {', '.join(sorted(done - _KNOWN))} unknown here), this soakd's is {SCHEMA_VERSION}:"
        " merge with that soakd or a newer one"
    )


def _tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM src.sqlite_master WHERE type = 'table'")
    return {str(r[0]) for r in rows}


def _migrations(conn: sqlite3.Connection) -> set[str]:
    if "_migrations" not in _tables(conn):
        return set()
    return {str(r[0]) for r in conn.execute("SELECT name FROM src._migrations")}


# --- connections


def _open_output(out: Path) -> sqlite3.Connection:
    """The output, created and migrated by ``db.connect`` (runs left ``running`` are not
    marked crashed: a later copy may finish them), then reopened with URI names enabled so
    inputs can be ATTACHed read-only."""
    try:
        store.connect(out, mark_orphans=False).close()
    except store.StoreError as exc:
        raise MergeRefused(str(exc)) from None
    conn = sqlite3.connect(
        store.sqlite_uri(out), uri=True, isolation_level=None, timeout=store.BUSY_TIMEOUT_MS / 1000
    )
    conn.execute(f"PRAGMA busy_timeout={store.BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _attach(conn: sqlite3.Connection, path: Path) -> None:
    """ATTACH ``path`` read-only as ``src``: ``mode=ro``, or ``immutable=1`` where SQLite
    cannot create the ``-shm`` file (a folder this user cannot write) and no live WAL holds
    rows an immutable open would miss. Refuses a file that is not SQLite."""
    wal = path.with_name(path.name + "-wal")
    flags = ["mode=ro"] + ([] if wal.exists() and wal.stat().st_size else ["immutable=1"])
    for i, flag in enumerate(flags):
        try:
            _attach_as_src(conn, store.sqlite_uri(path, flag))
            return
        except sqlite3.DatabaseError as exc:
            damaged = getattr(exc, "sqlite_errorname", "").startswith("SQLITE_CORRUPT")
            retry = any(w in str(exc).lower() for w in ("readonly", "unable to open"))
            if i == len(flags) - 1 or not retry or damaged:
                raise MergeRefused(_unreadable(path, exc)) from None


def _attach_as_src(conn: sqlite3.Connection, uri: str) -> None:
    """ATTACH and read the schema (SQLite opens the file lazily); detached again on error."""
    conn.execute("ATTACH DATABASE ? AS src", (uri,))
    try:
        conn.execute("SELECT count(*) FROM src.sqlite_master").fetchone()
    except sqlite3.DatabaseError:
        _detach(conn)
        raise


def _detach(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("DETACH DATABASE src")
    except sqlite3.Error:
        pass  # already detached, or the connection failed: the original error is raised


# --- merging one input


def _merge_one(conn: sqlite3.Connection, out: Path, path: Path) -> MergeResult:
    """Copy what ``path`` adds to ``out`` in one transaction."""
    _attach(conn, path)
    try:
        _check_source(conn, path)
        children = child_tables(conn)
        with store.atomic(conn):
            result = _classify(conn, out, path, children)
            _copy_runs(conn, result.runs[ADDED], result.runs[UPDATED], children)
            _copy_baselines(conn, out, result)
        result.out_runs = int(conn.execute("SELECT count(*) FROM main.runs").fetchone()[0])
        return result
    except sqlite3.DatabaseError as exc:
        raise _failure(out, path, exc) from None
    finally:
        _detach(conn)


def _failure(out: Path, path: Path, exc: sqlite3.DatabaseError) -> SoakdError:
    """The one line for a failure while copying ``path``: a damaged file or a lock held past
    the busy timeout is refused (exit 2), anything else (disk full, I/O) failed (exit 4)."""
    where = f"merging {path} into {out}: {exc}; {out} is as it was before {path}"
    if "malformed" in str(exc) or "not a database" in str(exc):
        return MergeRefused(f"{where} (check both with `sqlite3 FILE 'PRAGMA quick_check'`)")
    if "locked" in str(exc):
        return MergeRefused(f"{where}: another connection holds its write lock; try again")
    return MergeFailed(where)


def _rows(conn: sqlite3.Connection, schema: str, where: str = "") -> dict[str, dict[str, Any]]:
    """``runs`` rows of ``schema`` (``main`` or ``src``) by id, every column."""
    cur = conn.execute(f"SELECT * FROM {schema}.runs {where}")
    cols = [d[0] for d in cur.description]
    return {str(r[0]): dict(zip(cols, r, strict=True)) for r in cur}


def child_tables(conn: sqlite3.Connection) -> tuple[str, ...]:
    """The output's tables holding a run's rows (a ``run_id`` column or a key to ``runs``,
    as ``prune`` deletes them): CHILD_TABLES first, then the others by name."""
    found = {name for name, _ in run_tables(conn)} - _NOT_CHILDREN
    return (*(t for t in CHILD_TABLES if t in found), *sorted(found - set(CHILD_TABLES)))


def _classify(
    conn: sqlite3.Connection, out: Path, path: Path, children: Sequence[str]
) -> MergeResult:
    """Each run of the input with its outcome (see ``_outcome``); conflicts warned about."""
    result = MergeResult(path)
    theirs = _rows(conn, "src")
    ours = _rows(conn, "main", "WHERE id IN (SELECT id FROM src.runs)")
    for rid in sorted(theirs, key=lambda r: (theirs[r]["started_unix"], r)):
        count = partial(_child_rows, conn, run_id=rid, children=children)
        outcome = _outcome(ours.get(rid), theirs[rid], count)
        result.runs[outcome].append(rid)
        if outcome == CONFLICTING:
            result.warnings.append(_conflict(out, path, ours[rid], theirs[rid]))
    return result


def _rank(row: dict[str, Any]) -> int:
    """How far along a copy of a run is: 0 running, 1 ended but not closed and judged
    (found orphaned, forced out, or no verdict yet), 2 closed and judged."""
    if row["status"] == "running":
        return 0
    return 2 if row["ended_at"] is not None and row["verdict"] is not None else 1


def _outcome(
    ours: dict[str, Any] | None, theirs: dict[str, Any], count: Callable[[str], int]
) -> str:
    """What the input's copy ``theirs`` of a run does to the output's copy ``ours``.

    Added when the output lacks the run. Conflicting when the two are different runs (their
    identity columns differ). When ours is closed and judged: unchanged if theirs is
    identical or less far along, else conflicting. Otherwise the copy further along
    (``_rank``, then more child rows, counted by ``count(schema)``) wins: theirs updates
    ours, an older or identical copy leaves it unchanged, and a different one just as far
    along is conflicting."""
    if ours is None:
        return ADDED
    if any(ours[k] != theirs[k] for k in _IDENTITY):
        return CONFLICTING
    if _rank(ours) == 2:
        return UNCHANGED if ours == theirs or _rank(theirs) < 2 else CONFLICTING
    here, there = (_rank(ours), count("main")), (_rank(theirs), count("src"))
    if there > here:
        return UPDATED
    return UNCHANGED if there < here or ours == theirs else CONFLICTING


def _child_rows(conn: sqlite3.Connection, schema: str, run_id: str, children: Sequence[str]) -> int:
    """The run's rows in every child table of ``schema``."""
    parts = " + ".join(f"(SELECT count(*) FROM {schema}.{t} WHERE run_id = :r)" for t in children)
    return int(conn.execute(f"SELECT {parts}", {"r": run_id}).fetchone()[0])


def _conflict(out: Path, path: Path, ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    rid = ours["id"]
    if any(ours[k] != theirs[k] for k in _IDENTITY):
        what = (
            f"{out} holds a different run under this id (host {ours['host']} started"
            f" {ours['started_at']}, here host {theirs['host']} started {theirs['started_at']})"
        )
    else:
        what = f"differs from the copy in {out} and both have ended"
    return f"{path}: run {rid}: {what}; kept {out}'s"


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """The columns copied for ``table``: all of them but ``events.id`` (ids are per
    database: the output numbers the copies itself)."""
    cols = [str(r[1]) for r in conn.execute(f"PRAGMA main.table_info({table})")]
    return [c for c in cols if not (table == "events" and c == "id")]


def _copy_runs(
    conn: sqlite3.Connection, added: list[str], updated: list[str], children: Sequence[str]
) -> None:
    """Copy the runs ``added`` and ``updated`` whole; ``updated`` ones lose their rows in the
    output first. Set-based: one DELETE and one INSERT ... SELECT per table."""
    if not added and not updated:
        return
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS merge_runs (run_id TEXT PRIMARY KEY, refresh INTEGER)"
    )
    conn.execute("DELETE FROM temp.merge_runs")
    conn.executemany(
        "INSERT INTO temp.merge_runs VALUES (?, ?)",
        [(r, 0) for r in added] + [(r, 1) for r in updated],
    )
    chosen = "SELECT run_id FROM temp.merge_runs"
    for t in children:
        conn.execute(f"DELETE FROM main.{t} WHERE run_id IN ({chosen} WHERE refresh = 1)")
    cols = _columns(conn, "runs")
    names = ", ".join(cols)
    conn.execute(
        f"INSERT INTO main.runs ({names}) SELECT {names} FROM src.runs WHERE id IN ({chosen})"
        " ON CONFLICT(id) DO UPDATE SET "
        + ", ".join(f"{c} = excluded.{c}" for c in cols if c != "id")
    )
    for t in children:
        names = ", ".join(_columns(conn, t))
        order = " ORDER BY run_id, id" if t == "events" else ""
        conn.execute(
            f"INSERT INTO main.{t} ({names}) SELECT {names} FROM src.{t}"
            f" WHERE run_id IN ({chosen}){order}"
        )


def _copy_baselines(conn: sqlite3.Connection, out: Path, result: MergeResult) -> None:
    """Copy the input's baselines whose name is free in the output and whose run the output
    now holds; a name bound to another run there is kept and warned about."""
    path = result.source
    clash = conn.execute(
        "SELECT s.name, s.run_id, m.run_id FROM src.baselines s"
        " JOIN main.baselines m ON m.name = s.name WHERE m.run_id != s.run_id ORDER BY s.name"
    ).fetchall()
    for name, theirs, ours in clash:
        result.warnings.append(
            f"{path}: baseline {name!r} is run {theirs} here but run {ours} in {out}; kept {out}'s"
        )
    free = (
        "FROM src.baselines s WHERE s.name NOT IN (SELECT name FROM main.baselines)"
        " AND s.run_id IN (SELECT id FROM main.runs)"
    )
    result.baselines_added = [str(r[0]) for r in conn.execute(f"SELECT s.name {free}")]
    conn.execute(
        f"INSERT INTO main.baselines (name, run_id, created_at) SELECT s.name, s.run_id,"
        f" s.created_at {free}"
    )
    dangling = conn.execute(
        "SELECT name, run_id FROM src.baselines WHERE run_id NOT IN (SELECT id FROM main.runs)"
    ).fetchall()
    for name, rid in dangling:
        result.warnings.append(
            f"{path}: baseline {name!r} names run {rid}, which it lacks; skipped"
        )

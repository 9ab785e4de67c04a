"""The one owner of ``runs`` rows: open, close, exit code, verdict, orphans, look-ups.

Every other module reads and writes run rows through these functions; nothing outside
``soakd.store`` writes SQL.

* ``get_run`` / ``find_run`` return a ``RunRow`` (every column, JSON decoded).
* ``resolve`` is the one resolver of what a person typed: exact id, unique prefix,
  ``baseline:NAME``, a bare baseline name, ``latest``. "Latest" (``--latest``) always means
  the newest run of ``mode``: ``"soak"`` unless the caller passes another mode (or None for
  any mode), so ``show``, ``report`` and ``gate --latest`` name the same run.
* Baselines are named references to runs and live here too.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from soakd import redact
from soakd.errors import UsageError


def _utc(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def _dumps(v: Any) -> str:
    return json.dumps(v, default=str, sort_keys=True)


@dataclass(frozen=True, slots=True)
class NewRun:
    """What a run row holds when the run starts."""

    id: str
    name: str | None
    mode: str
    workload_kind: str
    fps: float | None
    config: dict[str, Any]
    config_hash: str
    workload: dict[str, Any]
    environment: dict[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)


def open_run(conn: sqlite3.Connection, run: NewRun, started_unix: float) -> None:
    """Insert the run's row with status ``running`` (this process's pid, its start time and
    the host: together they tell a later command whether the run's process still exists)."""
    pid = os.getpid()
    conn.execute(
        "INSERT INTO runs (id, name, mode, status, started_at, started_unix, pid, pid_start,"
        " host, workload_kind, fps, config, config_hash, workload, environment)"
        " VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run.id,
            run.name,
            run.mode,
            _utc(started_unix),
            started_unix,
            pid,
            process_start(pid),
            os.uname().nodename,
            run.workload_kind,
            run.fps,
            _dumps(redact.data(run.config)),  # as stored: no secret, no api_key_env
            run.config_hash,
            json.dumps(redact.data(run.workload), default=str),
            json.dumps(redact.data(run.environment), default=str),
        ),
    )
    conn.executemany(
        "INSERT INTO labels (run_id, key, value) VALUES (?, ?, ?)",
        [(run.id, k, v) for k, v in sorted(run.labels.items())],
    )


def close_run(
    conn: sqlite3.Connection,
    run_id: str,
    *,
    status: str,
    reason: str | None,
    ended_unix: float,
    duration_s: float,
    summary: dict[str, Any],
) -> None:
    """Record how the run ended and its summary counters."""
    conn.execute(
        "UPDATE runs SET status = ?, reason = ?, ended_at = ?, duration_s = ?, summary = ?"
        " WHERE id = ?",
        (
            status,
            None if reason is None else redact.text(reason),
            _utc(ended_unix),
            duration_s,
            json.dumps(redact.data(summary), default=str),
            run_id,
        ),
    )


def set_exit_code(conn: sqlite3.Connection, run_id: str, exit_code: int) -> None:
    """The exit code the run's process ended with (the verdict's, or 4 for a soakd bug)."""
    conn.execute("UPDATE runs SET exit_code = ? WHERE id = ?", (int(exit_code), run_id))


# --- reading run rows


class RunNotFound(UsageError):
    """No such run (or no run of the asked mode) in the database."""


_JSON_COLUMNS = ("config", "workload", "environment", "summary")


@dataclass(frozen=True, slots=True)
class RunRow:
    """One ``runs`` row: every column, the JSON columns decoded ({} when NULL or unreadable)."""

    id: str
    name: str | None
    mode: str
    status: str
    reason: str | None
    started_at: str
    started_unix: float
    ended_at: str | None
    duration_s: float | None
    pid: int | None
    host: str | None
    workload_kind: str | None
    fps: float | None
    config: dict[str, Any]
    config_hash: str
    workload: dict[str, Any]
    environment: dict[str, Any]
    summary: dict[str, Any]
    verdict: str | None
    exit_code: int | None
    pid_start: int | None = None
    labels: dict[str, str] = field(default_factory=dict)  # from the labels table

    def as_dict(self) -> dict[str, Any]:
        """The row as a plain dict (``soakd show --json``, the summary table)."""
        return {f.name: getattr(self, f.name) for f in fields(RunRow)}


_RUN_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RunRow) if f.name != "labels")
_SELECT_RUN = f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs"


def _loads(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        v = json.loads(text)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def _row(conn: sqlite3.Connection, values: Sequence[Any]) -> RunRow:
    d = dict(zip(_RUN_COLUMNS, tuple(values), strict=True))
    for k in _JSON_COLUMNS:
        d[k] = _loads(d[k])
    return RunRow(**d, labels=get_labels(conn, d["id"]))


def find_run(conn: sqlite3.Connection, run_id: str) -> RunRow | None:
    """The run with exactly this id, or None."""
    row = conn.execute(_SELECT_RUN + " WHERE id = ?", (run_id,)).fetchone()
    return None if row is None else _row(conn, row)


def get_labels(conn: sqlite3.Connection, run_id: str) -> dict[str, str]:
    """The run's labels (``[run.labels]`` and ``--label``), by name."""
    rows = conn.execute("SELECT key, value FROM labels WHERE run_id = ? ORDER BY key", (run_id,))
    return {str(k): str(v) for k, v in rows}


def _label_filter(labels: Mapping[str, str], alias: str = "runs.id") -> tuple[str, list[Any]]:
    """SQL conditions (AND-ed) selecting runs carrying every one of ``labels``."""
    conds, args = [], []
    for k, v in sorted(labels.items()):
        conds.append(
            f"EXISTS (SELECT 1 FROM labels l WHERE l.run_id = {alias}"
            " AND l.key = ? AND l.value = ?)"
        )
        args += [k, v]
    return " AND ".join(conds), args


def find_runs(
    conn: sqlite3.Connection, *, labels: Mapping[str, str], mode: str | None = "soak"
) -> list[RunRow]:
    """Every run carrying all of ``labels`` (of ``mode``; None: any), oldest first."""
    where, args = _label_filter(labels)
    if mode:
        where, args = " AND ".join(filter(None, [where, "mode = ?"])), [*args, mode]
    sql = _SELECT_RUN + (f" WHERE {where}" if where else "")
    rows = conn.execute(sql + " ORDER BY started_unix, id", args).fetchall()
    return [_row(conn, r) for r in rows]


def get_run(conn: sqlite3.Connection, run_id: str) -> RunRow:
    """The run with exactly this id; raises RunNotFound (a UsageError, exit 2)."""
    run = find_run(conn, run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id!r} in this database")
    return run


def list_runs(
    conn: sqlite3.Connection,
    *,
    limit: int = 20,
    mode: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The newest ``limit`` runs (of ``mode``; None: any; carrying every one of ``labels``)
    from the ``run_summary`` view, each with its ``labels``."""
    sql = (
        "SELECT run_id, name, mode, status, verdict, workload_kind, fps, started_at,"
        " duration_s, frames, measured_frames, drops, stale, errors FROM run_summary rs"
    )
    where, args = _label_filter(labels or {}, alias="rs.run_id")
    if mode:
        where, args = " AND ".join(filter(None, [where, "mode = ?"])), [*args, mode]
    sql += (f" WHERE {where}" if where else "") + " ORDER BY started_at DESC, run_id DESC LIMIT ?"
    out = [
        dict(zip(_SUMMARY_KEYS, tuple(r), strict=True)) for r in conn.execute(sql, [*args, limit])
    ]
    for r in out:
        r["labels"] = get_labels(conn, r["run_id"])
    return out


_SUMMARY_KEYS = (
    "run_id",
    "name",
    "mode",
    "status",
    "verdict",
    "workload_kind",
    "fps",
    "started_at",
    "duration_s",
    "frames",
    "measured_frames",
    "drops",
    "stale",
    "errors",
)


def latest_run_id(conn: sqlite3.Connection, mode: str | None = "soak") -> str:
    """The id of the most recently started run of ``mode`` (None: of any mode)."""
    sql = "SELECT id FROM runs"
    args: tuple[Any, ...] = ()
    if mode:
        sql, args = sql + " WHERE mode = ?", (mode,)
    row = conn.execute(sql + " ORDER BY started_unix DESC, rowid DESC LIMIT 1", args).fetchone()
    if row is None:
        raise RunNotFound(f"no {mode} run in this database yet" if mode else "no runs yet")
    return str(row[0])


def resolve(
    conn: sqlite3.Connection, ref: str | None, *, latest: bool = False, mode: str | None = "soak"
) -> str:
    """The run id a person means: ``latest`` (or ``latest=True``, or no ref) is the newest run
    of ``mode`` ("soak" unless asked otherwise; None: any mode); otherwise an exact run id,
    ``baseline:NAME``, a bare baseline name, or a unique run id prefix. Raises RunNotFound /
    UsageError with one line naming the problem."""
    if latest or ref is None:
        return latest_run_id(conn, mode)
    ref = ref.strip()
    if not ref:
        raise UsageError("the run id is empty: give a run id, an id prefix or a baseline name")
    if ref.startswith("baseline:"):
        name = ref.removeprefix("baseline:")
        rid = get_baseline(conn, name)
        if rid is None:
            raise RunNotFound(f"{ref}: no baseline named {name!r} (see `soakd baseline list`)")
        return rid
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (ref,)).fetchone():
        return ref
    rid = get_baseline(conn, ref)
    if rid is not None:
        return rid
    if ref == "latest":
        return latest_run_id(conn, mode)
    escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    rows = conn.execute(
        "SELECT id FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY id LIMIT 3", (escaped + "%",)
    ).fetchall()
    if len(rows) == 1:
        return str(rows[0][0])
    if rows:
        raise UsageError(f"{ref}: ambiguous run id prefix ({', '.join(r[0] for r in rows)}...)")
    raise RunNotFound(f"no run {ref!r}: no run or baseline with this id, id prefix or name")


# --- updating run rows


def set_verdict(conn: sqlite3.Connection, run_id: str, verdict: str, exit_code: int) -> None:
    """Record the run's verdict and the exit code it maps to."""
    conn.execute(
        "UPDATE runs SET verdict = ?, exit_code = ? WHERE id = ?", (verdict, int(exit_code), run_id)
    )


def process_start(pid: int) -> int | None:
    """When process ``pid`` started: field 22 of /proc/<pid>/stat (clock ticks since boot),
    which tells a process from a later one that reuses its pid. None where /proc does not
    say (no such process, not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # field 2 (comm) may hold spaces and parentheses: count the fields after its last ')'
    rest = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(rest[22 - 3])
    except (IndexError, ValueError):
        return None


def _pid_alive(pid: int | None, started: int | None = None) -> bool:
    """Whether the process ``pid`` still exists and, when its start time ``started`` was
    recorded and /proc can tell, is the same process (started at that time)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if started is None:
        return True
    now = process_start(pid)
    return now is None or now == started


def find_orphaned_runs(conn: sqlite3.Connection) -> list[str]:
    """Runs still ``running`` on this host whose process is gone (or whose pid now belongs
    to a process that started at another time). Reads only."""
    rows = conn.execute(
        "SELECT id, pid, host, pid_start FROM runs WHERE status = 'running'"
    ).fetchall()
    host = os.uname().nodename
    return [str(r[0]) for r in rows if r[2] == host and not _pid_alive(r[1], r[3])]


def mark_orphaned_runs(conn: sqlite3.Connection) -> list[str]:
    """Mark runs left ``running`` on this host by a process that is gone as ``crashed``
    (verdict INVALID unless one was stored) with a ``crashed`` event; returns their ids.
    The caller holds the transaction (``db.connect`` wraps this in ``atomic``)."""
    orphans = find_orphaned_runs(conn)
    for rid in orphans:
        last = conn.execute(
            "SELECT max(t) FROM (SELECT max(t_capture) AS t FROM frames WHERE run_id = ?"
            " UNION ALL SELECT max(t) FROM samples WHERE run_id = ?)",
            (rid, rid),
        ).fetchone()[0]
        conn.execute(
            "UPDATE runs SET status = 'crashed', reason = ?, duration_s = ?, "
            "verdict = COALESCE(verdict, 'INVALID') WHERE id = ?",
            ("process ended without closing the run (killed or power loss)", last, rid),
        )
        conn.execute(
            "INSERT INTO events (run_id, t, wall, kind, message) VALUES (?, ?, ?, 'crashed', ?)",
            (rid, last, time.time(), "found orphaned by a later soakd command"),
        )
    return orphans


# --- baselines: named references to runs


def set_baseline(conn: sqlite3.Connection, name: str, run_id: str) -> None:
    """Mark ``run_id`` as the baseline ``name`` (replacing an earlier one of that name)."""
    conn.execute(
        "INSERT INTO baselines (name, run_id, created_at) VALUES (?, ?, ?)"
        " ON CONFLICT(name) DO UPDATE SET run_id = excluded.run_id,"
        " created_at = excluded.created_at",
        (name, run_id, _utc(time.time())),
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


def mark_forced(conn: sqlite3.Connection, run_id: str, reason: str) -> None:
    """A run whose process is being forced out (a second stop signal) before it could close
    or judge the run: aborted, INVALID, with ``reason`` and a ``signal`` event saying so."""
    # two statements, each atomic on its own: the process may die between them
    conn.execute(
        "UPDATE runs SET status = CASE status WHEN 'running' THEN 'aborted' ELSE status END,"
        " reason = COALESCE(reason, ?), verdict = COALESCE(verdict, 'INVALID'),"
        " exit_code = COALESCE(exit_code, 3) WHERE id = ?",
        (reason, run_id),
    )
    conn.execute(
        "INSERT INTO events (run_id, t, wall, kind, message) VALUES (?, NULL, ?, 'signal', ?)",
        (run_id, time.time(), f"{reason}: forced exit before the run was closed and judged"),
    )

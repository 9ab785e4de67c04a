"""The queries the analysis and the reports need: a run's columns as numpy arrays, the
history of comparable runs, and storing a verdict.

Columns are fetched in chunks straight into numpy (no Python object per row survives), so
loading a 24-hour run at 30 fps (2.6 M frames) stays within a few hundred MB and seconds.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from soakd.errors import UsageError
from soakd.jsonsafe import clean_json
from soakd.records import SAMPLE_METRICS
from soakd.store.db import atomic
from soakd.store.runs import set_verdict

CHUNK_ROWS = 200_000


def _columns(
    conn: sqlite3.Connection,
    sql: str,
    params: Sequence[Any],
    names: Sequence[str],
    n_rows: int,
    dtypes: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Run ``sql`` (selecting ``names`` in order, at most ``n_rows`` rows) into one
    preallocated array per column (float64 unless ``dtypes`` says otherwise; NULL -> NaN),
    CHUNK_ROWS rows at a time, so peak memory is the result plus one chunk."""
    dtypes = dtypes or {}
    out = {n: np.empty(n_rows, dtype=dtypes.get(n, np.float64)) for n in names}
    cur = conn.cursor()
    cur.row_factory = None
    cur.execute(sql, tuple(params))
    pos = 0
    while pos < n_rows:
        rows = cur.fetchmany(min(CHUNK_ROWS, n_rows - pos))
        if not rows:
            break
        block = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
        for i, n in enumerate(names):
            out[n][pos : pos + len(rows)] = block[:, i]
        pos += len(rows)
    cur.close()
    return {n: a[:pos] for n, a in out.items()}


class DamagedValue(UsageError):
    """A value soakd never writes, written into the database by hand or by another tool:
    text where a number belongs, an infinite time (exit 2, the value named)."""


#: the tables of a run's rows and the column that tells one row from another
_ROW_KEYS = {
    "runs": "id",
    "frames": "frame_id",
    "samples": "seq",
    "emissions": "frame_id",
    "gpu_samples": "seq",
    "chunk_stages": "frame_id",
}
#: columns holding a time (s): a time is finite, whatever the run did; a non-finite
#: measurement (``infer_ms`` = inf) is evidence the verdict names instead
#: (analysis/criteria/validity.py)
_TIMES = frozenset(
    ("t", "wall", "t_sched", "t_capture", "t_dispatch", "t_done", "t_emit", "started_unix",
     "ended_unix", "duration_s")
)  # fmt: skip


def check_values(conn: sqlite3.Connection, run_id: str) -> None:
    """Raise DamagedValue naming the first value of the run's rows that soakd cannot have
    written: text or bytes in a numeric column, an infinite time. One scan of each table's
    rows of the run, done by SQLite."""
    for table, key in _ROW_KEYS.items():
        info = list(conn.execute(f"PRAGMA table_info({table})"))
        numeric = [str(r[1]) for r in info if str(r[2]).upper() in ("REAL", "INTEGER")]
        if not numeric:
            continue  # a table an older schema lacks
        terms = [f"typeof({c}) IN ('text', 'blob')" for c in numeric]
        terms += [f"abs({c}) = 9e999" for c in numeric if c in _TIMES]
        where = "id = ?" if table == "runs" else "run_id = ?"
        row = conn.execute(
            f"SELECT {key}, {', '.join(numeric)} FROM {table} WHERE {where}"
            f" AND ({' OR '.join(terms)}) LIMIT 1",
            (run_id,),
        ).fetchone()
        if row is not None:
            raise DamagedValue(_damage(table, key, numeric, tuple(row)))


def _damage(table: str, key: str, columns: list[str], row: tuple[Any, ...]) -> str:
    for c, v in zip(columns, row[1:], strict=True):
        text = isinstance(v, str | bytes)
        if text or (c in _TIMES and isinstance(v, float) and abs(v) == np.inf):
            what = "text where a number belongs" if text else "an infinite time"
            shown = repr(v[:40]) if text else repr(v)
            return (
                f"{table}.{c} = {shown} ({key} {row[0]}): {what}; the run database was changed"
                " outside soakd (damaged value): fix or delete that row"
            )
    return f"{table} ({key} {row[0]}): a damaged value"


def _count(conn: sqlite3.Connection, table: str, run_id: str) -> int:
    return int(
        conn.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", (run_id,)).fetchone()[0]
    )


FRAME_FIELDS: tuple[str, ...] = (
    "frame_id",
    "t_capture",
    "warmup",
    "skipped",
    "has_error",
    "grab_ms",
    "pre_ms",
    "infer_ms",
    "decode_ms",
    "total_ms",
    "frame_age_ms",
    "queue_len",
    "drop_count",
    "stale_count",
    "stream",
    "first_emit_ms",
    "output_latency_ms",
    "session_dropped",
    "consume_ms",
    "consume_output_ms",
    "lateness_ms",
)
"""The frame columns RunData knows (``has_error``: the frame's workload raised)."""

_MS32 = (
    "grab_ms",
    "pre_ms",
    "infer_ms",
    "decode_ms",
    "total_ms",
    "frame_age_ms",
    "first_emit_ms",
    "output_latency_ms",
    "consume_ms",
    "consume_output_ms",
    "queue_len",
)


def load_frame_columns(
    conn: sqlite3.Connection, run_id: str, extra: Sequence[str] = ()
) -> dict[str, np.ndarray]:
    """Every frame of the run ordered by frame_id: the core FRAME_FIELDS plus ``extra``
    ones (``first_emit_ms``, ``output_latency_ms``). Millisecond columns are float32, the
    three flags int8, times and counters float64."""
    core = [f for f in FRAME_FIELDS[:15] if f not in ("warmup", "skipped", "has_error")]
    names = [*core, "flags", *extra]
    exprs = [*core, "warmup + 2 * skipped + 4 * (error IS NOT NULL)", *extra]
    sql = f"SELECT {', '.join(exprs)} FROM frames WHERE run_id = ? ORDER BY frame_id"
    cols = _columns(
        conn,
        sql,
        (run_id,),
        names,
        _count(conn, "frames", run_id),
        {n: np.float32 for n in _MS32} | {"flags": np.int8},
    )
    flags = cols.pop("flags")
    cols["warmup"] = (flags & 1).astype(np.int8)
    cols["skipped"] = ((flags >> 1) & 1).astype(np.int8)
    cols["has_error"] = ((flags >> 2) & 1).astype(np.int8)
    return cols


def load_extra_keys(
    conn: sqlite3.Connection, run_id: str, keys: Sequence[str]
) -> dict[str, np.ndarray]:
    """Numbers a workload keeps in each frame's ``extra`` JSON (a served model's
    ``itl_p50_ms``...), one per frame ordered by frame_id as ``load_frame_columns``; NaN
    where a frame has none."""
    for k in keys:
        if not re.fullmatch(r"[a-z0-9_]+", k):
            raise ValueError(f"extra key {k!r}: [a-z0-9_] only")
    exprs = ", ".join(f"json_extract(extra, '$.{k}')" for k in keys)
    sql = f"SELECT {exprs} FROM frames WHERE run_id = ? ORDER BY frame_id"
    return _columns(conn, sql, (run_id,), tuple(keys), _count(conn, "frames", run_id))


def load_sample_columns(conn: sqlite3.Connection, run_id: str) -> dict[str, np.ndarray]:
    """The run's telemetry samples ordered by seq: ``t`` and SAMPLE_METRICS."""
    names = ("t", *SAMPLE_METRICS)
    have = {str(r[1]) for r in conn.execute("PRAGMA table_info(samples)")}
    # a database of an older soakd opened read-only (not migrated) lacks the later columns
    cols = ", ".join(n if n in have else f"NULL AS {n}" for n in names)
    sql = f"SELECT {cols} FROM samples WHERE run_id = ? ORDER BY seq"
    return _columns(conn, sql, (run_id,), names, _count(conn, "samples", run_id))


EMISSION_FIELDS: tuple[str, ...] = ("frame_id", "idx", "t_emit", "interval_ms", "chunk")


def load_emission_columns(conn: sqlite3.Connection, run_id: str) -> dict[str, np.ndarray]:
    """A generator run's emitted frames ordered by time."""
    sql = (
        f"SELECT {', '.join(EMISSION_FIELDS)} FROM emissions WHERE run_id = ? "
        "ORDER BY t_emit, frame_id, idx"
    )
    return _columns(conn, sql, (run_id,), EMISSION_FIELDS, _count(conn, "emissions", run_id))


def load_events(
    conn: sqlite3.Connection, run_id: str, limit: int = 200
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The first ``limit`` events (t, kind, frame_id, message, data: its JSON decoded, None
    when there is none) and the count of each kind."""
    rows = conn.execute(
        "SELECT t, kind, frame_id, message, data FROM events WHERE run_id = ?"
        " ORDER BY t, id LIMIT ?",
        (run_id, limit),
    ).fetchall()
    events = [
        {"t": r[0], "kind": r[1], "frame_id": r[2], "message": r[3], "data": _json(r[4])}
        for r in rows
    ]
    counts = {
        str(r[0]): int(r[1])
        for r in conn.execute(
            "SELECT kind, count(*) FROM events WHERE run_id = ? GROUP BY kind", (run_id,)
        )
    }
    return events, counts


def load_pause_columns(conn: sqlite3.Connection, run_id: str) -> dict[str, np.ndarray]:
    """Every ``pause`` event of the run, however many (``load_events`` reads the first 200 of
    all kinds), in time order: ``t``, the ticks the pacer missed and their ms from its data
    (``ticks``, ``ms``; NaN for an event of an older soakd without them, whose ``message``,
    None otherwise, says them)."""
    rows = conn.execute(
        "SELECT t, data, message FROM events WHERE run_id = ? AND kind = 'pause' ORDER BY t, id",
        (run_id,),
    ).fetchall()
    n = len(rows)
    out = {k: np.full(n, np.nan) for k in ("t", "ticks", "ms")}
    out["message"] = np.full(n, None, dtype=object)
    for i, (t, data, message) in enumerate(rows):
        d = _json(data)
        d = d if isinstance(d, dict) else {}
        out["t"][i] = np.nan if t is None else float(t)
        ticks, ms = _number(d.get("ticks")), _number(d.get("ms"))
        if ticks is None or ms is None:
            out["message"][i] = message
            continue
        out["ticks"][i], out["ms"][i] = ticks, ms
    return out


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _json(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def load_error_messages(
    conn: sqlite3.Connection, run_id: str, limit: int = 5
) -> list[tuple[str, int]]:
    """The most frequent error messages of the run's frames, with their counts."""
    rows = conn.execute(
        "SELECT error, count(*) AS n FROM frames WHERE run_id = ? AND error IS NOT NULL "
        "GROUP BY error ORDER BY n DESC LIMIT ?",
        (run_id, limit),
    ).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


#: what a realtime session keeps of each answered turn, in its frame's ``extra``
TURN_FIELDS: tuple[str, ...] = (
    "ttfd_ms", "done_ms", "delta_p95_ms", "audio_s", "audio_rtf", "underruns",
)  # fmt: skip


def load_turn_columns(conn: sqlite3.Connection, run_id: str) -> dict[str, np.ndarray]:
    """A realtime run's answered turns (frames whose ``extra`` holds a turn, without an
    error), ordered by frame_id: ``t_capture``, ``t_done`` (the answer's done), ``warmup``
    and TURN_FIELDS (NaN where a turn has none: no audio out). As many rows as turns,
    however long the run."""
    where = (
        "FROM frames WHERE run_id = ? AND error IS NULL"
        " AND json_extract(extra, '$.turn') IS NOT NULL"
    )
    n = int(conn.execute(f"SELECT count(*) {where}", (run_id,)).fetchone()[0])
    exprs = ", ".join(f"json_extract(extra, '$.{k}')" for k in TURN_FIELDS)
    sql = f"SELECT t_capture, t_done, warmup, {exprs} {where} ORDER BY frame_id"
    return _columns(conn, sql, (run_id,), ("t_capture", "t_done", "warmup", *TURN_FIELDS), n)


#: an error's kind: the word (and HTTP status) its message starts with ("timeout", "http
#: 503": a served request's failure), else its exception type, else "other"
_ERROR_KIND = re.compile(r"[a-z][a-z_-]{0,23}(?: \d{3})?")
_ERROR_TYPE = re.compile(r"[A-Za-z_][\w.]{0,79}")


def load_error_kinds(conn: sqlite3.Connection, run_id: str) -> dict[str, int]:
    """The run's frame errors (stored ``TypeName: message``) counted by kind: the message's
    own head when it is a kind word (``RequestFailed: http 503: ...`` is ``http 503``),
    else the exception type (``ValueError``); most frequent first."""
    rows = conn.execute(
        "SELECT h1, CASE WHEN instr(r, ':') > 0 THEN trim(substr(r, 1, instr(r, ':') - 1))"
        " ELSE '' END, count(*) FROM (SELECT CASE WHEN instr(error, ':') > 0 THEN"
        " substr(error, 1, instr(error, ':') - 1) ELSE error END AS h1, CASE WHEN"
        " instr(error, ':') > 0 THEN substr(error, instr(error, ':') + 1) ELSE '' END AS r"
        " FROM frames WHERE run_id = ? AND error IS NOT NULL) GROUP BY 1, 2",
        (run_id,),
    ).fetchall()
    out: dict[str, int] = {}
    for head, word, n in rows:
        if _ERROR_KIND.fullmatch(str(word)):
            kind = str(word)
        else:
            kind = str(head) if _ERROR_TYPE.fullmatch(str(head)) else "other"
        out[kind] = out.get(kind, 0) + int(n)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def load_history(
    conn: sqlite3.Connection,
    *,
    config_hash: str,
    host: str | None,
    before_unix: float,
    criterion: str = "jitter",
    limit: int = 20,
) -> list[float]:
    """Measured values of ``criterion`` in the last ``limit`` PASS runs with the same config
    hash on the same host that started before ``before_unix`` (newest first)."""
    rows = conn.execute(
        "SELECT v.value FROM runs r JOIN verdicts v ON v.run_id = r.id "
        "WHERE r.config_hash = ? AND r.host IS ? AND r.verdict = 'PASS' "
        "AND r.started_unix < ? AND v.criterion = ? AND v.status = 'pass' "
        "AND v.value IS NOT NULL ORDER BY r.started_unix DESC LIMIT ?",
        (config_hash, host, before_unix, criterion, limit),
    ).fetchall()
    return [float(r[0]) for r in rows]


def store_verdict(
    conn: sqlite3.Connection,
    run_id: str,
    rows: Sequence[dict[str, Any]],
    status: str,
    exit_code: int,
) -> None:
    """Replace the run's verdict rows and set runs.verdict / runs.exit_code, atomically
    (its own transaction, or a savepoint inside the caller's).

    Each row has criterion, status, value, threshold, unit, detail and evidence (a JSON-able
    dict)."""
    params = [
        (
            run_id,
            r["criterion"],
            r["status"],
            _num(r.get("value")),
            _num(r.get("threshold")),
            r.get("unit"),
            r.get("detail"),
            json.dumps(clean_json(r.get("evidence") or {}), separators=(",", ":"), allow_nan=False),
        )
        for r in rows
    ]
    with atomic(conn):
        conn.execute("DELETE FROM verdicts WHERE run_id = ?", (run_id,))
        conn.executemany(
            "INSERT INTO verdicts (run_id, criterion, status, value, threshold, unit, detail, "
            "evidence) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            params,
        )
        set_verdict(conn, run_id, status, exit_code)


def load_verdict_rows(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    """The stored verdict rows of a run (evidence decoded), in the order the verdict judged
    them (as stored)."""
    cur = conn.execute(
        "SELECT criterion, status, value, threshold, unit, detail, evidence FROM verdicts "
        "WHERE run_id = ? ORDER BY rowid",  # the verdict's order: the order it judged in
        (run_id,),
    )
    out = []
    for r in cur.fetchall():
        d = dict(
            zip(
                ("criterion", "status", "value", "threshold", "unit", "detail", "evidence"),
                tuple(r),
                strict=True,
            )
        )
        d["evidence"] = json.loads(d["evidence"]) if d["evidence"] else {}
        out.append(d)
    return out


def _num(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return f if np.isfinite(f) else None


# --------------------------------------------------------------------------- long runs
# A run too long to load whole (soakd.analysis.data.BOUNDED_ROWS) is read in chunks, and its
# telemetry as per-window aggregates computed by SQLite, so memory does not grow with it.

_FLAG_EXPR = {"warmup": "warmup", "skipped": "skipped", "has_error": "(error IS NOT NULL)"}


def count_rows(conn: sqlite3.Connection, run_id: str, cap: int | None = None) -> tuple[int, int]:
    """(frames, samples) of the run; with ``cap``, each counted only up to ``cap`` (what
    deciding "more than BOUNDED_ROWS" needs, without counting a long run to the end)."""
    if cap is None:
        return _count(conn, "frames", run_id), _count(conn, "samples", run_id)
    sql = "SELECT count(*) FROM (SELECT 1 FROM {} WHERE run_id = ? LIMIT ?)"
    frames, samples = (
        int(conn.execute(sql.format(t), (run_id, cap)).fetchone()[0]) for t in ("frames", "samples")
    )
    return frames, samples


def run_extent(
    conn: sqlite3.Connection, run_id: str
) -> tuple[float | None, float | None, float | None]:
    """(first capture of a frame not flagged warm-up, last capture, last sample time), by
    the key order: frames are captured in frame_id order, samples taken in seq order."""

    def one(sql: str) -> float | None:
        row = conn.execute(sql, (run_id,)).fetchone()
        return None if row is None else row[0]

    return (
        one(
            "SELECT t_capture FROM frames WHERE run_id = ? AND warmup = 0 ORDER BY frame_id LIMIT 1"
        ),
        one("SELECT t_capture FROM frames WHERE run_id = ? ORDER BY frame_id DESC LIMIT 1"),
        one("SELECT t FROM samples WHERE run_id = ? ORDER BY seq DESC LIMIT 1"),
    )


_MEASURED = "run_id = ? AND warmup = 0 AND skipped = 0 AND t_capture >= ?"
"""The measured frames (RunData.measured): post-warm-up, dispatched."""

SCAN_ROWS = 100_000
_SCAN_EXPR = {
    **_FLAG_EXPR,
    "flags": "warmup + 2 * skipped + 4 * (error IS NOT NULL)",
    "drop_count": "coalesce(drop_count, 0)",
    "stale_count": "coalesce(stale_count, 0)",
    "session_dropped": "coalesce(session_dropped, 0)",
}
"""What a scanned name selects: ``flags`` packs warm-up (1), skipped (2) and error (4) in
one value; the loss counters are read as the exact path reads them (NULL -> 0)."""


def _chunks(
    conn: sqlite3.Connection, sql: str, params: Sequence[Any], names: Sequence[str], rows: int,
    as_float32: bool = True,
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    """``sql``'s rows ``rows`` at a time as one array per name (milliseconds float32 when
    ``as_float32``, flags int8, the rest float64)."""
    dtypes: dict[str, Any] = {n: np.int8 for n in (*_FLAG_EXPR, "flags")}
    if as_float32:
        dtypes |= {n: np.float32 for n in _MS32}
    cur = conn.cursor()
    cur.row_factory = None
    cur.execute(sql, tuple(params))
    try:
        while block := cur.fetchmany(rows):
            arr = _block(block, len(names))
            yield {n: arr[:, i].astype(dtypes.get(n, np.float64)) for i, n in enumerate(names)}
    finally:
        cur.close()


def _block(rows: list[tuple[Any, ...]], width: int) -> np.ndarray:
    """Rows as a float64 array: ``fromiter`` (fast) unless a NULL needs ``np.array``."""
    try:
        flat = np.fromiter(itertools.chain.from_iterable(rows), np.float64, len(rows) * width)
    except TypeError:
        return np.array(rows, dtype=np.float64).reshape(len(rows), width)
    return flat.reshape(len(rows), width)


def frame_chunks(
    conn: sqlite3.Connection, run_id: str, names: Sequence[str], rows: int = SCAN_ROWS
) -> Iterator[dict[str, np.ndarray]]:
    """Every row of the run (warm-up and skipped ones too), ordered by frame_id, ``rows``
    at a time: only ``names`` (``_SCAN_EXPR`` says what ``flags`` and the counters read),
    typed as ``load_frame_columns`` types them."""
    exprs = [_SCAN_EXPR.get(n, n) for n in names]
    sql = f"SELECT {', '.join(exprs)} FROM frames WHERE run_id = ? ORDER BY frame_id"
    return _chunks(conn, sql, (run_id,), names, rows)


def measured_matching(
    conn: sqlite3.Connection,
    run_id: str,
    t0: float,
    names: Sequence[str],
    ranges: Sequence[tuple[str, float, float]],
    over: tuple[str, float] | None = None,
    rows: int = SCAN_ROWS,
) -> Iterator[dict[str, np.ndarray]]:
    """The measured frames from ``t0`` on with a value in one of ``ranges`` (column, lo,
    hi: inclusive) or, with ``over`` (column, cut), that did not raise and have ``column``
    > ``cut``: ``flags``, ``frame_id``, ``t_capture`` and ``names`` as stored (float64),
    in frame order. One scan in SQLite; only the matching rows come to Python."""
    cols = {c for c, _lo, _hi in ranges} | ({over[0]} if over else set())
    bad = sorted(c for c in cols | set(names) if c not in FRAME_FIELDS)
    if bad:
        raise ValueError(f"unknown frame column {bad[0]!r}")
    terms = [f"{c} BETWEEN ? AND ?" for c, _lo, _hi in ranges]
    params: list[Any] = [v for _c, lo, hi in ranges for v in (lo, hi)]
    if over:
        terms.append(f"({over[0]} > ? AND error IS NULL)")
        params.append(over[1])
    if not terms:
        return iter(())
    names = ["flags", "frame_id", "t_capture", *names]
    exprs = [_SCAN_EXPR.get(n, n) for n in names]
    sql = (
        f"SELECT {', '.join(exprs)} FROM frames WHERE {_MEASURED} AND ({' OR '.join(terms)}) "
        "ORDER BY frame_id"
    )
    return _chunks(conn, sql, (run_id, t0, *params), names, rows, as_float32=False)


_VALUES = {
    False: "run_id = ? AND warmup = 0 AND skipped = 0 AND error IS NULL",
    True: "run_id = ? AND first = 0 AND skipped = 0 AND error IS NULL",
}
"""The frames ``soakd compare`` reads (``profiling_queries.frame_values``): dispatched and
did not raise; a soak run's after the warm-up, a profile run's all but the first."""


def value_chunks(
    conn: sqlite3.Connection,
    run_id: str,
    names: Sequence[str],
    *,
    profile: bool,
    ranges: Sequence[tuple[str, float, float]] | None = None,
    rows: int = SCAN_ROWS,
) -> Iterator[dict[str, np.ndarray]]:
    """``names`` (float64, NaN: NULL) of the frames ``soakd compare`` reads (``_VALUES``) in
    frame order, ``rows`` at a time; with ``ranges`` (column, lo, hi: inclusive) only the
    frames with a value in one of them, found by SQLite in one scan."""
    bad = sorted(
        c for c in {c for c, _lo, _hi in ranges or ()} | set(names) if c not in FRAME_FIELDS
    )
    if bad:
        raise ValueError(f"unknown frame column {bad[0]!r}")
    where = _VALUES[profile]
    params: list[Any] = [run_id]
    if ranges is not None:
        if not ranges:
            return iter(())
        where += " AND (" + " OR ".join(f"{c} BETWEEN ? AND ?" for c, _lo, _hi in ranges) + ")"
        params += [v for _c, lo, hi in ranges for v in (lo, hi)]
    sql = f"SELECT {', '.join(names)} FROM frames WHERE {where} ORDER BY frame_id"
    return _chunks(conn, sql, params, names, rows, as_float32=False)


def first_post_id(conn: sqlite3.Connection, run_id: str, t0: float) -> float | None:
    """The frame_id of the first row after the warm-up (not flagged, captured from t0)."""
    row = conn.execute(
        "SELECT frame_id FROM frames WHERE run_id = ? AND warmup = 0 AND t_capture >= ? "
        "ORDER BY frame_id LIMIT 1",
        (run_id, t0),
    ).fetchone()
    return None if row is None else float(row[0])


def measured_over(
    conn: sqlite3.Connection, run_id: str, t0: float, column: str, cut: float, limit: int
) -> dict[str, np.ndarray]:
    """``frame_id``, ``t_capture`` and ``column`` (float32) of the measured frames that did
    not raise with ``column`` > ``cut``, in frame order, at most ``limit``."""
    if column not in FRAME_FIELDS:
        raise ValueError(f"unknown frame column {column!r}")
    sql = (
        f"SELECT frame_id, t_capture, {column} FROM frames WHERE {_MEASURED} "
        f"AND error IS NULL AND {column} > ? ORDER BY frame_id LIMIT ?"
    )
    n = int(conn.execute(f"SELECT count(*) FROM ({sql})", (run_id, t0, cut, limit)).fetchone()[0])
    names = ("frame_id", "t_capture", column)
    return _columns(conn, sql, (run_id, t0, cut, limit), names, n, {column: np.float32})


def _window_expr(t0: float, width: float, nwin: int) -> tuple[str, list[float]]:
    """SQL for the window index of ``t`` as ``stats.window_reduce`` assigns it (clipped)."""
    return "max(0, min(?, CAST((t - ?) / ? AS INTEGER)))", [nwin - 1, t0, width]


def sample_windows(
    conn: sqlite3.Connection,
    run_id: str,
    t0: float,
    t1: float,
    width: float,
    nwin: int,
    metrics: Sequence[str] = SAMPLE_METRICS,
) -> dict[str, np.ndarray]:
    """Per window of the samples in [t0, t1] (window -1: every sample before t0): the
    window ``w``, its first and last sample time ``t_lo`` / ``t_hi``, and for each of
    ``metrics`` (SAMPLE_METRICS) its ``count:NAME``, ``min:NAME`` and ``max:NAME`` (NaN: no
    value)."""
    bad = [m for m in metrics if m not in SAMPLE_METRICS]
    if bad:
        raise ValueError(f"unknown sample column {bad[0]!r}")
    wexpr, wparams = _window_expr(t0, width, nwin)
    aggs = [f"count({m}), min({m}), max({m})" for m in metrics]
    names = ["w", "t_lo", "t_hi"] + [f"{f}:{m}" for m in metrics for f in ("count", "min", "max")]
    sql = (
        f"SELECT CASE WHEN t < ? THEN -1 ELSE {wexpr} END AS w, min(t), max(t), "
        f"{', '.join(aggs)} FROM samples WHERE run_id = ? AND t <= ? GROUP BY w ORDER BY w"
    )
    params = [t0, *wparams, run_id, t1]
    return _columns(conn, sql, params, names, nwin + 1)


def sample_series_chunks(
    conn: sqlite3.Connection, run_id: str, column: str, t0: float, rows: int = 100_000
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(t, value) of ``column``'s samples from ``t0`` on that have a value, in seq order."""
    if column not in SAMPLE_METRICS:
        raise ValueError(f"unknown sample column {column!r}")
    cur = conn.cursor()
    cur.execute(
        f"SELECT t, {column} FROM samples WHERE run_id = ? AND t >= ? AND {column} IS NOT NULL "
        "ORDER BY seq",
        (run_id, t0),
    )
    try:
        while block := cur.fetchmany(rows):
            arr = _block(block, 2)
            yield arr[:, 0], arr[:, 1]
    finally:
        cur.close()

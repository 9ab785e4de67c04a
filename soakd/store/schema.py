"""The run database schema, created and upgraded through recorded migrations.

Every migration is a (name, SQL script) pair applied once, in order, inside a transaction,
and recorded in ``_migrations``. Never edit a released migration: append a new one.
docs/schema.md documents every table, column and view.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import time

from soakd.records import SAMPLE_FIELDS, FrameRecord

#: the frames table's columns: the run, then a FrameRecord's fields in order (its row)
FRAME_COLUMNS: tuple[str, ...] = ("run_id", *FrameRecord._fields)

SAMPLE_COLUMNS: tuple[str, ...] = (
    "run_id",
    "seq",
    "t",
    "wall",
    "lag_ms",
    "tick_ms",
    *SAMPLE_FIELDS,
)

EMISSION_COLUMNS: tuple[str, ...] = (
    "run_id",
    "frame_id",
    "idx",
    "t_emit",
    "interval_ms",
    "chunk",
    "chunk_frames",
    "chunk_ms",
)

EVENT_COLUMNS: tuple[str, ...] = ("run_id", "t", "wall", "kind", "frame_id", "message", "data")

#: the samples table's telemetry columns as migration 0001 created them (later ones are
#: added by their own migrations: a released migration never changes)
_INITIAL_SAMPLE_FIELDS: tuple[str, ...] = SAMPLE_FIELDS[: SAMPLE_FIELDS.index("torch_ooms") + 1]
_sample_cols_sql = ",\n    ".join(
    f"{c} {'REAL' if c.endswith(('_pct', '_w', '_c')) else 'INTEGER'}"
    for c in _INITIAL_SAMPLE_FIELDS
)

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_initial",
        f"""
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    name TEXT,
    mode TEXT NOT NULL DEFAULT 'soak',      -- soak | profile
    status TEXT NOT NULL,                   -- running | completed | aborted | crashed
    reason TEXT,                            -- why it was aborted/crashed
    started_at TEXT NOT NULL,               -- ISO 8601 UTC wall clock
    started_unix REAL NOT NULL,             -- wall clock at t = 0 (joins with journald)
    ended_at TEXT,
    duration_s REAL,                        -- measured, monotonic
    pid INTEGER,
    host TEXT,
    workload_kind TEXT,
    fps REAL,
    config TEXT NOT NULL,                   -- resolved settings, JSON
    config_hash TEXT NOT NULL,
    workload TEXT,                          -- the workload's describe(), JSON
    environment TEXT,                       -- cpu, gpu, driver, cuda, versions, JSON
    summary TEXT,                           -- JSON summary written at the end
    verdict TEXT,                           -- PASS | FAIL | INVALID
    exit_code INTEGER
);
CREATE INDEX runs_config_hash ON runs(config_hash, started_unix);

CREATE TABLE frames (
    run_id TEXT NOT NULL REFERENCES runs(id),
    frame_id INTEGER NOT NULL,
    t_sched REAL NOT NULL,
    t_capture REAL NOT NULL,
    t_dispatch REAL,
    t_done REAL,
    lateness_ms REAL,
    grab_ms REAL,
    pre_ms REAL,
    infer_ms REAL,
    decode_ms REAL,
    total_ms REAL,
    queue_len INTEGER,
    frame_age_ms REAL,
    e2e_ms REAL,
    drop_count INTEGER,
    stale_count INTEGER,
    out_tokens INTEGER,
    vision_tokens INTEGER,
    audio_tokens INTEGER,
    error TEXT,
    first INTEGER NOT NULL DEFAULT 0,
    warmup INTEGER NOT NULL DEFAULT 0,
    skipped INTEGER NOT NULL DEFAULT 0,
    session_dropped INTEGER,
    pending INTEGER,
    output_kind TEXT,
    output_latency_ms REAL,
    first_emit_ms REAL,
    emitted INTEGER,
    extra TEXT,
    PRIMARY KEY (run_id, frame_id)
) WITHOUT ROWID;

CREATE TABLE samples (
    run_id TEXT NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    t REAL NOT NULL,
    wall REAL NOT NULL,
    lag_ms REAL,
    tick_ms REAL,
    {_sample_cols_sql},
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE emissions (
    run_id TEXT NOT NULL REFERENCES runs(id),
    frame_id INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    t_emit REAL NOT NULL,
    interval_ms REAL,
    chunk INTEGER,
    chunk_frames INTEGER,
    chunk_ms REAL,
    PRIMARY KEY (run_id, frame_id, idx)
) WITHOUT ROWID;

CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id),
    t REAL,
    wall REAL,
    kind TEXT NOT NULL,
    frame_id INTEGER,
    message TEXT,
    data TEXT
);
CREATE INDEX events_run ON events(run_id, kind);

CREATE TABLE verdicts (
    run_id TEXT NOT NULL REFERENCES runs(id),
    criterion TEXT NOT NULL,
    status TEXT NOT NULL,                   -- pass | fail | invalid | n/a
    value REAL,
    threshold REAL,
    unit TEXT,
    detail TEXT,
    evidence TEXT,                          -- JSON
    PRIMARY KEY (run_id, criterion)
);

CREATE TABLE baselines (
    name TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id),
    created_at TEXT NOT NULL
);

-- Post-warm-up frames that were dispatched: what every statistic is computed on.
CREATE VIEW measured_frames AS
SELECT * FROM frames WHERE warmup = 0 AND skipped = 0;

-- One row per run: the questions people ask first.
CREATE VIEW run_summary AS
SELECT r.id AS run_id, r.name, r.mode, r.status, r.verdict, r.workload_kind, r.fps,
       r.started_at, r.duration_s,
       (SELECT count(*) FROM frames f WHERE f.run_id = r.id) AS frames,
       (SELECT count(*) FROM frames f WHERE f.run_id = r.id AND f.warmup = 0
            AND f.skipped = 0) AS measured_frames,
       (SELECT max(drop_count) FROM frames f WHERE f.run_id = r.id) AS drops,
       (SELECT max(stale_count) FROM frames f WHERE f.run_id = r.id) AS stale,
       (SELECT count(*) FROM frames f WHERE f.run_id = r.id AND f.error IS NOT NULL) AS errors,
       (SELECT round(avg(total_ms), 3) FROM measured_frames f WHERE f.run_id = r.id)
            AS avg_total_ms,
       (SELECT round(max(infer_ms), 3) FROM measured_frames f WHERE f.run_id = r.id)
            AS max_infer_ms,
       (SELECT max(rss_bytes) FROM samples s WHERE s.run_id = r.id) AS peak_rss_bytes,
       (SELECT max(gpu_mem_used_bytes) FROM samples s WHERE s.run_id = r.id)
            AS peak_gpu_mem_bytes,
       (SELECT count(*) FROM samples s WHERE s.run_id = r.id) AS samples
FROM runs r;

-- Per-second aggregates of the frames: "when did frame age start rising?" is one query.
CREATE VIEW frames_per_second AS
SELECT run_id, CAST(t_capture AS INTEGER) AS second,
       count(*) AS frames,
       sum(skipped) AS skipped,
       sum(error IS NOT NULL) AS errors,
       max(drop_count) AS drop_count,
       max(stale_count) AS stale_count,
       avg(grab_ms) AS grab_ms_avg, avg(pre_ms) AS pre_ms_avg,
       avg(infer_ms) AS infer_ms_avg, max(infer_ms) AS infer_ms_max,
       avg(decode_ms) AS decode_ms_avg, avg(total_ms) AS total_ms_avg,
       avg(frame_age_ms) AS frame_age_ms_avg, max(frame_age_ms) AS frame_age_ms_max,
       avg(e2e_ms) AS e2e_ms_avg, max(queue_len) AS queue_len_max,
       max(warmup) AS warmup
FROM frames GROUP BY run_id, second;

-- Per-second aggregates of the telemetry.
CREATE VIEW samples_per_second AS
SELECT run_id, CAST(t AS INTEGER) AS second, count(*) AS samples,
       min(rss_bytes) AS rss_bytes_min, max(rss_bytes) AS rss_bytes_max,
       avg(cpu_pct) AS cpu_pct_avg,
       min(gpu_mem_used_bytes) AS gpu_mem_used_bytes_min,
       max(gpu_mem_used_bytes) AS gpu_mem_used_bytes_max,
       avg(gpu_util_pct) AS gpu_util_pct_avg,
       max(torch_reserved_bytes) AS torch_reserved_bytes_max,
       max(tick_ms) AS tick_ms_max, max(lag_ms) AS lag_ms_max
FROM samples GROUP BY run_id, second;
""",
    ),
    (
        "0002_runs_pid_start",
        """
-- the start time of the run's process (/proc/<pid>/stat field 22, clock ticks since boot):
-- a pid that is alive but started at another time belongs to another process
ALTER TABLE runs ADD COLUMN pid_start INTEGER;
""",
    ),
    (
        "0003_measured_frames_window",
        """
-- the verdict's measured window exactly: frames captured before the warmup_end event (the
-- monitor logs it a moment after warmup_s, so a few frames there are not flagged warm-up)
-- are not measured either
DROP VIEW run_summary;
DROP VIEW measured_frames;
CREATE VIEW measured_frames AS
SELECT f.* FROM frames f
WHERE f.warmup = 0 AND f.skipped = 0
  AND f.t_capture >= coalesce((SELECT min(e.t) FROM events e WHERE e.run_id = f.run_id
                               AND e.kind = 'warmup_end'), f.t_capture);
-- One row per run: the questions people ask first.
CREATE VIEW run_summary AS
SELECT r.id AS run_id, r.name, r.mode, r.status, r.verdict, r.workload_kind, r.fps,
       r.started_at, r.duration_s,
       (SELECT count(*) FROM frames f WHERE f.run_id = r.id) AS frames,
       (SELECT count(*) FROM measured_frames f WHERE f.run_id = r.id) AS measured_frames,
       (SELECT max(drop_count) FROM frames f WHERE f.run_id = r.id) AS drops,
       (SELECT max(stale_count) FROM frames f WHERE f.run_id = r.id) AS stale,
       (SELECT count(*) FROM frames f WHERE f.run_id = r.id AND f.error IS NOT NULL) AS errors,
       (SELECT round(avg(total_ms), 3) FROM measured_frames f WHERE f.run_id = r.id)
            AS avg_total_ms,
       (SELECT round(max(infer_ms), 3) FROM measured_frames f WHERE f.run_id = r.id)
            AS max_infer_ms,
       (SELECT max(rss_bytes) FROM samples s WHERE s.run_id = r.id) AS peak_rss_bytes,
       (SELECT max(gpu_mem_used_bytes) FROM samples s WHERE s.run_id = r.id)
            AS peak_gpu_mem_bytes,
       (SELECT count(*) FROM samples s WHERE s.run_id = r.id) AS samples
FROM runs r;
""",
    ),
    (
        "0004_labels",
        """
-- what a run belongs to (release, model, cell of a plan...): `[run.labels]` and --label
CREATE TABLE labels (
    run_id TEXT NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
CREATE INDEX labels_key_value ON labels(key, value);
""",
    ),
    (
        "0005_streams",
        """
-- which of the run's paced sources (run.streams) captured the frame; frame_id stays unique
-- per run (frame k of stream s of N is k * N + s); drop_count and stale_count count per
-- stream. measured_frames (f.*) carries the column as is; run_summary's drops and stale
-- become the sum over the streams of each stream's counter.
ALTER TABLE frames ADD COLUMN stream INTEGER NOT NULL DEFAULT 0;
DROP VIEW run_summary;
CREATE VIEW run_summary AS
SELECT r.id AS run_id, r.name, r.mode, r.status, r.verdict, r.workload_kind, r.fps,
       r.started_at, r.duration_s,
       (SELECT count(*) FROM frames f WHERE f.run_id = r.id) AS frames,
       (SELECT count(*) FROM measured_frames f WHERE f.run_id = r.id) AS measured_frames,
       (SELECT sum(top) FROM (SELECT max(drop_count) AS top FROM frames f
            WHERE f.run_id = r.id GROUP BY f.stream)) AS drops,
       (SELECT sum(top) FROM (SELECT max(stale_count) AS top FROM frames f
            WHERE f.run_id = r.id GROUP BY f.stream)) AS stale,
       (SELECT count(*) FROM frames f WHERE f.run_id = r.id AND f.error IS NOT NULL) AS errors,
       (SELECT round(avg(total_ms), 3) FROM measured_frames f WHERE f.run_id = r.id)
            AS avg_total_ms,
       (SELECT round(max(infer_ms), 3) FROM measured_frames f WHERE f.run_id = r.id)
            AS max_infer_ms,
       (SELECT max(rss_bytes) FROM samples s WHERE s.run_id = r.id) AS peak_rss_bytes,
       (SELECT max(gpu_mem_used_bytes) FROM samples s WHERE s.run_id = r.id)
            AS peak_gpu_mem_bytes,
       (SELECT count(*) FROM samples s WHERE s.run_id = r.id) AS samples
FROM runs r;
""",
    ),
    (
        "0006_gpu_devices",
        """
-- one row per GPU per telemetry tick of a run that uses several GPUs (run.gpus); seq joins
-- samples.seq, whose gpu_* columns keep the primary GPU. gpu is the NVML index and uuid the
-- GPU's UUID, as nvidia-smi and dcgm-exporter name them (soakd.store.gpu_samples).
CREATE TABLE gpu_samples (
    run_id TEXT NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    t REAL NOT NULL,
    gpu INTEGER NOT NULL,
    uuid TEXT NOT NULL,
    mem_used_bytes INTEGER,
    mem_total_bytes INTEGER,
    util_pct REAL,
    proc_mem_bytes INTEGER,
    temp_c REAL,
    power_w REAL,
    PRIMARY KEY (run_id, gpu, seq)
) WITHOUT ROWID;
""",
    ),
    (
        "0007_session_consume",
        """
-- session models: when the model took the frame from its frame queue (t_consumed, seconds
-- since run start), push -> that take (consume_ms), and that take -> the model's first
-- output after it (consume_output_ms); NULL when unknown (no consume tracking, dropped by
-- the session, or no output after it before the run ended)
ALTER TABLE frames ADD COLUMN t_consumed REAL;
ALTER TABLE frames ADD COLUMN consume_ms REAL;
ALTER TABLE frames ADD COLUMN consume_output_ms REAL;
""",
    ),
    (
        "0008_chunk_stages",
        """
-- rollout generators: the named stages of each chunk (one frames row per chunk), as the
-- workload reports them through run.stage(name): "context", "denoise", "kv_write",
-- "vae_decode", "memory_bank" or any [a-z0-9_]+ name; ms is the stage's total in the chunk
-- (soakd.store.chunk_stages)
CREATE TABLE chunk_stages (
    run_id TEXT NOT NULL REFERENCES runs(id),
    frame_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    ms REAL NOT NULL,
    PRIMARY KEY (run_id, frame_id, name)
) WITHOUT ROWID;
""",
    ),
    (
        "0009_server_telemetry",
        """
-- served models (workload kind = "openai"): the model server's processes (with their
-- children) sampled beside soakd's own, NULL for an in-process workload or a remote server
ALTER TABLE samples ADD COLUMN server_rss_bytes INTEGER;
ALTER TABLE samples ADD COLUMN server_cpu_pct REAL;
ALTER TABLE samples ADD COLUMN server_cgroup_mem_bytes INTEGER;
ALTER TABLE samples ADD COLUMN server_gpu_mem_bytes INTEGER;
-- the server's own Prometheus gauges and counters at each telemetry tick (telemetry.
-- server_metrics: vLLM's and SGLang's queue and KV-cache series by default); seq joins
-- samples.seq; labels is the series' label set as k="v",... sorted by key, '' for none
CREATE TABLE server_metrics (
    run_id TEXT NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    t REAL NOT NULL,
    name TEXT NOT NULL,
    labels TEXT NOT NULL DEFAULT '',
    value REAL,
    PRIMARY KEY (run_id, name, labels, seq)
) WITHOUT ROWID;
""",
    ),
    (
        "0010_host_load",
        """
-- the host beside soakd (every process on it): CPU busy and stolen, % of all CPUs since the
-- previous tick; the 1-minute load average; the run queue (procs_running, Linux); NULL in
-- runs made before this migration and where the host does not tell
ALTER TABLE samples ADD COLUMN host_cpu_pct REAL;
ALTER TABLE samples ADD COLUMN host_steal_pct REAL;
ALTER TABLE samples ADD COLUMN host_load1 REAL;
ALTER TABLE samples ADD COLUMN host_run_queue INTEGER;
""",
    ),
]

SCHEMA_VERSION = len(MIGRATIONS)


class NewerSchemaError(Exception):
    """The database records migrations this soakd does not know: a newer soakd wrote it."""


def schema_version(names: set[str]) -> int:
    """The schema version a set of recorded migration names stands for (their highest
    number prefix, ``0002_...`` = 2)."""
    nums = [int(m.group()) for n in names if (m := re.match(r"\d+", n))]
    return max(nums, default=len(names))


def check_schema(conn: sqlite3.Connection) -> set[str]:
    """The migration names recorded in the database (empty for a new file); raises
    NewerSchemaError naming both schema versions when it records one this soakd lacks."""
    has = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'"
    ).fetchone()
    if not has:
        return set()
    done = {str(r[0]) for r in conn.execute("SELECT name FROM _migrations")}
    unknown = done - {name for name, _ in MIGRATIONS}
    if unknown:
        raise NewerSchemaError(
            f"written by a newer soakd: schema version {schema_version(done)}"
            f" ({', '.join(sorted(unknown))} unknown here), this soakd knows schema version"
            f" {SCHEMA_VERSION}; upgrade soakd to use it"
        )
    return done


class ChangedSchemaError(Exception):
    """A table, view or column the recorded migrations made is gone (renamed or dropped
    outside soakd, with no migration recording it)."""


@functools.cache
def expected_schema(done: frozenset[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each table and view the migrations ``done`` make, tables first: name -> (type,
    columns), read from an in-memory database they are applied to (once per set)."""
    conn = sqlite3.connect(":memory:")
    try:
        for name, script in MIGRATIONS:
            if name in done:
                conn.executescript(script)
        objects = conn.execute(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')"
            " ORDER BY type, rowid"
        ).fetchall()
        return {
            str(n): (str(t), tuple(str(r[1]) for r in conn.execute(f"PRAGMA table_info({n})")))
            for n, t in objects
        }
    finally:
        conn.close()


def check_columns(conn: sqlite3.Connection, done: set[str], schema: str = "main") -> None:
    """Raise ChangedSchemaError naming the first table or view, and column, that the
    migrations ``done`` made and the database (``schema``: ``main`` or an attached one) no
    longer has; tables and columns added besides them are left alone."""
    try:
        expected = expected_schema(frozenset(done)) if done else {}
    except sqlite3.Error:
        return  # a gap in the recorded migrations: no schema of this soakd to compare with
    for name, (kind, columns) in expected.items():
        try:
            have = [str(r[1]) for r in conn.execute(f"PRAGMA {schema}.table_info({name})")]
        except sqlite3.OperationalError as exc:
            raise ChangedSchemaError(f"{kind} {name} cannot be read ({exc})") from None
        if not have:
            raise ChangedSchemaError(f"{kind} {name} is missing")
        missing = [c for c in columns if c not in have]
        if missing:
            unknown = [c for c in have if c not in columns]
            also = f" (it has {', '.join(unknown)}, unknown to this soakd)" if unknown else ""
            raise ChangedSchemaError(f"{kind} {name} has no column {missing[0]}{also}")


@functools.cache
def _current_schema() -> tuple[dict[str, tuple[tuple[str, str], ...]], dict[str, str]]:
    """This soakd's schema: each table's (column, declared type) pairs, and each view's
    ``CREATE VIEW`` statement."""
    conn = sqlite3.connect(":memory:")
    try:
        for _name, script in MIGRATIONS:
            conn.executescript(script)
        rows = conn.execute("SELECT name, type, sql FROM sqlite_master ORDER BY rowid").fetchall()
        tables = {
            str(n): tuple((str(r[1]), str(r[2])) for r in conn.execute(f"PRAGMA table_info({n})"))
            for n, t, _sql in rows
            if t == "table"
        }
        return tables, {str(n): str(sql) for n, t, sql in rows if t == "view"}
    finally:
        conn.close()


def stand_in_older_schema(conn: sqlite3.Connection) -> list[str]:
    """On a read-only connection to a database of an older schema (which cannot be
    migrated there): TEMP stand-ins that read it as this soakd's schema, as a migration
    would have left it: an empty table for each table the file lacks (``server_metrics``
    before 0009), a view adding each column a table lacks as NULL, and this soakd's views
    over them. Unqualified names find TEMP first, so every query reads the stand-ins.
    Returns the names stood in; nothing is written to the file."""
    tables, views = _current_schema()
    have = {
        str(n): {str(r[1]) for r in conn.execute(f"PRAGMA main.table_info({n})")}
        for (n,) in conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")
    }
    statements = []
    for name, columns in tables.items():
        cols = have.get(name)
        if name == "_migrations" or (cols is not None and all(c in cols for c, _t in columns)):
            continue
        if cols is None:
            body = ", ".join(f"{c} {t}".strip() for c, t in columns)
            statements.append(f"CREATE TEMP TABLE {name} ({body})")
        else:
            sel = ", ".join(c if c in cols else f"NULL AS {c}" for c, _t in columns)
            statements.append(f"CREATE TEMP VIEW {name} AS SELECT {sel} FROM main.{name}")
    if not statements:
        return []
    statements += [re.sub(r"^CREATE VIEW", "CREATE TEMP VIEW", sql) for sql in views.values()]
    conn.execute("PRAGMA query_only = 0")  # the TEMP schema only: main is opened read-only
    try:
        for sql in statements:
            conn.execute(sql)
    finally:
        conn.execute("PRAGMA query_only = 1")
    return [sql.split()[3] for sql in statements]


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply pending migrations; returns the names applied. Refuses (NewerSchemaError) a
    database written by a newer soakd before changing anything. Two soakd processes that
    open one new file at once apply each migration once: the pending ones are read again
    and applied under the write lock (``BEGIN IMMEDIATE``), so the second waits and finds
    them done."""
    if not _pending(check_schema(conn)):
        return []
    conn.execute("BEGIN IMMEDIATE")
    try:
        pending = _pending(check_schema(conn))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS _migrations"
            " (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        for name, script in pending:
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO _migrations VALUES (?, ?)",
                (name, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return [name for name, _ in pending]


def _pending(done: set[str]) -> list[tuple[str, str]]:
    return [(name, script) for name, script in MIGRATIONS if name not in done]


def _statements(script: str) -> list[str]:
    """A migration script cut into its statements (``sqlite3.complete_statement`` knows a
    trigger's ``BEGIN ... END``), to run inside one transaction, which ``executescript``
    cannot: it commits first."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip() and not re.fullmatch(r"(\s|--[^\n]*)*", buf):
        raise ValueError(f"an incomplete statement at the end of a migration: {buf[:60]!r}")
    return out

"""The run database: migrations, WAL, the writer thread, orphaned runs, bad paths."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis import evaluate
from soakd.config import load_settings
from soakd.records import Event, FrameRecord, Sample
from soakd.run.runner import run_soak
from soakd.store import db as store
from soakd.store.runs import get_run, process_start
from soakd.store.schema import MIGRATIONS

from .conftest import make_run
from .test_faults import tmpfs


def _frames_within(db_path: Path, n: int, timeout_s: float) -> int:
    """The frame rows another connection sees once it sees ``n`` of them, or when
    ``timeout_s`` has passed (polled every 20 ms)."""
    reader = sqlite3.connect(db_path)
    deadline = time.monotonic() + timeout_s
    got = 0
    while time.monotonic() < deadline and got < n:
        got = reader.execute("SELECT count(*) FROM frames").fetchone()[0]
        time.sleep(0.02)
    reader.close()
    return got


def test_migrations_are_recorded_and_idempotent(db_path: Path) -> None:
    """Opening twice applies each migration once and records it in _migrations."""
    store.connect(db_path).close()
    conn = store.connect(db_path)
    names = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY name")]
    assert names == [m[0] for m in MIGRATIONS]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    views = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='view'")}
    assert {"run_summary", "frames_per_second", "samples_per_second", "measured_frames"} <= views


_OPEN_AT = """
import sys, time
from soakd.store import db
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
db.connect(sys.argv[1]).close()
"""


def test_processes_opening_one_new_file_at_once_each_get_the_schema_once(db_path: Path) -> None:
    """Four soakd processes opening one new database at the same instant all succeed, and
    each migration is applied and recorded once (no 'table runs already exists')."""
    at = str(time.time() + 2.0)  # after every interpreter has imported soakd
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AT, str(db_path), at],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    with sqlite3.connect(db_path) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY name")]
    assert names == [m[0] for m in MIGRATIONS]


def test_writer_flushes_within_a_second_while_running(db_path: Path) -> None:
    """Rows put into the writer are visible to another connection within a flush interval,
    before the writer is closed (a crash loses at most that)."""
    conn = store.connect(db_path)
    make_run(conn, id="r1", status="running")
    w = store.StoreWriter(db_path, "r1", flush_interval_s=0.2)
    w.start()
    for i in range(50):
        w.put(
            FrameRecord(
                frame_id=i,
                t_sched=i,
                t_capture=i,
                t_dispatch=i,
                t_done=i,
                lateness_ms=0,
                grab_ms=1,
                total_ms=5,
            )
        )
    assert _frames_within(db_path, 50, 1.0) == 50
    reader = sqlite3.connect(db_path)
    w.put(
        Sample(seq=0, t=0.1, wall=time.time(), lag_ms=0.1, tick_ms=0.2, values={"rss_bytes": 123})
    )
    w.put(Event("error", 0.2, time.time(), "boom", frame_id=3, data={"a": 1}))
    w.close()
    assert w.error is None
    assert reader.execute("SELECT rss_bytes, gpu_util_pct FROM samples").fetchone() == (123, None)
    assert reader.execute("SELECT kind, data FROM events").fetchone() == ("error", '{"a":1}')


def _counting_looks(db_path: Path, flush_interval_s: float) -> tuple[store.StoreWriter, list[int]]:
    """A started writer of a running run ``r1`` and a list that grows by one at each look
    it takes at its queue (each look is a wake)."""
    make_run(store.connect(db_path), id="r1", status="running")
    w = store.StoreWriter(db_path, "r1", flush_interval_s=flush_interval_s)
    looks: list[int] = []
    collect = w._collect
    w._collect = lambda deadline: looks.append(1) or collect(deadline)  # type: ignore[method-assign]
    w.start()
    return w, looks


def test_a_slow_trickle_wakes_the_writer_about_once_a_flush_and_a_burst_every_50_ms(
    db_path: Path,
) -> None:
    """10 records a second for 1.5 s (flush every 0.5 s): the writer looks at its queue a
    handful of times, not every DRAIN_INTERVAL_S (each look is a wake: issue 34); then 3000
    at once bring its sleep back to DRAIN_INTERVAL_S; every record becomes a row."""
    conn = store.connect(db_path)
    w, looks = _counting_looks(db_path, flush_interval_s=0.5)

    def frame(i: int) -> FrameRecord:
        return FrameRecord(i, i, i, i, i, 0, 1, total_ms=5)

    for i in range(15):
        w.put(frame(i))
        time.sleep(0.1)
    assert len(looks) <= 8, len(looks)  # every 50 ms: 30
    assert w._sleep_s > store.DRAIN_INTERVAL_S
    w.put_frames([frame(15 + i) for i in range(3000)])
    deadline = time.monotonic() + 30
    while w._sleep_s > store.DRAIN_INTERVAL_S and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w._sleep_s == store.DRAIN_INTERVAL_S
    w.close()
    assert w.error is None
    assert conn.execute("SELECT count(*) FROM frames").fetchone()[0] == 3015


def test_reader_holding_a_transaction_does_not_fail_the_writer(db_path: Path) -> None:
    """A reader in the middle of a long read transaction (WAL) never blocks the writer."""
    conn = store.connect(db_path)
    make_run(conn, id="r1", status="running")
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM frames").fetchone()
    w = store.StoreWriter(db_path, "r1", flush_interval_s=0.05)
    w.start()
    for i in range(100):
        w.put(
            FrameRecord(
                frame_id=i,
                t_sched=i,
                t_capture=i,
                t_dispatch=None,
                t_done=None,
                lateness_ms=0,
                grab_ms=1,
            )
        )
    w.close()
    # the open read transaction still sees its snapshot; a fresh one sees every row
    assert reader.execute("SELECT count(*) FROM frames").fetchone()[0] == 0
    reader.execute("COMMIT")
    assert reader.execute("SELECT count(*) FROM frames").fetchone()[0] == 100
    assert w.error is None


def test_orphaned_running_run_is_marked_crashed(db_path: Path) -> None:
    """A run left 'running' by a process that is gone becomes 'crashed' on the next open."""
    conn = store.connect(db_path)
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    make_run(conn, id="dead", status="running", pid=p.pid)
    make_run(conn, id="alive", status="running")
    conn.close()
    conn = store.connect(db_path)
    st = dict(conn.execute("SELECT id, status FROM runs").fetchall())
    assert st == {"dead": "crashed", "alive": "running"}
    kinds = [r[0] for r in conn.execute("SELECT kind FROM events WHERE run_id='dead'")]
    assert kinds == ["crashed"]


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    """A database path in a folder that does not exist is a one-line StoreError."""
    with pytest.raises(store.StoreError, match="does not exist"):
        store.connect(tmp_path / "no" / "such" / "soakd.db")


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    """A file that is not SQLite is refused with a message naming it, and left untouched."""
    p = tmp_path / "notes.db"
    p.write_bytes(b"hello, this is not sqlite at all" * 100)
    before = p.read_bytes()
    with pytest.raises(store.StoreError, match="not an SQLite database"):
        store.connect(p)
    assert p.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_database_is_a_clear_error(db_path: Path) -> None:
    """A read-only run database is refused with a clear message (non-root only)."""
    store.connect(db_path).close()
    os.chmod(db_path, 0o444)
    with pytest.raises(store.StoreError):
        conn = store.connect(db_path)
        make_run(conn, id="x", status="running")


# --- atomic(): the one transaction helper


def _table(db_path: Path) -> sqlite3.Connection:
    conn = store.connect(db_path)
    conn.execute("CREATE TABLE t (x TEXT)")
    return conn


def _xs(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT x FROM t ORDER BY rowid")]


def test_atomic_nested_rollback_keeps_the_outer_transaction(db_path: Path) -> None:
    """An exception inside a nested atomic() undoes only the nested block (a savepoint);
    the outer transaction goes on and commits what it wrote before and after."""
    conn = _table(db_path)
    with store.atomic(conn):
        conn.execute("INSERT INTO t VALUES ('before')")
        with pytest.raises(ValueError), store.atomic(conn):
            conn.execute("INSERT INTO t VALUES ('inner')")
            raise ValueError("inner fails")
        assert conn.in_transaction
        conn.execute("INSERT INTO t VALUES ('after')")
    assert not conn.in_transaction
    assert _xs(sqlite3.connect(db_path)) == ["before", "after"]


def test_atomic_exception_rolls_back_everything_and_propagates(db_path: Path) -> None:
    """An exception in the outermost atomic() rolls the whole transaction back (inner
    blocks that succeeded included) and reaches the caller unchanged."""
    conn = _table(db_path)
    with pytest.raises(KeyError, match="boom"), store.atomic(conn):
        conn.execute("INSERT INTO t VALUES ('a')")
        with store.atomic(conn):
            conn.execute("INSERT INTO t VALUES ('b')")
        raise KeyError("boom")
    assert not conn.in_transaction and _xs(conn) == []
    with store.atomic(conn):  # the connection is usable again
        conn.execute("INSERT INTO t VALUES ('c')")
    assert _xs(conn) == ["c"]


def _fill(conn: sqlite3.Connection, nested: bool) -> None:
    blob = "x" * 50_000
    with store.atomic(conn):
        if nested:
            with store.atomic(conn):
                conn.executemany("INSERT INTO t VALUES (?)", [(blob,)] * 200)
        else:
            conn.executemany("INSERT INTO t VALUES (?)", [(blob,)] * 200)


@pytest.mark.parametrize("nested", [False, True], ids=["outer", "nested"])
def test_atomic_keeps_the_disk_full_error(db_path: Path, nested: bool) -> None:
    """SQLITE_FULL rolls the transaction back inside SQLite; atomic() must not replace
    'database or disk is full' with 'cannot rollback - no transaction is active'."""
    conn = _table(db_path)
    conn.execute("INSERT INTO t VALUES ('kept')")
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 4}")  # the database cannot grow
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        _fill(conn, nested)
    assert not conn.in_transaction and _xs(conn) == ["kept"]


def test_writer_reports_disk_full_on_a_real_full_filesystem(tmp_path: Path) -> None:
    """On a real filesystem that fills up (a small tmpfs; needs root) the writer's error
    says 'disk full', not a failed ROLLBACK."""
    with tmpfs(tmp_path / "small", "size=512k") as mnt:
        conn = store.connect(mnt / "soakd.db")
        make_run(conn, id="r1", status="running")
        w = store.StoreWriter(mnt / "soakd.db", "r1", flush_interval_s=0.05)
        w.start()
        for i in range(20_000):
            w.put(Event(t=i, wall=0.0, kind="note", message="m" * 200))
        w.close()
        conn.close()
    assert w.error is not None and "disk full" in str(w.error), w.error


def test_running_run_whose_pid_now_belongs_to_a_process_started_later_is_marked_crashed(
    db_path: Path,
) -> None:
    """Same host, the pid alive, but another process start time (the pid was reused): the
    run is orphaned and the next connect marks it crashed; with the matching start time it
    stays running."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = process_start(child.pid)
        assert started is not None
        conn = store.connect(db_path)
        make_run(conn, id="reused", status="running", pid=child.pid)
        make_run(conn, id="same", status="running", pid=child.pid)
        conn.execute("UPDATE runs SET pid_start = ? WHERE id = 'reused'", (started - 1,))
        conn.execute("UPDATE runs SET pid_start = ? WHERE id = 'same'", (started,))
        conn.close()
        conn = store.connect(db_path)
        st = dict(conn.execute("SELECT id, status FROM runs").fetchall())
        assert st == {"reused": "crashed", "same": "running"}
    finally:
        child.kill()
        child.wait()


def test_open_run_records_the_process_start_time(db_path: Path) -> None:
    """open_run stores this process's start time with its pid."""
    conn = store.connect(db_path)
    rid = make_run(conn, status="running")
    assert get_run(conn, rid).pid_start == process_start(os.getpid()) is not None


def test_measured_frames_view_is_the_verdicts_measured_window(db_path: Path) -> None:
    """measured_frames leaves out unflagged frames captured before the warmup_end event, as
    the verdict does: its count(*) is the verdict's window["measured_frames"]."""
    conn = store.connect(db_path)
    make_run(conn, id="r1", config={"run": {"fps": 10, "warmup_s": 0.5}})
    w = store.StoreWriter(db_path, "r1")
    w.start()
    for i in range(40):  # 10 fps for 4 s; flagged warm-up below 0.5 s, the event at 0.75 s
        t = i / 10
        w.put(
            FrameRecord(
                frame_id=i, t_sched=t, t_capture=t, t_dispatch=t, t_done=t + 0.01,
                lateness_ms=0, grab_ms=1, infer_ms=5, total_ms=6, frame_age_ms=1,
                first=i == 0, warmup=t < 0.5,
            )
        )  # fmt: skip
    w.put(Event("warmup_end", 0.75, 0.75, "warm-up ended"))
    w.close()
    _, verdict = evaluate(conn, "r1")
    (n,) = conn.execute("SELECT count(*) FROM measured_frames WHERE run_id = 'r1'").fetchone()
    (summary_n,) = conn.execute("SELECT measured_frames FROM run_summary").fetchone()
    assert n == summary_n == verdict.window["measured_frames"] == 32  # t = 0.8 .. 3.9


def test_measured_frames_view_matches_the_verdict_of_a_real_run(tmp_path: Path) -> None:
    """A real 100 fps synthetic soak: count(*) from measured_frames equals the stored
    verdict's window["measured_frames"], and so does run_summary.measured_frames."""
    db = tmp_path / "soakd.db"
    settings = load_settings(
        overrides=[
            "workload.kind=synthetic", f"run.db={str(db)!r}", "run.duration=2", "run.fps=100",
            "run.warmup_s=0.5", "run.log_every=0", "source.width=32", "source.height=24",
            "workload.infer_ms=1", "workload.pre_ms=0", "workload.decode_ms=0",
        ]
    )  # fmt: skip
    res = run_soak(settings)
    conn = store.connect(db)
    (n,) = conn.execute("SELECT count(*) FROM measured_frames").fetchone()
    (summary_n,) = conn.execute("SELECT measured_frames FROM run_summary").fetchone()
    assert n == summary_n == res.verdict.window["measured_frames"] > 50


def test_a_database_of_the_previous_schema_opened_read_only_is_judged(synthetic) -> None:
    """A run in a database that lacks the last migration's sample columns (an older soakd
    wrote it; a read-only open does not migrate) loads and is judged, those columns NaN."""
    settings = synthetic("run.duration=2")
    run_soak(settings, judge=False)
    db = Path(settings.run.db)
    with sqlite3.connect(db) as conn:
        name, script = MIGRATIONS[-1]
        for col in re.findall(r"ADD COLUMN (\w+)", script):
            conn.execute(f"ALTER TABLE samples DROP COLUMN {col}")
        conn.execute("DELETE FROM _migrations WHERE name = ?", (name,))
    conn = store.connect(db, readonly=True)
    (run_id,) = conn.execute("SELECT id FROM runs").fetchone()
    data, verdict = evaluate(conn, run_id, settings.criteria)
    assert verdict.status in ("PASS", "FAIL", "INVALID") and len(data.samples["t"]) > 5
    assert np.isnan(data.sample("host_cpu_pct")).all()


def test_writer_stores_every_record_exactly_in_any_batch_size(db_path: Path) -> None:
    """Every frame, sample and event put into the writer, one by one or in batches, is
    stored with exactly the values it carried (NULLs, flags, extra JSON), however the rows
    split into statements and flushes; a frame put again later replaces the earlier row,
    as in put order."""
    conn = store.connect(db_path)
    make_run(conn, id="r1", status="running")
    w = store.StoreWriter(db_path, "r1", flush_interval_s=0.05, max_batch=300)
    w.start()
    frames = [
        FrameRecord(
            frame_id=i, t_sched=i / 30, t_capture=i / 30 + 1e-4, t_dispatch=None if i % 7 else i,
            t_done=i + 0.5, lateness_ms=0.1 * i, grab_ms=1.5, pre_ms=None if i % 3 else 2.0,
            infer_ms=float(i), out_tokens=i % 5 or None, error="boom" if i % 11 == 0 else None,
            first=i == 0, warmup=i < 10, skipped=i % 13 == 0,
            extra={"i": i} if i % 17 == 0 else None,
        )
        for i in range(1263)  # not a multiple of any statement size
    ]  # fmt: skip
    samples = [Sample(seq=k, t=k * 0.15, wall=1.0, lag_ms=0.0, tick_ms=0.1) for k in range(37)]
    again = FrameRecord(5, 9.0, 9.0, 9.0, 9.0, 0.0, 0.0, infer_ms=-1.0)  # right after frame 5
    for rec in (*frames[:6], again):
        w.put(rec)
    rest = frames[6:]
    for lo, hi in zip([0, 1, 65, 321], [1, 65, 321, len(rest)], strict=True):  # as drivers batch
        w.put_frames(rest[lo:hi])
    for s in samples:
        w.put(s)
    w.put(Event("error", 0.2, 1.0, "boom", frame_id=3, data={"a": 1}))
    w.close()
    assert w.error is None
    stored = conn.execute("SELECT * FROM frames WHERE run_id = 'r1' ORDER BY frame_id")
    expected = [store.frame_row("r1", again if r.frame_id == 5 else r) for r in frames]
    assert [tuple(row) for row in stored] == expected
    (n_samples,) = conn.execute("SELECT count(*) FROM samples WHERE run_id = 'r1'").fetchone()
    assert n_samples == 37
    events = conn.execute("SELECT kind, data FROM events WHERE run_id = 'r1'")
    assert [tuple(e) for e in events] == [("error", '{"a":1}')]


def test_the_run_writer_keeps_a_small_page_cache(tmp_path: Path) -> None:
    """The writer's connection caches at most 256 KiB of pages, not SQLite's default 2 MB:
    a page cache that fills as the run database grows is soakd's own RSS growing, which
    the memory criteria would judge as the model's."""
    conn = store.writer_connection(tmp_path / "w.db", 5.0)
    try:
        assert conn.execute("PRAGMA cache_size").fetchone()[0] == -store.WRITER_CACHE_KIB
        assert store.WRITER_CACHE_KIB <= 256
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    finally:
        conn.close()


def test_flush_soon_commits_what_is_queued_without_waiting_for_the_interval(
    db_path: Path,
) -> None:
    """A writer whose own timer flushes once a minute commits the rows queued when
    ``flush_soon()`` asks (the run's monitor, each tick), and after the flush goes back to
    sleep: it does not spin on the wake that asked (a handful of looks in 0.5 s)."""
    w, looks = _counting_looks(db_path, flush_interval_s=60.0)
    w.put_frames([FrameRecord(i, i, i, i, i, 0, 1, total_ms=5) for i in range(20)])
    w.flush_soon()
    assert _frames_within(db_path, 20, 20.0) == 20
    time.sleep(0.2)
    before = len(looks)
    time.sleep(0.5)
    assert len(looks) - before <= 3, len(looks) - before
    w.close()
    assert w.error is None

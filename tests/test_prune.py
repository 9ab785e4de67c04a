"""``soakd prune``: which runs go (keep-days, keep-runs, the union of both), which never go
(still running, named by a baseline), that a run goes whole from every table, that a dry
run writes nothing, and that a soak writing the same file while prune deletes and VACUUMs
loses no row and keeps its verdict."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from soakd.cli import main
from soakd.store import db as store
from soakd.store import prune
from soakd.store.runs import set_baseline

from .conftest import REPO, SYNTH_CLI, error_lines, make_run, run_cli, soakd_cmd

DAY = 86_400.0
NOW = time.time()


def _fill(conn: sqlite3.Connection, rid: str, frames: int = 50, samples: int = 20) -> None:
    """Rows for run ``rid`` in every table a run has rows in (besides ``runs``)."""
    with store.atomic(conn):
        conn.executemany(
            "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, infer_ms, extra)"
            " VALUES (?, ?, ?, ?, 20.5, ?)",
            [(rid, i, i / 30, i / 30 + 4e-4, "x" * 40) for i in range(frames)],
        )
        conn.executemany(
            "INSERT INTO samples (run_id, seq, t, wall, rss_bytes, cpu_pct) VALUES (?, ?, ?, ?,"
            " 83886080, 12.5)",
            [(rid, i, i * 0.15, NOW + i * 0.15) for i in range(samples)],
        )
        conn.execute(
            "INSERT INTO emissions (run_id, frame_id, idx, t_emit) VALUES (?, 0, 0, 0.1)", (rid,)
        )
        conn.execute("INSERT INTO events (run_id, t, kind) VALUES (?, 0.5, 'warmup_end')", (rid,))
        conn.execute(
            "INSERT INTO verdicts (run_id, criterion, status) VALUES (?, 'drops', 'pass')", (rid,)
        )
        conn.execute("INSERT INTO labels (run_id, key, value) VALUES (?, 'release', '1.4')", (rid,))


def _db(path: Path, runs: list[dict[str, Any]], **fill: int) -> list[str]:
    """A run database at ``path`` holding ``runs`` (``make_run`` fields), each filled."""
    conn = store.connect(path)
    try:
        ids = [make_run(conn, **r) for r in runs]
        for rid in ids:
            _fill(conn, rid, **fill)
    finally:
        conn.close()
    return ids


def _run_ids(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT id FROM runs")}
    finally:
        conn.close()


def _prune(
    path: Path, *args: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any]]:
    """``soakd prune --db PATH ARGS -f json`` in this process: exit code and the document."""
    code = main(["prune", "--db", str(path), *args, "-f", "json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_keep_runs_keeps_the_newest_n_of_each_mode_in_scope(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--keep-runs 2 keeps the two newest runs of each mode; --mode soak leaves the profile
    runs alone whatever their age."""
    runs = [{"id": f"s{i}", "started_unix": NOW - 10 * DAY + i} for i in range(4)]
    runs += [
        {"id": f"p{i}", "mode": "profile", "started_unix": NOW - 20 * DAY + i} for i in range(3)
    ]
    soak_only, every_mode = tmp_path / "soak.db", tmp_path / "any.db"
    _db(soak_only, runs)
    _db(every_mode, runs)
    code, doc = _prune(soak_only, "--keep-runs", "2", "--mode", "soak", capsys=capsys)
    assert code == 0 and [r["run_id"] for r in doc["deleted"]] == ["s0", "s1"]
    assert _run_ids(soak_only) == {"s2", "s3", "p0", "p1", "p2"}
    code, doc = _prune(every_mode, "--keep-runs", "2", capsys=capsys)
    assert code == 0 and _run_ids(every_mode) == {"s2", "s3", "p1", "p2"}


def test_keep_days_goes_by_start_time_and_both_rules_keep_the_union(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--keep-days 3 deletes the runs that started more than 3 days ago; with --keep-runs 2
    as well, a run goes only when neither rule keeps it."""
    ages = {"d10": 10, "d5": 5, "d4": 4, "d1": 1}
    runs = [{"id": k, "started_unix": NOW - v * DAY} for k, v in ages.items()]
    days, both = tmp_path / "days.db", tmp_path / "both.db"
    _db(days, runs)
    _db(both, runs)
    assert _prune(days, "--keep-days", "3", capsys=capsys)[0] == 0
    assert _run_ids(days) == {"d1"}
    code, doc = _prune(both, "--keep-days", "3", "--keep-runs", "2", capsys=capsys)
    assert code == 0 and _run_ids(both) == {"d1", "d4"}
    assert doc["runs"] == 2 and doc["frames"] == 100 and doc["samples"] == 40


def test_running_and_baseline_runs_are_kept_and_an_orphaned_one_goes_by_age(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A running run whose process is alive (this one) and a run a baseline names survive
    --keep-runs 0, and the output says so; a run left running by a dead process is a crashed
    run and goes."""
    gone_pid = _a_free_pid()
    path = tmp_path / "soakd.db"
    old = NOW - 30 * DAY
    _db(
        path,
        [
            {"id": "live", "status": "running", "started_unix": old},
            {"id": "orphan", "status": "running", "started_unix": old, "pid": gone_pid},
            {"id": "release", "started_unix": old},
            {"id": "plain", "started_unix": old},
        ],
    )
    conn = store.connect(path, mark_orphans=False)
    set_baseline(conn, "v1.4", "release")
    conn.close()
    assert main(["prune", "--db", str(path), "--keep-runs", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "kept 1 run named by baselines" in out and "kept 1 run still running" in out
    code, doc = _prune(path, "--keep-runs", "0", capsys=capsys)
    assert code == 0 and [r["run_id"] for r in doc["deleted"]] == ["orphan", "plain"]
    assert (doc["kept_baseline"], doc["kept_running"]) == (["release"], ["live"])
    assert _run_ids(path) == {"live", "release"}


def _a_free_pid() -> int:
    """A pid no process has now."""
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def _tables_with_run_rows(conn: sqlite3.Connection) -> list[str]:
    """Every table (but runs) with a run_id column, read from sqlite_master here, apart
    from prune's own discovery."""
    names = [
        r[0]
        for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        if r[0] != "runs"
    ]
    return [
        n for n in names if any(c[1] == "run_id" for c in conn.execute(f"PRAGMA table_info({n})"))
    ]


def test_a_deleted_run_leaves_no_row_in_any_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After prune, no table that has a run_id column holds a row of a deleted run, and the
    kept run's rows are all there."""
    path = tmp_path / "soakd.db"
    _db(path, [{"id": "old", "started_unix": NOW - 9 * DAY}, {"id": "new"}])
    conn = sqlite3.connect(path)
    tables = _tables_with_run_rows(conn)
    assert {"frames", "samples", "emissions", "events", "verdicts", "labels"} <= set(tables)
    before = {
        t: conn.execute(f"SELECT count(*) FROM {t} WHERE run_id = 'new'").fetchone()[0]
        for t in tables
    }
    conn.close()
    assert _prune(path, "--keep-days", "1", capsys=capsys)[0] == 0
    conn = sqlite3.connect(path)
    left = {
        t: conn.execute(f"SELECT count(*) FROM {t} WHERE run_id = 'old'").fetchone()[0]
        for t in tables
    }
    after = {
        t: conn.execute(f"SELECT count(*) FROM {t} WHERE run_id = 'new'").fetchone()[0]
        for t in tables
    }
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    assert set(left.values()) == {0} and after == before
    assert _run_ids(path) == {"new"}


def test_a_prune_that_fails_midway_leaves_whole_runs(tmp_path: Path) -> None:
    """One transaction per batch of runs: when deleting a run's samples fails (a trigger
    raises), that run keeps all its rows (its frames, deleted first, come back), the runs
    deleted before it are gone whole and the ones after it untouched."""
    path = tmp_path / "soakd.db"
    ids = _db(path, [{"id": f"r{i}", "started_unix": NOW - DAY * (9 - i)} for i in range(3)])
    conn = store.connect(path)
    conn.execute(
        "CREATE TRIGGER boom BEFORE DELETE ON samples WHEN old.run_id = 'r1'"
        " BEGIN SELECT RAISE(ABORT, 'killed'); END"
    )
    todo = prune.plan(conn, prune.Policy(keep_runs=0))
    with pytest.raises(sqlite3.IntegrityError, match="killed"):
        prune.delete_runs(conn, todo.delete, batch_rows=1)
    frames = dict(conn.execute("SELECT run_id, count(*) FROM frames GROUP BY run_id").fetchall())
    conn.close()
    assert [r.id for r in todo.delete] == ids
    assert _run_ids(path) == {"r1", "r2"} and frames == {"r1": 50, "r2": 50}


def test_a_run_named_by_a_baseline_after_the_plan_is_still_kept(tmp_path: Path) -> None:
    """The baselines are read again under the write lock: a run marked as a baseline
    between planning and deleting is not deleted."""
    path = tmp_path / "soakd.db"
    _db(
        path,
        [{"id": "a", "started_unix": NOW - 5 * DAY}, {"id": "b", "started_unix": NOW - 4 * DAY}],
    )
    conn = store.connect(path)
    todo = prune.plan(conn, prune.Policy(keep_days=1))
    set_baseline(conn, "late", "b")
    assert prune.delete_runs(conn, todo.delete) == ["a"]
    conn.close()
    assert _run_ids(path) == {"b"}


def test_dry_run_leaves_the_file_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run lists what would go (an orphaned run among them) and writes nothing: the
    file is byte for byte what it was, no orphan is marked crashed."""
    path = tmp_path / "soakd.db"
    _db(
        path,
        [
            {"id": "old", "started_unix": NOW - 9 * DAY},
            {
                "id": "gone",
                "status": "running",
                "started_unix": NOW - 9 * DAY,
                "pid": _a_free_pid(),
            },
        ],
    )
    before = path.read_bytes()
    code, doc = _prune(path, "--keep-days", "1", "--dry-run", capsys=capsys)
    assert code == 0 and doc["dry_run"] and doc["runs"] == 2 and doc["frames"] == 100
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [[], ["--keep-days", "-1"], ["--keep-runs", "-2"], ["--keep-runs", "2", "--mode", "bogus"]],
    ids=["neither", "negative-days", "negative-runs", "bad-mode"],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    """Neither --keep-days nor --keep-runs, a negative N or an unknown mode: one error line,
    exit 2, the database untouched."""
    path = tmp_path / "soakd.db"
    _db(path, [{"id": "old", "started_unix": NOW - 9 * DAY}])
    proc = run_cli("prune", "--db", str(path), *args)
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("soakd: error: "), proc.stderr
    assert _run_ids(path) == {"old"}


def _sizes(path: Path) -> int:
    return path.stat().st_size


def test_vacuum_shrinks_the_file_and_no_vacuum_keeps_its_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting most of the rows and VACUUMing shrinks the file (the report's bytes agree
    with the file); --no-vacuum deletes the same rows and leaves the file its size (the
    pages are free for later runs), and a later prune with nothing to delete gives them
    back."""
    runs = [{"id": f"old{i}", "started_unix": NOW - 9 * DAY} for i in range(3)] + [{"id": "new"}]
    shrunk, kept = tmp_path / "vacuum.db", tmp_path / "novacuum.db"
    _db(shrunk, runs, frames=4000, samples=1000)
    _db(kept, runs, frames=4000, samples=1000)
    size = _sizes(shrunk)
    code, doc = _prune(shrunk, "--keep-days", "1", capsys=capsys)
    assert code == 0 and doc["vacuum"] == "done" and doc["runs"] == 3
    assert doc["bytes_after"] == _sizes(shrunk) < size / 2
    assert doc["bytes_freed"] == doc["bytes_before"] - doc["bytes_after"]
    code, doc = _prune(kept, "--keep-days", "1", "--no-vacuum", capsys=capsys)
    assert code == 0 and doc["vacuum"] == "off" and _run_ids(kept) == {"new"}
    assert _sizes(kept) == size
    code, doc = _prune(kept, "--keep-days", "1", capsys=capsys)  # nothing left to delete
    assert code == 0 and doc["runs"] == 0 and doc["vacuum"] == "done" and _sizes(kept) < size / 2


def test_vacuum_without_the_lock_in_time_leaves_the_rows_deleted_and_the_size(
    tmp_path: Path,
) -> None:
    """When another connection holds the write lock past the bound, VACUUM gives up and
    says why; the runs stay deleted and the file keeps its size."""
    path = tmp_path / "soakd.db"
    _db(path, [{"id": "old", "started_unix": NOW - 9 * DAY}, {"id": "new"}], frames=3000)
    conn = store.connect(path)
    prune.delete_runs(conn, prune.plan(conn, prune.Policy(keep_days=1)).delete)
    size = _sizes(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        done = prune.vacuum(conn, busy_timeout_s=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not done.done and done.skipped == "the write lock was not free within 0.2 s"
    assert _sizes(path) == size and _run_ids(path) == {"new"}
    assert prune.vacuum(conn).done  # once the lock is free
    conn.close()
    assert _sizes(path) < size


# --- a soak writing the same file while prune deletes and VACUUMs


#: an 8 s soak's RSS floor still rises 0.7-1.6 MB/min from start-up (page cache, imports),
#: astride the 1.5 MB/min default: a verdict comparison would test that, not prune
SOAK_CRITERIA = ["--set", "criteria.max_memory_growth_mb_per_min=10"]


def _soak(db: Path, seconds: int) -> subprocess.Popen[bytes]:
    """A real ``soakd run`` of the synthetic workload writing ``db`` (its output in
    ``db``.log)."""
    args = ["run", "--db", str(db), "--duration", f"{seconds}s", "--fps", "20", "--no-live"]
    with db.with_suffix(".log").open("wb") as log:
        return subprocess.Popen(
            soakd_cmd(*args, *SOAK_CRITERIA, *SYNTH_CLI), cwd=REPO, stdout=log, stderr=log
        )


def _frames_of_latest(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT count(*) FROM frames WHERE run_id = (SELECT id FROM runs WHERE"
            " status = 'running')"
        ).fetchone()
        return int(row[0])
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        conn.close()


def _ended_run(db: Path) -> dict[str, Any]:
    """The newest run's verdict (and each criterion's status), exit code, summary, how many
    rows it has per table, its event kinds and its last sample's wall time."""
    conn = sqlite3.connect(db)
    try:
        rid, verdict, code, summary = conn.execute(
            "SELECT id, verdict, exit_code, summary FROM runs ORDER BY started_unix DESC LIMIT 1"
        ).fetchone()
        judged = conn.execute(
            "SELECT criterion, status, detail FROM verdicts WHERE run_id = ?", (rid,)
        ).fetchall()
        # a trend its run could not decide (INVALID or n/a "undecided") is chance, not prune
        criteria = {
            name: status for name, status, detail in judged if "undecided" not in (detail or "")
        }
        undecided = {name for name, _, detail in judged if "undecided" in (detail or "")}
        rows = {
            t: conn.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", (rid,)).fetchone()[0]
            for t in ("frames", "samples", "emissions", "events")
        }
        kinds = {r[0] for r in conn.execute("SELECT kind FROM events WHERE run_id = ?", (rid,))}
        last_wall = conn.execute(
            "SELECT max(wall) FROM samples WHERE run_id = ?", (rid,)
        ).fetchone()[0]
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    return {
        "id": rid,
        "verdict": verdict,
        "criteria": criteria,
        "undecided": undecided,
        "exit_code": code,
        "summary": json.loads(summary),
        "rows": rows,
        "kinds": kinds,
        "last_wall": last_wall,
    }


def test_a_soak_writing_the_same_file_loses_nothing_while_prune_vacuums(tmp_path: Path) -> None:
    """A real soak writes the database while `soakd prune --keep-runs 0` deletes three old
    runs and VACUUMs: the soak is kept as running, every row it counted is stored (frames =
    captured - dropped - left queued; all rows = what its writer wrote), no row was dropped,
    its verdict, each criterion's status and its exit code are those of the same soak
    run beside it on a file nobody prunes, and the old runs are gone from every table."""
    path = tmp_path / "soakd.db"
    # three old runs to delete, and a baseline's as large that VACUUM copies while the soak
    # writes
    runs = [{"id": f"old{i}", "started_unix": NOW - 30 * DAY + i} for i in range(4)]
    old = _db(path, runs, frames=30_000, samples=10_000)[:3]
    conn = store.connect(path)
    set_baseline(conn, "release", "old3")
    conn.close()
    control = tmp_path / "control.db"  # the same soak beside it, on a file nobody prunes
    alone_proc = _soak(control, 8)
    proc = _soak(path, 8)
    while _frames_of_latest(path) < 10 and proc.poll() is None:
        time.sleep(0.1)
    pruned = run_cli("prune", "--db", str(path), "--keep-runs", "0", "-f", "json")
    pruned_at = time.time()
    code = proc.wait(timeout=90)
    assert alone_proc.wait(timeout=90) in (0, 1, 3), control.with_suffix(".log").read_text()
    alone = _ended_run(control)
    assert pruned.returncode == 0, pruned.stderr
    doc = json.loads(pruned.stdout)
    run = _ended_run(path)
    assert doc["runs"] == 3 and doc["kept_running"] == [run["id"]]
    assert doc["kept_baseline"] == ["old3"] and _run_ids(path) == {"old3", run["id"]}
    assert doc["vacuum"].startswith("done")
    if doc["vacuum"] == "done":
        assert doc["bytes_after"] < doc["bytes_before"] / 2
    else:  # "done, WAL not emptied yet (a reader is open)": the soak's writer was mid-batch
        # and the shrunk copy waits in the WAL; the next checkpoint gives the space back
        ck = sqlite3.connect(path)
        assert ck.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        ck.close()
        assert prune.file_bytes(path) < doc["bytes_before"] / 2
    assert run["last_wall"] > pruned_at  # the soak went on writing after prune finished
    s, rows = run["summary"], run["rows"]
    assert (
        rows["frames"]
        == s["frames_captured"] - s["drops"] - s["queued_at_end"] - s["in_flight_at_end"]
    )
    assert sum(rows.values()) == s["writer_rows"] and "store_overflow" not in run["kinds"]
    # each criterion both runs decided has the same status; so has the run, unless a trend
    # one of them could not decide (chance on a loaded host) is all that differs
    decided = set(run["criteria"]) & set(alone["criteria"])
    assert {c: run["criteria"][c] for c in decided} == {c: alone["criteria"][c] for c in decided}
    if run["undecided"] == alone["undecided"]:
        assert (code, run["verdict"]) == (alone["exit_code"], alone["verdict"])
    else:
        assert {run["verdict"], alone["verdict"]} != {"PASS", "FAIL"}
    conn = sqlite3.connect(path)
    marks = ", ".join("?" * len(old))
    for table in _tables_with_run_rows(conn):
        sql = f"SELECT count(*) FROM {table} WHERE run_id IN ({marks})"
        assert conn.execute(sql, old).fetchone()[0] == 0, table
    conn.close()

"""Faults of the run database itself, with real components: a second process holding the
write lock, read-only files and folders read as an unprivileged user, a database from a
newer soakd, a corrupt page. (Disk full and a read-only mount are in test_faults.py.)"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bench.hostile import FILL_THEN_STORE, old_database
from soakd.cli import main
from soakd.config import Settings
from soakd.errors import ExitCode, UsageError
from soakd.records import Event, FrameRecord, Sample
from soakd.run.runner import run_soak
from soakd.store import db as store
from soakd.store.schema import SCHEMA_VERSION

from .conftest import REPO, make_run, run_cli, soakd_cmd

NOBODY = 65534

# a second process: wait until `ready_sql` returns a row (if given), take the write lock
# with BEGIN EXCLUSIVE, say so, hold it for `hold` seconds, release it
_LOCKER = """
import sqlite3, sys, time
path, hold, ready = sys.argv[1], float(sys.argv[2]), sys.argv[3]
conn = sqlite3.connect(path, isolation_level=None, timeout=30)
while ready and not conn.execute(ready).fetchone():
    time.sleep(0.02)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(hold)
conn.execute("COMMIT")
print("released", flush=True)
"""


@contextmanager
def locked(path: Path, hold_s: float, ready_sql: str = "") -> Iterator[subprocess.Popen[str]]:
    """A real second process holding ``BEGIN EXCLUSIVE`` on ``path`` for ``hold_s`` seconds
    (after ``ready_sql`` first returns a row, when given); yields once the lock is taken."""
    p = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(path), str(hold_s), ready_sql],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if not ready_sql:
            assert p.stdout is not None and p.stdout.readline().strip() == "locked"
        yield p
    finally:
        p.wait(timeout=60)


def _frame(i: int) -> FrameRecord:
    return FrameRecord(
        frame_id=i, t_sched=i, t_capture=i, t_dispatch=i, t_done=i, lateness_ms=0, grab_ms=1
    )


def _sample(i: int) -> Sample:
    return Sample(seq=i, t=i, wall=time.time(), lag_ms=0, tick_ms=0, values={"rss_bytes": i})


def _count(path: Path, sql: str) -> Any:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


# --- item 8: a reader holding the lock never kills the writer


def test_writer_keeps_every_row_while_a_reader_holds_the_lock_past_the_busy_timeout(
    db_path: Path,
) -> None:
    """A second process holds BEGIN EXCLUSIVE for 2 s against a 0.5 s busy timeout: the
    writer keeps its rows, retries, and every row arrives once the lock clears, with one
    store_locked event for the episode."""
    conn = store.connect(db_path)
    make_run(conn, id="r1", status="running")
    conn.close()
    w = store.StoreWriter(db_path, "r1", flush_interval_s=0.05, busy_timeout_s=0.5)
    w.start()
    for i in range(50):
        w.put(_frame(i))
    time.sleep(0.3)
    with locked(db_path, 2.0):
        for i in range(50, 250):
            w.put(_frame(i))
            w.put(_sample(i))
        time.sleep(1.0)  # past the busy timeout, the lock still held
        assert w.error is None
    w.close()
    assert w.error is None, w.error
    assert _count(db_path, "SELECT count(*) FROM frames") == 250
    assert _count(db_path, "SELECT count(*) FROM samples") == 200
    assert w.lock_episodes == 1 and w.lock_retries >= 1
    assert _count(db_path, "SELECT count(*) FROM events WHERE kind = 'store_locked'") == 1
    assert _count(db_path, "SELECT count(*) FROM events WHERE kind = 'store_overflow'") == 0


def test_writer_over_its_pending_bound_drops_the_oldest_samples_first_and_records_it(
    db_path: Path,
) -> None:
    """With room for 50 pending rows during the lock, the oldest samples go first; every
    frame and event is kept; a store_overflow event counts what was dropped."""
    conn = store.connect(db_path)
    make_run(conn, id="r1", status="running")
    conn.close()
    w = store.StoreWriter(db_path, "r1", flush_interval_s=0.05, busy_timeout_s=0.3, max_pending=50)
    w.start()
    with locked(db_path, 1.5):
        for i in range(20):
            w.put(_frame(i))
        for i in range(40):
            w.put(_sample(i))
        w.put(Event("error", 1.0, time.time(), "boom"))
        time.sleep(0.8)
    w.close()
    assert w.error is None, w.error
    assert _count(db_path, "SELECT count(*) FROM frames") == 20
    # 61 rows for 50 places: the 11 oldest samples were dropped
    assert _count(db_path, "SELECT min(seq) FROM samples") == 11
    assert _count(db_path, "SELECT count(*) FROM events WHERE kind = 'error'") == 1
    data = _count(db_path, "SELECT data FROM events WHERE kind = 'store_overflow'")
    assert '"samples":11' in data and '"max_pending":50' in data


def test_writer_fails_at_once_on_a_genuine_error_instead_of_retrying(db_path: Path) -> None:
    """A write that fails for a reason other than a lock (here the frames table is gone) is
    not retried as a lock: ``error`` names the real failure."""
    conn = store.connect(db_path)
    make_run(conn, id="r1", status="running")
    conn.execute("DROP TABLE frames")
    conn.close()
    w = store.StoreWriter(db_path, "r1", flush_interval_s=0.05, busy_timeout_s=0.3)
    w.start()
    w.put(_frame(0))
    t0 = time.monotonic()
    w.close(timeout=10)
    assert time.monotonic() - t0 < 2
    assert w.error is not None and "no such table: frames" in str(w.error)
    assert w.lock_episodes == 0


def test_run_completes_unaffected_while_a_reader_holds_the_lock_past_the_busy_timeout(
    synthetic: Callable[..., Settings], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through run_soak: a reader holds BEGIN EXCLUSIVE for 2 s mid-run against a 0.5 s busy
    timeout; the run completes with the verdict and exit code of the same run unlocked, and
    every frame it counted is in the database."""
    monkeypatch.setattr(store, "BUSY_TIMEOUT_MS", 500)
    # 6 s: enough frame-age windows that a loaded host's noise leaves neither run untested;
    # the rows the writer keeps while locked are a few hundred KB of RSS, which 6 s cannot
    # tell from a leak: memory growth is not what this test judges
    sets = ("run.duration=6", "criteria.max_memory_growth_mb_per_min=1000")
    control = run_soak(synthetic(*sets))
    ready = "SELECT 1 FROM frames f JOIN runs r ON r.id = f.run_id WHERE r.status = 'running'"
    with locked(db_path, 2.0, ready_sql=ready) as locker:
        res = run_soak(synthetic(*sets))
    assert locker.stdout is not None and "released" in locker.stdout.read()
    assert res.status == "completed", res.reason
    got, want = (res.exit_code, res.verdict.status), (control.exit_code, control.verdict.status)
    assert got == want, (res.verdict.reason, control.verdict.reason)
    rid = res.run_id
    n = _count(db_path, f"SELECT count(*) FROM frames WHERE run_id = '{rid}'")
    assert n == res.summary["frames_done"] > 40
    kinds = f"SELECT group_concat(kind) FROM events WHERE run_id = '{rid}'"
    assert "store_locked" in _count(db_path, kinds)


# --- item 12: databases that cannot be written, are newer, or are damaged


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder outside pytest's 0700 tmp tree, so another user can reach it."""
    d = Path(tempfile.mkdtemp(prefix="soakd-store-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _cli_as_nobody(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``soakd ARGS`` as the unprivileged user nobody (no capabilities: root's permission
    bypass is gone, so read-only means read-only). ``setpriv`` switches the user: the
    interpreter's own folders under /root stay reachable through it, as they would not be
    from a ``preexec_fn`` setuid."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to switch to an unprivileged user")
    user = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return subprocess.run(
        [*user, *soakd_cmd(*args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**env, "HOME": "/tmp"},
        timeout=120,
    )


def marker_factory(options: dict[str, Any], ctx: Any) -> Any:
    """A workload factory that leaves a marker file: proof the model was being loaded."""
    Path(options["marker"]).write_text("built")
    raise RuntimeError("the workload must not be built")


def test_read_only_database_file_fails_with_exit_2_before_the_workload_builds(
    open_dir: Path, subprocess_env: dict[str, str]
) -> None:
    """As an unprivileged user, a 0444 database in a folder the user owns (SQLite opens it,
    read-only, without complaint) is refused at start, one line, exit 2, before the model
    loads (the factory's marker file is never written)."""
    db = open_dir / "soakd.db"
    store.connect(db).close()
    db.chmod(0o444)
    os.chown(open_dir, NOBODY, NOBODY)
    marker = open_dir / "marker"
    r = _cli_as_nobody(
        "run",
        "--db",
        str(db),
        "--duration",
        "2s",
        "--no-live",
        "--set",
        'workload.kind="python"',
        "--set",
        'workload.factory="tests.test_store_faults:marker_factory"',
        "--set",
        f"workload.options={{marker = {str(marker)!r}}}",
        env=subprocess_env,
    )
    assert r.returncode == ExitCode.USAGE, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("soakd: error")]
    assert len(lines) == 1 and "read-only" in lines[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert not marker.exists()


def test_database_locked_at_start_fails_before_the_workload_builds(
    synthetic: Callable[..., Settings],
    db_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A database whose write lock another process holds past the busy timeout when the run
    starts is a usage error naming the lock, raised before the workload is built."""
    monkeypatch.setattr(store, "BUSY_TIMEOUT_MS", 300)
    store.connect(db_path).close()
    marker = tmp_path / "marker"
    settings = synthetic(
        'workload.kind="python"',
        'workload.factory="tests.test_store_faults:marker_factory"',
        f"workload.options={{marker = {str(marker)!r}}}",
    )
    with locked(db_path, 3.0), pytest.raises(UsageError, match="locked by another connection"):
        run_soak(settings)
    assert not marker.exists()


def _future_db(path: Path) -> None:
    conn = store.connect(path)
    make_run(conn, id="r1")
    conn.execute("INSERT INTO _migrations VALUES ('0099_from_the_future', 'x')")
    conn.close()


def test_database_from_a_newer_soakd_is_refused_naming_both_schema_versions(
    db_path: Path, subprocess_env: dict[str, str]
) -> None:
    """A database recording a migration this soakd does not know is refused, for writing
    and for reading, with one line naming its schema version and ours (exit 2)."""
    _future_db(db_path)
    for readonly in (False, True):
        with pytest.raises(store.StoreError, match=f"version 99 .* version {SCHEMA_VERSION}"):
            store.connect(db_path, readonly=readonly)
    for args in (("runs",), ("gate", "--latest"), ("show", "--latest")):
        r = run_cli(*args, "--db", str(db_path), env=subprocess_env, timeout=60)
        assert r.returncode == ExitCode.USAGE, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "newer soakd" in r.stderr, r.stderr
    names = _count(db_path, "SELECT group_concat(name) FROM _migrations")
    assert names.count(",") == SCHEMA_VERSION  # ours and the future one, nothing added


def test_run_refuses_a_database_from_a_newer_soakd(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """``run`` does not write into a newer soakd's database."""
    _future_db(db_path)
    with pytest.raises(UsageError, match="newer soakd"):
        run_soak(synthetic())


def _corrupt_frames_page(path: Path) -> None:
    conn = store.connect(path)
    rid = make_run(conn, id="r1")
    with store.atomic(conn):
        conn.executemany(
            "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, error) VALUES (?,?,?,?,?)",
            [(rid, i, i, i, "x" * 200) for i in range(2000)],
        )
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'frames'").fetchone()[0]
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page)
        f.write(b"\xde\xad\xbe\xef" * (page // 4))


def test_corrupt_page_is_one_line_with_a_quick_check_hint_and_exit_2(
    db_path: Path, subprocess_env: dict[str, str]
) -> None:
    """A database with one page overwritten by garbage: runs, show and report each print one
    line naming the damage and `PRAGMA quick_check`, and exit 2, never a traceback."""
    _corrupt_frames_page(db_path)
    for args in (("runs",), ("show", "r1"), ("report", "r1"), ("gate", "r1")):
        r = run_cli(*args, "--db", str(db_path), env=subprocess_env, timeout=60)
        assert r.returncode == ExitCode.USAGE, (args, r.stderr[-2000:])
        assert "Traceback" not in r.stderr
        assert r.stderr.count("\n") == 1 and "PRAGMA quick_check" in r.stderr, r.stderr


def test_gate_runs_and_report_read_a_database_in_a_read_only_folder_as_another_user(
    synthetic: Callable[..., Settings], open_dir: Path, subprocess_env: dict[str, str]
) -> None:
    """An unprivileged user reading the service's database (folder 0755 and file 0644, both
    root's, no WAL left): `gate --latest` exits with the run's verdict, `runs` and `report`
    work, an orphan is reported but not marked, and the file is not changed."""
    db = open_dir / "soakd.db"
    res = run_soak(synthetic(f"run.db={str(db)!r}", "run.duration=2"))
    conn = store.connect(db)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    make_run(conn, id="0-orphan", status="running", pid=dead.pid, started_unix=1.0)
    conn.close()
    db.chmod(0o644)
    before = db.read_bytes()
    g = _cli_as_nobody("gate", "--latest", "--db", str(db), env=subprocess_env)
    assert g.returncode == res.exit_code, g.stderr[-2000:]
    assert "looks orphaned" in g.stderr and "Traceback" not in g.stderr
    r = _cli_as_nobody("runs", "--db", str(db), "--json", env=subprocess_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert res.run_id in r.stdout and '"status": "running"' in r.stdout
    m = _cli_as_nobody("report", "0-orphan", "--db", str(db), env=subprocess_env)
    assert m.returncode == 0, m.stderr[-2000:]
    assert db.read_bytes() == before
    assert sorted(p.name for p in open_dir.iterdir()) == ["soakd.db"]


def test_a_disk_that_fills_as_the_run_closes_is_named_disk_full(
    synthetic: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk filling at the run's last write (closing its row) is the same one line as
    mid-run: 'disk full while writing the run database', exit 4, not SQLite's own words."""
    from soakd.errors import SoakdError
    from soakd.store import runs

    def full(*_a: Any, **_k: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(runs, "close_run", full)
    with pytest.raises(SoakdError) as info:
        run_soak(synthetic("run.duration=1"))
    assert "disk full while writing the run database (closing the run)" in str(info.value)
    assert info.value.exit_code == ExitCode.INTERNAL


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 20 MB tmpfs of its own (a real filesystem that can fill up); skipped where this
    user may not mount one (root only)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20M", "tmpfs", str(mnt)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_the_disk_filling_as_the_verdict_is_stored_is_one_line_naming_it_last(
    small_disk: Path, subprocess_env: dict[str, str]
) -> None:
    """The disk filling right before the verdict is stored (a real full tmpfs) is one line
    on stderr, the last one, naming the verdict that could not be stored and the full disk,
    exit 4, no Traceback; under stop_on_fail it is that line, not the early stop's reason.
    The run's frames are all still there."""
    db = small_disk / "soakd.db"
    fails = "criteria.thresholds=[{expr='p50(infer_ms) < 1', abort_on_fail=true}]"
    p = subprocess.run(
        [sys.executable, "-c", FILL_THEN_STORE, "run", "--db", str(db), "--duration", "4",
         "--fps", "20", "--no-live", "--set", "workload.kind=synthetic",
         "--set", "run.warmup_s=0.5", "--set", "run.stop_on_fail=true", "--set", fails],
        capture_output=True, text=True, cwd=REPO, timeout=120, env=subprocess_env,
    )  # fmt: skip
    last = [line for line in p.stderr.splitlines() if line.strip()][-1]
    assert p.returncode == 4 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert last.startswith("soakd: error: the FAIL verdict could not be stored: "), last
    assert last.endswith("disk full while writing the run database"), last
    (small_disk / "filler").unlink()
    assert _count(db, "SELECT count(*) FROM frames") > 5


@pytest.fixture
def read_only_disk(small_disk: Path) -> Callable[[], None]:
    """``small_disk``, and a call that remounts it read-only (read-only storage)."""

    def remount() -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)

    return remount


@pytest.mark.parametrize("migrations", [1, 8])
def test_an_older_schema_on_read_only_storage_is_read_as_it_is(
    small_disk: Path,
    read_only_disk: Callable[[], None],
    migrations: int,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A database of an older schema on read-only storage (it cannot be migrated there) is
    read as it is, what it lacks read as empty: gate (PASS, exit 0), report -f md / html,
    show and export of every table work, not "no such table: server_metrics" or "near
    FROM: syntax error"; nothing is written to it."""
    db = small_disk / "old.db"
    old_database(db, migrations)
    read_only_disk()
    before = db.read_bytes()
    for args in (["gate", "old1"], ["report", "old1"], ["report", "old1", "-f", "html"],
                 ["show", "old1"], ["export", "old1", "--table", "server_metrics"],
                 ["export", "old1", "--table", "gpu_samples"], ["export", "old1"]):  # fmt: skip
        code = main([*args, "--db", str(db)])  # read commands: in this process
        err = capfd.readouterr().err
        assert code == 0 and "Traceback" not in err, (args, err[-2000:])
    assert db.read_bytes() == before


def test_merge_says_how_to_upgrade_an_older_input_on_read_only_storage(
    small_disk: Path, read_only_disk: Callable[[], None], tmp_path: Path
) -> None:
    """`soakd merge` refuses an input of an older schema on read-only storage with advice
    that works there (upgrade a copy: `cp ... && soakd runs --db COPY`), not "open it once
    with this soakd", which cannot migrate it where it is; following the advice merges."""
    db = small_disk / "old.db"
    old_database(db, 4)
    read_only_disk()
    out = tmp_path / "out.db"
    r = run_cli("merge", str(out), str(db))
    assert r.returncode == 2 and "cannot be upgraded where it is" in r.stderr, r.stderr
    copy_cmd = r.stderr.split("`")[1]
    copy = Path(copy_cmd.split("&&")[0].split()[-1])
    try:
        assert (
            subprocess.run(
                ["bash", "-c", copy_cmd.replace("soakd ", " ".join(soakd_cmd()) + " ", 1)],
                cwd=REPO,
                capture_output=True,
                check=False,
            ).returncode
            == 0
        )
        r = run_cli("merge", str(out), str(copy))
        assert r.returncode == 0, r.stderr[-2000:]
    finally:
        copy.unlink(missing_ok=True)

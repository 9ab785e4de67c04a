"""Faults operators meet: CUDA out of memory, a full disk, a read-only database path."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from soakd.config import Settings
from soakd.errors import ExitCode
from soakd.run.runner import run_soak

from .conftest import soakd_cmd

pytestmark = pytest.mark.slow

OOM = [
    'workload.kind="python"',
    'workload.factory="tests.fault_workloads:oom_every"',
    "workload.options={every = 4}",
]


def test_oom_is_recorded_with_allocator_state_and_fails_memory(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """An out-of-memory frame is an `oom` event; the run goes on (on_oom = continue) and the
    verdict fails."""
    res = run_soak(synthetic(*OOM, "run.duration=2.5"))
    assert res.status == "completed"
    conn = sqlite3.connect(db_path)
    n_oom = conn.execute("SELECT count(*) FROM events WHERE kind = 'oom'").fetchone()[0]
    assert n_oom >= 5 and res.summary["ooms"] == n_oom
    # never PASS; INVALID when a 2.5 s run's memory trend could not be tested (a loaded host)
    assert res.verdict is not None and res.verdict.status in ("FAIL", "INVALID")
    failed = {c for (c,) in conn.execute("SELECT criterion FROM verdicts WHERE status = 'fail'")}
    assert "oom" in failed, failed


def test_oom_stops_the_run_when_asked(synthetic: Callable[..., Settings]) -> None:
    """With on_oom = "stop" the first OOM ends the run as aborted with that reason."""
    res = run_soak(synthetic(*OOM, 'run.on_oom="stop"', "run.duration=10"))
    assert res.status == "aborted" and res.reason is not None and "out of memory" in res.reason
    assert res.duration_s < 5


@contextmanager
def tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """A real tmpfs mounted at ``mnt`` for the block (skips the test where mounting is not
    allowed: it needs root)."""
    mnt.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) here (needs root): {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 400 KiB tmpfs: a real filesystem that fills up."""
    with tmpfs(tmp_path / "small", "size=400k") as mnt:
        yield mnt


def test_disk_full_ends_the_run_with_a_clear_error_and_a_sound_database(
    tiny_fs: Path, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """When the disk fills mid-run, soakd stops with exit 4 and a one-line 'disk full'
    error; the database that is there passes PRAGMA integrity_check."""
    db = tiny_fs / "soakd.db"
    p = subprocess.run(
        soakd_cmd(
            "run",
            "--db",
            str(db),
            "--duration",
            "60s",
            "--fps",
            "200",
            "--no-live",
            "--set",
            "workload.kind=synthetic",
            "--set",
            "workload.infer_ms=0",
            "--set",
            "workload.pre_ms=0",
            "--set",
            "workload.decode_ms=0",
            "--set",
            "run.sample_interval_ms=50",
            "--set",
            "run.log_every=0",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env,
    )
    assert p.returncode == ExitCode.INTERNAL, p.stderr[-3000:]
    assert "disk full" in p.stderr
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM frames").fetchone()[0] > 0


def test_read_only_database_path_is_a_usage_error(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """A database on a read-only filesystem is refused before the run (exit 2), naming it."""
    with tmpfs(tmp_path / "ro", "ro,size=100k") as mnt:
        db = mnt / "soakd.db"
        r = subprocess.run(
            soakd_cmd(
                "run",
                "--db",
                str(db),
                "--duration",
                "2s",
                "--no-live",
                "--set",
                "workload.kind=synthetic",
            ),
            capture_output=True,
            text=True,
            timeout=120,
            env=subprocess_env,
        )
        assert r.returncode == ExitCode.USAGE, r.stderr[-2000:]
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("soakd: error")]
        assert len(lines) == 1 and str(db) in lines[0]

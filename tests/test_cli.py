"""The CLI around a run: per-frame log lines at their cadence, `soakd runs`, `soakd show`."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from .conftest import soakd_cmd

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """One short synthetic soak through the real CLI, logging JSON every 5th frame."""
    db = tmp_path_factory.mktemp("cli") / "soakd.db"
    p = subprocess.run(
        soakd_cmd(
            "run",
            "--db",
            str(db),
            "--duration",
            "3s",
            "--fps",
            "20",
            "--no-live",
            "--log-json",
            "--set",
            "workload.kind=synthetic",
            "--set",
            "workload.infer_ms=5",
            "--set",
            "run.log_every=5",
            "--set",
            "run.warmup_s=0.5",
            "--set",
            "criteria.min_duration_s=1",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return db, p


def test_frame_log_lines_carry_the_seed_fields_at_the_cadence(
    run_db: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """Off a terminal the run logs JSON lines; one `frame` line every log_every frames with
    frame, grab, pre, infer, decode, total, queue, age and drop."""
    _, p = run_db
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [json.loads(ln) for ln in p.stderr.splitlines() if ln.startswith("{")]
    frames = [ln for ln in lines if ln.get("msg") == "frame"]
    assert 10 <= len(frames) <= 13  # ~60 frames / 5
    assert all(f["frame"] % 5 == 0 for f in frames)
    for key in ("frame", "grab", "pre", "infer", "decode", "total", "queue", "age", "drop"):
        assert key in frames[-1], key
    assert {ln.get("msg") for ln in lines} >= {"run started", "run ended"}


def test_runs_lists_the_run_and_show_summarises_it(
    run_db: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """`soakd runs --json` lists the run with its verdict; `soakd show --latest --json` has
    the stage statistics and the run's summary."""
    db, _ = run_db
    p = subprocess.run(
        soakd_cmd("runs", "--db", str(db), "--json"), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    rows = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["status"] == "completed" and rows[0]["verdict"] == "PASS"
    run_id = rows[0]["run_id"]
    p = subprocess.run(
        soakd_cmd("show", run_id[:12], "--db", str(db), "--json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["run"]["id"] == run_id
    assert 4 <= doc["stages"]["infer"]["p50"] <= 20
    assert doc["run"]["summary"]["frames_done"] >= 55
    p = subprocess.run(
        soakd_cmd("show", "--latest", "--db", str(db)), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and "infer" in p.stdout and run_id in p.stdout


def test_show_unknown_run_is_a_usage_error(
    run_db: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """An unknown run id is exit 2 with one line naming it."""
    db, _ = run_db
    p = subprocess.run(
        soakd_cmd("show", "nope", "--db", str(db)), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and "no run 'nope'" in p.stderr


@pytest.mark.model
def test_the_readme_main_job_runs_the_embedded_default(tmp_path: Path) -> None:
    """`soakd run` with no config soaks the embedded tiny VLM offline and judges it (a short
    version of the README's first command; PASS or FAIL depends on this machine's load, an
    unjudgeable or broken run does not)."""
    db = tmp_path / "soakd.db"
    env_cache = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(
        soakd_cmd(
            "run",
            "--db",
            str(db),
            "--duration",
            "6s",
            "--no-live",
            "--set",
            "run.warmup_s=1",
            "--set",
            "criteria.min_duration_s=3",
            "--set",
            f"workload.cache_dir={str(tmp_path / 'models')!r}",
        ),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env_cache},
    )
    assert p.returncode in (0, 1), p.stderr[-3000:]
    conn = sqlite3.connect(db)
    ((kind, status, verdict),) = conn.execute("SELECT workload_kind, status, verdict FROM runs")
    assert (kind, status) == ("tiny-vlm", "completed") and verdict in ("PASS", "FAIL")
    ((n, tokens),) = conn.execute("SELECT count(*), min(out_tokens) FROM measured_frames")
    assert n >= 5 and tokens == 8

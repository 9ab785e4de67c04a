"""The CLI around a run: per-frame log lines at their cadence, `soakd runs`, `soakd show`."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
import typer

from soakd.cli.output import write_output

from .conftest import run_cli, soakd_cmd

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
    """`soakd run` with no config soaks the embedded tiny VLM offline and judges it. This is
    a 6 s version of the README's first command, too short for its frame-age trend (one
    window at 2 fps): the honest outcome is INVALID "untested", naming the run length that
    would test it, never a PASS (test_verdict.py checks that the default length is
    testable)."""
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
    assert p.returncode == 3, p.stderr[-3000:]
    assert "untested" in p.stdout, p.stdout[-3000:]
    conn = sqlite3.connect(db)
    ((kind, status, verdict),) = conn.execute("SELECT workload_kind, status, verdict FROM runs")
    assert (kind, status, verdict) == ("tiny-vlm", "completed", "INVALID")
    ((detail,),) = conn.execute("SELECT detail FROM verdicts WHERE criterion = 'frame_age'")
    assert detail.startswith("untested") and "run.duration >=" in detail
    ((n, tokens),) = conn.execute("SELECT count(*), min(out_tokens) FROM measured_frames")
    assert n >= 5 and tokens == 8


# --- write_output: stdout or a file


def test_write_output_into_a_missing_folder_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file in a folder that does not exist is a usage error: exit 2, one line naming the
    path and the reason, nothing written."""
    target = tmp_path / "nope" / "out.md"
    with pytest.raises(typer.Exit) as info:
        write_output("text", target)
    assert info.value.exit_code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"soakd: error: {target}: cannot write: folder {target.parent} does not exist"
    ]
    assert not target.parent.exists()


def test_write_output_unwritable_path_names_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path that cannot be written (here: a folder) is exit 2 with the OS's reason."""
    with pytest.raises(typer.Exit) as info:
        write_output("text", tmp_path)
    assert info.value.exit_code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"soakd: error: {tmp_path}: cannot write: ") and "directory" in line


def test_write_output_stdout_is_newline_terminated_and_files_are_as_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On stdout the text ends with exactly one newline; a file gets the text unchanged."""
    write_output("a", None)
    write_output("b\n", None)
    assert capsys.readouterr().out == "a\nb\n"
    write_output("c", tmp_path / "c.txt")
    assert (tmp_path / "c.txt").read_text() == "c"


def test_sweep_output_into_a_missing_folder_exits_2(tmp_path: Path) -> None:
    """`soakd sweep -o MISSING/x.md` exits 2 with one line on stderr."""
    target = tmp_path / "missing" / "x.md"
    p = run_cli(
        "sweep",
        "--vary",
        "workload.infer_ms=1",
        "--frames",
        "2",
        "--set",
        "workload.kind=synthetic",
        "--db",
        str(tmp_path / "x.db"),
        "-o",
        str(target),
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"soakd: error: {target}: cannot write: folder {target.parent} does not exist"
    ]

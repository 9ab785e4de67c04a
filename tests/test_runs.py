"""Run rows and run lookup (soakd.store.runs): one RunRow, one resolver, one meaning of
--latest (the newest *soak* run unless a mode is asked for) in every command."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from soakd.errors import UsageError
from soakd.store import db as store
from soakd.store import runs

from .conftest import SYNTH_CLI, make_run, soakd_cmd


def test_latest_is_the_newest_soak_run_unless_another_mode_is_asked(db_path: Path) -> None:
    """A profile run started after the newest soak run is not "latest" by default; mode
    "profile" or None (any mode) picks it."""
    conn = store.connect(db_path)
    make_run(conn, id="soak-old", started_unix=100.0)
    make_run(conn, id="soak-new", started_unix=200.0)
    make_run(conn, id="prof", mode="profile", started_unix=300.0)
    assert runs.resolve(conn, None, latest=True) == "soak-new"
    assert runs.resolve(conn, "latest") == "soak-new"
    assert runs.resolve(conn, None, latest=True, mode="profile") == "prof"
    assert runs.resolve(conn, None, latest=True, mode=None) == "prof"
    assert runs.resolve(conn, "soak-o") == "soak-old"  # unique prefix
    assert runs.resolve(conn, "prof") == "prof"  # exact id of any mode


def test_no_run_of_the_mode_is_a_one_line_usage_error(db_path: Path) -> None:
    """Without a soak run, --latest names what is missing; get_run's not-found error is a
    UsageError (exit 2) with one line."""
    conn = store.connect(db_path)
    make_run(conn, id="prof", mode="profile")
    with pytest.raises(runs.RunNotFound, match="no soak run"):
        runs.resolve(conn, None, latest=True)
    with pytest.raises(UsageError) as exc:
        runs.get_run(conn, "nope")
    assert "\n" not in str(exc.value) and "no run 'nope'" in str(exc.value)
    assert runs.find_run(conn, "nope") is None


def test_run_row_has_every_column_with_json_decoded(db_path: Path) -> None:
    """RunRow carries every column of `runs` and the run's labels; config, workload,
    environment and summary are dicts ({} when unreadable), and as_dict() is what
    `show --json` prints."""
    conn = store.connect(db_path)
    rid = make_run(conn, config={"run": {"fps": 5}}, summary={"frames_done": 7}, duration_s=2)
    conn.execute("UPDATE runs SET environment = 'not json' WHERE id = ?", (rid,))
    row = runs.get_run(conn, rid)
    cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    assert sorted(row.as_dict()) == sorted([*cols, "labels"])
    assert row.config == {"run": {"fps": 5}} and row.summary == {"frames_done": 7}
    assert row.environment == {} and row.status == "completed" and row.duration_s == 2
    runs.set_verdict(conn, rid, "PASS", 0)
    assert (runs.get_run(conn, rid).verdict, runs.get_run(conn, rid).exit_code) == ("PASS", 0)
    assert json.loads(json.dumps(row.as_dict()))["id"] == rid


def _cli(db: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        soakd_cmd(*args, "--db", str(db)), capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.slow
def test_gate_report_and_show_latest_name_the_same_soak_run_after_a_profile(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """A real soak, then a real `soakd profile` on the same database: `gate --latest`,
    `report --latest -f json` and `show --latest --json` all name the soak run (they used
    to disagree: gate and report picked the profile run and judged it INVALID)."""
    db = tmp_path / "soakd.db"
    synth = ("--set", "workload.kind=synthetic", "--set", "workload.infer_ms=5")
    p = _cli(
        db,
        "run",
        "--duration",
        "2s",
        "--fps",
        "20",
        "--no-live",
        *SYNTH_CLI,
        "--set",
        "workload.infer_ms=5",
        env=subprocess_env,
    )
    assert p.returncode in (0, 1), p.stderr[-2000:]
    p = _cli(db, "profile", "--frames", "5", *synth, env=subprocess_env)
    assert p.returncode == 0, p.stderr[-2000:]
    conn = store.connect(db)
    soak = runs.list_runs(conn, mode="soak")[0]["run_id"]
    prof = runs.list_runs(conn, mode="profile")[0]["run_id"]
    conn.close()
    assert soak != prof
    show = _cli(db, "show", "--latest", "--json", env=subprocess_env)
    assert show.returncode == 0, show.stderr
    assert json.loads(show.stdout)["run"]["id"] == soak
    report = _cli(db, "report", "--latest", "-f", "json", env=subprocess_env)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["run"]["id"] == soak
    gate = _cli(db, "gate", "--latest", env=subprocess_env)
    assert gate.returncode in (0, 1), gate.stdout + gate.stderr
    assert re.search(rf"run {re.escape(soak)}\b", gate.stdout), gate.stdout
    gate = _cli(db, "gate", "--latest", "--mode", "profile", env=subprocess_env)
    assert prof in gate.stdout


def test_runs_table_shows_the_name_and_never_cuts_a_run_id_at_80_columns(
    db_path: Path, subprocess_env: dict[str, str]
) -> None:
    """`soakd runs` on an 80-column display has a name column and every run id whole."""
    conn = store.connect(db_path)
    rid = "20261205T140512Z-3f9a1c7b"
    make_run(conn, id=rid, name="nightly-moss")
    conn.close()
    env = {**subprocess_env, "COLUMNS": "80"}
    p = subprocess.run(
        soakd_cmd("runs", "--db", str(db_path)), capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert rid in p.stdout
    assert "name" in p.stdout.splitlines()[1] and "nightly" in p.stdout

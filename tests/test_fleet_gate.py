"""The release gate over many runs (`soakd gate --label/--plan`): one row per cell, the
latest run of each cell judged, exit 0 only when every cell passed, databases untouched.

Runs are real rows in real SQLite files: ``_soak`` writes a 60 s, 10 fps run the way the
runner stores one (frames, samples, labels, a stored verdict) through ``make_run``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import subprocess
import xml.etree.ElementTree as ET
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis import judge_run
from soakd.cli import main
from soakd.store import db as store

from .conftest import SYNTH_CLI, error_lines, make_run, run_cli, soakd_cmd

MIB = 1 << 20
REL = ("--label", "release=1.4.0")


def _soak(
    conn: sqlite3.Connection,
    *,
    cell: str | None = "a",
    started: float = 1000.0,
    error_frame: bool = False,
    status: str = "completed",
    labels: dict[str, str] | None = None,
    **run: object,
) -> str:
    """A 60 s, 10 fps synthetic run with steady frames and memory (PASS), labelled
    release=1.4.0 and ``cell``; ``error_frame``: one frame raised (FAIL on errors). Its
    verdict is stored, as the runner stores it."""
    cfg = {"criteria": {}, "workload": {"kind": "synthetic", "device": "cpu"}, "run": {}}
    rid = make_run(conn, started_unix=started, fps=10, config=cfg, duration_s=60,
                   status=status, **run)  # fmt: skip
    tags = {"release": "1.4.0", **({"cell": cell} if cell else {}), **(labels or {})}
    conn.executemany("INSERT INTO labels (run_id, key, value) VALUES (?, ?, ?)",
                     [(rid, k, v) for k, v in tags.items()])  # fmt: skip
    rng = np.random.default_rng(0)
    infer = 20 * np.exp(rng.normal(0, 0.05, 600))
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, warmup, grab_ms, pre_ms,"
        " infer_ms, decode_ms, total_ms, frame_age_ms, error) VALUES (?,?,?,?,?,1,2,?,2,?,3,?)",
        [(rid, i, i / 10, i / 10, int(i < 20), infer[i], infer[i] + 5,
          "boom" if error_frame and i == 300 else None) for i in range(600)],
    )  # fmt: skip
    conn.executemany(
        "INSERT INTO samples (run_id, seq, t, wall, rss_bytes, cpu_pct) VALUES (?,?,?,0,?,50)",
        [(rid, i, i / 10, 400 * MIB + int(rng.normal(0, 0.1 * MIB))) for i in range(600)],
    )
    if status != "running":
        judge_run(conn, rid)
    return rid


def _db(path: Path) -> sqlite3.Connection:
    return store.connect(path)


def _gate(*args: str) -> subprocess.CompletedProcess[str]:
    """`soakd gate ARGS` through the CLI's entry point, in this process (the subprocess path
    is exercised by the tests that call ``run_cli``)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["gate", *args])
    return subprocess.CompletedProcess(
        ["soakd", "gate", *args], code, out.getvalue(), err.getvalue()
    )


def _json(*args: str) -> dict:
    r = _gate(*args, "-f", "json")
    doc = json.loads(r.stdout)
    assert doc["verdict"]["exit_code"] == r.returncode, r.stderr
    return doc


def _cells(doc: dict) -> dict[str, str]:
    return {c["cell"]: c["status"] for c in doc["cells"]}


def test_every_cell_passing_exits_0_with_one_row_per_cell(db_path: Path) -> None:
    conn = _db(db_path)
    a, b = _soak(conn, cell="fps=2"), _soak(conn, cell="fps=4")
    conn.close()
    r = _gate(*REL, "--db", str(db_path))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln for ln in r.stdout.splitlines() if a in ln or b in ln]
    assert len(rows) == 2 and all("PASS" in ln for ln in rows)
    assert r.stdout.splitlines()[-1] == "2 cells: 2 passed, 0 failed, 0 invalid, 0 missing"


def test_one_failing_cell_exits_1_and_the_table_names_the_cell_and_criterion(
    db_path: Path,
) -> None:
    conn = _db(db_path)
    _soak(conn, cell="fps=2")
    bad = _soak(conn, cell="fps=4", error_frame=True)
    conn.close()
    r = run_cli("gate", *REL, "--db", str(db_path))
    assert r.returncode == 1, r.stdout + r.stderr
    row = next(ln for ln in r.stdout.splitlines() if bad in ln)
    assert "fps=4" in row and "FAIL" in row and "errors 1 count (threshold 0)" in row
    assert r.stdout.splitlines()[-1] == "2 cells: 1 passed, 1 failed, 0 invalid, 0 missing"


def test_a_cell_whose_latest_run_is_running_or_aborted_is_invalid_exit_3(db_path: Path) -> None:
    """Steady frames do not make an aborted run pass, and a run still going is not judged."""
    conn = _db(db_path)
    _soak(conn, cell="ok")
    _soak(conn, cell="aborted", status="aborted", reason="signal SIGTERM")
    _soak(conn, cell="running", status="running", pid=os.getpid())
    conn.close()
    doc = _json(*REL, "--db", str(db_path))
    assert _cells(doc) == {"ok": "PASS", "aborted": "INVALID", "running": "INVALID"}
    why = {c["cell"]: c["reason"] for c in doc["cells"]}
    assert "signal SIGTERM" in why["aborted"] and why["running"].startswith("still running")
    assert doc["verdict"]["status"] == "INVALID" and doc["verdict"]["exit_code"] == 3


def test_two_databases_from_two_hosts_make_one_table(tmp_path: Path) -> None:
    dbs = [tmp_path / "h1.db", tmp_path / "h2.db"]
    for i, path in enumerate(dbs):
        conn = _db(path)
        _soak(conn, cell=f"gpu{i}", host=f"node{i}")
        conn.close()
    r = _gate(*REL, "--db", str(dbs[0]), "--db", str(dbs[1]), "-f", "md")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| gpu")]
    assert [("node0" in rows[0], "h1.db" in rows[0]), ("node1" in rows[1], "h2.db" in rows[1])] \
        == [(True, True), (True, True)]  # fmt: skip
    assert "**2 cells: 2 passed, 0 failed, 0 invalid, 0 missing**" in r.stdout


@pytest.mark.parametrize(("older_fails", "code"), [(True, 0), (False, 1)])
def test_the_latest_run_of_a_cell_across_databases_is_the_one_judged(
    tmp_path: Path, older_fails: bool, code: int
) -> None:
    """An older FAIL superseded by a newer PASS (in another database) passes; an older PASS
    superseded by a newer FAIL fails; the older run is listed as superseded."""
    old_db, new_db = tmp_path / "old.db", tmp_path / "new.db"
    conn = _db(old_db)
    old = _soak(conn, started=1000, error_frame=older_fails, host="n1")
    conn.close()
    conn = _db(new_db)
    new = _soak(conn, started=2000, error_frame=not older_fails, host="n2")
    conn.close()
    doc = _json(*REL, "--db", str(old_db), "--db", str(new_db))
    assert doc["verdict"]["exit_code"] == code
    assert [c["run"]["id"] for c in doc["cells"]] == [new]
    assert [(s["cell"], s["run"]["id"]) for s in doc["superseded"]] == [("a", old)]


def test_runs_without_a_cell_label_are_grouped_by_what_they_measured(db_path: Path) -> None:
    """Same name, fps, GPU and config hash: one cell (the newer run judged); another config
    hash: another cell."""
    conn = _db(db_path)
    _soak(conn, cell=None, started=1000, error_frame=True, name="vlm", config_hash="c0ffee00aa")
    newer = _soak(conn, cell=None, started=2000, name="vlm", config_hash="c0ffee00aa")
    _soak(conn, cell=None, started=1500, name="vlm", config_hash="beef0000bb")
    conn.close()
    doc = _json(*REL, "--db", str(db_path))
    assert _cells(doc) == {"vlm/10fps/cpu/beef0000": "PASS", "vlm/10fps/cpu/c0ffee00": "PASS"}
    assert newer in [c["run"]["id"] for c in doc["cells"]]


def test_one_run_found_in_two_databases_is_one_run(db_path: Path, tmp_path: Path) -> None:
    """A merged copy and its source hold the same run id: one cell, nothing superseded."""
    conn = _db(db_path)
    rid = _soak(conn)
    conn.close()
    copy = tmp_path / "merged.db"
    copy.write_bytes(db_path.read_bytes())
    doc = _json(*REL, "--db", str(db_path), "--db", str(copy))
    assert [c["run"]["id"] for c in doc["cells"]] == [rid] and doc["superseded"] == []
    assert doc["verdict"]["exit_code"] == 0


def test_a_database_from_before_labels_holds_no_matching_run(db_path: Path) -> None:
    """Opened read-only it cannot be migrated: a note says so, and the gate is not a pass."""
    conn = _db(db_path)
    _soak(conn)
    conn.execute("DROP TABLE labels")
    conn.execute("DELETE FROM _migrations WHERE name = '0004_labels'")
    conn.close()
    doc = _json(*REL, "--db", str(db_path))
    assert doc["verdict"]["exit_code"] == 3 and doc["cells"] == []
    assert doc["notes"] == [f"{db_path}: written before labels existed: no labelled run in it"]


PLAN = '[plan]\nname = "r"\nlabels = {release = "1.4.0"}\n[matrix]\n"run.fps" = [2, 4]\n'


def test_a_plan_cell_without_a_run_is_missing_and_runs_outside_the_plan_do_not_count(
    db_path: Path, tmp_path: Path
) -> None:
    """Plan r has cells fps=2 and fps=4: fps=2 passed, fps=4 has no run (MISSING, exit 3);
    a run of r in a cell r does not name is listed as not in plan and its FAIL does not
    count; a run of fps=4 without the plan=r label is not a run of the plan."""
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    conn = _db(db_path)
    _soak(conn, cell="fps=2", labels={"plan": "r"})
    stray = _soak(conn, cell="fps=8", labels={"plan": "r"}, error_frame=True)
    _soak(conn, cell="fps=4")
    conn.close()
    doc = _json("--plan", str(plan), "--db", str(db_path))
    assert _cells(doc) == {"fps=2": "PASS", "fps=4": "MISSING"}
    assert doc["verdict"] == {"status": "INVALID", "exit_code": 3, "reason": "fps=4 missing"}
    assert [(s["cell"], s["run"]["id"]) for s in doc["not_in_plan"]] == [("fps=8", stray)]
    assert doc["selection"]["labels"] == {"plan": "r", "release": "1.4.0"}


def test_a_label_contradicting_the_plan_or_a_bad_plan_is_a_usage_error(
    db_path: Path, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    _db(db_path).close()
    r = _gate("--plan", str(plan), "--label", "release=1.5.0", "--db", str(db_path))
    assert r.returncode == 2 and "contradicts plan 'r' (release=1.4.0)" in r.stderr, r.stderr
    plan.write_text(PLAN.replace("[matrix]", "[matrx]"))
    r = _gate("--plan", str(plan), "--db", str(db_path))
    assert r.returncode == 2 and "unknown table 'matrx'" in error_lines(r.stderr)[-1], r.stderr


def test_junit_has_one_testcase_per_cell(db_path: Path, tmp_path: Path) -> None:
    conn = _db(db_path)
    ok = _soak(conn, cell="ok")
    _soak(conn, cell="bad", error_frame=True)
    _soak(conn, cell="aborted", status="aborted")
    conn.close()
    out = tmp_path / "gate.xml"
    r = _gate(*REL, "--db", str(db_path), "-f", "junit", "-o", str(out))
    assert r.returncode == 1 and "1 failed" in r.stderr
    suite = ET.parse(out).getroot().find("testsuite")
    assert suite is not None and (suite.get("tests"), suite.get("failures")) == ("3", "1")
    cases = {tc.get("name"): tc for tc in suite.iter("testcase")}
    assert sorted(cases) == ["aborted", "bad", "ok"]
    assert cases["bad"].find("failure") is not None and cases["aborted"].find("error") is not None
    props = {p.get("name"): p.get("value") for p in cases["ok"].iter("property")}
    assert (
        props["run_id"] == ok and props["db"] == str(db_path) and "release=1.4.0" in props["labels"]
    )


def test_no_matching_run_is_invalid_exit_3_with_one_line(db_path: Path) -> None:
    """Also in JUnit: one testcase in error, never an empty (green) suite."""
    conn = _db(db_path)
    _soak(conn)
    conn.close()
    r = _gate("--label", "release=9.9", "--db", str(db_path))
    assert r.returncode == 3, r.stdout + r.stderr
    why = [ln for ln in r.stdout.splitlines() if "no soak run carries release=9.9" in ln]
    assert len(why) == 1 and why[0].endswith("nothing was soaked")
    junit = ET.fromstring(_gate("--label", "release=9.9", "--db", str(db_path), "-f", "junit")
                          .stdout.split("\n", 1)[1])  # fmt: skip
    assert [tc.find("error") is not None for tc in junit.iter("testcase")] == [True]


def test_text_from_runs_cannot_break_the_table_markdown_or_junit(db_path: Path) -> None:
    """A cell label holding console markup, a pipe and HTML stays one inert cell."""
    conn = _db(db_path)
    _soak(conn, cell="[/]x|<b>\x1b[31m")
    conn.close()
    table, md, junit = (
        _gate(*REL, "--db", str(db_path), "-f", f) for f in ("table", "md", "junit")
    )
    assert table.returncode == 0 and "[/]x|<b>" in table.stdout, table.stderr
    assert "| [/]x\\|&lt;b&gt; | ✅ PASS |" in md.stdout
    case = ET.fromstring(junit.stdout.split("\n", 1)[1]).find("testsuite/testcase")
    assert case is not None and case.get("name") == "[/]x|<b>"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_gate_leaves_the_databases_byte_identical(tmp_path: Path) -> None:
    """Nothing is written: not the verdict of a run judged for the first time, not a run
    left running by a process that is gone (a writing command would mark it crashed). The
    file is byte-identical and its write-ahead log, which a read-only open of a WAL database
    creates beside it, stays empty."""
    db = tmp_path / "s.db"
    conn = _db(db)
    rid = _soak(conn, cell="orphan", status="running", pid=2**22 + 7)
    _soak(conn, cell="unjudged")
    conn.execute("UPDATE runs SET verdict = NULL")
    conn.execute("DELETE FROM verdicts")
    conn.close()
    before = _digest(db)
    doc = _json(*REL, "--db", str(db))
    wal = db.with_name(db.name + "-wal")
    assert _digest(db) == before and (not wal.exists() or wal.stat().st_size == 0)
    assert _cells(doc) == {"orphan": "INVALID", "unjudged": "PASS"}
    assert "process on this host is gone" in next(c["reason"] for c in doc["cells"]
                                                  if c["run"]["id"] == rid)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--db", "a.db", "--db", "b.db", "--latest"], "one --db for one run"),
        (["--latest", *REL], "not both"),
        (["--label", "release"], "expected NAME=VALUE"),
    ],
    ids=["two-dbs-one-run", "run-and-label", "bad-label"],
)
def test_mixing_one_run_and_many_runs_is_a_usage_error(
    args: list[str], says: str, db_path: Path
) -> None:
    r = _gate(*args)
    assert r.returncode == 2 and says in error_lines(r.stderr)[-1], r.stderr


def test_a_missing_database_is_a_usage_error(tmp_path: Path) -> None:
    r = _gate(*REL, "--db", str(tmp_path / "nope.db"))
    assert r.returncode == 2 and "no run database here" in r.stderr, r.stderr


def _soak_cli(db: Path, cell: str, *extra: str) -> subprocess.Popen[bytes]:
    """A real 4 s `soakd run --label release=1.4.0 -l cell=CELL` soak into ``db``."""
    argv = ["run", "--duration", "4s", "--fps", "20", "--no-live", "--db", str(db)]
    argv += [*SYNTH_CLI, *REL, "-l", f"cell={cell}", *extra]
    return subprocess.Popen(soakd_cmd(*argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.slow
def test_real_soaks_on_two_databases_gate_to_the_failing_cell(tmp_path: Path) -> None:
    """Two real `soakd run --label` soaks at once, one raising on every 3rd frame, each in its
    own database: the gate over both exits 1 and names the failing cell and criterion."""
    procs = {
        "healthy": _soak_cli(tmp_path / "healthy.db", "healthy"),
        "errors": _soak_cli(tmp_path / "errors.db", "errors", "--set", "workload.error_every=3"),
    }
    assert {n: p.wait(timeout=120) for n, p in procs.items()} == {"healthy": 0, "errors": 1}
    doc = _json(*REL, "--db", str(tmp_path / "healthy.db"), "--db", str(tmp_path / "errors.db"))
    assert doc["verdict"]["exit_code"] == 1
    assert _cells(doc) == {"errors": "FAIL", "healthy": "PASS"}
    bad = next(c for c in doc["cells"] if c["status"] == "FAIL")
    assert bad["run"]["db"].endswith("errors.db")
    assert [p["criterion"] for p in bad["criteria"]] == ["errors"]

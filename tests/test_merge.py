"""`soakd merge OUT IN...`: run databases from many hosts brought into one, every row kept,
idempotent, a later copy of a live database finishing its runs, bad inputs refused whole.

Inputs are real SQLite files: two made by real short soaks (module fixture ``soaked``), the
others written the way the runner writes runs (``make_run`` plus inserted rows)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from soakd.cli import main
from soakd.store import db as store
from soakd.store.runs import close_run, set_baseline, set_verdict
from soakd.store.schema import MIGRATIONS, SCHEMA_VERSION

from .conftest import SYNTH_CLI, make_run, run_cli

TABLES = ("runs", "labels", "frames", "samples", "emissions", "events", "verdicts", "baselines")
SOAK = ("--duration", "2s", "--no-live", "--set", "run.fps=20", "-l", "release=1.4.0")


def _rows(db: Path, table: str) -> list[tuple[object, ...]]:
    """Every row of ``table`` (events without their per-database id, in id order)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        if table == "events":
            sql = "SELECT run_id, t, wall, kind, frame_id, message, data FROM events ORDER BY id"
            return conn.execute(sql).fetchall()
        return sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
    finally:
        conn.close()


def _content(db: Path) -> list[str] | None:
    """The whole database as SQL text (None: no file): what "unchanged" means."""
    if not db.exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def _files(db: Path) -> dict[str, str]:
    """Hashes of the database file and its -wal: what "never changed" means for an input."""
    files = [db, db.with_name(db.name + "-wal")]
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.exists()}


def _frames(conn: sqlite3.Connection, rid: str, ids: range) -> None:
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, total_ms) VALUES (?,?,?,?,5)",
        [(rid, i, i / 10, i / 10) for i in ids],
    )


def _merge(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, list[str]]:
    """``soakd merge ARGV`` in this process: exit code, stdout, stderr lines."""
    code = main(["merge", *map(str, argv)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err.splitlines()


def _merged_json(capsys: pytest.CaptureFixture[str], *argv: object) -> list[dict[str, Any]]:
    """``soakd merge ARGV -f json`` in this process: its per-input results."""
    code, out, err = _merge(capsys, *argv, "-f", "json")
    assert code == 0, err
    inputs: list[dict[str, Any]] = json.loads(out)["inputs"]
    return inputs


@pytest.fixture(scope="module")
def soaked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two databases from two real 2 s soaks run at once, labelled node=a / node=b; node b's
    with an impossible frame-age limit (FAIL), and its host rewritten to ``node-b`` (as if
    it had run there)."""
    d = tmp_path_factory.mktemp("soaks")
    a, b = d / "node-a.db", d / "node-b.db"
    extra = {a: ("-l", "node=a"), b: ("-l", "node=b", "--set", "criteria.max_age_p95_ms=1e-6")}
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda p: run_cli("run", "--db", str(p), *SOAK, *SYNTH_CLI,
                                               *extra[p]), (a, b)))  # fmt: skip
    # node a: any verdict (a busy host can fail or invalidate 2 s), node b: FAIL
    assert [r.returncode for r in done][1] == 1 and done[0].returncode in (0, 1, 3), done[0].stderr
    conn = sqlite3.connect(b)
    with conn:
        conn.execute("UPDATE runs SET host = 'node-b'")
    conn.close()
    return a, b


def test_two_soaked_databases_merge_with_every_row_host_label_and_verdict(
    soaked: tuple[Path, Path], tmp_path: Path
) -> None:
    """Every table of OUT holds exactly the rows of both inputs; `runs` lists both runs with
    their hosts and labels; `gate RUN` gives the same verdict on OUT as on its source."""
    a, b = soaked
    out = tmp_path / "out.db"
    r = run_cli("merge", str(out), str(a), str(b))
    assert r.returncode == 0, r.stderr
    added = "runs 1 added, 0 updated, 0 unchanged, 0 conflicting; 0 baseline(s) added"
    assert r.stdout.splitlines() == [
        f"{a}: {added}",
        f"{b}: {added}",
        f"{out}: 2 runs after merging 2 database(s)",
    ]
    for t in TABLES:
        both = _rows(a, t) + _rows(b, t)
        assert _rows(out, t) == (both if t == "events" else sorted(both, key=repr)), t
    rid_a, rid_b = _rows(a, "runs")[0][0], _rows(b, "runs")[0][0]
    gates = [("gate", rid, "--db", str(db)) for rid, src in ((rid_a, a), (rid_b, b))
             for db in (src, out)]  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        listed, *judged = pool.map(lambda argv: run_cli(*argv),
                                   [("runs", "--db", str(out), "-f", "json"), *gates])  # fmt: skip
    runs = {d["run_id"]: d["labels"] for d in map(json.loads, listed.stdout.splitlines())}
    assert runs == {rid_a: {"node": "a", "release": "1.4.0"},
                    rid_b: {"node": "b", "release": "1.4.0"}}  # fmt: skip
    conn = sqlite3.connect(out)
    hosts = dict(conn.execute("SELECT id, host FROM runs").fetchall())
    conn.close()
    assert hosts == {rid_a: os.uname().nodename, rid_b: "node-b"}
    src_a, out_a, src_b, out_b = ((g.returncode, g.stdout) for g in judged)
    assert src_a == out_a and src_b == out_b and out_b[0] == 1


def test_merging_the_same_databases_again_adds_nothing(
    soaked: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second merge of the same inputs reports every run unchanged and leaves OUT as it
    was, row for row."""
    out = tmp_path / "out.db"
    _merge(capsys, out, *soaked)
    before = _content(out)
    again = _merged_json(capsys, out, *soaked, soaked[0])
    assert [(i["added"], i["updated"], i["unchanged"]) for i in again] == [(0, 0, 1)] * 3
    assert _content(out) == before


def test_a_later_copy_of_a_live_database_replaces_the_run_it_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A live input (a writer mid-transaction on it) is merged without waiting for the
    writer, without its uncommitted rows and without a byte of it changed; a later copy
    (more rows, or the run ended there) replaces OUT's rows of that run with its own; an
    older copy merged afterwards changes nothing."""
    live, snap, out = tmp_path / "live.db", tmp_path / "snap.db", tmp_path / "out.db"
    conn = store.connect(live)
    rid = make_run(conn, status="running")
    conn.execute("INSERT INTO labels VALUES (?, 'release', '1.4.0')", (rid,))
    _frames(conn, rid, range(10))
    writer = sqlite3.connect(live, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    _frames(writer, rid, range(10, 20))
    before = _files(live)
    assert _merged_json(capsys, out, live)[0]["runs"]["added"] == [rid]
    assert _files(live) == before and len(_rows(out, "frames")) == 10
    writer.execute("COMMIT")  # the merge held no lock on the input
    writer.close()
    conn.execute(f"VACUUM INTO '{snap}'")  # a later copy, taken while the run still ran
    assert _merged_json(capsys, out, snap)[0]["updated"] == 1  # more rows: further along
    assert len(_rows(out, "frames")) == 20
    with store.atomic(conn):
        _frames(conn, rid, range(20, 30))
        close_run(conn, rid, status="completed", reason=None, ended_unix=2e9, duration_s=3.0,
                  summary={"frames": 30})  # fmt: skip
        set_verdict(conn, rid, "PASS", 0)
    updated = _merged_json(capsys, out, live)
    assert updated[0]["updated"] == 1 and updated[0]["warnings"] == []
    for t in TABLES:
        assert _rows(out, t) == _rows(live, t), t
    finished = _content(out)
    assert _merged_json(capsys, out, snap)[0]["unchanged"] == 1
    assert _content(out) == finished


def test_two_different_ended_copies_keep_out_s_with_one_warning_naming_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ended copies of one run that differ (another verdict), or two different runs
    under one id (another host), keep OUT's copy and warn once each, naming the run."""
    rid = "20261203T120000-c0ffee"
    dbs = {}
    for name, verdict, host in (("pass", "PASS", None), ("fail", "FAIL", None),
                                ("other", "PASS", "elsewhere")):  # fmt: skip
        dbs[name] = tmp_path / f"{name}.db"
        conn = store.connect(dbs[name])
        make_run(conn, id=rid, started_unix=1000.0, host=host)
        set_verdict(conn, rid, verdict, 0)
        conn.close()
    out = tmp_path / "out.db"
    _merge(capsys, out, dbs["pass"])
    code, stdout, err = _merge(capsys, out, dbs["fail"], dbs["other"])
    assert code == 0 and stdout.count("0 added, 0 updated, 0 unchanged, 1 conflicting") == 2
    assert err == [
        f"soakd: warning: {dbs['fail']}: run {rid}: differs from the copy in {out} and both"
        f" have ended; kept {out}'s",
        f"soakd: warning: {dbs['other']}: run {rid}: {out} holds a different run under this id"
        f" (host {os.uname().nodename} started 1970-01-01T00:16:40Z, here host elsewhere"
        f" started 1970-01-01T00:16:40Z); kept {out}'s",
    ]
    assert _rows(out, "runs") == _rows(dbs["pass"], "runs")


def test_another_host_s_run_under_the_id_of_a_running_one_never_replaces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy further along only replaces the same run (same host, start, pid, config): a
    finished run from another host that happens to share a running run's id conflicts."""
    live, other, out = tmp_path / "live.db", tmp_path / "other.db", tmp_path / "out.db"
    for path, status, host in ((live, "running", None), (other, "completed", "elsewhere")):
        conn = store.connect(path)
        make_run(conn, id="20261203T120000-c0ffee", started_unix=1000.0, status=status, host=host)
        conn.close()
    _merge(capsys, out, live)
    assert _merged_json(capsys, out, other)[0]["conflicting"] == 1
    assert _rows(out, "runs") == _rows(live, "runs")


def test_baselines_are_copied_when_their_name_is_free_and_kept_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A baseline name free in OUT is copied; one OUT binds to another run stays OUT's, with
    a warning naming it."""
    one, two, out = tmp_path / "one.db", tmp_path / "two.db", tmp_path / "out.db"
    picks = {}
    for path, names in ((one, ("default",)), (two, ("default", "nightly"))):
        conn = store.connect(path)
        picks[path] = make_run(conn)
        for name in names:
            set_baseline(conn, name, picks[path])
        conn.close()
    code, stdout, err = _merge(capsys, out, one, two)
    assert code == 0 and stdout.splitlines()[1].endswith("; 1 baseline(s) added")
    assert err == [
        f"soakd: warning: {two}: baseline 'default' is run {picks[two]} here but run"
        f" {picks[one]} in {out}; kept {out}'s"
    ]
    conn = sqlite3.connect(out)
    assert dict(conn.execute("SELECT name, run_id FROM baselines")) == {
        "default": picks[one],
        "nightly": picks[two],
    }
    conn.close()


def _good(path: Path) -> Path:
    conn = store.connect(path)
    _frames(conn, make_run(conn), range(5))
    conn.close()
    return path


def _bad(kind: str, tmp_path: Path, out: Path) -> Path:
    """An input ``soakd merge`` must refuse, of the given kind."""
    path = tmp_path / f"{kind}.db"
    if kind == "not-sqlite":
        path.write_text("frame_id,total_ms\n" * 100)
    elif kind == "not-soakd":
        sqlite3.connect(path).execute("CREATE TABLE readings (x)").connection.close()
    elif kind in ("newer", "older"):
        conn = store.connect(_good(path))
        if kind == "newer":
            conn.execute("INSERT INTO _migrations VALUES ('9999_from_the_future', 'now')")
        else:
            conn.execute("DELETE FROM _migrations WHERE name = ?", (MIGRATIONS[-1][0],))
        conn.close()
    elif kind == "out-itself":
        (tmp_path / "sub").mkdir()
        return tmp_path / "sub" / ".." / out.name
    elif kind == "hard-link":
        os.link(out, path)
    return path


REFUSALS = {
    "missing": "no such file",
    "not-sqlite": "not an SQLite database",
    "not-soakd": "not a soakd run database (no _migrations or runs table)",
    "out-itself": "is the output database",
    "hard-link": "is the output database",
    "newer": f"schema version 9999 (written by a newer soakd: 9999_from_the_future unknown"
    f" here), this soakd's is {SCHEMA_VERSION}",
    "older": f"schema version {SCHEMA_VERSION - 1} (lacks {MIGRATIONS[-1][0]}), this soakd's"
    f" is {SCHEMA_VERSION}: upgrade it first by opening it once with this soakd, e.g."
    " `soakd runs --db",
}


@pytest.mark.parametrize("kind", REFUSALS)
def test_an_input_that_cannot_be_merged_is_refused_before_anything_is_written(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing file, a non-SQLite file, a non-soakd database, OUT itself (another spelling,
    a hard link) or another schema version: exit 2, one line naming the input, and OUT is
    left as it was, even for the good input named before it."""
    out = tmp_path / "out.db"
    _merge(capsys, out, _good(tmp_path / "first.db"))
    before = _content(out)
    bad = _bad(kind, tmp_path, out)
    code, stdout, err = _merge(capsys, out, _good(tmp_path / "second.db"), bad)
    assert (code, stdout) == (2, "")
    assert len(err) == 1 and err[0].startswith(f"soakd: error: {bad}: {REFUSALS[kind]}"), err
    assert _content(out) == before


def test_a_refused_input_leaves_no_output_file_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OUT is only created once every input has passed its checks."""
    out = tmp_path / "new.db"
    assert _merge(capsys, out, _good(tmp_path / "a.db"), tmp_path / "gone.db")[0] == 2
    assert not out.exists()


def test_a_merge_failing_midway_leaves_out_as_it_was_before_that_input(
    soaked: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """When copying the second input fails after some of its rows went in (here: OUT
    refuses its events), that input's rows are all rolled back, the first input's stay,
    and the failure is one line, exit 4."""
    a, b = soaked
    out = tmp_path / "out.db"
    rid_b = _rows(b, "runs")[0][0]
    conn = store.connect(out)
    conn.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.run_id = '{rid_b}'"
                 " BEGIN SELECT RAISE(ABORT, 'disk on fire'); END")  # fmt: skip
    conn.close()
    code, stdout, err = _merge(capsys, out, a, b)
    assert code == 4 and stdout.splitlines()[0].startswith(f"{a}: runs 1 added")
    assert err == [
        f"soakd: error: merging {b} into {out}: disk on fire; {out} is as it was before {b}"
    ]
    for t in TABLES:
        assert _rows(out, t) == _rows(a, t), t

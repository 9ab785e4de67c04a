"""Hostile input through the real CLI (issue 24): each value or file an operator, a script or
a damaged disk can hand soakd is refused with one line naming it and a documented exit code,
never a traceback, never a run that dies later (exit 4) or leaves no verdict."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import click
import pytest
import typer
from click.testing import CliRunner, Result
from pydantic import BaseModel

from soakd import config
from soakd.analysis.model import MIN_WINDOWS
from soakd.cli import app, main
from soakd.config import ConfigError, load_settings
from soakd.records import FrameRecord
from soakd.store import db as store

from .conftest import REPO, SYNTH_CLI, error_lines, make_run, soakd_cmd


@click.command(
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def _soakd(argv: tuple[str, ...]) -> None:
    """The soakd entry point (``soakd.cli.main``: exit codes, one-line usage errors) as one
    click command, so that click's CliRunner runs it in this process and captures it."""
    raise SystemExit(main(list(argv)))


def cli(*args: str) -> Result:
    """``soakd ARGS`` in this process, through click's CliRunner (stdout, stderr apart)."""
    return CliRunner().invoke(_soakd, list(args), catch_exceptions=False)


#: the app's click command, built once (``main`` builds it on each call, 70 ms): what typer's
#: CliRunner invokes, for the sweep below that runs `soakd run` a few hundred times
_RUN_APP = typer.main.get_command(app)


def cli_app(*args: str) -> Result:
    """``soakd ARGS`` through the app's click command (its config errors are the same one
    line and exit code as ``main``'s; only usage errors are printed by click instead)."""
    return CliRunner().invoke(_RUN_APP, list(args), prog_name="soakd", catch_exceptions=False)


def one_error(stderr: str) -> str:
    """The one line a refusal prints (asserted to be exactly one, with no traceback)."""
    lines = error_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith("soakd: error: "), stderr[-3000:]
    return lines[0]


def _missing_db(tmp_path: Path) -> str:
    """A database path whose folder does not exist: a config soakd accepted would still
    stop there (one line, exit 2) before any workload is built, naming the folder."""
    return str(tmp_path / "no-such-folder" / "soakd.db")


# --- 1. a list or table as workload.kind


def test_a_workload_kind_that_is_a_list_or_a_table_is_one_line_exit_2(tmp_path: Path) -> None:
    """`workload.kind` given as a list or a table (--set or a TOML file) is refused with one
    line naming workload.kind and exit 2, not an `unhashable type` traceback (exit 4)."""
    toml = tmp_path / "kind.toml"
    toml.write_text('[workload]\nkind = ["synthetic"]\n', encoding="utf-8")
    db = _missing_db(tmp_path)
    for args in (
        ["--set", "workload.kind=[1]"],
        ["--set", "workload.kind={a=1}"],
        [str(toml)],
    ):
        r = cli("run", "--db", db, *args)
        line = one_error(r.stderr)
        assert r.exit_code == 2 and line.startswith("soakd: error: workload.kind: "), args
        assert "unhashable" not in line


# --- 2. durations and counts past what a run can use


def test_a_duration_past_a_year_is_refused_as_a_flag_and_as_a_key(tmp_path: Path) -> None:
    """`--duration 1e308` and `run.duration = 1e308` are refused before the run starts (one
    line, exit 2), not accepted and then an OverflowError in the monitor (exit 4)."""
    db = _missing_db(tmp_path)
    r = cli("run", "--db", db, "--duration", "1e308")
    assert r.exit_code == 2 and one_error(r.stderr).startswith("soakd: error: --duration: ")
    r = cli("run", "--db", db, "--set", "run.duration=1e308")
    assert r.exit_code == 2 and one_error(r.stderr).startswith("soakd: error: run.duration: ")


def test_the_duration_bound_is_a_year_exactly() -> None:
    """A run of exactly MAX_DURATION_S (one year) is accepted; a second more is refused."""
    year = config.MAX_DURATION_S
    assert year == 365 * 86_400
    assert load_settings(overrides=[f"run.duration={year:.0f}"]).run.duration == year
    with pytest.raises(ConfigError, match=r"^run\.duration: "):
        load_settings(overrides=[f"run.duration={year + 1:.0f}"])


def _number_kind(ann: Any) -> tuple[type, bool] | None:
    """(int or float, whether it is a list of them) when a field holds numbers; None for
    anything else (strings, tables: ``generate_kwargs``, ``options`` and ``extra_body``
    are passed through to the model or factory, not soakd's own settings)."""
    origin = typing.get_origin(ann)
    if ann in (int, float):
        return ann, False
    if origin is dict or origin is typing.Literal:
        return None
    if origin is tuple:
        inner = _number_kind(typing.get_args(ann)[0])
        return (inner[0], True) if inner else None
    for arg in typing.get_args(ann):
        if arg is not type(None) and (found := _number_kind(arg)):
            return found
    return None


def _sub_model(ann: Any) -> type[BaseModel] | None:
    """The model of a field that holds a list of tables (``workload.questions``)."""
    if typing.get_origin(ann) is tuple:
        (arg, *_) = typing.get_args(ann)
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _toml(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(v) if isinstance(v, str) else str(v)


def _required(model: type[BaseModel], tmp_path: Path) -> dict[str, Any]:
    """Values for a model's required keys: an existing file for a string (a path such as
    matrix_game's checkpoint), 1 for a number."""
    (tmp_path / "f").touch()
    out: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        if f.is_required() and name != "kind":
            out[name] = 1 if _number_kind(f.annotation) else str(tmp_path / "f")
    return out


def _number_settings(tmp_path: Path, value: str) -> list[tuple[str, list[str]]]:
    """Every number setting of every section and every built-in workload kind, found by
    walking the pydantic models: (its key path, the --set overrides setting it to
    ``value``, a list of them for a list setting, with the keys its table requires)."""
    sections: list[tuple[str, type[BaseModel], dict[str, Any]]] = [
        (name, typing.cast(type[BaseModel], f.annotation), {})
        for name, f in config.Settings.model_fields.items()
        if name != "workload"
    ]
    for kind, model in config.BUILTIN_WORKLOADS.items():
        sections.append(("workload", model, {"kind": kind, **_required(model, tmp_path)}))
    out: list[tuple[str, list[str]]] = []
    for section, model, base in sections:
        for name, f in model.model_fields.items():
            key = f"{section}.{name}"
            head = [f"{section}.{k}={_toml(v)}" for k, v in base.items() if k != name]
            if sub := _sub_model(f.annotation):
                for inner, g in sub.model_fields.items():
                    if found := _number_kind(g.annotation):
                        item = {**_required(sub, tmp_path), inner: value}
                        text = _toml(item).replace(f"'{value}'", value)
                        out.append((f"{key}.0.{inner}", [*head, f"{key}=[{text}]"]))
                continue
            if found := _number_kind(f.annotation):
                out.append((key, [*head, f"{key}={f'[{value}]' if found[1] else value}"]))
    return out


@pytest.mark.parametrize("value", ["1e308", "-1e308", "1" + "0" * 30])
def test_every_number_setting_refuses_an_absurd_value_with_one_line_exit_2(
    tmp_path: Path, value: str
) -> None:
    """Each duration, count and other number setting (walked from the config models, so a
    new one is covered) refuses 1e308, -1e308 and 10**30 with one line naming its key and
    exit 2, instead of being accepted and failing in the middle of a run."""
    found = _number_settings(tmp_path, value)
    assert len(found) > 80, found  # the walk found the settings (about 100)
    db = _missing_db(tmp_path)
    wrong = []
    for key, overrides in found:
        r = cli_app("run", "--db", db, *(a for o in overrides for a in ("--set", o)))
        lines = error_lines(r.stderr)
        if r.exit_code != 2 or len(lines) != 1 or not lines[0].startswith(f"soakd: error: {key}"):
            wrong.append((key, r.exit_code, lines[-1:]))
    assert not wrong, wrong


# --- 3. a schema changed by hand


def _db_with_frames(path: Path, frames: int = 10) -> str:
    """A run database written through the store: one finished run with ``frames`` rows."""
    conn = store.connect(path)
    try:
        rid = make_run(conn, id="r1")
        rows = [FrameRecord(i, i / 10, i / 10, i / 10, i / 10 + 0.02, 0.1, 0.2, 1.0, 15.5,
                            1.0, 17.7, 1, 0.4, 21.0) for i in range(frames)]  # fmt: skip
        with store.atomic(conn):
            store.insert_rows(conn, FrameRecord, rid, [store.frame_values(r) for r in rows])
    finally:
        conn.close()
    return rid


def _sql(path: Path, *statements: str) -> list[tuple[Any, ...]]:
    """Run ``statements`` on one plain sqlite3 connection; the last one's rows."""
    conn = sqlite3.connect(path)
    try:
        rows = [conn.execute(sql).fetchall() for sql in statements][-1]
        conn.commit()
        return rows
    finally:
        conn.close()


def test_a_column_renamed_by_hand_is_refused_at_open_naming_table_and_column(
    tmp_path: Path,
) -> None:
    """A database whose frames.infer_ms was renamed without a new schema version is refused
    when `soakd run` opens it (one line naming frames and infer_ms, exit 2, no run row), not
    at the first flush (exit 4, no verdict); `soakd runs` and `soakd merge` refuse it too."""
    db = tmp_path / "soakd.db"
    _db_with_frames(db)
    # legacy_alter_table: the rename goes through although views name the column (as with
    # an older SQLite, or a tool that sets it)
    _sql(db, "PRAGMA legacy_alter_table = ON", "ALTER TABLE frames RENAME COLUMN infer_ms TO x")
    cmd = soakd_cmd("run", "--db", str(db), "--duration", "1", "--fps", "20", "--no-live",
                    "--set", "workload.kind=synthetic", "--set", "run.warmup_s=0")  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    line = one_error(p.stderr)
    assert p.returncode == 2 and "frames" in line and "infer_ms" in line, p.stderr[-2000:]
    assert _sql(db, "SELECT id FROM runs") == [("r1",)]
    r = cli("runs", "--db", str(db))
    assert r.exit_code == 2 and "frames" in one_error(r.stderr) and "infer_ms" in r.stderr
    r = cli("merge", str(tmp_path / "out.db"), str(db))
    assert r.exit_code == 2 and "frames" in one_error(r.stderr) and "infer_ms" in r.stderr


# --- 4. soakd merge: a damaged input, a folder as OUT


def _damage_first_pages(path: Path) -> None:
    """Overwrite the file's schema page (page 1 after the 100-byte header)."""
    with path.open("r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 3000)


def _truncate(path: Path) -> None:
    """Keep only the first page: every table's pages are gone."""
    data = path.read_bytes()
    path.write_bytes(data[:4096])


@pytest.mark.parametrize("damage", [_damage_first_pages, _truncate])
def test_merge_names_a_damaged_input_as_damaged(tmp_path: Path, damage: Any) -> None:
    """A damaged input is one line naming the file as damaged (malformed) with the
    quick_check hint, exit 2, nothing written: not "cannot open read-only: unable to open
    database: file:...?immutable=1"."""
    good, bad, out = tmp_path / "good.db", tmp_path / "bad.db", tmp_path / "out.db"
    _db_with_frames(good)
    shutil.copy(good, bad)
    damage(bad)
    r = cli("merge", str(out), str(bad))
    line = one_error(r.stderr)
    assert r.exit_code == 2 and line.startswith(f"soakd: error: {bad}: "), line
    assert "damaged" in line and "malformed" in line and "PRAGMA quick_check" in line, line
    assert "immutable" not in line and "cannot open" not in line, line
    assert not out.exists()


def test_merge_says_a_folder_given_as_out_or_in_is_a_folder(tmp_path: Path) -> None:
    """A folder given as OUT is one line saying OUT is a directory (not the message of an
    input that cannot be opened); a folder given as an input says the same of that input."""
    good, folder = tmp_path / "good.db", tmp_path / "folder"
    _db_with_frames(good)
    folder.mkdir()
    r = cli("merge", str(folder), str(good))
    line = one_error(r.stderr)
    assert r.exit_code == 2 and line.startswith(f"soakd: error: {folder}: "), line
    assert "OUT" in line and "is a directory" in line and "cannot open" not in line, line
    r = cli("merge", str(tmp_path / "out.db"), str(folder))
    line = one_error(r.stderr)
    assert r.exit_code == 2 and line.startswith(f"soakd: error: {folder}: "), line
    assert "is a directory" in line, line


# --- 5. soakd export to a closed pipe or a full device


@pytest.fixture(scope="module")
def big_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose CSV export (about 1.5 MB) is far larger than a pipe's buffer (64 KiB)."""
    db = tmp_path_factory.mktemp("export") / "soakd.db"
    _db_with_frames(db, frames=12_000)
    return db


def _export_sh(db: Path, tmp_path: Path, *args: str, tail: str) -> tuple[int, str, str]:
    """``soakd export r1 --db DB ARGS 2>FILE TAIL`` in bash (TAIL: a pipe or a redirection of
    its stdout); (soakd's exit status, what reached stdout, soakd's stderr)."""
    err = tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "soakd", "export", "r1", "--db", str(db), *args]
    script = " ".join(f"'{a}'" for a in cmd) + f" 2>'{err}' {tail}; exit ${{PIPESTATUS[0]}}"
    p = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    return p.returncode, p.stdout, err.read_text()


def test_export_into_a_closed_pipe_ends_quietly_with_exit_0(big_db: Path, tmp_path: Path) -> None:
    """`soakd export ... | head -1` exits 0 with nothing on stderr (as `sqlite-utils` and
    `cat` do): no "Broken pipe" error and no "Exception ignored" noise."""
    rc, out, err = _export_sh(big_db, tmp_path, tail="| head -1")
    assert (rc, err) == (0, "") and len(out.splitlines()) == 1, (rc, err[-2000:])


@pytest.mark.parametrize(
    "where",
    [["-o", "/dev/full"], ["-f", "jsonl", ">/dev/full"], ["-f", "parquet", "-o", "/dev/full"]],
)
def test_export_to_a_full_device_is_one_line_exit_4(
    big_db: Path, tmp_path: Path, where: list[str]
) -> None:
    """Export to a full device (-o /dev/full, stdout on /dev/full, parquet) is one line saying
    the device is full and exit 4 (the environment failed: the README's exit-code table),
    with no "Exception ignored ... closed database" after it."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    if "parquet" in where:
        pytest.importorskip("pyarrow")
    redirect = " ".join(w for w in where if w.startswith(">"))
    args = [w for w in where if not w.startswith(">")]
    rc, _, err = _export_sh(big_db, tmp_path, *args, tail=redirect)
    line = one_error(err)
    assert rc == 4 and "No space left on device" in line, err[-2000:]


# --- 6. nan and infinity as numeric options


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["prune", "--keep-days", "nan"], "--keep-days"),
        (["prune", "--keep-days", "inf"], "--keep-days"),
        (["compare", "a", "b", "--fail-on-regression", "nan"], "--fail-on-regression"),
        (["compare", "a", "b", "--fail-on-regression", "inf"], "--fail-on-regression"),
        (["compare", "a", "b", "--alpha", "nan"], "--alpha"),
    ],
)
def test_nan_or_infinity_as_a_numeric_option_is_not_a_number(
    tmp_path: Path, args: list[str], option: str
) -> None:
    """A numeric option given nan or inf is one line naming the option and saying it is not
    a (finite) number, exit 2 (not "greater than or equal to 0", and never silently taken:
    a nan --fail-on-regression would never fail)."""
    db = tmp_path / "soakd.db"
    _db_with_frames(db)
    r = cli(*args, "--db", str(db))
    line = one_error(r.stderr)
    assert r.exit_code == 2 and option in line and "greater than" not in line, line
    assert re.search(r"'(nan|inf)' is not a (finite )?number", line), line


def test_a_run_count_past_2_53_is_a_usage_error_not_an_overflow(tmp_path: Path) -> None:
    """`soakd runs --limit 10**24` is one line naming --limit, exit 2, not SQLite's
    OverflowError ("Python int too large to convert to SQLite INTEGER", exit 4)."""
    db = tmp_path / "soakd.db"
    _db_with_frames(db)
    r = cli("runs", "--limit", "1" + "0" * 24, "--db", str(db))
    line = one_error(r.stderr)
    assert r.exit_code == 2 and "'--limit'" in line and str(config.MAX_NUMBER) in line, line


# --- issue 32: hostile data never a traceback


@pytest.fixture(scope="module")
def passing_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 6 s synthetic soak that PASSes (stored by `soakd run`; 3 s was seen INVALID on
    a busy machine: too few frame-age windows): copied and damaged by the tests below."""
    db = tmp_path_factory.mktemp("passing") / "soakd.db"
    p = subprocess.run(
        soakd_cmd("run", "--db", str(db), "--duration", "6", "--fps", "20", "--no-live",
                  *SYNTH_CLI),
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return db


def _copy(src: Path, tmp_path: Path, *statements: str) -> Path:
    """A copy of ``src`` with ``statements`` run on it (by hand, as another tool would)."""
    db = tmp_path / "copy.db"
    shutil.copy(src, db)
    if statements:
        _sql(db, *statements)
    return db


#: a command of each kind that reads --db
_DB_COMMANDS = [
    ["runs"], ["show", "x"], ["gate", "x"], ["report", "x"], ["export", "x"], ["baseline", "list"],
    ["prune", "--keep-days", "1"],
]  # fmt: skip


@pytest.mark.parametrize(
    "command",
    _DB_COMMANDS,
)
def test_an_empty_db_path_is_one_line_naming_it_a_folder(command: list[str]) -> None:
    """`--db ''` (the current folder) is one line saying --db names a folder, not a run
    database, exit 2: not "PosixPath('.') has an empty name" (a Traceback, exit 4)."""
    r = cli(*command, "--db", "")
    line = one_error(r.stderr)
    assert r.exit_code == 2 and "--db '.'" in line and "is a folder" in line, line


def test_an_empty_run_id_is_one_line_saying_it_is_empty(passing_db: Path, tmp_path: Path) -> None:
    """`soakd show ''` (and gate, report, export) says the run id is empty, exit 2: not
    ": ambiguous run id prefix" (every id starts with '') or the only run picked."""
    db = _copy(passing_db, tmp_path)
    for command in ("show", "gate", "report", "export"):
        r = cli(command, "", "--db", str(db))
        line = one_error(r.stderr)
        assert r.exit_code == 2 and "the run id is empty" in line, (command, line)


def test_toml_nested_500_levels_is_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    """A value nested 500 levels deep in --set, a config file or a plan file is one line
    saying it is nested too deeply, exit 2 (not a RecursionError, exit 4)."""
    deep = "[" * 500 + "]" * 500
    conf, plan = tmp_path / "deep.toml", tmp_path / "plan.toml"
    conf.write_text(f"[run]\nname = {deep}\n", encoding="utf-8")
    plan.write_text(f'[plan]\nname = "p"\n[axes]\n"run.fps" = {deep}\n', encoding="utf-8")
    db = _missing_db(tmp_path)
    for args, where in (
        (["run", "--db", db, "--set", f"run.name={deep}"], "--set run.name: "),
        (["run", "--db", db, str(conf)], f"{conf}: "),
        (["plan", "show", str(plan)], f"{plan}: "),
    ):
        r = cli(*args)
        line = one_error(r.stderr)
        assert r.exit_code == 2 and line.startswith(f"soakd: error: {where}"), line
        assert "nested too deeply" in line, line


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("UPDATE frames SET infer_ms = 'abc' WHERE frame_id = 30", "frames.infer_ms = 'abc'"),
        ("UPDATE samples SET rss_bytes = 'abc' WHERE seq = 5", "samples.rss_bytes = 'abc'"),
        ("UPDATE samples SET t = 9e999 WHERE seq = 5", "samples.t = inf"),
        ("UPDATE runs SET duration_s = 9e999", "runs.duration_s = inf"),
        ("UPDATE runs SET started_unix = 'abc'", "runs.started_unix = 'abc'"),
    ],
)
def test_a_damaged_value_is_named_by_gate_report_and_show(
    passing_db: Path, tmp_path: Path, damage: str, named: str
) -> None:
    """Text in a numeric column or an infinite time, written by hand, is one line naming
    the table, column and value as damaged, exit 2, from gate, report (md, html) and show:
    not a Traceback (exit 4)."""
    db = _copy(passing_db, tmp_path, damage)
    for command in (["gate"], ["report"], ["report", "-f", "html"], ["show"]):
        r = cli(*command, "--latest", "--db", str(db))
        line = one_error(r.stderr)
        assert r.exit_code == 2 and named in line and "damaged value" in line, (command, line)


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE frames SET infer_ms = 9e999 WHERE frame_id = 30",
        "UPDATE frames SET infer_ms = -9e999 WHERE frame_id = 30",
        "UPDATE frames SET frame_age_ms = 9e999 WHERE frame_id = 30",
    ],
)
def test_an_infinite_measurement_is_invalid_evidence_named(
    passing_db: Path, tmp_path: Path, damage: str
) -> None:
    """A ±inf infer_ms or frame_age_ms row is not left out silently (the run PASSed): the
    gate says INVALID (exit 3) and names the column and how many rows."""
    assert cli("gate", "--latest", "--db", str(passing_db)).exit_code == 0
    db = _copy(passing_db, tmp_path, damage)
    r = cli("gate", "--latest", "--db", str(db), "-f", "json")
    assert r.exit_code == 3, r.stdout[-2000:]
    column = damage.split()[3]
    assert f"not a finite number: {column} in 1 row(s)" in r.stdout, r.stdout[-2000:]


def _damage_page(db: Path, table: str) -> None:
    """Overwrite the root page of ``table`` with 0xff bytes (a damaged sector)."""
    (root,) = _sql(db, f"SELECT rootpage FROM sqlite_master WHERE name = '{table}'")[0]
    page = _sql(db, "PRAGMA page_size")[0][0]
    with db.open("r+b") as f:
        f.seek((root - 1) * page)
        f.write(b"\xff" * page)


def test_run_refuses_a_damaged_database_before_it_starts(passing_db: Path, tmp_path: Path) -> None:
    """`soakd run` on a database whose samples pages are damaged is refused before the run
    starts (one line naming it damaged with the quick_check hint, exit 2, no run row): not
    a started run that dies at its first flush (Traceback, exit 4, no verdict)."""
    db = _copy(passing_db, tmp_path)
    _damage_page(db, "samples")
    p = subprocess.run(
        soakd_cmd("run", "--db", str(db), "--duration", "2", "--fps", "20", "--no-live",
                  *SYNTH_CLI),
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    line = one_error(p.stderr)
    assert p.returncode == 2 and "damaged" in line and "PRAGMA quick_check" in line, line
    assert len(_sql(db, "SELECT id FROM runs")) == 1


def _raising_run(tmp_path: Path, what: str) -> subprocess.CompletedProcess[str]:
    """A 3 s soak of tests.hostile_workloads:raises, its infer raising ``what`` on every
    other frame (the rest are timed, so the run can be judged)."""
    return subprocess.run(
        soakd_cmd(
            "run", "--db", str(tmp_path / "soakd.db"), "--duration", "3", "--fps", "20",
            "--no-live", *SYNTH_CLI, "--set", "workload.kind=python",
            "--set", "workload.factory=tests.hostile_workloads:raises",
            "--set", f'workload.options={{what="{what}", every=2}}',
        ),
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip


def test_a_workload_calling_sys_exit_is_a_frame_error_not_a_stall(tmp_path: Path) -> None:
    """A workload whose infer raises SystemExit has each frame recorded as its error
    ("SystemExit: 3"), the run completed and judged FAIL on errors (exit 1): not "stalled"
    with a "no frame finished for 5 s" event at 1 s (exit 4)."""
    p = _raising_run(tmp_path, "system_exit")
    assert p.returncode == 1, p.stderr[-3000:]
    db = tmp_path / "soakd.db"
    assert _sql(db, "SELECT status, reason, verdict FROM runs") == [("completed", None, "FAIL")]
    assert _sql(db, "SELECT count(*) FROM events WHERE kind = 'stall'") == [(0,)]
    assert _sql(db, "SELECT DISTINCT error FROM frames WHERE error IS NOT NULL") == [
        ("SystemExit: 3",)
    ]


def test_a_lone_surrogate_in_an_exception_is_stored_escaped(tmp_path: Path) -> None:
    """An exception whose text holds a lone surrogate ('\\udcff') is stored as that escape
    on each frame and event, the run completed and `errors` FAILs: not aborted by
    "surrogates not allowed" (exit 4). (The run's verdict is FAIL, exit 1, or INVALID, exit
    3, where a loaded host left its 3 s too thin to judge another criterion.)"""
    p = _raising_run(tmp_path, "surrogate")
    assert p.returncode in (1, 3), p.stderr[-3000:]
    db = tmp_path / "soakd.db"
    assert _sql(db, "SELECT status FROM runs") == [("completed",)]
    assert _sql(db, "SELECT status FROM verdicts WHERE criterion = 'errors'") == [("fail",)]
    assert _sql(db, "SELECT DISTINCT error FROM frames WHERE error IS NOT NULL") == [
        ("ValueError: bad byte \\udcff in the model's output",)
    ]


def test_merge_checks_every_input_before_writing_any(passing_db: Path, tmp_path: Path) -> None:
    """`soakd merge OUT GOOD BAD` where BAD's frames pages are damaged (its schema reads
    fine) is refused naming BAD as damaged, exit 2, before GOOD is written: OUT is not
    created (not GOOD merged, then BAD refused midway)."""
    good, bad, out = tmp_path / "good.db", tmp_path / "bad.db", tmp_path / "out.db"
    shutil.copy(passing_db, good)
    _db_with_frames(bad, frames=2000)
    _damage_page(bad, "frames")
    r = cli("merge", str(out), str(good), str(bad))
    line = one_error(r.stderr)
    assert r.exit_code == 2 and line.startswith(f"soakd: error: {bad}: ") and "damaged" in line
    assert not out.exists()


# --- issue 32: wording and small faults


def test_a_bad_max_duration_is_named_as_run_max_duration(tmp_path: Path) -> None:
    """`run.duration = "auto"` with a bad run.max_duration names run.max_duration, not
    run.duration (which the user set to "auto")."""
    for bad in ("bogus", "-5", "1e308"):
        r = cli("run", "--db", _missing_db(tmp_path), "--set", "run.duration=auto",
                "--set", f"run.max_duration={bad}")  # fmt: skip
        line = one_error(r.stderr)
        assert r.exit_code == 2 and line.startswith("soakd: error: run.max_duration: "), line


def test_a_run_name_with_control_characters_is_refused_and_printed_escaped(
    passing_db: Path, tmp_path: Path
) -> None:
    """A run.name holding an ANSI escape is refused at input (exit 2, naming run.name); one
    already in a database (written by hand, with a NUL) is printed escaped by `runs` and
    `show`, never as raw control characters."""
    r = cli("run", "--db", _missing_db(tmp_path), "--set", 'run.name="a\\u001b[2Jb"')
    assert r.exit_code == 2 and one_error(r.stderr).startswith("soakd: error: run.name: ")
    db = _copy(passing_db, tmp_path, "UPDATE runs SET name = 'ev' || char(0) || 'il' || char(27)")
    for command in ("runs", "show"):
        r = cli(command, *([] if command == "runs" else ["--latest"]), "--db", str(db))
        assert r.exit_code == 0 and "\x00" not in r.stdout and "\x1b" not in r.stdout
        assert "ev\\x00il\\x1b" in r.stdout, r.stdout[-2000:]


def test_export_jsonl_writes_an_infinity_as_a_string_not_invalid_json(
    passing_db: Path, tmp_path: Path
) -> None:
    """`export -f jsonl` of a row holding ±inf writes strict JSON (the strings "inf" and
    "-inf"), not `Infinity`, which JSON parsers other than Python's refuse."""
    inf = "UPDATE frames SET infer_ms = 9e999, pre_ms = -9e999 WHERE frame_id = 30"
    db = _copy(passing_db, tmp_path, inf)
    r = cli("export", "--latest", "--db", str(db), "-f", "jsonl")
    assert r.exit_code == 0

    def strict(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    rows = [json.loads(line, parse_constant=strict) for line in r.stdout.splitlines()]
    (row,) = [x for x in rows if x["frame_id"] == 30]
    assert (row["infer_ms"], row["pre_ms"]) == ("inf", "-inf")


@pytest.mark.parametrize(
    "command",
    [["runs"], ["show", "--latest"], ["gate", "--latest"], ["report", "--latest"], ["export"]],
)
def test_a_full_device_is_exit_4_for_every_command_with_o(
    passing_db: Path, tmp_path: Path, command: list[str]
) -> None:
    """`-o /dev/full` and stdout on /dev/full are one line saying the device is full and
    exit 4 for every command (the README's table: the environment failed), as for export:
    not 2 for some commands and a Traceback for a full stdout."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    latest = ["--latest"] if command == ["export"] else []
    cmd = [sys.executable, "-m", "soakd", *command, *latest, "--db", str(passing_db)]
    for tail in (["-o", "/dev/full"], []):
        with open("/dev/full", "w") as full:
            p = subprocess.run([*cmd, *tail], stdout=full, stderr=subprocess.PIPE, text=True,
                               cwd=REPO, timeout=120)  # fmt: skip
        line = one_error(p.stderr)
        assert p.returncode == 4 and "No space left on device" in line, (tail, p.stderr[-2000:])


def test_a_failing_systemctl_is_named_in_its_own_words(tmp_path: Path) -> None:
    """telemetry.server_unit where systemctl fails (no systemd, no bus) says so in
    systemctl's words, not "not running (MainPID ?)"."""
    from soakd.telemetry.server import ServerNotFound, unit_process

    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Failed to connect to bus: Host is down' >&2\nexit 1\n")
    fake.chmod(0o755)
    mp = pytest.MonkeyPatch()
    mp.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    try:
        with pytest.raises(ServerNotFound, match="systemctl failed: Failed to connect to bus"):
            unit_process("vllm.service")
    finally:
        mp.undo()


def test_a_run_stopped_by_its_stall_timeout_says_it_was_reached(tmp_path: Path) -> None:
    """A run aborted because a frame hung past the stall timeout says the timeout was
    reached ("stall timeout N s reached"), not "(stall timeout N s not reached)"."""
    db = tmp_path / "soakd.db"
    p = subprocess.run(
        soakd_cmd("run", "--db", str(db), "--duration", "8", "--fps", "20", "--no-live",
                  *SYNTH_CLI, "--set", "workload.stall_after_s=2"),
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert p.returncode == 3 and _sql(db, "SELECT reason FROM runs") == [("stalled",)]
    r = cli("gate", "--latest", "--db", str(db), "-f", "json")
    assert "s reached: the run was stopped" in r.stdout and "not reached" not in r.stdout


def test_too_short_advice_rounds_the_length_up(tmp_path: Path) -> None:
    """The length a too-short run is told to reach is rounded up: a floor window of 0.34 s
    needs MIN_WINDOWS (12) of them, 4.08 s, advised as `>= 5 s`, not `>= 4 s` (which would
    still be too short)."""
    db = tmp_path / "soakd.db"
    subprocess.run(
        soakd_cmd("run", "--db", str(db), "--duration", "2", "--fps", "20", "--no-live",
                  *SYNTH_CLI, "--set", "run.warmup_s=0", "--set", "criteria.floor_window_s=0.34"),
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    r = cli("gate", "--latest", "--db", str(db), "-f", "json")
    need = MIN_WINDOWS * 0.34  # the memory floor's windows: 4.08 s
    advice = re.findall(r"run at least (\d+) s after the warm-up \(run.duration >= (\d+) s\)"
                        r" or lower criteria.floor_window_s", r.stdout)  # fmt: skip
    assert advice, r.stdout[-3000:]
    for after_warmup, total in advice:
        assert int(after_warmup) >= need and int(total) >= need, advice

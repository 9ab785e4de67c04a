"""One CLI grammar: every command that writes JSON takes the old `--json` as `-f json`, the
same placeholder names the same idea in every `--help`, and `soakd gate RUN_ID` takes `-f`
and `-o` as the README says. Each command list is derived from the typer app, so a new
command that breaks the grammar fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer.core
import typer.main
from typer._click.core import Context

from soakd.cli import main

from .conftest import SYNTH_CLI, run_cli
from .test_cli import cli_commands

pytestmark = pytest.mark.slow

#: the --help placeholder of every option that takes a value (by its long name) and of every
#: argument (by its parameter name): one name per idea across the whole CLI
METAVARS = {
    "--db": "PATH",
    "--output": "FILE",
    "--plot": "FILE",
    "--out": "DIR",
    "--set": "KEY=VALUE",
    "--label": "NAME=VALUE",
    "--limit": "N",
    "--frames": "N",
    "--keep-days": "N",
    "--keep-runs": "N",
    "--cell": "N|NAME",
    "--duration": "DURATION",
    "--fps": "FPS",
    "--metrics-addr": "HOST:PORT",
    "--vary": "KEY=V1,V2,...",
    "--plan": "PLAN",
    "--fail-on-regression": "PCT",
    "--alpha": "ALPHA",
    "--metric": "METRIC",
    "--name": "NAME",
    "run_id": "RUN_ID",
    "run_a": "RUN_A",
    "run_b": "RUN_B",
    "config": "CONFIG",
    "plan": "PLAN",
    "out": "OUT",
    "inputs": "IN",
}
#: options with a fixed set of values, shown as the values themselves (`md|json`)
CHOICE_OPTIONS = ("--format", "--mode", "--table")


def _key(p: Any) -> str:
    """An option by its long name, an argument by its parameter name."""
    if isinstance(p, typer.core.TyperArgument):
        return str(p.name)
    return max((o for o in p.opts if o.startswith("--")), key=len)


def _format_values(cmd: Any) -> list[str]:
    """The fixed values of a command's -f (empty: it has none)."""
    fmt = next((p for p in cmd.params if "-f" in getattr(p, "opts", ())), None)
    return fmt.metavar.split("|") if fmt is not None else []


def test_every_placeholder_in_help_matches_the_table() -> None:
    """Every visible option that takes a value and every argument shows the table's
    placeholder (a fixed set of values shows the values), in the help text itself."""
    for path, cmd in cli_commands().items():
        ctx = Context(cmd, info_name=path)
        for p in cmd.params:
            if getattr(p, "hidden", False) or getattr(p, "is_flag", False):
                continue
            key = _key(p)
            shown = p.get_help_record(ctx)[0]
            if key in CHOICE_OPTIONS:
                assert re.fullmatch(r"[a-z_]+(\|[a-z_]+)+", p.metavar or ""), (path, key)
            else:
                assert key in METAVARS, f"soakd {path} {key}: add its placeholder to METAVARS"
                assert p.metavar == METAVARS[key], (path, key, p.metavar)
            if isinstance(p, typer.core.TyperArgument):
                assert shown.split()[0] == p.metavar, (path, shown)
            else:
                assert shown.endswith(f" {p.metavar}"), (path, shown)


def test_every_command_with_a_format_writes_to_a_file_too() -> None:
    """A command that takes -f/--format (it writes a report or a listing) takes -o/--output
    FILE as well."""
    for path, cmd in cli_commands().items():
        if _format_values(cmd):
            opts = {o for p in cmd.params for o in getattr(p, "opts", ())}
            assert {"-o", "--output"} <= opts, path


def test_help_usage_lines_name_the_arguments_as_the_readme_does() -> None:
    """`soakd X --help` (through run_cli) names RUN_ID, RUN_A/RUN_B, OUT IN and PLAN."""
    usage = {
        "show": "[RUN_ID]",
        "compare": "{RUN_A} [RUN_B]",
        "merge": "{OUT} {IN}...",
        "plan show": "{PLAN}",
        "run": "[CONFIG]",
    }
    for path, args in usage.items():
        p = run_cli(*path.split(), "--help")
        assert p.returncode == 0 and f"soakd {path} [OPTIONS] {args}" in p.stdout, p.stdout


# --- --json, the deprecated alias of -f json, on every command that has -f json


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One short synthetic soak (marked as a baseline) and a two-cell plan file."""
    tmp = tmp_path_factory.mktemp("grammar")
    db = tmp / "soakd.db"
    p = run_cli("run", "--db", str(db), "--duration", "2", "--fps", "20", "--no-live", *SYNTH_CLI)
    assert p.returncode in (0, 1, 3), p.stderr[-2000:]
    assert run_cli("baseline", "set", "--latest", "--db", str(db)).returncode == 0
    (rid,) = [json.loads(ln)["run_id"] for ln in run_cli("runs", "--db", str(db), "-f", "json")
              .stdout.splitlines()]  # fmt: skip
    plan = tmp / "plan.toml"
    plan.write_text('[plan]\nname = "p"\n[matrix]\n"run.fps" = [2, 4]\n', encoding="utf-8")
    return {"db": str(db), "rid": rid, "plan": str(plan), "tmp": str(tmp)}


#: how to call each command that has -f json (what follows `soakd PATH`); a new one must be
#: added here
CALLS: dict[str, list[str]] = {
    "runs": [],
    "show": ["--latest"],
    "report": ["--latest"],
    "gate": ["--latest"],
    "compare": ["{rid}", "--latest"],
    "profile": ["--frames", "3", *SYNTH_CLI],
    "sweep": ["--vary", "workload.infer_ms=1", "--frames", "3", *SYNTH_CLI],
    "prune": ["--keep-days", "30", "--dry-run"],
    "merge": ["{tmp}/merged-{n}.db", "{db}"],
    "baseline list": [],
    "plan show": ["{plan}"],
}
#: commands whose JSON holds a fresh measurement (a new profile run), the file it wrote, or
#: the database's size on disk (which moves with its WAL): compared by shape
VARYING = ("profile", "sweep", "merge", "prune")


def _argv(path: str, cmd: Any, world: dict[str, str], n: int, *extra: str) -> list[str]:
    args = [a.format(n=n, **world) for a in CALLS[path]]
    if any("--db" in getattr(p, "opts", ()) for p in cmd.params):
        args += ["--db", world["db"]]
    return [*path.split(), *args, *extra]


def _call(path: str, cmd: Any, world: dict[str, str], n: int, *extra: str) -> Any:
    """``soakd PATH ...`` through run_cli (a subprocess for commands that soak or profile)."""
    return run_cli(*_argv(path, cmd, world, n, *extra), timeout=180)


def _in_process(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """``soakd ARGV`` through soakd.cli.main in this process: the exit code the program
    exits with, its stdout and its stderr (for a usage error or --help, which stop before
    the command does anything: a subprocess each would only add ~0.5 s of CPU)."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _docs(text: str) -> list[Any]:
    """The JSON a command printed: one object, or one a line."""
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(ln) for ln in text.splitlines()]


def _shape(doc: Any) -> Any:
    """The keys of a document's objects, all the way down to its lists (values left out)."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items()}
    return type(doc).__name__ if isinstance(doc, list) else None


def test_every_command_with_json_output_takes_the_old_json_flag(
    world: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """For every command whose -f offers json: `--json` prints what `-f json` prints (the
    same document; a fresh measurement the same shape: through run_cli), stays out of
    --help, and with another -f is one usage error line, exit 2 (soakd.cli.main in this
    process)."""
    with_json = {path: cmd for path, cmd in cli_commands().items() if "json" in _format_values(cmd)}
    assert set(with_json) == set(CALLS), "a command with -f json: add it to CALLS"
    for path, cmd in with_json.items():
        new = _call(path, cmd, world, 0, "-f", "json")
        old = _call(path, cmd, world, 1, "--json")
        assert old.returncode == new.returncode, (path, old.stderr[-2000:])
        assert new.stdout.strip(), (path, new.stderr[-2000:])
        a, b = _docs(new.stdout), _docs(old.stdout)
        assert _shape(a) == _shape(b) if path in VARYING else a == b, (path, new.stdout[:3000])
        other = next(v for v in _format_values(cmd) if v != "json")
        code, _, err = _in_process(capsys, _argv(path, cmd, world, 2, "--json", "-f", other))
        assert code == 2, (path, err)
        assert [ln for ln in err.splitlines() if ln.startswith("soakd:")] == [
            f"soakd: error: --json is the old spelling of -f json: give -f {other} or --json,"
            " not both"
        ], path
        code, out, _ = _in_process(capsys, [*path.split(), "--help"])
        assert code == 0 and "Usage: soakd" in out and "--json" not in out, path


# --- soakd gate RUN_ID takes -f and -o


def test_gate_of_one_run_writes_each_format_and_exits_with_the_verdict(
    world: dict[str, str], tmp_path: Path
) -> None:
    """`soakd gate RUN_ID -f json` prints the report's JSON (soakd.verdict/2, the same
    document as `soakd report -f json`) and exits with the verdict's code; `-f junit -o
    FILE` writes the file, nothing on stdout, and names the verdict on stderr."""
    db, rid = world["db"], world["rid"]
    report = run_cli("report", rid, "-f", "json", "--db", db)
    doc = json.loads(report.stdout)
    code = {"PASS": 0, "FAIL": 1, "INVALID": 3}[doc["verdict"]["status"]]
    gate = run_cli("gate", rid, "-f", "json", "--db", db)
    assert gate.returncode == code, gate.stderr[-2000:]
    assert json.loads(gate.stdout) == doc
    out = tmp_path / "gate.xml"
    gate = run_cli("gate", rid, "-f", "junit", "-o", str(out), "--db", db)
    assert gate.returncode == code and gate.stdout == ""
    assert out.read_text().startswith("<?xml") and "<testsuite" in out.read_text()
    assert f"soakd: gate: run {rid} {doc['verdict']['status']}" in gate.stderr
    table = run_cli("gate", rid, "--db", db)
    assert table.returncode == code and "criterion" in table.stdout

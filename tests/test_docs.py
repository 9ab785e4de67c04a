"""The README cannot drift from the code: every command, option and config key is in it,
it opens with the two set-up commands, and CI runs the README's test command."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer.main

from soakd.cli import app
from soakd.config import (
    BUILTIN_WORKLOADS,
    AudioSettings,
    CriteriaSettings,
    RunSettings,
    ServiceSettings,
    SourceSettings,
    load_settings,
)
from soakd.run.runner import run_soak
from soakd.store.db import connect
from soakd.store.runs import set_baseline

from .conftest import soakd_cmd

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _commands() -> list[tuple[str, Any]]:
    root: Any = typer.main.get_command(app)
    out = []
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click)
            out += [(f"{name} {sub}", c) for sub, c in cmd.commands.items()]
        else:
            out.append((name, cmd))
    return out


@pytest.mark.parametrize(("name", "cmd"), _commands(), ids=lambda x: str(x))
def test_every_command_and_option_is_in_the_readme(name: str, cmd: Any) -> None:
    """Each command has a README section and each of its options is named there."""
    assert f"`soakd {name}" in README, f"README has no section for soakd {name}"
    for param in cmd.params:
        if param.param_type_name == "option":
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    assert f"`{opt}" in README or f"{opt} " in README or f"{opt}`" in README, (
                        f"soakd {name} {opt} is not in the README"
                    )


@pytest.mark.parametrize(
    ("section", "model"),
    [
        ("run", RunSettings),
        ("source", SourceSettings),
        ("audio", AudioSettings),
        ("criteria", CriteriaSettings),
        ("service", ServiceSettings),
    ],
)
def test_every_config_key_is_in_the_readme(section: str, model: type) -> None:
    """Each key of the [run], [source], [audio], [criteria] and [service] tables is
    documented in the README's configuration reference."""
    for key in model.model_fields:
        assert f"`{key}`" in README, f"[{section}] {key} is not in the README"


def test_every_workload_kind_is_in_the_readme() -> None:
    """Each built-in workload kind has a row in the README."""
    for kind in BUILTIN_WORKLOADS:
        assert f"| `{kind}` |" in README, kind


def test_readme_opens_with_the_two_setup_commands_and_ci_runs_the_test_one() -> None:
    """The README's first code block is the run command then the test command, and .ci/run
    calls the test command word for word."""
    block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert block is not None and README.index("```sh") < 200
    lines = [ln.split("#")[0].strip() for ln in block.group(1).strip().splitlines()]
    assert len(lines) == 2
    run_cmd, test_cmd = lines
    assert "soakd run" in run_cmd and run_cmd.startswith("bash .ci/setup")
    ci = (REPO / ".ci/run").read_text()
    assert test_cmd in ci


def test_exit_codes_are_documented() -> None:
    """The README's exit code table lists every ExitCode."""
    from soakd.errors import ExitCode

    for code in ExitCode:
        assert f"| {int(code)} |" in README


@pytest.mark.parametrize(
    "argv",
    [["run", "--bogus"], ["nope"], ["run", "--fps", "abc"], ["show"]],
    ids=["unknown-option", "unknown-command", "bad-value", "missing-argument"],
)
def test_usage_errors_exit_2_without_a_traceback(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Command-line mistakes are exit code 2 with a message, never a traceback."""
    from soakd.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("Error" in err or "error" in err)


# ---------------------------------------------------------------------------------------
# Every soakd command shown in the docs runs


DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SOAKD = re.compile(r"^(?:\$ )?(?:\.venv/bin/)?soakd\s")
_RUN_ID = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{6}$")
#: a command that contains one of these is only checked against the CLI (command and
#: options exist, files exist), not run: why it cannot run here
NOT_RUN = {
    "/models/": "needs a Hugging Face checkpoint on disk (workload.model_path)",
    "workload.device=cuda": "needs a CUDA GPU",
}


#: file names the docs use as placeholders for the reader's own
PLACEHOLDER_FILES = {"config.toml"}


def _doc_commands() -> list[tuple[str, list[str]]]:
    """(``file:line``, argv after ``soakd``) for each soakd line of an ``sh`` block and each
    ``$ soakd`` line of any fenced block; continuation lines joined, comments and anything
    after ``&&`` / ``|`` / ``;`` left out."""
    out = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            first = text.count("\n", 0, m.start(2)) + 1
            lines = m.group(2).splitlines()
            i = 0
            while i < len(lines):
                line, where = lines[i], f"{path.relative_to(REPO)}:{first + i}"
                while line.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
                is_cmd = _SOAKD.match(line) and (m.group(1) == "sh" or line.startswith("$ "))
                if not is_cmd:
                    continue
                words = shlex.split(line.removeprefix("$ "), comments=True)
                cut = [k for k, w in enumerate(words) if w in {"&&", "||", "|", ";"}]
                out.append((where, words[1 : cut[0] if cut else None]))
    return out


def _click_command(argv: list[str]) -> tuple[Any, list[str]]:
    """The click command ``argv`` names and the rest of ``argv``."""
    cmd: Any = typer.main.get_command(app)
    rest = list(argv)
    while hasattr(cmd, "commands") and rest and rest[0] in cmd.commands:
        cmd = cmd.commands[rest.pop(0)]
    return cmd, rest


def _check_against_cli(argv: list[str]) -> None:
    """The command exists, each option it uses is one of its options, each file exists."""
    cmd, rest = _click_command(argv)
    assert not hasattr(cmd, "commands"), f"soakd {' '.join(argv)}: no such command"
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    for w in rest:
        if w.startswith("-"):
            assert w.split("=", 1)[0] in known, f"{w} is not an option of soakd {argv[0]}"
        elif w.endswith(".toml") and w not in PLACEHOLDER_FILES:
            assert (REPO / w).is_file(), f"{w} does not exist"


@pytest.fixture(scope="module")
def doc_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A database with one short synthetic soak, marked as baselines ``release`` and
    ``default``, and a synthetic config file for the docs' placeholder ``config.toml``."""
    tmp = tmp_path_factory.mktemp("docs")
    db = tmp / "soakd.db"
    settings = load_settings(
        overrides=[
            "workload.kind=synthetic", f"run.db={str(db)!r}", "run.duration=2", "run.fps=10",
            "run.warmup_s=0.5", "run.log_every=0", "source.width=32", "source.height=24",
            "criteria.min_duration_s=1", "criteria.min_frames=5",
        ]
    )  # fmt: skip
    run_id = run_soak(settings).run_id
    conn = connect(db)
    try:
        for name in ("release", "default"):
            set_baseline(conn, name, run_id)
    finally:
        conn.close()
    config = tmp / "config.toml"
    config.write_text('[workload]\nkind = "synthetic"\n[run]\nwarmup_s = 0.5\nlog_every = 0\n')
    return {"db": str(db), "run_id": run_id, "config": str(config), "dir": str(tmp)}


def _for_here(argv: list[str], run: dict[str, str]) -> list[str]:
    """``argv`` made runnable here: the test database, a 2 s soak, a 4-frame profile, port
    0, the test run for run ids, the synthetic config for ``config.toml``, repository paths
    made absolute."""
    out, sub = [], argv[0]
    words = iter(argv)
    for w in words:
        if w in ("--db", "--duration", "--metrics-addr"):
            next(words, None)
            continue
        if _RUN_ID.match(w.removeprefix("baseline:")):
            w = run["run_id"]
        elif w in PLACEHOLDER_FILES:
            w = run["config"]
        elif (REPO / w).exists() and not w.startswith("-"):
            w = str(REPO / w)
        out.append(w)
    out += ["--db", run["db"]]
    if sub == "profile" and "--frames" not in argv:
        out += ["--frames", "4"]
    if argv[:2] == ["plan", "run"]:
        out += ["--set", "run.duration=2s"]  # each cell: too short to pass, long enough to run
    if sub == "run":
        out += ["--duration", "2s"]
        if "--metrics-addr" in argv:
            out += ["--metrics-addr", "127.0.0.1:0"]
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("where", "argv"), _doc_commands(), ids=lambda x: str(x))
def test_every_documented_command_runs(
    where: str, argv: list[str], doc_run: dict[str, str], subprocess_env: dict[str, str]
) -> None:
    """Each soakd command in the README and docs/ runs against a real database (exit 0, 1
    or 3, no traceback); one that needs a GPU or a checkpoint at least names a real command,
    real options and real files."""
    _check_against_cli(argv)
    why = [reason for k, reason in NOT_RUN.items() if k in " ".join(argv)]
    if why:
        pytest.skip(f"{where}: checked against the CLI only; {'; '.join(why)}")
    cmd = soakd_cmd(*_for_here(argv, doc_run))
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=doc_run["dir"], env=subprocess_env, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1, 3) and "Traceback" not in out, f"{where}: {out[-3000:]}"

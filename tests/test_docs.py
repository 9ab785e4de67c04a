"""The README cannot drift from the code: every command, option and config key is in it,
it opens with the two set-up commands, and CI runs the README's test command."""

from __future__ import annotations

import re
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
)

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

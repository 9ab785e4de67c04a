"""--help names each argument by its metavar alone, as the README writes it (CONFIG, RUN_ID,
PLAN), never typer's "CONFIG <path>": commands' help through a real subprocess."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize(
    "argv", [("run",), ("profile",), ("show",), ("compare",), ("plan", "show")], ids=" ".join
)
def test_an_arguments_help_line_is_its_metavar_alone(argv: tuple[str, ...]) -> None:
    """Each argument reads 'NAME  help' in the Arguments section, no '<type>' after it."""
    out = run_cli(*argv, "--help").stdout
    section = out.split("Arguments:")[1].split("Options:")[0]
    names = [ln.strip().split("  ")[0] for ln in section.splitlines() if ln.startswith("  ")
             and not ln.startswith("   ")]  # fmt: skip
    assert names and all(re.fullmatch(r"[A-Z_]+", n) for n in names), names

"""The typer app. Each command parses its options, calls one library function and returns an
exit code (see soakd.errors.ExitCode). Command groups live in their own modules and
register themselves here."""

from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(
    name="soakd",
    help="Soak-test and telemetry daemon for real-time video and multimodal model inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# modules that define register(app); each adds its commands
_COMMAND_MODULES = (
    "soakd.cli.run",
    "soakd.cli.report",
    "soakd.cli.profile",
)

for _name in _COMMAND_MODULES:
    try:
        _mod = importlib.import_module(_name)
    except ModuleNotFoundError as _exc:  # a command group not written yet
        if _exc.name != _name:
            raise
        continue
    _mod.register(app)


def main(argv: list[str] | None = None) -> int:
    try:
        rv = app(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except SystemExit as exc:  # pragma: no cover - click raises this for --help in some versions
        return int(exc.code or 0)
    except Exception as exc:
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show(file=sys.stderr)
            return 2
        if isinstance(exc, click.exceptions.Abort):
            return 130
        raise
    return int(rv or 0)

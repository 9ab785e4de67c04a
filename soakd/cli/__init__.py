"""The typer app. Each command parses its options, calls one library function and returns an
exit code (see soakd.errors.ExitCode). Command groups live in their own modules and
register themselves here."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperArgument
from typer.exceptions import TyperException

from soakd import __version__
from soakd.sources import native

app = typer.Typer(
    name="soakd",
    help="Soak-test and telemetry daemon for real-time video and multimodal model inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# an argument is shown in --help by its metavar alone (CONFIG, RUN_ID, PLAN: the README's
# convention), not typer's "CONFIG <path>" / "RUN_ID <str>"
TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]

# modules that define register(app); each adds its commands
_COMMAND_MODULES = (
    "soakd.cli.run",
    "soakd.cli.runs",
    "soakd.cli.report",
    "soakd.cli.profile",
    "soakd.cli.export",
    "soakd.cli.plan",
    "soakd.cli.prune",
    "soakd.cli.merge",
)


def _print_version(value: bool) -> None:
    if value:
        print(f"soakd {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Soak-test and telemetry daemon for real-time video and multimodal model inference."""


for _name in _COMMAND_MODULES:
    importlib.import_module(_name).register(app)


# how long the CLI waits at exit for a thread a source left inside OpenCV/FFmpeg
NATIVE_EXIT_WAIT_S = 2.0


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code. Usage errors (unknown option, bad value, unknown
    command) are printed by typer with the usage line and exit 2.

    Last resort: a thread still inside OpenCV/FFmpeg when the interpreter shuts down aborts
    the process (SIGABRT, exit 134) as soon as its native call returns (see
    soakd.sources.native). When such a thread outlives ``NATIVE_EXIT_WAIT_S``, the process
    leaves with ``os._exit(code)`` after flushing logs and stdio, so the exit code holds.
    Only as the program itself (``argv`` None): a caller passing ``argv`` keeps its process."""
    code = _main(argv)
    if argv is None and not native.wait_native_threads(NATIVE_EXIT_WAIT_S):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _cli_errors() -> tuple[type[Exception], ...]:
    """Typer's usage errors: its own (it vendors click since 0.2x) and click's (earlier)."""
    try:
        import click
    except ImportError:
        return (TyperException,)
    return (TyperException, click.ClickException)


def _usage_error(exc: Any) -> int:
    """A bad option or value: one line naming it and where help is, exit 2 (a bare
    ``soakd`` or group prints its help)."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        print(exc.format_message(), file=sys.stderr)
        return int(exc.exit_code)
    ctx = getattr(exc, "ctx", None)
    message = " ".join(exc.format_message().split())
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    print(f"soakd: error: {message}{where}", file=sys.stderr)
    return int(getattr(exc, "exit_code", 2))


def _main(argv: list[str] | None) -> int:
    try:
        code = typer.main.get_command(app).main(args=argv, prog_name="soakd", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except _cli_errors() as exc:
        return _usage_error(exc)
    except typer.Abort:
        print("soakd: aborted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except Exception as exc:  # a bug in soakd: the traceback helps, the exit code is API
        import traceback

        traceback.print_exc()
        print(f"soakd: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 4

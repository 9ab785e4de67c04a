"""The typer app. Each command parses its options, calls one library function and returns an
exit code (see soakd.errors.ExitCode). Command groups live in their own modules, each with
a ``register(app)``; ``COMMANDS`` names the module of each command, imported when the
command is looked up."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Annotated, Any

import typer
import typer.main
from typer._click import Command, Context
from typer.core import TyperArgument, TyperGroup
from typer.exceptions import TyperException

from soakd import __version__

# each command (or group of commands) by name, in --help's order, and the module whose
# register(app) adds it. A command's module is imported when the command is looked up, so
# `soakd runs` never imports the soak runner, the report renderers or cv2 (a CLI call's
# CPU: docs/benchmarks.md, "The test suite's wall time"); `soakd --help` imports them all.
COMMANDS: dict[str, str] = {
    "run": "soakd.cli.run",
    "runs": "soakd.cli.runs",
    "show": "soakd.cli.runs",
    "report": "soakd.cli.report",
    "gate": "soakd.cli.report",
    "profile": "soakd.cli.profile",
    "model-path": "soakd.cli.profile",
    "sweep": "soakd.cli.profile",
    "compare": "soakd.cli.profile",
    "export": "soakd.cli.export",
    "prune": "soakd.cli.prune",
    "merge": "soakd.cli.merge",
    "baseline": "soakd.cli.profile",
    "plan": "soakd.cli.plan",
}

# the root app's settings, and each command module's (a command is built with its app's)
_SETTINGS: dict[str, Any] = {
    "add_completion": False,
    "pretty_exceptions_enable": False,
    "rich_markup_mode": None,
}


def module_commands(module: str) -> dict[str, Command]:
    """The click commands ``module``'s register(app) adds, by name; they must be the ones
    COMMANDS gives it."""
    sub = typer.Typer(**_SETTINGS)
    importlib.import_module(module).register(sub)
    built = dict(typer.main.get_group(sub).commands)
    named = {name for name, owner in COMMANDS.items() if owner == module}
    if set(built) != named:
        raise RuntimeError(f"{module} registers {sorted(built)}; COMMANDS gives it {sorted(named)}")
    return built


class _LazyCommands(MutableMapping[str, Command]):
    """The root group's commands: every name of COMMANDS, each built on first look-up."""

    def __init__(self, modules: Mapping[str, str]) -> None:
        self._modules = dict(modules)
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            self._built.update(module_commands(self._modules[name]))
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._modules.setdefault(name, "")
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._modules[name]
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)


class _LazyGroup(TyperGroup):
    """The root group: lists COMMANDS by name, imports a command's module only to run it or
    show its help."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _LazyCommands(COMMANDS)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)


app = typer.Typer(
    name="soakd",
    help="Soak-test and telemetry daemon for real-time video and multimodal model inference.",
    no_args_is_help=True,
    cls=_LazyGroup,
    **_SETTINGS,
)

# an argument is shown in --help by its metavar alone (CONFIG, RUN_ID, PLAN: the README's
# convention), not typer's "CONFIG <path>" / "RUN_ID <str>"
TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]


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
    if argv is None and not _native_threads_done():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _native_threads_done() -> bool:
    """True when no thread a source abandoned is still inside a native call, after waiting
    up to ``NATIVE_EXIT_WAIT_S``. A source that abandons a thread hands it to
    soakd.sources.native: a command that never imported that module has none (and does not
    import the sources for the answer)."""
    native = sys.modules.get("soakd.sources.native")
    return native is None or native.wait_native_threads(NATIVE_EXIT_WAIT_S)


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

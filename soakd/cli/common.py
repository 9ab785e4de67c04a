"""Shared CLI plumbing: the --db option, error reporting, exit codes."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import typer
from rich.console import Console

from soakd.errors import ExitCode, SoakdError
from soakd.store import db as store

DB_HELP = "Run database (default: $STATE_DIRECTORY/soakd.db under systemd, else ./soakd.db)."
RUN_REF_HELP = "Run id, unique id prefix, baseline:NAME or a baseline name."
LATEST_MODE_HELP = "--latest picks the newest run of this mode: soak (default), profile or any."
RUN_MODES = ("soak", "profile")


def latest_mode(mode: str) -> str | None:
    """The ``mode`` argument of ``soakd.store.runs.resolve`` for a --mode value (any: None)."""
    if mode == "any":
        return None
    if mode not in RUN_MODES:
        raise error(f"--mode: must be one of {', '.join(RUN_MODES)} or any, got {mode!r}")
    return mode


def default_db_path(db: Path | None = None) -> Path:
    if db is not None:
        return db
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "soakd.db"
    return Path("soakd.db")


def error(message: str, code: ExitCode | int = ExitCode.USAGE) -> typer.Exit:
    """Print a one-line error to stderr and return the Exit to raise."""
    print(f"soakd: error: {message}", file=sys.stderr)
    return typer.Exit(int(code))


def open_db(db: Path | None) -> sqlite3.Connection:
    """Open an existing run database for a read-mostly command (marks orphaned runs)."""
    path = default_db_path(db)
    if not path.exists():
        raise error(f"{path}: no run database here (run `soakd run` first or pass --db)")
    try:
        return store.connect(path)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    except store.StoreError as exc:
        raise error(str(exc)) from None


def console() -> Console:
    """stdout console: the terminal's width on a terminal; 160 columns in logs and CI, where
    rich's 80-column default would wrap every table row into many lines."""
    return Console() if sys.stdout.isatty() else Console(width=160)

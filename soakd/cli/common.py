"""Shared CLI plumbing: the --db option, error reporting, exit codes."""

from __future__ import annotations

import math
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console

from soakd import redact
from soakd.errors import ExitCode, SoakdError
from soakd.store import db as store
from soakd.store import runs

DB_HELP = "Run database (default: $STATE_DIRECTORY/soakd.db under systemd, else ./soakd.db)."
RUN_REF_HELP = "Run id, unique id prefix, baseline:NAME or a baseline name."
LATEST_MODE_HELP = "--latest picks the newest run of this mode: soak (default), profile or any."
RUN_MODES = ("soak", "profile")
LATEST_MODES = (*RUN_MODES, "any")
LATEST_HELP = "The newest run (of --mode, soak by default) instead of a RUN_ID."
OUTPUT_HELP = "Write here instead of stdout."
SET_HELP = "Override a config key: section.key=value (repeatable)."
JSON_ALIAS_HELP = "Deprecated: same as -f json."

# --help placeholders: one name per idea, the same on every command (tests/test_cli_grammar.py
# holds the table every command is checked against)
PATH_METAVAR = "PATH"  # a database or other file soakd reads (--db)
FILE_METAVAR = "FILE"  # a file soakd writes (-o/--output, --plot)
DIR_METAVAR = "DIR"  # a folder soakd writes into
N_METAVAR = "N"  # a count or other number without a unit
RUN_ID_METAVAR = "RUN_ID"
CONFIG_METAVAR = "CONFIG"
PLAN_METAVAR = "PLAN"
SET_METAVAR = "KEY=VALUE"
LABEL_METAVAR = "NAME=VALUE"


def choice(*values: str) -> Callable[[str], str]:
    """The parser of an option with a fixed set of values: anything else is a usage error
    (exit 2) that lists them."""

    def parse(value: str) -> str:
        if value not in values:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(values)}")
        return value

    return parse


def choice_option(*decls: str, values: tuple[str, ...], help: str) -> Any:
    """An option taking one of ``values`` (shown as its metavar, e.g. ``md|json``)."""
    return typer.Option(*decls, parser=choice(*values), metavar="|".join(values), help=help)


def finite_number(minimum: float | None = None) -> Callable[[str], float]:
    """The parser of a numeric option: ``nan`` is not a number and ``inf`` not a finite one
    (each would pass or skip every comparison made with it), nor is a value below
    ``minimum``: a usage error (exit 2) that says which."""

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if not math.isfinite(x):
            what = "a finite number" if math.isinf(x) else "a number"
            raise typer.BadParameter(f"{value!r} is not {what}")
        if minimum is not None and x < minimum:
            raise typer.BadParameter(f"must be >= {minimum:g}, got {value}")
        return x

    return parse


def number_option(*decls: str, help: str, minimum: float | None = None, metavar: str = "N") -> Any:
    """A float option parsed by ``finite_number``."""
    return typer.Option(*decls, parser=finite_number(minimum), metavar=metavar, help=help)


def format_option(help: str, *values: str, default: str | None = None) -> Any:
    """``-f/--format`` with its fixed set of values: the same option on every command that
    writes a report. Give the parameter a None default and the real one here (shown in
    ``--help``), so ``resolve_format`` can tell ``-f`` given from ``-f`` left out."""
    return typer.Option(
        "--format",
        "-f",
        parser=choice(*values),
        metavar="|".join(values),
        help=help,
        show_default=default if default is not None else False,
    )


def output_option() -> Any:
    """``-o/--output FILE``: the same option on every command that writes a report."""
    return typer.Option("--output", "-o", metavar=FILE_METAVAR, help=OUTPUT_HELP)


def db_option(help: str = DB_HELP) -> Any:
    """``--db PATH``: the run database, the same option on every command."""
    return typer.Option("--db", metavar=PATH_METAVAR, help=help)


def json_alias_option() -> Any:
    """The old ``--json`` flag, hidden: kept so scripts written against it still work.
    Every command with ``-f json`` takes it; ``resolve_format`` reads the two together."""
    return typer.Option("--json", hidden=True, help=JSON_ALIAS_HELP)


def resolve_format(fmt: str | None, as_json: bool, default: str) -> str:
    """The format a command writes: ``--json`` is ``-f json``; ``-f`` left out is
    ``default``. ``--json`` with another ``-f`` is a usage error (exit 2)."""
    if as_json and fmt not in (None, "json"):
        raise error(f"--json is the old spelling of -f json: give -f {fmt} or --json, not both")
    if as_json:
        return "json"
    return default if fmt is None else fmt


#: ``--live/--no-live`` and ``--log-json/--log-text``: the same options on every command
#: that runs a soak (``run``, ``plan run``)
LiveOpt = Annotated[
    bool | None,
    typer.Option("--live/--no-live", help="Live display (default: on when stderr is a terminal)."),
]
LogJsonOpt = Annotated[
    bool | None,
    typer.Option(
        "--log-json/--log-text", help="Log format (default: JSON unless stderr is a terminal)."
    ),
]


def label_option(help: str) -> Any:
    """``--label NAME=VALUE`` (repeatable): what a run belongs to, or a filter on it."""
    return typer.Option("--label", "-l", metavar=LABEL_METAVAR, help=help)


def parse_labels(items: list[str] | None) -> dict[str, str]:
    """``["release=1.4.0", ...]`` -> ``{"release": "1.4.0"}``; a usage error (exit 2) naming
    the item that is not NAME=VALUE or names a label twice with two values."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise error(f"--label {item!r}: expected NAME=VALUE")
        if out.get(name, value) != value:
            raise error(f"--label {name}: given twice ({out[name]!r} and {value!r})")
        out[name] = value
    return out


def latest_option() -> Any:
    return typer.Option("--latest", help=LATEST_HELP)


def run_id_argument(help: str = RUN_REF_HELP) -> Any:
    """The optional ``RUN_ID`` of a command that also takes ``--latest``."""
    return typer.Argument(metavar=RUN_ID_METAVAR, help=help, show_default=False)


def mode_option() -> Any:
    return choice_option("--mode", values=LATEST_MODES, help=LATEST_MODE_HELP)


def run_ref(run_id: str | None, latest: bool) -> str | None:
    """The run reference a command was given; neither a RUN_ID nor --latest (or both) is a
    usage error."""
    if run_id is None and not latest:
        raise error("give a RUN_ID or --latest")
    if run_id is not None and latest:
        raise error(f"give a RUN_ID or --latest, not both (got {run_id!r} and --latest)")
    return run_id


def latest_mode(mode: str) -> str | None:
    """The ``mode`` argument of ``soakd.store.runs.resolve`` for a --mode value (any: None)."""
    if mode == "any":
        return None
    if mode not in RUN_MODES:
        raise error(f"--mode: must be one of {', '.join(RUN_MODES)} or any, got {mode!r}")
    return mode


def _is_folder(p: Path) -> bool:
    """``p`` is a folder; a path this user may not look at is not (opening it then names
    the permission problem in one line)."""
    try:
        return p.is_dir()
    except OSError:
        return False


def default_db_path(db: Path | None = None) -> Path:
    """The database a command reads: ``--db`` when given, else the default. A folder given
    as ``--db`` (``--db ''`` is the current folder) is a usage error naming it, exit 2."""
    if db is not None:
        if _is_folder(db):
            raise error(
                f"--db {str(db)!r}: is a folder, not a run database file"
                " (name the file, e.g. --db soakd.db)"
            )
        return db
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "soakd.db"
    return Path("soakd.db")


def error(message: str, code: ExitCode | int = ExitCode.USAGE) -> typer.Exit:
    """Print a one-line error to stderr and return the Exit to raise."""
    print(f"soakd: error: {redact.text(message)}", file=sys.stderr)
    return typer.Exit(int(code))


def _writable(path: Path) -> bool:
    """Whether this user may write the database and its folder (the ``-wal``/``-shm`` files
    live there); false on a read-only mount too."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def open_db(db: Path | None, *, write: bool = False) -> sqlite3.Connection:
    """Open an existing run database for a command (marks orphaned runs). A read-mostly
    command (``write=False``) that cannot write it (a read-only folder, another user's
    database, a lock held past the busy timeout) opens it read-only instead: nothing is
    then written (``store.is_readonly``), orphaned runs are only reported."""
    path = default_db_path(db)
    if not _exists(path):
        raise error(f"{path}: no run database here (run `soakd run` first or pass --db)")
    try:
        if write or _writable(path):
            try:
                return store.connect(path)
            except store.StoreError as exc:
                if write or not _readonly_would_do(str(exc)):
                    raise
        conn = store.connect(path, readonly=True)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    except store.StoreError as exc:
        raise error(str(exc)) from None
    _note_orphans(conn, path)
    return conn


def _exists(path: Path) -> bool:
    """Whether the database file is there; a folder this user may not enter (the unit's
    0750 /var/lib/soakd for someone outside group soakd) is a one-line usage error."""
    try:
        present = path.exists()
    except PermissionError:
        present, readable = True, False
    else:
        readable = not present or os.access(path, os.R_OK)
    if not readable:
        raise _unreadable(path)
    return present


def _unreadable(path: Path) -> typer.Exit:
    return error(
        f"{path}: permission denied: this user may not read the run database or its folder"
        " (for the systemd unit: `sudo usermod -aG soakd $USER`, then log in again;"
        " see docs/service.md)"
    )


def _readonly_would_do(message: str) -> bool:
    return any(w in message for w in ("read-only", "cannot open", "locked by another"))


def _note_orphans(conn: sqlite3.Connection, path: Path) -> None:
    try:
        orphans = runs.find_orphaned_runs(conn)
    except sqlite3.DatabaseError:
        return  # the command's own query reports a damaged file
    for rid in orphans:
        print(
            f"soakd: note: run {rid} looks orphaned (its process is gone) but {path} is"
            " read-only here: not marked crashed; it is judged as still running (INVALID)",
            file=sys.stderr,
        )


@contextmanager
def reading(db: Path | None, *, write: bool = False) -> Iterator[sqlite3.Connection]:
    """``open_db`` for the block, closed after it; a damaged file (SQLite's "database disk
    image is malformed" from any query in the block) or a damaged value in it
    (``rundata.DamagedValue``) becomes one line and exit 2."""
    path = default_db_path(db)
    conn = open_db(db, write=write)
    try:
        yield conn
    except sqlite3.DatabaseError as exc:
        raise error(_db_message(path, exc)) from None
    except SoakdError as exc:
        raise error(f"{path}: {exc}", exc.exit_code) from None
    finally:
        conn.close()


def _db_message(path: Path, exc: sqlite3.DatabaseError) -> str:
    if "malformed" in str(exc) or "not a database" in str(exc):
        return store.corrupt_message(path, exc)
    return f"{path}: {exc}"


def console(file: IO[str] | None = None) -> Console:
    """stdout console (or one writing to ``file``): the terminal's width on a terminal; 160
    columns in logs, files and CI, where rich's 80-column default would wrap every table
    row into many lines."""
    if file is not None:
        return Console(file=file, width=160, color_system=None)
    return Console() if sys.stdout.isatty() else Console(width=160)

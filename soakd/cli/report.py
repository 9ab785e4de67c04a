"""``soakd report`` and ``soakd gate``: render a run's verdict, or exit with it.

Both re-evaluate the run from its rows with the criteria stored in its config (the analysis
is pure and deterministic, and jitter history only counts runs that started earlier), so a
report always shows the plots and evidence behind the verdict. A run judged for the first
time here (e.g. one that crashed before its verdict) gets its verdict stored.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from soakd.analysis import RunData, Verdict, evaluate, store
from soakd.cli.common import (
    DB_HELP,
    RUN_REF_HELP,
    console,
    error,
    format_option,
    latest_mode,
    latest_option,
    mode_option,
    output_option,
    reading,
    run_ref,
)
from soakd.cli.output import write_output
from soakd.errors import SoakdError
from soakd.report import FORMATS, render
from soakd.report.console import format_verdict_table
from soakd.store import db as store_db
from soakd.store import runs

FORMAT_HELP = "md (pull-request comment), json (soakd.verdict/2), junit (CI), html (offline)."


def _evaluate(
    conn: sqlite3.Connection, run_id: str | None, latest: bool, mode: str = "soak"
) -> tuple[RunData, Verdict]:
    run_id = run_ref(run_id, latest)
    try:
        rid = runs.resolve(conn, run_id, latest=latest, mode=latest_mode(mode))
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    data, verdict = evaluate(conn, rid)
    stored = runs.get_run(conn, rid).verdict
    if stored is None and data.meta.status != "running" and not store_db.is_readonly(conn):
        store(conn, verdict)
    elif stored is not None and stored != verdict.status:
        verdict.warnings.insert(
            0,
            f"the verdict stored at the end of the run was {stored}; re-evaluated now: "
            f"{verdict.status}",
        )
    return data, verdict


def report_cmd(
    run_id: Annotated[str | None, typer.Argument(help=RUN_REF_HELP)] = None,
    latest: Annotated[bool, latest_option()] = False,
    mode: Annotated[str, mode_option()] = "soak",
    fmt: Annotated[str, format_option(FORMAT_HELP, *FORMATS)] = "md",
    output: Annotated[Path | None, output_option()] = None,
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
) -> None:
    """Render a run's verdict as Markdown, JSON, JUnit XML or one offline HTML file.

    Exit code 0 when the report was written (whatever the verdict; use `soakd gate` to exit
    with the verdict), 2 for a usage error such as an unknown run."""
    if output is not None and not output.parent.exists():
        raise error(f"{output}: folder {output.parent} does not exist")
    with reading(db) as conn:
        data, verdict = _evaluate(conn, run_id, latest, mode)
        text = render(fmt, data, verdict)
    write_output(text, output)


def gate_cmd(
    run_id: Annotated[str | None, typer.Argument(help=RUN_REF_HELP)] = None,
    latest: Annotated[bool, latest_option()] = False,
    mode: Annotated[str, mode_option()] = "soak",
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
) -> None:
    """Print the one-screen verdict and exit with its code: 0 PASS, 1 FAIL, 3 INVALID
    (2 usage error, 4 internal error). The release-gate step."""

    with reading(db) as conn:
        _, verdict = _evaluate(conn, run_id, latest, mode)
    console().print(format_verdict_table(verdict))
    raise typer.Exit(int(verdict.exit_code))


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
    app.command("gate")(gate_cmd)

"""``soakd report`` and ``soakd gate``: render a run's verdict, or exit with it.

Both re-evaluate the run from its rows with the criteria stored in its config (the analysis
is pure and deterministic, and jitter history only counts runs that started earlier), so a
report always shows the plots and evidence behind the verdict. A run judged for the first
time here (e.g. one that crashed before its verdict) gets its verdict stored.

``soakd gate --label / --plan`` is the release gate over many runs (``soakd.cli.fleet``):
it opens every database read-only and stores nothing.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Annotated

import typer

from soakd.analysis import RunData, Verdict, evaluate, store
from soakd.cli.common import (
    DB_HELP,
    PATH_METAVAR,
    PLAN_METAVAR,
    db_option,
    error,
    format_option,
    json_alias_option,
    label_option,
    latest_mode,
    latest_option,
    mode_option,
    output_option,
    parse_labels,
    reading,
    resolve_format,
    run_id_argument,
    run_ref,
)
from soakd.cli.fleet import fleet_gate
from soakd.cli.output import print_rich, write_output
from soakd.errors import SoakdError
from soakd.report import FORMATS, render
from soakd.report.console import format_verdict_table
from soakd.report.fleet import FLEET_FORMATS
from soakd.report.host import with_host_warning
from soakd.store import db as store_db
from soakd.store import runs

FORMAT_HELP = "md (pull-request comment), json (soakd.verdict/2), junit (CI), html (offline)."
GATE_DB_HELP = DB_HELP + " Repeatable with --label / --plan: every database is searched."
GATE_LABEL_HELP = (
    "Gate every soak run carrying this label (repeatable: all of them), latest run per cell."
)
GATE_PLAN_HELP = "Gate this plan's cells: each needs a run labelled plan=NAME and cell=CELL."
GATE_FORMAT_HELP = (
    "table (the one-screen verdict), md, json (soakd.verdict/2; with --label / --plan"
    " soakd.gate/1), junit (a testcase per criterion; per cell with --label / --plan)."
)


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
    run_id: Annotated[str | None, run_id_argument()] = None,
    latest: Annotated[bool, latest_option()] = False,
    mode: Annotated[str, mode_option()] = "soak",
    fmt: Annotated[str | None, format_option(FORMAT_HELP, *FORMATS, default="md")] = None,
    output: Annotated[Path | None, output_option()] = None,
    db: Annotated[Path | None, db_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """Render a run's verdict as Markdown, JSON, JUnit XML or one offline HTML file.

    Exit code 0 when the report was written (whatever the verdict; use `soakd gate` to exit
    with the verdict), 2 for a usage error such as an unknown run."""
    how = resolve_format(fmt, as_json, "md")
    if output is not None and not output.parent.exists():
        raise error(f"{output}: folder {output.parent} does not exist")
    with reading(db) as conn:
        data, verdict = _evaluate(conn, run_id, latest, mode)
        text = render(how, data, verdict)
    write_output(text, output)


def gate_cmd(
    run_id: Annotated[str | None, run_id_argument()] = None,
    latest: Annotated[bool, latest_option()] = False,
    mode: Annotated[str, mode_option()] = "soak",
    db: Annotated[list[Path] | None, typer.Option(metavar=PATH_METAVAR, help=GATE_DB_HELP)] = None,
    label: Annotated[list[str] | None, label_option(GATE_LABEL_HELP)] = None,
    plan: Annotated[Path | None, typer.Option(metavar=PLAN_METAVAR, help=GATE_PLAN_HELP)] = None,
    fmt: Annotated[
        str | None, format_option(GATE_FORMAT_HELP, *FLEET_FORMATS, default="table")
    ] = None,
    output: Annotated[Path | None, output_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """Print the one-screen verdict and exit with its code: 0 PASS, 1 FAIL, 3 INVALID
    (2 usage error, 4 internal error). The release-gate step.

    With --label / --plan: gate the latest run of every cell across every --db, one row per
    cell; exit 0 only if every cell passed, 1 if any failed, else 3 (invalid or missing
    cells, or no matching run)."""
    how = resolve_format(fmt, as_json, "table")
    if output is not None and not output.parent.exists():
        raise error(f"{output}: cannot write: folder {output.parent} does not exist")
    if label or plan is not None:
        _fleet_only(run_id, latest, mode)
        labels = parse_labels(label)
        fleet_gate(db or [], labels, plan, how, output)
    if db is not None and len(db) > 1:
        raise error("one --db for one run; several --db need --label or --plan")
    with reading(db[0] if db else None) as conn:
        data, verdict = _evaluate(conn, run_id, latest, mode)
        if how == "table":
            print_rich([format_verdict_table(with_host_warning(data, verdict))], output)
        else:
            write_output(render(how, data, verdict), output)
    if output is not None:
        print(f"soakd: gate: run {verdict.run_id} {verdict.status}", file=sys.stderr)
    raise typer.Exit(int(verdict.exit_code))


def _fleet_only(run_id: str | None, latest: bool, mode: str) -> None:
    """A gate over many runs takes no single run: RUN_ID, --latest and --mode are errors."""
    if run_id is not None or latest:
        raise error("give a RUN_ID / --latest (one run) or --label / --plan (many), not both")
    if mode != "soak":
        raise error("--mode picks the run of --latest; a gate over many runs judges soak runs")


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
    app.command("gate")(gate_cmd)

"""``soakd plan show|run|write PLAN``: a matrix of config overrides as named cells
(``soakd.studies.plan``), listed, soaked one after another here (or one, ``--cell``, as a
Slurm array task or a Kubernetes indexed pod runs it), or written out as one config per cell.

``plan run`` soaks each cell exactly as ``soakd run`` does (``soakd.cli.run``), prints one line
per finished cell and a table at the end, and exits with the worst outcome
(``soakd.studies.plan.plan_exit_code``). Every cell's settings are built before the first one
runs, so a bad option or override stops the plan with exit 2 and nothing written; a cell that
cannot start (a model file that is not there) is reported and the plan goes on. A stop
signal ends the cell in flight cleanly (stored, judged INVALID) and no further cell starts.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from soakd.analysis.criteria.validity import convergence
from soakd.cli.common import (
    DIR_METAVAR,
    N_METAVAR,
    PLAN_METAVAR,
    SET_HELP,
    SET_METAVAR,
    LiveOpt,
    LogJsonOpt,
    console,
    db_option,
    error,
    format_option,
    json_alias_option,
    label_option,
    output_option,
    parse_labels,
    resolve_format,
)
from soakd.cli.output import print_rich, write_output
from soakd.config import ConfigError, Settings
from soakd.errors import SoakdError
from soakd.jsonsafe import clean_json
from soakd.service.signals import STOP_SIGNALS, abort_reason, install_signal_handlers
from soakd.studies.plan import (
    CELL_LABEL,
    PLAN_LABEL,
    Cell,
    Plan,
    cell_file_name,
    load_plan,
    plan_exit_code,
    settings_toml,
)

CELLS_TSV = "cells.tsv"
SHOW_FORMATS = ("table", "json")
SHOW_FORMAT_HELP = "table (people) or json (one object: plan, labels, cells)."
NOT_RUN = "not run"
_STOP_REASONS = frozenset(abort_reason(s) for s in STOP_SIGNALS)

plan_app = typer.Typer(
    help="A matrix of config overrides as named cells: show them, soak them, write them out.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

PlanArg = Annotated[
    Path,
    typer.Argument(metavar=PLAN_METAVAR, help="The plan file (TOML: [plan], [matrix], [[cell]])."),
]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", metavar=SET_METAVAR, help=SET_HELP + " Every cell.")
]
LabelOpt = Annotated[
    list[str] | None,
    label_option("Label every cell's run (repeatable; the plan's own labels cannot change)."),
]
DbOpt = Annotated[Path | None, db_option()]


@dataclass(frozen=True, slots=True)
class CellOutcome:
    """How one cell ended: its run (None if it never started), verdict, exit code, the
    criteria that failed (or, INVALID, could not be judged) and how long it ran."""

    cell: Cell
    run_id: str | None
    verdict: str
    code: int | None  # None: not run
    note: str = ""
    failing: tuple[str, ...] = ()
    duration_s: float | None = None
    #: a run.duration = "auto" cell: "decided after ..." or what was still undecided
    decided: str = ""


def _load(path: Path) -> Plan:
    try:
        return load_plan(path)
    except ConfigError as exc:
        raise error(str(exc)) from None


def _flags(plan: Plan, db: Path | None, labels: list[str] | None) -> dict[str, Any]:
    """``--db`` and ``--label`` as settings flags; a label naming ``plan``, ``cell`` or one of
    the plan's labels with another value is a usage error (the run would leave the plan)."""
    extra = parse_labels(labels)
    for key, value in extra.items():
        if key in (PLAN_LABEL, CELL_LABEL):
            raise error(f"--label {key}: set by the plan itself")
        if plan.labels.get(key, value) != value:
            raise error(
                f"--label {key}={value} contradicts plan {plan.name!r} ({key}={plan.labels[key]})"
            )
    return {
        "run.db": str(db) if db is not None else None,
        **{f"run.labels.{k}": v for k, v in extra.items()},
    }


def _cell_settings(
    plan: Plan, cells: list[Cell], overrides: list[str] | None, flags: dict[str, Any]
) -> list[tuple[Cell, Settings]]:
    """Every cell's settings before anything runs: a problem is one line and exit 2."""
    out = []
    for cell in cells:
        try:
            out.append((cell, plan.settings(cell, overrides or [], flags)))
        except ConfigError as exc:
            raise error(f"{plan.path}: cell {cell.index} ({cell.name}): {exc}") from None
    return out


# --------------------------------------------------------------------------- show


@plan_app.command("show")
def show_cmd(
    plan: PlanArg,
    fmt: Annotated[
        str | None, format_option(SHOW_FORMAT_HELP, *SHOW_FORMATS, default="table")
    ] = None,
    output: Annotated[Path | None, output_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """List the plan's cells (index, name, overrides) after checking every one."""
    how = resolve_format(fmt, as_json, "table")
    p = _load(plan)
    if how == "json":
        write_output(json.dumps(clean_json(p.as_dict()), indent=2), output)
        return
    t = Table(title=f"plan {p.name}: {len(p.cells)} cells")
    for col in ("index", "cell", "overrides"):
        t.add_column(col, justify="right" if col == "index" else "left")
    for c in p.cells:
        t.add_row(str(c.index), c.name, " ".join(c.overrides) or "-")
    labels = ", ".join(f"{k}={v}" for k, v in p.cell_labels(p.cells[0]).items() if k != "cell")
    base = f"base config {p.config}" if p.config else "base config: the embedded defaults"
    set_ = f"; every cell: {' '.join(p.overrides)}" if p.overrides else ""
    print_rich([t, Text(f"labels {labels}, cell=<cell>; {base}{set_}")], output)


# --------------------------------------------------------------------------- run


@plan_app.command("run")
def run_cmd(
    plan: PlanArg,
    cell: Annotated[
        str | None,
        typer.Option(
            metavar=f"{N_METAVAR}|NAME",
            help="Only this cell, by index or name (an array task: $SLURM_ARRAY_TASK_ID).",
        ),
    ] = None,
    db: DbOpt = None,
    label: LabelOpt = None,
    set_: SetOpt = None,
    live: LiveOpt = None,
    log_json: LogJsonOpt = None,
) -> None:
    """Soak every cell one after another (or only --cell), each exactly as `soakd run`.
    Exit code: 1 if any cell failed, else 4 if soakd failed on one, else 2 if one could
    not start, else 3 if one was INVALID, else 0 (2 before any cell: a usage error)."""
    from soakd.observers.logs import configure_logging  # structlog: for the cells' logs

    p = _load(plan)
    try:
        cells = [p.cell(cell)] if cell is not None else p.cells
    except ConfigError as exc:
        raise error(f"--cell: {exc}") from None
    todo = _cell_settings(p, cells, set_, _flags(p, db, label))
    use_live = sys.stderr.isatty() if live is None else live
    configure_logging(json=log_json, level="warning" if use_live else "info")
    outcomes = _run_cells(p, todo, live=use_live)
    console().print(outcome_table(p, outcomes))
    if any(o.run_id for o in outcomes):
        print("each cell's stage table and criteria: soakd show RUN_ID (or soakd report RUN_ID)")
    raise typer.Exit(plan_exit_code(o.code for o in outcomes if o.code is not None))


def _run_cells(plan: Plan, todo: list[tuple[Cell, Settings]], *, live: bool) -> list[CellOutcome]:
    """Soak the cells in order, one line each as it ends; after a stop signal (in a cell
    or between two) the rest are not run."""
    outcomes: list[CellOutcome] = []
    with install_signal_handlers(lambda signum: None) as between:
        for cell, settings in todo:
            if between.received is not None:
                break
            outcome = _run_cell(plan, cell, settings, live=live)
            outcomes.append(outcome)
            print(_cell_line(plan, outcome), flush=True)
            if outcome.note in _STOP_REASONS:
                break
    stopped = [CellOutcome(c, None, NOT_RUN, None) for c, _ in todo[len(outcomes) :]]
    if stopped:
        why = outcomes[-1].note if outcomes and outcomes[-1].note else between.reason
        print(f"soakd: plan {plan.name} stopped ({why}): {len(stopped)} cell(s) not run")
    return outcomes + stopped


def _run_cell(plan: Plan, cell: Cell, settings: Settings, *, live: bool) -> CellOutcome:
    """One cell as ``soakd run`` serves it, printing nothing of its own (the cell's line
    says how it ended; `soakd show RUN_ID` has the rest); a cell that cannot start is
    reported, not fatal."""
    # `soakd run`'s serving (the runner under it) only to run a cell: `plan show` and
    # `plan write` do without
    from soakd.cli.run import result_code, serve_run

    try:
        result = serve_run(settings, live=live)
    except SoakdError as exc:
        print(f"soakd: error: {plan.path}: cell {cell.index} ({cell.name}): {exc}", file=sys.stderr)
        return CellOutcome(cell, None, "error", int(exc.exit_code), str(exc))
    v = result.verdict
    verdict = v.status if v is not None else "INVALID"
    bad = (v.failed or v.invalid) if v is not None else []
    note = (result.reason or "") if result.status != "completed" else ""
    failing = tuple(c.criterion for c in bad)
    code = result_code(result)
    decided = convergence(v) if v is not None else ""
    return CellOutcome(
        cell, result.run_id, verdict, code, note, failing, result.duration_s, decided
    )


def _cell_line(plan: Plan, o: CellOutcome) -> str:
    """``soakd: plan NAME: cell I (CELL): VERDICT (failing criteria), run ID, 12.0 s (exit
    N)``: one line per finished cell; a ``duration = "auto"`` cell's says when it was
    decided and what each trend could see (or what was still undecided)."""
    head = f"soakd: plan {plan.name}: cell {o.cell.index} ({o.cell.name}):"
    if o.run_id is None:
        return f"{head} not started: {o.note} (exit {o.code})"
    failing = f" ({', '.join(o.failing)})" if o.failing else ""
    took = "" if o.duration_s is None else f", {o.duration_s:.1f} s"
    why = "".join(f", {w}" for w in (o.note, o.decided) if w)
    return f"{head} {o.verdict}{failing}, run {o.run_id}{took}{why} (exit {o.code})"


def outcome_table(plan: Plan, outcomes: list[CellOutcome]) -> Table:
    """One row per cell: index, cell, run, verdict, exit code, note (aborted or not
    started; an auto cell's "decided after ...")."""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.verdict] = counts.get(o.verdict, 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    t = Table(title=f"plan {plan.name}: {len(outcomes)} cells: {summary}")
    for col in ("index", "cell", "run", "verdict", "exit", "note"):
        t.add_column(col, justify="right" if col in ("index", "exit") else "left")
    for o in outcomes:
        code = "-" if o.code is None else str(o.code)
        note = "; ".join(w for w in (o.note, o.decided) if w)
        t.add_row(str(o.cell.index), o.cell.name, o.run_id or "-", o.verdict, code, note)
    return t


# --------------------------------------------------------------------------- write


@plan_app.command("write")
def write_cmd(
    plan: PlanArg,
    out: Annotated[
        Path,
        typer.Option("--out", metavar=DIR_METAVAR, help="Folder for the cell configs (created)."),
    ],
    db: DbOpt = None,
    label: LabelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Write one resolved config per cell, DIR/<index>-<name>.toml (labels included; run
    each with `soakd run FILE`), and DIR/cells.tsv (index, name, file) for an engine."""
    p = _load(plan)
    todo = _cell_settings(p, p.cells, set_, _flags(p, db, label))
    try:
        out.mkdir(parents=True, exist_ok=True)
        rows = [_write_cell(p, cell, settings, out) for cell, settings in todo]
        (out / CELLS_TSV).write_text("".join(rows), encoding="utf-8")
    except OSError as exc:
        raise error(f"{out}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {len(todo)} cell configs and {CELLS_TSV} to {out}")


def _write_cell(plan: Plan, cell: Cell, settings: Settings, out: Path) -> str:
    """Write the cell's config; its ``cells.tsv`` row (the header before cell 0)."""
    name = cell_file_name(cell)
    comment = (
        f"soakd plan {plan.name}, cell {cell.index}: {cell.name}",
        f"resolved from {plan.path} (config hash {settings.config_hash()})",
        f"soakd run {name}",
    )
    (out / name).write_text(settings_toml(settings, comment), encoding="utf-8")
    header = "index\tname\tfile\n" if cell.index == 0 else ""
    return f"{header}{cell.index}\t{cell.name}\t{name}\n"


def register(app: typer.Typer) -> None:
    app.add_typer(plan_app, name="plan")

"""``soakd gate --label K=V [--plan PLAN] [--db A --db B ...]``: the release gate over many
runs (``soakd.studies.fleet``), called by ``gate_cmd`` when --label or --plan is given."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from soakd.analysis.fleet import FleetResult
from soakd.cli.common import default_db_path, error
from soakd.cli.output import print_rich, write_output
from soakd.config import ConfigError
from soakd.errors import SoakdError
from soakd.report.fleet import fleet_table, render_fleet
from soakd.studies.fleet import PlanLike, gate_fleet


def _load_plan(path: Path | None) -> PlanLike | None:
    if path is None:
        return None
    from soakd.studies.plan import load_plan  # the plan module, only when a plan is given

    try:
        return load_plan(path)
    except ConfigError as exc:
        raise error(str(exc)) from None


def fleet_gate(
    dbs: list[Path], labels: dict[str, str], plan: Path | None, fmt: str, output: Path | None
) -> None:
    """Gate every cell, write the result in ``fmt`` (to ``output`` or stdout) and exit with
    the gate's code. Writing to a file, the last line (the summary) goes to stderr too."""
    try:
        result = gate_fleet(dbs or [default_db_path()], labels, _load_plan(plan))
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    if fmt == "table":
        print_rich(fleet_table(result), output)
    else:
        write_output(render_fleet(fmt, result), output)
    if output is not None:
        print(f"soakd: gate: {_last_line(result)}", file=sys.stderr)
    raise typer.Exit(int(result.exit_code))


def _last_line(r: FleetResult) -> str:
    return r.summary if r.status == "PASS" else f"{r.status}: {r.reason} ({r.summary})"

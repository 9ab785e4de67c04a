"""``soakd merge OUT IN...``: bring run databases from many hosts together
(``soakd.store.merge``), printing what each input added."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from soakd.cli.common import (
    error,
    format_option,
    json_alias_option,
    output_option,
    resolve_format,
)
from soakd.cli.output import print_rich, write_output
from soakd.errors import SoakdError
from soakd.store.merge import OUTCOMES, MergeResult, merge

MERGE_FORMAT_HELP = (
    "table (a table on a terminal, one line per input otherwise) or json (one object,"
    " soakd.merge/1)."
)


def merge_cmd(
    out: Annotated[
        Path, typer.Argument(metavar="OUT", help="The merged database (created if missing).")
    ],
    inputs: Annotated[
        list[Path],
        typer.Argument(metavar="IN", help="Run databases to merge in (opened read-only)."),
    ],
    fmt: Annotated[
        str | None, format_option(MERGE_FORMAT_HELP, "table", "json", default="table")
    ] = None,
    output: Annotated[Path | None, output_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """Merge run databases into OUT, one transaction per IN: every run with its host, labels,
    frames, samples, emissions, events and verdicts, and free baseline names. Merging an IN
    again adds nothing; a later copy of a live database updates the runs it finished.
    Exit 0; 2 when an IN cannot be merged (nothing is written then); 4 when writing OUT fails
    (OUT stays as it was before that IN)."""
    how = resolve_format(fmt, as_json, "table")
    results: list[MergeResult] = []
    failure: SoakdError | None = None
    try:
        for result in merge(out, inputs):
            results.append(result)
            for line in result.warnings:
                print(f"soakd: warning: {line}", file=sys.stderr)
    except SoakdError as exc:
        failure = exc
    if results:
        _summary(out, results, how, output)
    if failure is not None:
        raise error(str(failure), failure.exit_code)


def _summary(out: Path, results: list[MergeResult], fmt: str, output: Path | None) -> None:
    """JSON, a rich table on a terminal, else one plain line per input and one for OUT."""
    if fmt == "json":
        doc = {
            "schema": "soakd.merge/1",
            "out": str(out),
            "out_runs": results[-1].out_runs,
            "inputs": [r.as_dict() for r in results],
        }
        write_output(json.dumps(doc, indent=2), output)
        return
    total = f"{out}: {results[-1].out_runs} runs after merging {len(results)} database(s)"
    if output is None and sys.stdout.isatty():
        print_rich([_table(results), Text(total)], None)
        return
    write_output("".join(_line(r) + "\n" for r in results) + total + "\n", output)


def _line(r: MergeResult) -> str:
    counts = ", ".join(f"{r.count(o)} {o}" for o in OUTCOMES)
    return f"{r.source}: runs {counts}; {len(r.baselines_added)} baseline(s) added"


def _table(results: list[MergeResult]) -> Table:
    t = Table()
    for c in ("database", *OUTCOMES, "baselines added"):
        t.add_column(c)
    for r in results:
        t.add_row(str(r.source), *(str(r.count(o)) for o in OUTCOMES), str(len(r.baselines_added)))
    return t


def register(app: typer.Typer) -> None:
    app.command("merge")(merge_cmd)

"""``soakd profile``, ``soakd sweep``, ``soakd compare`` and ``soakd baseline set|list``.

Each command parses its options, calls one library function (``soakd.studies.profiling.profile``,
``soakd.studies.sweep.sweep``, ``soakd.studies.compare.compare``) and prints its Markdown or JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from soakd.cli.common import DB_HELP, console, error, reading
from soakd.cli.output import write_output
from soakd.config import ConfigError, Settings, load_settings
from soakd.errors import ExitCode, SoakdError
from soakd.observers.logs import configure_logging
from soakd.store import runs
from soakd.studies.compare import compare
from soakd.studies.profiling import profile
from soakd.studies.sweep import parse_vary, sweep

CONFIG_ARG = typer.Argument(help="TOML config (default: embedded).")
SET_HELP = "Override a key: section.key=value (repeatable)."


def _settings(config: Path | None, overrides: list[str] | None, db: Path | None) -> Settings:
    try:
        return load_settings(
            config, overrides=overrides or [], flags={"run.db": str(db) if db else None}
        )
    except ConfigError as exc:
        raise error(str(exc)) from None


def profile_cmd(
    config: Annotated[Path | None, CONFIG_ARG] = None,
    frames: Annotated[int, typer.Option(min=2, help="Frames to run back to back.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of Markdown.")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
) -> None:
    """Run N frames back to back and print the stage table, the first frame apart, peak
    memory, the theoretical rate (1000 / median total) and a recommended --fps. Exit code:
    0 measured, 2 usage/config error, 3 no frame finished after the first."""
    settings = _settings(config, set_, db)
    configure_logging(level="warning")
    try:
        result = profile(settings, frames=frames)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    write_output(result.to_json() if as_json else result.to_markdown(), None)
    raise typer.Exit(int(ExitCode.PASS if result.theoretical_fps else ExitCode.INVALID))


@contextmanager
def _progress_bar(enabled: bool, total: int) -> Iterator[Any]:
    """A rich progress bar on stderr, or a no-op callback."""
    if not enabled:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("sweep", total=total)

        def update(done: int, _total: int, value: Any) -> None:
            desc = "sweep" if value is None else f"sweep: {value}"
            bar.update(task, completed=done, description=desc)

        yield update


def sweep_cmd(
    vary: Annotated[str, typer.Option(help="KEY=V1,V2,... : the one variable to sweep.")],
    config: Annotated[Path | None, CONFIG_ARG] = None,
    frames: Annotated[int, typer.Option(min=2, help="Frames per point.")] = 20,
    fmt: Annotated[str, typer.Option("--format", help="md or json.")] = "md",
    out: Annotated[Path | None, typer.Option("-o", "--output", help="Write here.")] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write an SVG plot of stage times vs the value.")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
) -> None:
    """Profile once per value of one variable, everything else held fixed; mark the knee and
    where the usable range ends. Exit code: 0, 2 usage/config error, 3 every value rejected."""
    if fmt not in ("md", "json"):
        raise error(f"--format {fmt}: expected md or json")
    settings = _settings(config, set_, db)
    try:
        key, values = parse_vary(vary)
    except ConfigError as exc:
        raise error(str(exc)) from None
    configure_logging(level="error")
    try:
        with _progress_bar(sys.stderr.isatty(), len(values)) as progress:
            result = sweep(settings, key, values, frames=frames, progress=progress)
    except ConfigError as exc:
        raise error(str(exc)) from None
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    write_output(result.to_json() if fmt == "json" else result.to_markdown(), out)
    if plot is not None:
        write_output(result.to_svg(), plot)
    ok = any(p.status == "ok" for p in result.points)
    raise typer.Exit(int(ExitCode.PASS if ok else ExitCode.INVALID))


def compare_cmd(
    run_a: Annotated[str, typer.Argument(help="Run id, unique prefix, or baseline name.")],
    run_b: Annotated[str, typer.Argument(help="Run id, unique prefix, or baseline:NAME.")],
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of Markdown.")] = False,
    fail_on_regression: Annotated[
        float | None,
        typer.Option(help="Exit 1 when --metric is worse in RUN_B by more than PCT percent."),
    ] = None,
    metric: Annotated[str, typer.Option(help="Metric gated by --fail-on-regression.")] = (
        "total_ms.p50"
    ),
    alpha: Annotated[float, typer.Option(help="Significance level of the tests.")] = 0.01,
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
) -> None:
    """Compare two runs (or a run and a baseline): config diff, stage and frame-age
    statistics, drops, memory floor slopes and criteria, each with its change and whether it
    is beyond noise. Exit code: 0, 1 regression (with --fail-on-regression), 2 usage error."""
    if not 0 < alpha < 0.5:
        raise error(f"--alpha: must be between 0 and 0.5, got {alpha}")
    try:
        with reading(db) as conn:
            a, b = runs.resolve(conn, run_a), runs.resolve(conn, run_b)
            comp = compare(conn, a, b, alpha=alpha)
        reg = None if fail_on_regression is None else comp.regression(metric, fail_on_regression)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    if as_json:
        d = comp.to_dict()
        if reg is not None:
            d["regression"] = {
                "metric": reg.metric,
                "threshold_pct": reg.threshold_pct,
                "failed": reg.failed,
                "message": reg.message,
            }
        write_output(json.dumps(d, indent=2, default=str), None)
    else:
        text = comp.to_markdown()
        if reg is not None:
            text += f"\n**{reg.message}**\n"
        write_output(text, None)
    if reg is not None and reg.failed:
        print(f"soakd: {reg.message}", file=sys.stderr)
        raise typer.Exit(int(ExitCode.FAIL))


baseline_app = typer.Typer(
    help="Mark runs as named baselines for `soakd compare`.", no_args_is_help=True
)


@baseline_app.command("set")
def baseline_set_cmd(
    run_id: Annotated[str, typer.Argument(help="Run id, unique prefix, or latest (soak).")],
    name: Annotated[str, typer.Option(help="Baseline name.")] = "default",
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
) -> None:
    """Mark RUN_ID as the baseline NAME (replacing an earlier one of that name)."""
    if not name or name.startswith("baseline:") or any(c.isspace() for c in name):
        raise error(f"--name {name!r}: a baseline name is one word without 'baseline:'")
    try:
        with reading(db, write=True) as conn:
            rid = runs.resolve(conn, run_id)
            runs.set_baseline(conn, name, rid)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    print(f"baseline {name} = {rid}")


@baseline_app.command("list")
def baseline_list_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
) -> None:
    """List the baselines: name, run, when it was marked, the run's verdict."""
    with reading(db) as conn:
        rows = runs.list_baselines(conn)
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return
    t = Table()
    for c in ("name", "run_id", "marked", "mode", "verdict", "workload", "started"):
        t.add_column(c)
    for r in rows:
        t.add_row(
            r["name"],
            r["run_id"],
            r["created_at"],
            r["mode"] or "-",
            r["verdict"] or "-",
            r["workload_kind"] or "-",
            r["started_at"] or "-",
        )
    console().print(t)


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_cmd)
    app.command("sweep")(sweep_cmd)
    app.command("compare")(compare_cmd)
    app.add_typer(baseline_app, name="baseline")

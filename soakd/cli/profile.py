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
from rich.text import Text

from soakd.cli.common import (
    CONFIG_METAVAR,
    FILE_METAVAR,
    N_METAVAR,
    SET_HELP,
    SET_METAVAR,
    db_option,
    error,
    format_option,
    json_alias_option,
    latest_mode,
    latest_option,
    mode_option,
    number_option,
    output_option,
    reading,
    resolve_format,
    run_id_argument,
    run_ref,
)
from soakd.cli.output import print_rich, write_output
from soakd.cli.tables import profile_tables, sweep_tables
from soakd.config import ConfigError, Settings, load_settings
from soakd.errors import ExitCode, SoakdError
from soakd.store import runs
from soakd.studies.compare import Comparison, Regression, compare

CONFIG_ARG = typer.Argument(metavar=CONFIG_METAVAR, help="TOML config (default: embedded).")
SET_OPTION = typer.Option("--set", metavar=SET_METAVAR, help=SET_HELP)
STUDY_FORMAT_HELP = "md or json (default: a table on a terminal, else md)."
COMPARE_FORMAT_HELP = "md, json or html (one offline file)."


def _study_format(fmt: str | None, as_json: bool, output: Path | None) -> str:
    """The format a profile or sweep is written in: -f (or --json), else a rich table on a
    terminal, else Markdown (piped, or -o)."""
    tty = output is None and sys.stdout.isatty()
    return resolve_format(fmt, as_json, "table" if tty else "md")


def _settings(config: Path | None, overrides: list[str] | None, db: Path | None) -> Settings:
    try:
        return load_settings(
            config, overrides=overrides or [], flags={"run.db": str(db) if db else None}
        )
    except ConfigError as exc:
        raise error(str(exc)) from None


def profile_cmd(
    config: Annotated[Path | None, CONFIG_ARG] = None,
    frames: Annotated[
        int, typer.Option(min=2, metavar=N_METAVAR, help="Frames to run back to back.")
    ] = 20,
    fmt: Annotated[str | None, format_option(STUDY_FORMAT_HELP, "md", "json")] = None,
    output: Annotated[Path | None, output_option()] = None,
    set_: Annotated[list[str] | None, SET_OPTION] = None,
    db: Annotated[Path | None, db_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """Run N frames back to back and print the stage table, the first frame apart, peak
    memory, the theoretical rate (1000 / median total) and a recommended --fps. Exit code:
    0 measured, 2 usage/config error, 3 no frame finished after the first or the run did not
    complete (stalled, aborted: no rate recommended)."""
    # the studies run soaks: the runner under them is imported by the commands that profile
    # (`soakd compare`, `baseline`, `model-path` do without)
    from soakd.observers.logs import configure_logging
    from soakd.studies.profiling import profile

    how = _study_format(fmt, as_json, output)
    _check_folder(output)
    settings = _settings(config, set_, db)
    configure_logging(level="warning")
    try:
        result = profile(settings, frames=frames)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    if how == "table":
        print_rich(profile_tables(result), None)
    else:
        write_output(result.to_json() if how == "json" else result.to_markdown(), output)
    if result.host is not None and result.host.contended:
        print(f"soakd: warning: host busy: {result.host.words()}", file=sys.stderr)
    ok = result.theoretical_fps and result.completed
    raise typer.Exit(int(ExitCode.PASS if ok else ExitCode.INVALID))


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


def _check_folder(output: Path | None) -> None:
    """-o into a folder that does not exist fails before any frame is run."""
    if output is not None and not output.parent.exists():
        raise error(f"{output}: cannot write: folder {output.parent} does not exist")


def sweep_cmd(
    vary: Annotated[
        str,
        typer.Option(metavar="KEY=V1,V2,...", help="The one variable to sweep and its values."),
    ],
    config: Annotated[Path | None, CONFIG_ARG] = None,
    frames: Annotated[int, typer.Option(min=2, metavar=N_METAVAR, help="Frames per point.")] = 20,
    fmt: Annotated[str | None, format_option(STUDY_FORMAT_HELP, "md", "json")] = None,
    out: Annotated[Path | None, output_option()] = None,
    plot: Annotated[
        Path | None,
        typer.Option(metavar=FILE_METAVAR, help="Write an SVG plot of stage times vs the value."),
    ] = None,
    set_: Annotated[list[str] | None, SET_OPTION] = None,
    db: Annotated[Path | None, db_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """Profile once per value of one variable, everything else held fixed; mark the knee and
    where the usable range ends. Exit code: 0, 2 usage/config error, 3 every value rejected."""
    from soakd.observers.logs import configure_logging
    from soakd.studies.sweep import parse_vary, sweep  # the runner under it: as profile_cmd

    how = _study_format(fmt, as_json, out)
    _check_folder(out)
    _check_folder(plot)
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
    if how == "table":
        print_rich([*sweep_tables(result), *(Text(f"note: {n}") for n in result.notes)], None)
    else:
        write_output(result.to_json() if how == "json" else result.to_markdown(), out)
    if plot is not None:
        write_output(result.to_svg(), plot)
    ok = any(p.status == "ok" for p in result.points)
    raise typer.Exit(int(ExitCode.PASS if ok else ExitCode.INVALID))


def compare_cmd(
    run_a: Annotated[
        str, typer.Argument(metavar="RUN_A", help="Run id, unique prefix, or baseline name.")
    ],
    run_b: Annotated[
        str | None,
        typer.Argument(metavar="RUN_B", help="Run id, unique prefix, or baseline:NAME."),
    ] = None,
    latest: Annotated[bool, latest_option()] = False,
    mode: Annotated[str, mode_option()] = "soak",
    fmt: Annotated[
        str | None, format_option(COMPARE_FORMAT_HELP, "md", "json", "html", default="md")
    ] = None,
    output: Annotated[Path | None, output_option()] = None,
    fail_on_regression: Annotated[
        float | None,
        number_option(
            "--fail-on-regression",
            metavar="PCT",
            help="Exit 1 when --metric is worse in RUN_B by more than PCT percent.",
        ),
    ] = None,
    metric: Annotated[
        str, typer.Option(metavar="METRIC", help="Metric gated by --fail-on-regression.")
    ] = "total_ms.p50",
    alpha: Annotated[
        float, number_option("--alpha", metavar="ALPHA", help="Significance level of the tests.")
    ] = 0.01,
    db: Annotated[Path | None, db_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """Compare two runs (or a run and a baseline; --latest: RUN_B is the newest run): config
    diff, stage and frame-age statistics, drops, memory floor slopes and criteria, each with
    its change and whether it is beyond noise. Exit code: 0, 1 regression (with
    --fail-on-regression), 2 usage error."""
    how = resolve_format(fmt, as_json, "md")
    if not 0 < alpha < 0.5:
        raise error(f"--alpha: must be between 0 and 0.5, got {alpha}")
    ref_b = run_ref(run_b, latest)
    try:
        with reading(db) as conn:
            a = runs.resolve(conn, run_a)
            b = runs.resolve(conn, ref_b, latest=latest, mode=latest_mode(mode))
            comp = compare(conn, a, b, alpha=alpha)
        reg = None if fail_on_regression is None else comp.regression(metric, fail_on_regression)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    write_output(_comparison_text(comp, reg, how), output)
    if reg is not None and reg.failed:
        print(f"soakd: {reg.message}", file=sys.stderr)
        raise typer.Exit(int(ExitCode.FAIL))


def _comparison_text(comp: Comparison, reg: Regression | None, fmt: str) -> str:
    """The comparison in ``fmt`` (md, json, html), the regression gate's outcome included."""
    if fmt == "json":
        d = comp.to_dict()
        if reg is not None:
            d["regression"] = {
                "metric": reg.metric,
                "threshold_pct": reg.threshold_pct,
                "failed": reg.failed,
                "message": reg.message,
            }
        return json.dumps(d, indent=2, default=str)
    if fmt == "html":
        to_html = getattr(comp, "to_html", None)
        if to_html is None:
            raise error("-f html: this soakd cannot render a comparison as HTML yet; use md")
        return str(to_html())
    text = comp.to_markdown()
    return text if reg is None else text + f"\n**{reg.message}**\n"


baseline_app = typer.Typer(
    help="Mark runs as named baselines for `soakd compare`.", no_args_is_help=True
)


@baseline_app.command("set")
def baseline_set_cmd(
    run_id: Annotated[str | None, run_id_argument("Run id or unique prefix.")] = None,
    latest: Annotated[bool, latest_option()] = False,
    mode: Annotated[str, mode_option()] = "soak",
    name: Annotated[str, typer.Option(metavar="NAME", help="Baseline name.")] = "default",
    db: Annotated[Path | None, db_option()] = None,
) -> None:
    """Mark RUN_ID (or --latest) as the baseline NAME (replacing an earlier one of that
    name)."""
    if not name or name.startswith("baseline:") or any(c.isspace() for c in name):
        raise error(f"--name {name!r}: a baseline name is one word without 'baseline:'")
    ref = run_ref(run_id, latest)
    try:
        with reading(db, write=True) as conn:
            rid = runs.resolve(conn, ref, latest=latest, mode=latest_mode(mode))
            runs.set_baseline(conn, name, rid)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    print(f"baseline {name} = {rid}")


@baseline_app.command("list")
def baseline_list_cmd(
    fmt: Annotated[
        str | None,
        format_option("table or json (one JSON object a line).", "table", "json", default="table"),
    ] = None,
    output: Annotated[Path | None, output_option()] = None,
    db: Annotated[Path | None, db_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """List the baselines: name, run, when it was marked, the run's verdict."""
    how = resolve_format(fmt, as_json, "table")
    with reading(db) as conn:
        rows = runs.list_baselines(conn)
    if how == "json":
        write_output("".join(json.dumps(r) + "\n" for r in rows), output)
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
    print_rich([t], output)


def model_path_cmd(
    config: Annotated[Path | None, CONFIG_ARG] = None,
    set_: Annotated[list[str] | None, SET_OPTION] = None,
) -> None:
    """Print the folder the embedded tiny model (workload.kind = "tiny-vlm") of CONFIG is
    loaded from, building it first when it is not there: what `transformers serve` serves
    (configs/openai-endpoint.toml). Exit code: 0, 2 usage/config error or another
    workload."""
    from soakd.config import TinyVlmWorkload
    from soakd.observers.logs import configure_logging
    from soakd.workloads.base import WorkloadError
    from soakd.workloads.tiny import TinySpec, ensure_tiny_model

    w = _settings(config, set_, None).workload
    configure_logging(level="warning")
    if not isinstance(w, TinyVlmWorkload):
        raise error(f"workload.kind is {w.kind!r}: model-path names the tiny-vlm model's folder")
    spec = TinySpec(arch=w.arch, seed=w.seed, short_side=w.short_side)
    try:
        print(ensure_tiny_model(spec, w.cache_dir))
    except WorkloadError as exc:
        raise error(str(exc)) from None


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_cmd)
    app.command("model-path")(model_path_cmd)
    app.command("sweep")(sweep_cmd)
    app.command("compare")(compare_cmd)
    app.add_typer(baseline_app, name="baseline")

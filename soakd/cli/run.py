"""``soakd run``: parse the options, serve one soak, print how it ended."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from soakd.cli.common import (
    CONFIG_METAVAR,
    SET_HELP,
    SET_METAVAR,
    LiveOpt,
    LogJsonOpt,
    console,
    db_option,
    error,
    label_option,
    parse_labels,
)
from soakd.config import ConfigError, Settings, load_settings, parse_duration
from soakd.errors import ExitCode, SoakdError
from soakd.observers.base import Observer, RunResult
from soakd.observers.display import LiveDisplay, summary_table
from soakd.observers.journal import journal_stream
from soakd.observers.logs import FrameLogObserver, configure_logging
from soakd.report.console import format_verdict_table
from soakd.report.host import add_warning, host_load, host_warning
from soakd.service.serve import serve
from soakd.store import db as store
from soakd.store import queries, runs
from soakd.store.rundata import load_sample_columns


def _settings(config: Path | None, overrides: list[str], flags: dict[str, Any]) -> Settings:
    try:
        return load_settings(config, overrides=overrides, flags=flags)
    except ConfigError as exc:
        raise error(str(exc)) from None


def _duration(v: str | None) -> float | str | None:
    if v is None:
        return None
    if v.strip().lower() == "auto":
        return "auto"  # run until decided, at most run.max_duration
    try:
        return parse_duration(v)
    except ValueError as exc:
        raise error(f"--duration: {exc}") from None


def _display(*, live: bool, log_every: int) -> Observer:
    """What a person or a log reads: the live display on a terminal, else log lines."""
    return LiveDisplay() if live else FrameLogObserver(log_every)


def run_cmd(
    config: Annotated[
        Path | None,
        typer.Argument(metavar=CONFIG_METAVAR, help="TOML config (default: embedded)."),
    ] = None,
    duration: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help="Soak length, e.g. 10m, 90s; auto: until every criterion is decided, at most"
            " run.max_duration.",
        ),
    ] = None,
    fps: Annotated[float | None, typer.Option(metavar="FPS", help="Target frame rate.")] = None,
    db: Annotated[Path | None, db_option()] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", metavar=SET_METAVAR, help=SET_HELP)
    ] = None,
    label: Annotated[
        list[str] | None,
        label_option("Label the run, e.g. release=1.4.0 (repeatable; adds to [run.labels])."),
    ] = None,
    metrics_addr: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="Serve Prometheus metrics on HOST:PORT (loopback unless told otherwise).",
        ),
    ] = None,
    live: LiveOpt = None,
    log_json: LogJsonOpt = None,
) -> None:
    """Soak the configured workload at a fixed frame rate; store every frame and telemetry
    sample; judge the run. Exit code: 0 PASS, 1 FAIL, 2 usage/config error, 3 INVALID,
    4 internal error."""
    flags = {
        "run.duration": _duration(duration),
        "run.fps": fps,
        "run.db": str(db) if db is not None else None,
        "service.metrics_addr": metrics_addr,
        **{f"run.labels.{k}": v for k, v in parse_labels(label).items()},
    }
    settings = _settings(config, set_ or [], flags)
    tty = sys.stderr.isatty()
    use_live = tty if live is None else live
    configure_logging(json=log_json, level="warning" if use_live else "info")
    raise typer.Exit(execute_run(settings, live=use_live))


def execute_run(settings: Settings, *, live: bool) -> int:
    """``soakd run`` after parsing: serve one soak, print its end, return the exit code."""
    try:
        result = serve_and_print(settings, live=live)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    return result_code(result)


def serve_and_print(settings: Settings, *, live: bool) -> RunResult:
    """Serve one soak with the display (``live``) or log lines, then print its end as
    ``soakd run`` does. ``SoakdError`` (nothing was started) propagates."""
    result = serve_run(settings, live=live)
    try:
        _print_end(console(), settings, result)
    except Exception as exc:  # the run is stored; only the summary print failed
        print(f"soakd: warning: cannot print the run summary: {exc}", file=sys.stderr)
    return result


def serve_run(settings: Settings, *, live: bool) -> RunResult:
    """Serve one soak with the display (``live``) or log lines, printing nothing on stdout;
    a failure of soakd itself is one line on stderr. ``SoakdError`` propagates."""
    result = serve(settings, observers=[_display(live=live, log_every=settings.run.log_every)])
    if result.exit_code == ExitCode.INTERNAL:
        # the verdict says INVALID; say plainly what went wrong with soakd itself
        # (a verdict that could not be stored says so, whatever ended the run)
        why = result.summary.get("verdict_error") or result.reason
        print(f"soakd: error: {why}", file=sys.stderr)
    return result


def result_code(result: RunResult) -> int:
    """A served run's exit code (internal error when it has none)."""
    return int(result.exit_code if result.exit_code is not None else ExitCode.INTERNAL)


def _print_end(con: Console, settings: Settings, result: RunResult) -> None:
    """The stage table, the counts and the verdict; in the journal (stdout is the stream
    systemd connected) as aligned columns without box-drawing characters."""
    boxed = not journal_stream(sys.stdout)
    conn = store.connect(settings.resolved_db(), readonly=True)  # it may be full now
    host = None
    try:
        run = runs.get_run(conn, result.run_id).as_dict()
        cpus = run["environment"].get("cpu_count")
        host = host_load(load_sample_columns(conn, result.run_id), cpus)
        con.print(summary_table(run, queries.stage_stats(conn, result.run_id), boxed=boxed))
        s = result.summary
        con.print(
            f"frames {s.get('frames_done')} of {s.get('frames_captured')} captured, "
            f"drops {s.get('drops')}, stale {s.get('stale')}, errors {s.get('errors')}, "
            f"achieved {s.get('achieved_fps')} fps over {s.get('duration_s')} s"
            + (f"; aborted: {result.reason}" if result.status != "completed" else "")
        )
    finally:
        conn.close()
    if result.verdict is not None:
        verdict = add_warning(result.verdict, host_warning(host))
        con.print(format_verdict_table(verdict, boxed=boxed))


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)

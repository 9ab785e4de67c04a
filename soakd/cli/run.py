"""``soakd run``, ``soakd runs``, ``soakd show``."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from soakd.cli.common import DB_HELP, console, error
from soakd.config import ConfigError, load_settings, parse_duration
from soakd.errors import ExitCode, SoakdError
from soakd.observers.base import Observer
from soakd.observers.display import LiveDisplay, summary_table
from soakd.observers.logs import FrameLogObserver, configure_logging
from soakd.service.signals import abort_reason, install_signal_handlers
from soakd.store import queries


def _settings(config: Path | None, overrides: list[str], flags: dict[str, Any]) -> Any:
    try:
        return load_settings(config, overrides=overrides, flags=flags)
    except ConfigError as exc:
        raise error(str(exc)) from None


def _duration(v: str | None) -> float | None:
    if v is None:
        return None
    try:
        return parse_duration(v)
    except ValueError as exc:
        raise error(f"--duration: {exc}") from None


def _observers(settings: Any, *, live: bool, log_every: int) -> list[Observer]:
    obs: list[Observer] = []
    if live:
        obs.append(LiveDisplay())
    else:
        obs.append(FrameLogObserver(log_every))
    if settings.service.notify and os.environ.get("NOTIFY_SOCKET"):
        from soakd.observers.systemd import SystemdObserver

        sd = SystemdObserver.from_env()
        if sd is not None:
            obs.append(sd)
    if settings.service.metrics_addr:
        from soakd.observers.metrics import open_metrics

        try:
            obs.append(open_metrics(settings.service.metrics_addr))
        except SoakdError as exc:
            raise error(str(exc), exc.exit_code) from None
    return obs


def run_cmd(
    config: Annotated[Path | None, typer.Argument(help="TOML config (default: embedded).")] = None,
    duration: Annotated[str | None, typer.Option(help="Soak length, e.g. 10m, 90s.")] = None,
    fps: Annotated[float | None, typer.Option(help="Target frame rate.")] = None,
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a key: section.key=value (repeatable)."),
    ] = None,
    metrics_addr: Annotated[
        str | None,
        typer.Option(
            help="Serve Prometheus metrics on HOST:PORT (loopback unless told otherwise)."
        ),
    ] = None,
    live: Annotated[
        bool | None,
        typer.Option(
            "--live/--no-live", help="Live display (default: on when stderr is a terminal)."
        ),
    ] = None,
    log_json: Annotated[
        bool | None,
        typer.Option(
            "--log-json/--log-text", help="Log format (default: JSON unless stderr is a terminal)."
        ),
    ] = None,
) -> None:
    """Soak the configured workload at a fixed frame rate; store every frame and telemetry
    sample; judge the run. Exit code: 0 PASS, 1 FAIL, 2 usage/config error, 3 INVALID,
    4 internal error."""
    flags = {
        "run.duration": _duration(duration),
        "run.fps": fps,
        "run.db": str(db) if db is not None else None,
        "service.metrics_addr": metrics_addr,
    }
    settings = _settings(config, set_ or [], flags)
    tty = sys.stderr.isatty()
    use_live = tty if live is None else live
    configure_logging(json=log_json, level="warning" if use_live else "info")
    raise typer.Exit(execute_run(settings, live=use_live))


def execute_run(settings: Any, *, live: bool) -> int:
    from soakd.run.runner import Run

    con = console()
    observers = _observers(settings, live=live, log_every=settings.run.log_every)
    stop = threading.Event()
    try:
        run = Run(settings, observers=observers, stop=stop)
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None

    def on_signal(signum: int) -> None:
        run.request_stop(abort_reason(signum))

    handlers = None
    if threading.current_thread() is threading.main_thread():
        # a first SIGTERM/SIGINT stops the run cleanly; a second one forces the exit
        handlers = install_signal_handlers(on_signal)
    try:
        result = run.execute()
    except SoakdError as exc:
        raise error(str(exc), exc.exit_code) from None
    finally:
        if handlers is not None:
            handlers.restore()
    try:
        _print_end(con, settings, result)
    except Exception as exc:  # the run is stored; only the summary print failed
        print(f"soakd: warning: cannot print the run summary: {exc}", file=sys.stderr)
    if result.exit_code == ExitCode.INTERNAL:
        # the verdict table says INVALID; say plainly what went wrong with soakd itself
        print(
            f"soakd: error: {result.reason or result.summary.get('verdict_error')}", file=sys.stderr
        )
    return int(result.exit_code if result.exit_code is not None else ExitCode.INTERNAL)


def _print_end(con: Console, settings: Any, result: Any) -> None:
    from soakd.store import db as store

    conn = store.connect(settings.resolved_db())
    try:
        run = queries.get_run(conn, result.run_id)
        con.print(summary_table(run, queries.stage_stats(conn, result.run_id)))
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
        try:
            from soakd.analysis import format_verdict_table

            con.print(format_verdict_table(result.verdict))
        except ImportError:
            con.print(f"verdict: {result.verdict.status}")


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)

"""``soakd runs`` and ``soakd show``: read what is in the run database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from soakd.cli.common import (
    DB_HELP,
    LATEST_MODE_HELP,
    RUN_REF_HELP,
    console,
    error,
    latest_mode,
    reading,
)
from soakd.errors import SoakdError
from soakd.observers.display import fmt_bytes, summary_table
from soakd.store import queries, runs


def runs_cmd(
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
    limit: Annotated[int, typer.Option(help="How many runs, newest first.")] = 20,
    mode: Annotated[
        str | None, typer.Option(help="Only runs of this mode (soak, profile).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
) -> None:
    """List runs in the database, newest first."""
    with reading(db) as conn:
        rows = runs.list_runs(conn, limit=limit, mode=mode)
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return
    t = Table()
    for c in (
        "run_id",
        "mode",
        "status",
        "verdict",
        "workload",
        "fps",
        "started",
        "dur s",
        "frames",
        "drops",
        "errors",
    ):
        t.add_column(c)
    for r in rows:
        t.add_row(
            r["run_id"],
            r["mode"],
            r["status"],
            r["verdict"] or "-",
            r["workload_kind"] or "-",
            f"{r['fps']:g}" if r["fps"] else "-",
            r["started_at"],
            f"{r['duration_s']:.1f}" if r["duration_s"] else "-",
            str(r["frames"]),
            str(r["drops"] or 0),
            str(r["errors"]),
        )
    console().print(t)


SHOW_EVENTS = (
    "error",
    "oom",
    "stall",
    "source_end",
    "signal",
    "crashed",
    "store_locked",
    "store_overflow",
    "end",
)


def show_cmd(
    run_id: Annotated[str | None, typer.Argument(help=RUN_REF_HELP)] = None,
    latest: Annotated[bool, typer.Option("--latest", help="The newest soak run.")] = False,
    mode: Annotated[str, typer.Option(help=LATEST_MODE_HELP)] = "soak",
    db: Annotated[Path | None, typer.Option(help=DB_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of tables.")] = False,
) -> None:
    """Summarise one run: status, stage statistics, counters, events, verdict."""
    if run_id is None and not latest:
        raise error("give a RUN_ID or --latest")
    with reading(db) as conn:
        try:
            rid = runs.resolve(conn, run_id, latest=latest, mode=latest_mode(mode))
            run = runs.get_run(conn, rid).as_dict()
            stages = queries.stage_stats(conn, rid)
            evs = queries.events(conn, rid, SHOW_EVENTS)
            peak_rss = queries.peak(conn, rid, "rss_bytes")
        except SoakdError as exc:
            raise error(str(exc), exc.exit_code) from None
    if as_json:
        print(json.dumps({"run": run, "stages": stages, "events": evs[:50]}, default=str, indent=2))
        return
    con = console()
    con.print(summary_table(run, stages))
    s = run.get("summary") or {}
    con.print(
        f"workload {run['workload_kind']}, fps {run['fps']}, started {run['started_at']}, "
        f"duration {run['duration_s'] or 0:.1f} s, verdict {run['verdict'] or '-'}"
        + (f", reason: {run['reason']}" if run.get("reason") else "")
    )
    if s:
        con.print(
            f"frames {s.get('frames_done')} of {s.get('frames_captured')} captured, "
            f"drops {s.get('drops')}, stale {s.get('stale')}, errors {s.get('errors')}, "
            f"peak RSS {fmt_bytes(peak_rss)}"
        )
    for e in evs[:20]:
        con.print(f"  t={e['t'] or 0:8.2f}s {e['kind']:<10} {e['message'] or ''}")


def register(app: typer.Typer) -> None:
    app.command("runs")(runs_cmd)
    app.command("show")(show_cmd)

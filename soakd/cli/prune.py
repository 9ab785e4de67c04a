"""``soakd prune``: delete old runs whole and VACUUM the file (``soakd.store.prune``)."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from soakd.cli.common import (
    LATEST_MODES,
    N_METAVAR,
    choice_option,
    db_option,
    default_db_path,
    error,
    format_option,
    json_alias_option,
    number_option,
    output_option,
    reading,
    resolve_format,
)
from soakd.cli.output import print_rich, write_output
from soakd.store import db as store
from soakd.store import prune

FORMAT_HELP = "table (people) or json (one object)."
MODE_HELP = (
    "Which runs may go: soak, profile or any (default; --keep-runs then counts each mode apart)."
)


def prune_cmd(
    keep_days: Annotated[
        float | None,
        number_option("--keep-days", minimum=0, help="Keep runs started in the last N days."),
    ] = None,
    keep_runs: Annotated[
        int | None,
        typer.Option(min=0, metavar=N_METAVAR, help="Keep the newest N runs (of each mode)."),
    ] = None,
    mode: Annotated[str, choice_option("--mode", values=LATEST_MODES, help=MODE_HELP)] = "any",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go; write nothing.")
    ] = False,
    no_vacuum: Annotated[
        bool, typer.Option("--no-vacuum", help="Only remove the rows: the file keeps its size.")
    ] = False,
    db: Annotated[Path | None, db_option()] = None,
    fmt: Annotated[str | None, format_option(FORMAT_HELP, "table", "json", default="table")] = None,
    output: Annotated[Path | None, output_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """Remove old runs (every row of each, in every table) and VACUUM the file. Never
    deletes a run still being written or one a baseline names. Safe while a soak writes
    the same file: it waits for the lock and loses nothing. Exit code: 0 done (also when
    VACUUM could not get the lock: a warning says so), 2 usage error."""
    how = resolve_format(fmt, as_json, "table")
    if keep_days is None and keep_runs is None:
        raise error("give --keep-days N or --keep-runs N (or both)")
    policy = prune.Policy(keep_days, keep_runs, None if mode == "any" else mode)
    path = default_db_path(db)
    with _database(db, dry_run=dry_run) as conn:
        before = prune.file_bytes(path)
        todo = prune.plan(conn, policy)
        report: dict[str, Any] = _plan_doc(todo, dry_run)
        report["vacuum"] = "dry run"
        if not dry_run:
            pause = prune.LIVE_PAUSE_S if todo.live else 0.0
            prune.delete_runs(conn, todo.delete, pause_s=pause)
            report["vacuum"] = _vacuum(conn, no_vacuum)
    after = prune.file_bytes(path)
    report.update(bytes_before=before, bytes_after=after, bytes_freed=before - after)
    if how == "json":
        write_output(json.dumps(report, indent=2), output)
    else:
        print_rich(_text(report), output)


@contextmanager
def _database(db: Path | None, *, dry_run: bool) -> Iterator[sqlite3.Connection]:
    """The database for writing, or for a dry run read-only: nothing is written, not even
    orphaned runs marked crashed (they are pruned by age either way)."""
    if not dry_run:
        with reading(db, write=True) as conn:
            yield conn
        return
    try:
        conn = store.connect(default_db_path(db), readonly=True)
    except store.StoreError as exc:
        raise error(str(exc)) from None
    try:
        yield conn
    finally:
        conn.close()


def _vacuum(conn: sqlite3.Connection, off: bool) -> str:
    """Run VACUUM unless ``off`` (also when nothing was deleted this time: pages an earlier
    prune freed are given back); what happened, in a word or a line. A VACUUM that could
    not run is one warning line on stderr: the rows are deleted, the file keeps its size."""
    if off:
        return "off"
    done = prune.vacuum(conn)
    if done.skipped is not None:
        print(
            f"soakd: warning: not vacuumed: {done.skipped}; the runs are deleted but the file"
            " keeps its size (their pages are reused by later runs; prune again to shrink it)",
            file=sys.stderr,
        )
        return f"skipped: {done.skipped}"
    if not done.done:
        return "not needed (no free pages)"
    return "done" if done.checkpointed else "done, WAL not emptied yet (a reader is open)"


def _plan_doc(todo: prune.Plan, dry_run: bool) -> dict[str, Any]:
    gone = todo.delete
    return {
        "dry_run": dry_run,
        "runs": len(gone),
        "frames": sum(r.frames for r in gone),
        "samples": sum(r.samples for r in gone),
        "deleted": [
            {
                "run_id": r.id,
                "mode": r.mode,
                "status": r.status,
                "started_at": r.started_at,
                "frames": r.frames,
                "samples": r.samples,
            }
            for r in gone
        ],
        "kept_baseline": todo.kept_baseline,
        "kept_running": todo.kept_running,
    }


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _text(doc: dict[str, Any]) -> list[Any]:
    """What ``prune`` prints for people: the runs deleted, then one line each for what it
    kept and the file's size."""
    verb = "would delete" if doc["dry_run"] else "deleted"
    out: list[Any] = [
        f"{verb} {_n(doc['runs'], 'run')}: {_n(doc['frames'], 'frame')},"
        f" {_n(doc['samples'], 'sample')}"
    ]
    if doc["deleted"]:
        out.insert(0, _runs_table(doc["deleted"]))
    if doc["kept_baseline"]:
        out.append(f"kept {_n(len(doc['kept_baseline']), 'run')} named by baselines")
    if doc["kept_running"]:
        out.append(f"kept {_n(len(doc['kept_running']), 'run')} still running")
    if doc["dry_run"]:
        out.append(f"dry run: nothing written; {_mib(doc['bytes_before'])} on disk")
    else:
        out.append(
            f"{_mib(doc['bytes_before'])} -> {_mib(doc['bytes_after'])} on disk"
            f" ({_mib(doc['bytes_freed'])} freed; vacuum: {doc['vacuum']})"
        )
    return out


def _runs_table(rows: list[dict[str, Any]]) -> Table:
    t = Table()
    for c in ("run_id", "mode", "status", "started", "frames", "samples"):
        t.add_column(c)
    for r in rows:
        t.add_row(
            r["run_id"], r["mode"], r["status"], r["started_at"], str(r["frames"]),
            str(r["samples"]),
        )  # fmt: skip
    return t


def register(app: typer.Typer) -> None:
    app.command("prune")(prune_cmd)

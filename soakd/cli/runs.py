"""``soakd runs`` and ``soakd show``: read what is in the run database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from soakd.analysis.streams import stored_streams
from soakd.cli.common import (
    LATEST_MODES,
    N_METAVAR,
    choice_option,
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
from soakd.cli.output import print_rich, write_output
from soakd.cli.tables import IdListing, printable
from soakd.errors import SoakdError
from soakd.report.console import format_criteria_rows, format_streams_table
from soakd.sections import MAX_NUMBER
from soakd.store import queries, runs
from soakd.store.chunk_stages import chunk_stage_stats
from soakd.store.rundata import check_values, load_verdict_rows

RUNS_FORMAT_HELP = "table (people) or json (one JSON object a line)."
SHOW_FORMAT_HELP = "text (tables) or json (one object: run, stages, events)."
RUNS_HEADS: tuple[str, ...] = (
    "run_id", "name", "mode", "status", "verdict", "workload", "fps", "started", "dur s",
    "frames", "drops", "errors", "labels",
)  # fmt: skip


def runs_cmd(
    db: Annotated[Path | None, db_option()] = None,
    limit: Annotated[
        int,
        typer.Option(min=1, max=MAX_NUMBER, metavar=N_METAVAR, help="How many runs, newest first."),
    ] = 20,
    mode: Annotated[
        str | None,
        choice_option("--mode", values=LATEST_MODES, help="Only runs of this mode (any: all)."),
    ] = None,
    label: Annotated[
        list[str] | None, label_option("Only runs with this label (repeatable: all of them).")
    ] = None,
    fmt: Annotated[
        str | None, format_option(RUNS_FORMAT_HELP, "table", "json", default="table")
    ] = None,
    output: Annotated[Path | None, output_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """List runs in the database, newest first."""
    how = resolve_format(fmt, as_json, "table")
    labels = parse_labels(label)
    with reading(db) as conn:
        rows = runs.list_runs(conn, limit=limit, mode=None if mode is None else latest_mode(mode),
                              labels=labels)  # fmt: skip
    if how == "json":
        write_output("".join(json.dumps(r) + "\n" for r in rows), output)
        return
    print_rich([_runs_table(rows)], output)


def _runs_table(rows: list[dict[str, Any]]) -> IdListing:
    # a run id is what people copy into `soakd show`: never cut or wrapped, at any width
    t = IdListing(RUNS_HEADS)
    for r in rows:
        t.add_row(
            r["run_id"],
            printable(r["name"] or "-"),
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
            format_labels(r["labels"]),
        )
    return t


def format_labels(labels: dict[str, str]) -> str:
    """``release=1.4.0 model=moss`` (``-`` for none): how people read a run's labels."""
    return printable(" ".join(f"{k}={v}" for k, v in sorted(labels.items()))) or "-"


SHOW_EVENTS = (
    "warmup_end",
    "error",
    "oom",
    "stall",
    "source_end",
    "signal",
    "crashed",
    "store_locked",
    "store_overflow",
    "early_stop",
    "decided",
    "server_replaced",
    "server_lost",
    "end",
)


def show_cmd(
    run_id: Annotated[str | None, run_id_argument()] = None,
    latest: Annotated[bool, latest_option()] = False,
    mode: Annotated[str, mode_option()] = "soak",
    db: Annotated[Path | None, db_option()] = None,
    fmt: Annotated[
        str | None, format_option(SHOW_FORMAT_HELP, "text", "json", default="text")
    ] = None,
    output: Annotated[Path | None, output_option()] = None,
    as_json: Annotated[bool, json_alias_option()] = False,
) -> None:
    """Summarise one run: status, stage statistics, counters, events, verdict."""
    how = resolve_format(fmt, as_json, "text")
    run_id = run_ref(run_id, latest)
    with reading(db) as conn:
        try:
            rid = runs.resolve(conn, run_id, latest=latest, mode=latest_mode(mode))
            check_values(conn, rid)
            run = runs.get_run(conn, rid).as_dict()
            stages = queries.stage_stats(conn, rid)
            chunk_stages = chunk_stage_stats(conn, rid)  # a rollout's named stages
            evs = queries.events(conn, rid, SHOW_EVENTS)
            peak_rss = queries.peak(conn, rid, "rss_bytes")
            verdict_rows = load_verdict_rows(conn, rid)
            streams = stored_streams(verdict_rows)  # run.streams > 1 only
        except SoakdError as exc:
            raise error(str(exc), exc.exit_code) from None
    if how == "json":
        doc = {
            "run": run,
            "stages": stages,
            "chunk_stages": chunk_stages,
            "events": evs[:50],
            "criteria": [_criterion(r) for r in verdict_rows],
            "streams": streams,
        }
        write_output(json.dumps(doc, default=str, indent=2), output)
        return
    shown = _show_text(run, stages, evs, peak_rss)
    # content_fps judged a number only when it PASSed or FAILed (N/A: unset, not judged)
    judged = next(
        (
            r
            for r in verdict_rows
            if r["criterion"] == "content_fps" and str(r["status"]).lower() in ("pass", "fail")
        ),
        None,
    )
    shown[1:1] = _generator_lines(run.get("summary") or {}, chunk_stages, judged)
    if verdict_rows:
        shown.append(format_criteria_rows([_criterion(r) for r in verdict_rows]))
    print_rich([*shown, format_streams_table(streams)] if streams else shown, output)


def _criterion(row: dict[str, Any]) -> dict[str, Any]:
    """A stored verdict row without its evidence (``soakd report -f json`` has that)."""
    return {k: v for k, v in row.items() if k != "evidence"}


def _ms(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, int | float) else "-"


def _generator_lines(
    s: dict[str, Any], chunk_stages: dict[str, Any], judged: dict[str, Any] | None = None
) -> list[str]:
    """A generator run's first output and output intervals (the run summary's: every frame
    of the run), the number content_fps judged (the verdict's: after the warm-up, and only
    when content_fps is set), and a rollout's named chunk stages (ms over the measured
    chunks). A summary line is marked "(judged)" only when its p95 is the verdict's, else
    "(whole run)": a run with no verdict, or content_fps unset, has no judged line."""
    iv = s.get("interval_ms")
    out = []
    if isinstance(iv, dict):
        episodes = s.get("rollout_episodes")
        out.append(
            f"first output {_ms(s.get('first_output_ms'))} ms"
            + (f", {episodes} episode(s)" if episodes is not None else "")
        )
        basis_judged = s.get("interval_judged_on")
        value = judged.get("value") if judged else None
        for key, label, basis in (
            ("presentation_ms", "presentation interval", "presentation"),
            ("interval_ms", "per-frame average interval", "per_frame"),
        ):
            d = s.get(key)
            if isinstance(d, dict):
                same = isinstance(value, int | float) and value == d.get("p95")
                mark = " (judged)" if basis_judged == basis and same else " (whole run)"
                out.append(
                    f"{label}{mark} ms p50 {_ms(d.get('p50'))} p95 {_ms(d.get('p95'))} "
                    f"p99 {_ms(d.get('p99'))} max {_ms(d.get('max'))} ({d.get('n', 0)} frames)"
                )
        if isinstance(value, int | float) and judged is not None:
            out.append(f"judged (content_fps {str(judged['status']).upper()}): {judged['detail']}")
    out += [
        f"chunk stage {name}: p50 {_ms(d['p50'])} p95 {_ms(d['p95'])} p99 {_ms(d['p99'])} "
        f"max {_ms(d['max'])} ms ({d['n']} chunks)"
        for name, d in chunk_stages.items()
    ]
    return out


def _show_text(
    run: dict[str, Any], stages: Any, evs: list[dict[str, Any]], peak_rss: float | None
) -> list[Any]:
    """What ``show`` prints for people: the stage table, then plain lines."""
    # the live display's tables: soakd.observers sets up structlog, which `soakd runs` and
    # `show -f json` do without (~0.2 s of CPU a call)
    from soakd.observers.display import fmt_bytes, summary_table

    out: list[Any] = [summary_table(run, stages)]
    s = run.get("summary") or {}
    named = f"run {printable(run['name'])}: " if run.get("name") else ""
    out.append(
        f"{named}workload {run['workload_kind']}, fps {run['fps']}, started {run['started_at']}, "
        f"duration {run['duration_s'] or 0:.1f} s, verdict {run['verdict'] or '-'}"
        + (f", reason: {printable(run['reason'])}" if run.get("reason") else "")
    )
    if run.get("labels"):
        out.append(f"labels {format_labels(run['labels'])}")
    if s:
        out.append(
            f"frames {s.get('frames_done')} of {s.get('frames_captured')} captured, "
            f"drops {s.get('drops')}, stale {s.get('stale')}, errors {s.get('errors')}, "
            f"peak RSS {fmt_bytes(peak_rss)}"
        )
    out += [f"  t={e['t'] or 0:8.2f}s {e['kind']:<10} {e['message'] or ''}" for e in evs[:20]]
    return out


def register(app: typer.Typer) -> None:
    app.command("runs")(runs_cmd)
    app.command("show")(show_cmd)

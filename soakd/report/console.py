"""The verdict for people at a terminal: a rich table of the criteria, then the reason,
warnings and hints. Printed after every run (``soakd run``) and by ``soakd gate``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from soakd.analysis.model import (
    FAIL,
    INVALID,
    NA,
    OVERALL_FAIL,
    OVERALL_INVALID,
    OVERALL_PASS,
    PASS,
    Verdict,
)
from soakd.analysis.streams import streams_of

_STYLE = {PASS: "green", FAIL: "bold red", INVALID: "bold yellow", NA: "dim"}
_OVERALL = {OVERALL_PASS: "bold green", OVERALL_FAIL: "bold red", OVERALL_INVALID: "bold yellow"}


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "fraction":
        return f"{v:.2%}"
    return f"{v:.4g}"


def format_verdict_table(verdict: Verdict, *, boxed: bool = True) -> RenderableType:
    """The verdict as a rich renderable: the criteria table, then warnings and hints.
    ``boxed=False``: aligned columns with no box-drawing characters (for the journal)."""
    st = _OVERALL.get(verdict.status, "bold")
    table = Table(
        title=Text(f"{verdict.status}  run {verdict.run_id}", style=st),
        title_justify="left",
        expand=False,
        box=box.HEAVY_HEAD if boxed else None,
    )
    for col in ("criterion", "status", "value", "threshold", "unit", "detail"):
        table.add_column(col, overflow="fold", no_wrap=col != "detail")
    for c in verdict.criteria:
        table.add_row(
            c.criterion,
            Text(c.status.upper(), style=_STYLE.get(c.status, "")),
            _fmt(c.value, c.unit),
            _fmt(c.threshold, c.unit),
            c.unit,
            c.detail,
        )
    parts: list[RenderableType] = [table]
    streams = streams_of(verdict)
    if streams:
        parts.append(format_streams_table(streams, boxed=boxed))
    if verdict.status != OVERALL_PASS:
        parts.append(Text(f"reason: {verdict.reason}", style=st))
    for w in verdict.warnings:
        parts.append(Text(f"warning: {w}", style="yellow"))
    for h in verdict.hints:
        parts.append(Text(f"hint: {h}", style="cyan"))
    return Group(*parts)


def format_criteria_rows(rows: Sequence[dict[str, Any]]) -> Table:
    """Stored verdict rows (criterion, status, value, threshold, unit) as a compact table:
    what ``soakd show`` lists; ``soakd gate`` prints the details."""
    table = Table(box=box.SIMPLE_HEAD, expand=False)
    for col in ("criterion", "status", "value", "threshold", "unit"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        status, unit = str(r["status"]), str(r.get("unit") or "")
        table.add_row(
            str(r["criterion"]),
            Text(status.upper(), style=_STYLE.get(status, "")),
            _fmt(r.get("value"), unit),
            _fmt(r.get("threshold"), unit),
            unit,
        )
    return table


#: the per-stream table's columns: heading, and the text of one stream's result
STREAM_COLUMNS: tuple[tuple[str, str], ...] = (
    ("stream", "stream"),
    ("verdict", "status"),
    ("frames", "frames"),
    ("measured", "measured_frames"),
    ("lost", "loss_fraction"),
    ("errors", "errors"),
    ("age p95 ms", "frame_age_p95_ms"),
    ("reason", "reason"),
)


def stream_cells(r: dict[str, Any]) -> list[str]:
    """One stream's result as the texts of STREAM_COLUMNS (``-`` where unknown); the
    reason only when the stream did not pass."""
    out = []
    for _, key in STREAM_COLUMNS:
        v = r.get(key)
        if key == "reason" and r.get("status") == OVERALL_PASS:
            v = None
        if v is None:
            out.append("-")
        elif key == "loss_fraction":
            out.append(f"{v:.2%}")
        elif isinstance(v, float):
            out.append(f"{v:.4g}")
        else:
            out.append(str(v))
    return out


def format_streams_table(streams: Sequence[dict[str, Any]], *, boxed: bool = True) -> Table:
    """Each stream's own verdict (``run.streams``): the ``streams`` criterion's evidence."""
    table = Table(title="per stream", title_justify="left", box=box.HEAVY_HEAD if boxed else None)
    for head, _ in STREAM_COLUMNS:
        table.add_column(head, overflow="fold", no_wrap=head != "reason")
    for r in streams:
        cells = stream_cells(r)
        st = _OVERALL.get(str(r.get("status")), "")
        table.add_row(cells[0], Text(cells[1], style=st), *cells[2:])
    return table

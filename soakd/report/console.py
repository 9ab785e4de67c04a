"""The verdict for people at a terminal: a rich table of the criteria, then the reason,
warnings and hints. Printed after every run (``soakd run``) and by ``soakd gate``."""

from __future__ import annotations

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
    if verdict.status != OVERALL_PASS:
        parts.append(Text(f"reason: {verdict.reason}", style=st))
    for w in verdict.warnings:
        parts.append(Text(f"warning: {w}", style="yellow"))
    for h in verdict.hints:
        parts.append(Text(f"hint: {h}", style="cyan"))
    return Group(*parts)

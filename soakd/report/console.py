"""The verdict for people at a terminal: a rich table of the criteria, then the reason,
warnings and hints. Printed after every run (``soakd run``) and by ``soakd gate``.

The tables lay themselves out for the width they are given (``NotedTable``): a run id is
never cut, and a criterion's detail (a stream's reason) is wrapped at word boundaries, or,
on a terminal too narrow for a readable column, listed under the table instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
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
from soakd.report.text import row_detail

_STYLE = {PASS: "green", FAIL: "bold red", INVALID: "bold yellow", NA: "dim"}
_OVERALL = {OVERALL_PASS: "bold green", OVERALL_FAIL: "bold red", OVERALL_INVALID: "bold yellow"}

#: the fewest columns a criterion's detail (a stream's reason) is wrapped into: with fewer
#: left beside the other columns, the details are listed under the table instead
MIN_NOTE_WIDTH = 30
#: measuring a table's natural width: wider than any terminal
_UNBOUNDED = 100_000


def natural_width(console: Console, options: ConsoleOptions, renderable: RenderableType) -> int:
    """How wide ``renderable`` draws itself with no limit (a table: nothing wrapped)."""
    return Measurement.get(console, options.update_width(_UNBOUNDED), renderable).maximum


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "fraction":
        return f"{v:.2%}"
    return f"{v:.4g}"


class NotedTable:
    """A rich table whose last column is free text (a criterion's detail, a stream's
    reason), laid out for the width it is rendered at. The text is wrapped at word
    boundaries in a column at least as wide as its longest word and MIN_NOTE_WIDTH (or as
    wide as the longest text, if that is less); when the other columns leave less than
    that, the table is drawn without it and the texts follow, each keyed by its row's first
    cell. ``make`` builds the table with every column but the note's."""

    def __init__(self, make: Callable[[], Table], note_head: str) -> None:
        self._make = make
        self._head = note_head
        self._rows: list[tuple[list[RenderableType], str]] = []

    def add_row(self, key: str, *cells: RenderableType, note: str) -> None:
        """One row: its first cell ``key`` (what the note is listed under), the other
        cells, and its note (empty: none)."""
        self._rows.append(([key, *cells], note))

    def table(self, note_width: int | None) -> Table:
        """The table, with the note column ``note_width`` wide (None: without it)."""
        t = self._make()
        if note_width is not None:
            t.add_column(self._head, width=note_width, overflow="fold")
        for cells, note in self._rows:
            t.add_row(*cells, *([Text(note or "-")] if note_width is not None else []))
        return t

    def note_width(self, console: Console, options: ConsoleOptions) -> int | None:
        """The note column's width at ``options.max_width``; None: list the notes below."""
        notes = [n for _, n in self._rows]
        longest = max([cell_len(self._head), *(cell_len(n) for n in notes)])
        longest_word = max([0, *(cell_len(w) for n in notes for w in n.split())])
        others = natural_width(console, options, self.table(1)) - 1
        left = options.max_width - others
        if left >= longest:
            return longest
        if left >= max(MIN_NOTE_WIDTH, longest_word):
            return left
        return None

    def notes_below(self) -> list[RenderableType]:
        """The notes as a keyed list: ``key: note``, wrapped at word boundaries."""
        out: list[RenderableType] = [Text(f"{self._head}s:", style="bold")]
        for cells, note in self._rows:
            if note:
                line = Text.assemble((f"{cells[0]}: ", "bold"), note)  # no markup
                out.append(Padding(line, (0, 0, 0, 2)))
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = self.note_width(console, options)
        yield self.table(width)
        if width is None:
            yield from self.notes_below()


def format_verdict_table(verdict: Verdict, *, boxed: bool = True) -> RenderableType:
    """The verdict as a rich renderable: the criteria table, then warnings and hints.
    ``boxed=False``: aligned columns with no box-drawing characters (for the journal)."""
    st = _OVERALL.get(verdict.status, "bold")
    parts: list[RenderableType] = [_criteria_table(verdict, st, boxed)]
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


def _criteria_table(verdict: Verdict, style: str, boxed: bool) -> NotedTable:
    """The criteria, one row each, their details in the last column (or under it)."""

    def make() -> Table:
        t = Table(
            title=Text(f"{verdict.status}  run {verdict.run_id}", style=style),
            title_justify="left",
            expand=False,
            box=box.HEAVY_HEAD if boxed else None,
        )
        for col in ("criterion", "status", "value", "threshold", "unit"):
            t.add_column(col, no_wrap=True)
        return t

    table = NotedTable(make, "detail")
    for c in verdict.criteria:
        table.add_row(
            c.criterion,
            Text(c.status.upper(), style=_STYLE.get(c.status, "")),
            _fmt(c.value, c.unit),
            _fmt(c.threshold, c.unit),
            c.unit,
            note=row_detail(c),
        )
    return table


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


def format_streams_table(streams: Sequence[dict[str, Any]], *, boxed: bool = True) -> NotedTable:
    """Each stream's own verdict (``run.streams``): the ``streams`` criterion's evidence,
    the reasons wrapped as ``NotedTable`` wraps a criterion's detail."""

    def make() -> Table:
        t = Table(title="per stream", title_justify="left", box=box.HEAVY_HEAD if boxed else None)
        for head, _ in STREAM_COLUMNS[:-1]:
            t.add_column(head, no_wrap=True)
        return t

    table = NotedTable(make, STREAM_COLUMNS[-1][0])
    for r in streams:
        cells = stream_cells(r)
        st = _OVERALL.get(str(r.get("status")), "")
        note = cells[-1] if cells[-1] != "-" else ""
        table.add_row(cells[0], Text(cells[1], style=st), *cells[2:-1], note=note)
    return table

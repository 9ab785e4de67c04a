"""Rich terminal tables for ``soakd profile`` and ``soakd sweep`` (on a terminal, instead of
their Markdown; the numbers are the same ones the Markdown shows), and ``IdListing``: a
listing of runs that never cuts a run id, whatever the terminal's width."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from soakd.records import STAGES
from soakd.report.console import natural_width

if TYPE_CHECKING:  # the soak runner under them: not for `soakd runs`, which lists with IdListing
    from soakd.studies.profiling import ProfileResult
    from soakd.studies.sweep import SweepResult


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _mb(v: int | None) -> str:
    return "–" if v is None else f"{v / (1 << 20):.0f} MB"


def profile_tables(r: ProfileResult) -> list[Any]:
    """The stage table, then the memory / rate lines and the notes."""
    t = Table(title=f"soakd profile {r.run_id} ({r.workload_kind}, {r.frames} frames unpaced)")
    for c in ("stage", "first frame (ms)", "median (ms)", "max (ms)"):
        t.add_column(c, justify="left" if c == "stage" else "right")
    for s in STAGES:
        st = r.stages[s]
        t.add_row(s, _ms(r.first.get(s)), _ms(st.median), _ms(st.max))
    lines = [
        f"statistics over the {r.measured} frames after the first",
        f"peak RSS {_mb(r.peak_rss_bytes)}, peak GPU memory {_mb(r.peak_gpu_mem_bytes)}",
    ]
    if r.first_error:
        lines.append(f"first frame raised: {r.first_error}")
    if r.out_tokens is not None:
        lines.append(f"output tokens per frame (median): {r.out_tokens:g}")
    if r.session is not None:
        se = r.session
        lines.append(
            f"session: interval between frames taken p50 {_ms(se.take_interval_p50_ms)} ms, "
            f"max {_ms(se.take_interval_max_ms)} ms ({se.taken} frames); capture -> next "
            f"output p50 {_ms(se.output_latency_p50_ms)} ms"
        )
    if r.question_every_s is not None and r.theoretical_fps is not None:  # realtime
        lines.append(f"answers {r.theoretical_fps:.2f} a second one at a time (1000 / "
                     f"{r.rate_basis})")  # fmt: skip
        lines.append(f"recommended: a question at most every {r.question_every_s:g} s: "
                     f"--set workload.question_every_s={r.question_every_s:g}")  # fmt: skip
    elif r.theoretical_fps is not None:
        lines.append(f"theoretical rate {r.theoretical_fps:.2f} fps (1000 / {r.rate_basis})")
        if r.fps_flag is not None:
            lines.append(f"recommended rate {r.recommended_fps:g} fps: {r.fps_flag}")
        else:
            lines.append(f"recommended rate: none (the run ended {r.status})")
    else:
        lines.append("theoretical rate: unknown (no frame finished after the first)")
    lines += [f"note: {n}" for n in r.notes]
    return [t, *(Text(ln) for ln in lines)]


def sweep_tables(r: SweepResult) -> list[Any]:
    """One row per value (the knee marked), then the summary line and the knee rule."""
    how = "paced" if r.paced else "back to back"
    t = Table(title=f"soakd sweep {r.key} ({len(r.values)} values, {r.frames} frames, {how})")
    cols = ["value", "status", "pre p50", "infer p50", "infer max", "total p50"]
    cols += ["age p95", "drops"] if r.paced else []
    cols += ["peak RSS", "out tokens"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("value", "status") else "right")
    for i, p in enumerate(r.points):
        value = f"{p.value} (knee)" if i == r.knee_index else str(p.value)
        if p.status != "ok":
            t.add_row(value, f"rejected: {p.reason}", *("–" for _ in cols[2:]))
            continue
        status = (p.verdict or "ok") + (" (host busy)" if p.host_busy else "")
        row = [value, status, _ms(p.pre_median_ms), _ms(p.infer_median_ms)]
        row += [_ms(p.infer_max_ms), _ms(p.total_median_ms)]
        if r.paced:
            drops = "–" if p.drop_fraction is None else f"{p.drop_fraction:.1%}"
            row += [_ms(p.age_p95_ms), drops]
        row += [_mb(p.peak_rss_bytes), "–" if p.out_tokens is None else f"{p.out_tokens:g}"]
        t.add_row(*row)
    return [t, Text(r.summary), Text(f"times in ms; knee rule: {r.knee_rule}")]


class IdListing:
    """Records whose first field is an id people copy (a run id, into ``soakd show RUN_ID``),
    laid out for the width they are rendered at with nothing cut: one table row per record
    when the whole table fits; narrower, one block per record, the id whole on a line of its
    own, then the other fields as ``head value`` (``-`` left out) apart by `` · ``, wrapped
    at word boundaries."""

    def __init__(self, heads: Sequence[str]) -> None:
        self.heads = tuple(heads)
        self.rows: list[tuple[str, ...]] = []

    def add_row(self, *cells: str) -> None:
        """One record: its id, then a text for each of the other heads."""
        self.rows.append(cells)

    def table(self) -> Table:
        """Every record as a table row (texts as they are: no markup)."""
        t = Table()
        t.add_column(self.heads[0], no_wrap=True)
        for head in self.heads[1:]:
            t.add_column(head)
        for cells in self.rows:
            t.add_row(*(Text(c) for c in cells))
        return t

    def blocks(self) -> list[RenderableType]:
        """Every record as its id in bold, then its fields indented under it."""
        out: list[RenderableType] = []
        for cells in self.rows:
            pairs = zip(self.heads[1:], cells[1:], strict=True)
            fields = " · ".join(f"{head} {v}" for head, v in pairs if v != "-")
            out += [Text(cells[0], style="bold"), Padding(Text(fields), (0, 0, 0, 2))]
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table()
        if natural_width(console, options, table) <= options.max_width:
            yield table
        else:
            yield from self.blocks()


def printable(text: str) -> str:
    """``text`` as a terminal shows it safely: a character that is not printable (NUL, an
    ANSI escape, a newline) written as its Python escape (``\\x1b``), the rest as is.
    For what a database holds and soakd did not write (a name set by hand)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)

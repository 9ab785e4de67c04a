"""The live display of ``soakd run`` on a terminal, and the end-of-run summary table."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from soakd.observers.base import Observer, Progress, RunInfo, RunResult
from soakd.records import DECIDED, FAILING, LOOK_EVENT, STAGES, Event, Standing, standings


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def fmt_bytes(v: float | int | None) -> str:
    if v is None:
        return "-"
    return f"{v / (1 << 20):.0f} MiB"


def fmt_s(v: float) -> str:
    v = max(0, int(v))
    h, rem = divmod(v, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:d}:{s:02d}"


class LiveDisplay(Observer):
    """Redraws once a second from the runner's progress snapshots; before the first frame, a
    spinner says what is happening (opening the source, building or loading the model,
    warm-up)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live: Live | None = None
        self.info: RunInfo | None = None
        self.phase = "starting"
        self.last: Progress | None = None
        #: the latest look of a ``duration = "auto"`` run: when, and each criterion's standing
        self.look: tuple[float, list[Standing]] | None = None

    def _start(self) -> None:
        if self.live is None:
            self.live = Live(self._render(self.last), console=self.console, refresh_per_second=4)
            self.live.start()

    def on_phase(self, name: str) -> None:
        self.phase = name
        self._start()
        assert self.live is not None
        self.live.update(self._render(self.last))

    def on_run_start(self, info: RunInfo) -> None:
        self.info = info
        self._start()
        assert self.live is not None
        self.live.update(self._render(None))

    def on_event(self, event: Event) -> None:
        if event.kind == LOOK_EVENT:
            self.look = (event.t, standings(event.data))

    def on_progress(self, p: Progress) -> None:
        self.last = p
        if self.live is not None:
            self.live.update(self._render(p))

    def _title(self) -> Text:
        info = self.info
        s = info.settings if info else None
        return Text.assemble(
            ("soakd ", "bold"),
            (info.run_id if info else "", "cyan"),
            f"  {s.workload.kind} @ {s.run.fps:g} fps" if s else "",
        )

    def _render(self, p: Progress | None) -> Any:
        title = self._title()
        if p is None or p.frames_done == 0:
            since = f" {fmt_s(p.elapsed_s)}" if p is not None else ""
            return Group(title, Spinner("dots", text=Text(f"{self.phase}...{since}", style="dim")))
        total = p.elapsed_s + p.remaining_s
        bar = ProgressBar(total=max(total, 1e-9), completed=p.elapsed_s, width=40)
        head = Table.grid(padding=(0, 1))
        auto = self.info is not None and self.info.settings.run.auto_duration
        # an auto run ends when decided: its max_duration is a bound, not its length
        span = f" (auto, at most {fmt_s(total)})" if auto else f" / {fmt_s(total)}"
        head.add_row(
            bar,
            Text(f"{fmt_s(p.elapsed_s)}{span}"),
            Text("warm-up" if p.warmup else "", style="yellow"),
        )
        parts: list[Any] = [title, head, _counters(p), _stages(p), *self._convergence()]
        for line in p.failing:
            parts.append(Text(f"failing: {line}", style="bold red"))
        if not p.progressing and p.stalled_s > 2:
            parts.append(Text(f"no frame finished for {p.stalled_s:.0f} s", style="bold red"))
        return Group(*parts)

    def _convergence(self) -> list[Any]:
        """A ``duration = "auto"`` run: when the first look comes, then the latest look's
        standing of each criterion (nothing for a run of fixed length)."""
        s = self.info.settings if self.info else None
        if s is None or not s.run.auto_duration:
            return []
        if self.look is None:
            first = fmt_s(float(s.criteria.min_duration_s))
            return [Text(f"duration auto: the first look at {first}", style="dim")]
        return [convergence_table(*self.look)]

    def on_run_end(self, result: RunResult) -> None:
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _counters(p: Progress) -> Table:
    t = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    for col in ("fps", "frames", "drops", "stale", "errors", "age p50", "RSS", "VRAM"):
        t.add_column(col, justify="right")
    t.add_row(
        f"{p.achieved_fps:.2f}",
        str(p.frames_done),
        str(p.drops),
        str(p.stale),
        Text(str(p.errors), style="red" if p.errors else ""),
        fmt_ms(p.age_p50_ms),
        fmt_bytes(p.rss_bytes),
        fmt_bytes(p.gpu_mem_bytes),
    )
    return t


_STATE_STYLE = {DECIDED: "green", FAILING: "red"}


def convergence_table(t: float, stands: list[Standing]) -> Table:
    """Each criterion at a look: decided, failing or undecided, and the smallest growth a
    trend could see so far beside its tolerance."""
    table = Table(
        title=f"look at {fmt_s(t)}",
        title_justify="left",
        box=None,
        header_style="bold",
        pad_edge=False,
    )
    for col in ("criterion", "state", "smallest growth it could see", "why not decided"):
        table.add_column(col)
    for st in stands:
        why = "-" if st.why in ("", st.state, "undecided") else st.why  # the state says it
        table.add_row(st.criterion, Text(st.state, style=_STATE_STYLE.get(st.state, "yellow")),
                      st.sees() or "-", why)  # fmt: skip
    return table


def _stages(p: Progress) -> Table:
    """Recent stage times (ms): p50, p95 and max per stage."""
    t = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    t.add_column("ms")
    for name in STAGES:
        t.add_column(name, justify="right")
    for label, vals in (("p50", p.stage_p50_ms), ("p95", p.stage_p95_ms), ("max", p.stage_max_ms)):
        t.add_row(label, *(fmt_ms(vals.get(k)) for k in STAGES))
    return t


def summary_table(
    run: dict[str, Any], stages: dict[str, dict[str, float | None]], *, boxed: bool = True
) -> Table:
    """The first frame's stage times and the stages' p50, p95, p99 and max (post-warm-up);
    a row no frame has a value for is left out (a session's untimed stages and total), and
    a session's capture -> next output latency is the "next output" row.
    ``boxed=False``: aligned columns with no box-drawing characters (for the journal)."""
    t = Table(
        title=f"run {run['id']}  ({run['status']})",
        title_justify="left",
        box=box.HEAVY_HEAD if boxed else None,
    )
    t.add_column("stage")
    cols = ("first", "p50", "p95", "p99", "max")
    for c in cols:
        t.add_column(f"{c} ms", justify="right")
    for name, st in stages.items():
        if all(st.get(c) is None for c in cols):
            continue
        t.add_row(_ROW_NAMES.get(name, name), *(fmt_ms(st.get(c)) for c in cols))
    return t


#: the summary table's rows that are not stages, named for people
_ROW_NAMES = {"output_latency": "next output"}

"""The live display of ``soakd run`` on a terminal, and the end-of-run summary table."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from soakd.observers.base import Observer, Progress, RunInfo, RunResult


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
    """Redraws once a second from the runner's progress snapshots."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live: Live | None = None
        self.info: RunInfo | None = None
        self.loading = "starting"

    def on_run_start(self, info: RunInfo) -> None:
        self.info = info
        self.live = Live(
            self._render(None), console=self.console, refresh_per_second=4, transient=False
        )
        self.live.start()

    def on_progress(self, p: Progress) -> None:
        if self.live is not None:
            self.live.update(self._render(p))

    def _render(self, p: Progress | None) -> Any:
        info = self.info
        s = info.settings if info else None
        title = Text.assemble(
            ("soakd ", "bold"),
            (info.run_id if info else "", "cyan"),
            f"  {s.workload.kind} @ {s.run.fps:g} fps" if s else "",
        )
        if p is None:
            return Group(title, Text("waiting for the first frame...", style="dim"))
        total = p.elapsed_s + p.remaining_s
        bar = ProgressBar(total=max(total, 1e-9), completed=p.elapsed_s, width=40)
        head = Table.grid(padding=(0, 1))
        head.add_row(
            bar,
            Text(f"{fmt_s(p.elapsed_s)} / {fmt_s(total)}"),
            Text("warm-up" if p.warmup else "", style="yellow"),
        )
        t = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
        for col in (
            "fps",
            "frames",
            "drops",
            "stale",
            "errors",
            "age p50",
            "grab",
            "pre",
            "infer",
            "decode",
            "total",
            "RSS",
            "VRAM",
        ):
            t.add_column(col, justify="right")
        st = p.stage_p50_ms
        t.add_row(
            f"{p.achieved_fps:.2f}",
            str(p.frames_done),
            str(p.drops),
            str(p.stale),
            Text(str(p.errors), style="red" if p.errors else ""),
            fmt_ms(p.age_p50_ms),
            fmt_ms(st.get("grab")),
            fmt_ms(st.get("pre")),
            fmt_ms(st.get("infer")),
            fmt_ms(st.get("decode")),
            fmt_ms(st.get("total")),
            fmt_bytes(p.rss_bytes),
            fmt_bytes(p.gpu_mem_bytes),
        )
        parts: list[Any] = [title, head, t]
        if not p.progressing and p.stalled_s > 2:
            parts.append(Text(f"no frame finished for {p.stalled_s:.0f} s", style="bold red"))
        return Group(*parts)

    def on_run_end(self, result: RunResult) -> None:
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def summary_table(run: dict[str, Any], stages: dict[str, dict[str, float | None]]) -> Table:
    """Stage medians and maxima (post-warm-up) plus the run's counters."""
    t = Table(title=f"run {run['id']}  ({run['status']})", title_justify="left")
    t.add_column("stage")
    for c in ("first", "p50", "p95", "max"):
        t.add_column(f"{c} ms", justify="right")
    for name, st in stages.items():
        t.add_row(
            name,
            fmt_ms(st.get("first")),
            fmt_ms(st.get("p50")),
            fmt_ms(st.get("p95")),
            fmt_ms(st.get("max")),
        )
    return t

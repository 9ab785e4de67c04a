"""Reports: a Verdict (and the run's series) to Markdown, JSON, JUnit XML or one offline
HTML file. ``render(fmt, data, verdict)`` picks the renderer; ``soakd.report.console``
renders the verdict table for a terminal.

Reports read soakd.analysis (the model and the window rules) and soakd.jsonsafe, never the
store: the caller loads and judges the run and hands its RunData and Verdict in."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from soakd.analysis.model import RunData, Verdict

FORMATS: tuple[str, ...] = ("md", "json", "junit", "html")


def render(fmt: str, data: RunData, verdict: Verdict) -> str:
    """Render the report in ``fmt`` (one of FORMATS); a run measured while other processes
    held the host's CPUs carries the host-load warning (``soakd.report.host``) in each.
    The renderers are imported here: a command that prints the console table
    (``soakd.report.console``, a module of this package) does not import them."""
    from soakd.report.host import with_host_warning
    from soakd.report.html import render_html
    from soakd.report.json import render_json
    from soakd.report.junit import render_junit
    from soakd.report.markdown import render_markdown

    renderers: dict[str, Callable[[RunData, Verdict], str]] = {
        "md": render_markdown,
        "json": render_json,
        "junit": render_junit,
        "html": render_html,
    }
    if fmt not in renderers:
        raise ValueError(f"unknown report format {fmt!r} (choose {', '.join(FORMATS)})")
    return renderers[fmt](data, with_host_warning(data, verdict))

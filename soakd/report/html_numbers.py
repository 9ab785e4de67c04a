"""The HTML report's numbers section (stage table, fps, counts, environment, config), set
above the panels by ``soakd.report.html.render_html``. Every text from the run is escaped."""

from __future__ import annotations

import json
from html import escape

from soakd.report.markdown import episodes_words, interval_words, served_words, tail_words
from soakd.report.summary import RunSummary


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g}"


def _count(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f}"


def _stage_rows(s: RunSummary) -> str:
    rows = []
    for name, d in [*s.stages.items(), ("frame age", s.frame_age), *s.served.items()]:
        if not d.n:
            continue
        cells = [str(d.n), *(_ms(v) for v in (d.p50, d.p95, d.p99, d.max))]
        cells.append(_ms(s.first_ms.get(name)))
        rows.append(
            f'<tr data-stage="{escape(name)}"><td>{escape(name)}</td>'
            + "".join(f"<td>{c}</td>" for c in cells)
            + "</tr>"
        )
    return "".join(rows)


def _generator_html(s: RunSummary) -> str:
    """A generator run's first output, output intervals and their tail, and a rollout's
    named chunk stages table."""
    g = s.generator
    if not g:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in interval_words(g))
    out = (
        f'<p class="note" id="generator"><b>First output:</b> '
        f"{_ms(g.get('first_output_ms'))} ms{escape(episodes_words(g))}</p>"
        f'<ul class="note" id="intervals">{items}</ul>'
    )
    if g.get("tail"):
        words = escape(tail_words(g["tail"]))
        out += f'<p class="note" id="interval-tail"><b>Interval tail:</b> {words}</p>'
    if s.chunk_stages:
        rows = "".join(
            f'<tr data-chunk-stage="{escape(name)}"><td>{escape(name)}</td><td>{d.n}</td>'
            + "".join(f"<td>{_ms(v)}</td>" for v in (d.p50, d.p95, d.p99, d.max))
            + "</tr>"
            for name, d in s.chunk_stages.items()
        )
        out += (
            '<table id="chunk-stages"><tr><th>chunk stage</th><th>n</th><th>p50 ms</th>'
            f"<th>p95 ms</th><th>p99 ms</th><th>max ms</th></tr>{rows}</table>"
        )
    return out


def _served_html(s: RunSummary) -> str:
    if not s.served_run:
        return ""
    words = escape(served_words(s.served_run))
    return f'<p class="note" id="served"><b>Served:</b> {words}</p>'


def numbers_html(s: RunSummary) -> str:
    """``<h2>Numbers</h2>`` and what follows it, as one HTML fragment."""
    c = s.counts
    counts = (
        f"{_count(c.get('captured'))} captured, {_count(c.get('done'))} done, "
        f"{_count(c.get('measured'))} measured (after the warm-up), "
        f"{_count(c.get('drops'))} dropped, "
        f"{_count(c.get('stale'))} stale, {_count(c.get('errors'))} errors"
    )
    fps = f"{_ms(s.fps.get('achieved'))} achieved vs {_ms(s.fps.get('target'))} target"
    config = json.dumps(s.config, indent=2, sort_keys=True, default=str)
    return (
        '<h2 id="numbers">Numbers</h2><table id="stages"><tr><th>stage</th><th>n</th>'
        "<th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>max ms</th><th>first ms</th></tr>"
        f"{_stage_rows(s)}</table>{_generator_html(s)}{_served_html(s)}"
        f'<p class="note" id="fps"><b>fps:</b> {fps}</p>'
        f'<p class="note" id="counts"><b>Counts</b> (the whole run, warm-up included; '
        f"the verdict counts after it): {counts}</p>"
        f'<p class="note" id="environment"><b>Environment:</b> '
        f"{escape(s.environment_line())}</p>"
        f"<details><summary>Config</summary><pre>{escape(config)}</pre></details>"
    )

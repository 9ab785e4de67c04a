"""The Markdown report: short enough for a pull-request comment.

Text from the run (its name, reasons, error messages in details, warnings and hints) is
escaped by ``md_cell``: no raw HTML reaches the page, and no ``|`` or newline breaks a table.
"""

from __future__ import annotations

import json
from typing import Any

from soakd.analysis.model import RunData, Verdict
from soakd.analysis.streams import stream_count, streams_of
from soakd.report.console import STREAM_COLUMNS, stream_cells
from soakd.report.summary import RunSummary, summarize
from soakd.report.text import plain, row_detail

_ICON = {"pass": "✅", "fail": "❌", "invalid": "⚠️", "n/a": "➖"}
BADGE = {"PASS": "✅ PASS", "FAIL": "❌ FAIL", "INVALID": "⚠️ INVALID"}


def _html(text: str) -> str:
    """``text`` with ``& < >`` as HTML entities (line breaks kept)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def md_cell(text: str) -> str:
    """``text`` as inert Markdown on one line: ANSI codes and controls made visible
    (``soakd.report.text.plain``), ``& < >`` as HTML entities, ``|`` escaped, line breaks
    as spaces."""
    text = _html(plain(text))
    return text.replace("|", "\\|").replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "–"
    return f"{v:.2%}" if unit == "fraction" else f"{v:.4g}"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g}"


def _count(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f}"


def numbers_section(s: RunSummary) -> list[str]:
    """The "Numbers" section: stage percentiles (ms), frame age, fps, counts, environment
    and the config (collapsed)."""
    lines = ["", "### Numbers", "", "| stage | n | p50 ms | p95 ms | p99 ms | max ms | first ms |"]
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    rows = [*s.stages.items(), ("frame age", s.frame_age), *s.session.items(), *s.served.items()]
    for name, d in rows:
        if not d.n:
            continue
        first = _ms(s.first_ms.get(name))
        lines.append(
            f"| {name} | {d.n} | {_ms(d.p50)} | {_ms(d.p95)} | {_ms(d.p99)} | {_ms(d.max)} | "
            f"{first} |"
        )
    ach, tgt = s.fps.get("achieved"), s.fps.get("target")
    c = s.counts
    lines += generator_lines(s)
    lines += questions_lines(s.questions)
    if s.served_run:
        lines += ["", f"**Served:** {md_cell(served_words(s.served_run))}"]
    lines += [
        "",
        f"**fps:** {_ms(ach)} achieved vs {_ms(tgt)} target (measured frames / measured s)",
        "",
        "**Counts** (the whole run, warm-up included; the verdict counts after it): "
        f"{_count(c.get('captured'))} captured, {_count(c.get('done'))} done, "
        f"{_count(c.get('measured'))} measured (after the warm-up), "
        f"{_count(c.get('drops'))} dropped, "
        f"{_count(c.get('stale'))} stale, {_count(c.get('errors'))} errors",
        "",
        f"**Environment:** {md_cell(s.environment_line())}",
        "",
        "<details><summary>Config</summary>",
        "",
        f"<pre>{_html(json.dumps(s.config, indent=2, sort_keys=True, default=str))}</pre>",
        "",
        "</details>",
    ]
    return lines


def served_words(r: dict[str, Any]) -> str:
    """``1234 output tokens, 56.7 tokens/s (measured window); errors by kind (the whole
    run): timeout 3, http 503 2`` for a served model's ``served_run``."""
    rate = r.get("output_tokens_per_s")
    words = f"{r.get('output_tokens', 0)} output tokens"
    words += f", {rate:.4g} tokens/s (measured window)" if rate is not None else ""
    kinds = r.get("errors_by_kind") or {}
    errors = ", ".join(f"{k} {n}" for k, n in kinds.items()) if kinds else "none"
    return f"{words}; errors by kind (the whole run): {errors}"


def generator_lines(s: RunSummary) -> list[str]:
    """A generator run's first output, output intervals, where their tail falls, and a
    rollout's named chunk stages (p50/p95/p99/max ms each)."""
    g = s.generator
    if not g:
        return []
    lines = ["", f"**First output:** {_ms(g.get('first_output_ms'))} ms{episodes_words(g)}"]
    lines += ["", *(f"- {line}" for line in interval_words(g, "**"))]
    if g.get("tail"):
        lines += ["", f"**Interval tail:** {tail_words(g['tail'])}"]
    if s.chunk_stages:
        lines += ["", "| chunk stage | n | p50 ms | p95 ms | p99 ms | max ms |"]
        lines.append("|---|---:|---:|---:|---:|---:|")
        for name, d in s.chunk_stages.items():
            lines.append(
                f"| {md_cell(name)} | {d.n} | {_ms(d.p50)} | {_ms(d.p95)} | {_ms(d.p99)} | "
                f"{_ms(d.max)} |"
            )
    return lines


def episodes_words(g: dict[str, Any]) -> str:
    """``; 1 episode (one rollout for the whole run)`` for a rollout, else ``""``."""
    n = g.get("episodes")
    if n is None:
        return ""
    return "; 1 episode (one rollout for the whole run)" if n == 1 else f"; {n} episodes"


def interval_words(g: dict[str, Any], b: str = "") -> list[str]:
    """The presentation interval and the per-frame average (``b``: the bold marker), each
    marked when content_fps and jitter judged it."""
    judged = g.get("judged_on")
    rows = (
        ("presentation", "presentation interval", "frames as they become visible"),
        ("per_frame", "per-frame average interval", "each gap over its frames"),
    )
    out = []
    for basis, label, what in rows:
        d = g["presentation" if basis == "presentation" else "interval"]
        mark = " (judged: criteria.generator_interval)" if judged == basis else ""
        out.append(
            f"{b}{label}{b}{mark} (ms, {what}, {d.n} frames): p50 {_ms(d.p50)}, "
            f"p95 {_ms(d.p95)}, p99 {_ms(d.p99)}, max {_ms(d.max)}"
        )
    return out


def tail_words(tail: dict[str, Any]) -> str:
    """``7 intervals >= 33.1 ms (p95); by emit in the chunk (0 = first): 0 x7; in 3 chunks,
    most in #12 x3`` (chunks by frame id)."""
    pos = ", ".join(f"{p} x{n}" for p, n in tail["tail_by_position"].items())
    top = ", ".join(f"#{fid} x{n}" for fid, n in tail["tail_top_chunks"])
    return (
        f"{tail['tail_intervals']} intervals >= {tail['tail_cut_ms']:.4g} ms (p95); by emit "
        f"in the chunk (0 = first): {pos}; in {tail['tail_chunks']} chunks, most in {top}"
    )


def questions_lines(questions: list[dict[str, Any]]) -> list[str]:
    """A session run's questions: when each was pushed and its answer latency (time to the
    first text chunk after it)."""
    if not questions:
        return []
    parts = [
        f"{md_cell(repr(q.get('text')))} at {_ms(q.get('t_asked'))} s: "
        + ("no answer" if q.get("answer_ms") is None else f"answered in {_ms(q['answer_ms'])} ms")
        for q in questions
    ]
    return ["", "**Questions:** " + "; ".join(parts)]


def streams_section(verdict: Verdict) -> list[str]:
    """The "Streams" section (``run.streams`` > 1): each stream's own verdict; [] for one."""
    streams = streams_of(verdict)
    if not streams:
        return []
    lines = ["", "### Streams", "", "| " + " | ".join(h for h, _ in STREAM_COLUMNS) + " |"]
    lines.append("|---|---|---:|---:|---:|---:|---:|---|")
    for r in streams:
        cells = stream_cells(r)
        cells[1] = BADGE.get(cells[1], cells[1])
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return lines


def render_markdown(data: RunData, verdict: Verdict) -> str:
    """A heading with the verdict, the criteria table, the numbers, then warnings and
    hints."""
    m = data.meta
    dur = f"{m.duration_s:.0f} s" if m.duration_s is not None else "?"
    n, each = stream_count(data), m.setting("run", "fps")
    rate = f" at {m.fps:g} fps" if m.fps else ""  # None: a run that crashed before its row
    if n > 1 and each:
        rate = f" at {n} streams x {each:g} fps"
    lines = [
        f"## soakd verdict: {BADGE.get(verdict.status, verdict.status)}",
        "",
        f"Run `{m.run_id}`{f' ({md_cell(m.name)})' if m.name else ''}: "
        f"{md_cell(m.workload_kind or '?')} workload on {md_cell(m.device or 'cpu')}, {dur}"
        f"{rate if m.fps else ''}, {verdict.window.get('measured_frames', 0)}"
        f" measured frames, exit code {int(verdict.exit_code)}.",
        "",
    ]
    if verdict.status != "PASS":
        lines += [f"**Reason:** {md_cell(verdict.reason)}", ""]
    lines += ["| | criterion | value | threshold | unit | detail |", "|---|---|---:|---:|---|---|"]
    for c in verdict.criteria:
        lines.append(
            f"| {_ICON.get(c.status, c.status)} | {md_cell(c.criterion)} | "
            f"{_num(c.value, c.unit)} | {_num(c.threshold, c.unit)} | {c.unit} | "
            f"{md_cell(row_detail(c))} |"
        )
    lines += streams_section(verdict)
    lines += numbers_section(summarize(data, verdict))
    if verdict.warnings:
        lines += ["", "**Warnings**", ""] + [f"- {md_cell(w)}" for w in verdict.warnings]
    if verdict.hints:
        lines += ["", "**Diagnosis**", ""] + [f"- {md_cell(h)}" for h in verdict.hints]
    return "\n".join(lines) + "\n"

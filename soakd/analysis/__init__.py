"""Analysis: a run's rows in, a Verdict out.

* ``judge(data, criteria, history) -> Verdict`` is pure (soakd.analysis.verdict).
* ``evaluate(conn, run_id)`` loads a run, its criteria and history and judges it.
* ``judge_run(conn, run_id, settings)`` is what the runner calls at the end of every run:
  evaluate and store the verdict (``verdicts`` rows, ``runs.verdict`` / ``exit_code``).
* ``format_verdict_table(verdict)`` is the rich renderable printed after a run and by
  ``soakd gate``.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from soakd.analysis.data import RunData, RunMeta, load_run_data, make_run_data
from soakd.analysis.verdict import CriterionResult, Verdict, judge
from soakd.config import CriteriaSettings
from soakd.store import rundata as q

if TYPE_CHECKING:
    from rich.console import RenderableType

    from soakd.config import Settings

__all__ = [
    "CriterionResult",
    "RunData",
    "RunMeta",
    "Verdict",
    "criteria_of",
    "evaluate",
    "format_verdict_table",
    "judge",
    "judge_run",
    "load_history",
    "load_run_data",
    "make_run_data",
    "store",
]


def criteria_of(data: RunData) -> tuple[CriteriaSettings, str | None]:
    """The ``[criteria]`` the run was configured with (defaults, with a note, when the stored
    config cannot be read back)."""
    raw = data.meta.config.get("criteria")
    if raw is None:
        return CriteriaSettings(), "run has no stored criteria; using the defaults"
    try:
        return CriteriaSettings.model_validate(raw), None
    except Exception as exc:  # a config from another soakd version
        first = str(exc).splitlines()[0]
        return CriteriaSettings(), f"stored criteria unreadable ({first}); using the defaults"


def load_history(conn: sqlite3.Connection, data: RunData) -> list[float]:
    """Jitter ratios of earlier PASS runs with the same config hash on the same host."""
    if not data.meta.config_hash:
        return []
    return q.load_history(
        conn,
        config_hash=data.meta.config_hash,
        host=data.meta.host,
        before_unix=data.meta.started_unix,
        criterion="jitter",
    )


def evaluate(
    conn: sqlite3.Connection, run_id: str, criteria: CriteriaSettings | None = None
) -> tuple[RunData, Verdict]:
    """Load a run and judge it (criteria: the given ones, else the run's own)."""
    data = load_run_data(conn, run_id)
    note = None
    if criteria is None:
        criteria, note = criteria_of(data)
    history = load_history(conn, data) if criteria.jitter_k == "history" else []
    verdict = judge(data, criteria, history)
    if note:
        verdict.warnings.insert(0, note)
    return data, verdict


def store(conn: sqlite3.Connection, verdict: Verdict) -> None:
    """Store a verdict: one ``verdicts`` row per criterion plus runs.verdict/exit_code."""
    q.store_verdict(
        conn,
        verdict.run_id,
        [c.row() for c in verdict.criteria],
        verdict.status,
        int(verdict.exit_code),
    )


def judge_run(conn: sqlite3.Connection, run_id: str, settings: Settings | None = None) -> Verdict:
    """Judge a finished run with ``settings.criteria`` (else its stored criteria) and store
    the verdict. The runner turns ``verdict.exit_code`` into the process exit code."""
    _, verdict = evaluate(conn, run_id, settings.criteria if settings is not None else None)
    store(conn, verdict)
    return verdict


_STYLE = {"pass": "green", "fail": "bold red", "invalid": "bold yellow", "n/a": "dim"}
_OVERALL = {"PASS": "bold green", "FAIL": "bold red", "INVALID": "bold yellow"}


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "fraction":
        return f"{v:.2%}"
    return f"{v:.4g}"


def format_verdict_table(verdict: Verdict) -> RenderableType:
    """The verdict as a rich renderable: the criteria table, then warnings and hints."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    st = _OVERALL.get(verdict.status, "bold")
    table = Table(
        title=Text(f"{verdict.status}  run {verdict.run_id}", style=st),
        title_justify="left",
        expand=False,
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
    parts: list[Any] = [table]
    if verdict.status != "PASS":
        parts.append(Text(f"reason: {verdict.reason}", style=st))
    for w in verdict.warnings:
        parts.append(Text(f"warning: {w}", style="yellow"))
    for h in verdict.hints:
        parts.append(Text(f"hint: {h}", style="cyan"))
    return Group(*parts)

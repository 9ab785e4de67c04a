"""Analysis: a run's rows in, a Verdict out.

The package has a pure core and a thin layer of glue:

* ``model``: the vocabulary: ``RunMeta`` / ``RunData`` in, ``CriterionResult`` /
  ``Verdict`` out, the status words (``PASS`` ... ``NA``), ``MIB`` and the window rules
  (``age_window_s``, ``floor_window_s``).
* ``stats`` (robust statistics), ``verdict`` (``judge(data, criteria, history) -> Verdict``,
  the criteria) and ``diagnosis`` (plain-language hints): pure, numpy in and dataclasses
  out. They import only ``model``, ``stats`` and soakd's vocabulary (config, records,
  errors): no sqlite3, no soakd.store, no rich.
* ``data``: ``make_run_data(...)`` (RunData from plain arrays) and ``load_run_data(conn,
  run_id)`` (RunData from the database, through ``soakd.store.rundata``).
* this module: ``evaluate(conn, run_id)`` loads a run, its criteria and history and judges
  it; ``judge_run(conn, run_id, settings)`` is what the runner calls at the end of every run:
  evaluate and store the verdict (``verdicts`` rows, ``runs.verdict`` / ``exit_code``);
  ``store`` and ``load_history`` are the store-facing halves of that.

Rendering lives in soakd.report: ``soakd.report.console.format_verdict_table`` is the rich
table printed after a run and by ``soakd gate``; the Markdown, JSON, JUnit and HTML reports
sit beside it. soakd.analysis never imports soakd.report or rich.
"""

from __future__ import annotations

import importlib
import sqlite3
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from soakd.analysis.data import load_run_data, make_run_data
    from soakd.analysis.model import CriterionResult, RunData, RunMeta, Verdict
    from soakd.analysis.verdict import judge
    from soakd.config import CriteriaSettings, Settings

__all__ = [
    "CriterionResult",
    "RunData",
    "RunMeta",
    "Verdict",
    "criteria_of",
    "evaluate",
    "judge",
    "judge_run",
    "load_history",
    "load_run_data",
    "make_run_data",
    "store",
]

# the names this package re-exports, by the module that defines them, imported at first use
# (PEP 562): importing one module of the package (``model`` for a table, ``streams`` for
# `soakd show`) does not import the verdict engine, the store glue and the config's pydantic
# models with it (a CLI call's CPU: docs/benchmarks.md, "The test suite's wall time")
_EXPORTS = {
    "CriterionResult": "soakd.analysis.model",
    "RunData": "soakd.analysis.model",
    "RunMeta": "soakd.analysis.model",
    "Verdict": "soakd.analysis.model",
    "judge": "soakd.analysis.verdict",
    "load_run_data": "soakd.analysis.data",
    "make_run_data": "soakd.analysis.data",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def criteria_of(data: RunData) -> tuple[CriteriaSettings, str | None]:
    """The ``[criteria]`` the run was configured with (defaults, with a note, when the stored
    config cannot be read back)."""
    from soakd.config import CriteriaSettings

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
    from soakd.store import rundata as q

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
    """Load a run and judge it (criteria: the given ones, else the run's own), each stream
    and all together when it had several (``streams.judge_streams``: the data returned is
    then the all-streams view). A value soakd cannot have written (text in a numeric
    column, an infinite time) raises ``rundata.DamagedValue`` naming it."""
    from soakd.analysis.data import load_run_data
    from soakd.analysis.streams import judge_streams
    from soakd.store import rundata as q

    q.check_values(conn, run_id)
    data = load_run_data(conn, run_id)
    note = None
    if criteria is None:
        criteria, note = criteria_of(data)
    history = load_history(conn, data) if criteria.jitter_k == "history" else []
    data, verdict = judge_streams(data, criteria, history)  # = judge for one stream
    if note:
        verdict.warnings.insert(0, note)
    return data, verdict


def store(conn: sqlite3.Connection, verdict: Verdict) -> None:
    """Store a verdict: one ``verdicts`` row per criterion plus runs.verdict/exit_code."""
    from soakd.store import rundata as q

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

"""A release gate over many runs (``soakd gate --label release=1.4.0 [--plan P] [--db A ...]``).

A PASS is a promise to a release manager, so every rule picks the answer that cannot let a
broken model ship (docs/verdict.md, "Gating a release over many runs"):

* the gated runs are the soak runs carrying every selection label (``--label``; with a plan
  also its labels and ``plan=<name>``), from every database;
* a run's cell is its ``cell`` label (as ``plan/cell`` outside a plan gate, so two plans'
  cells never mix), else a key built from what it measured: run name or workload kind,
  fps, GPU name (``cpu`` without one) and the short config hash;
* the latest run of a cell (``started_unix`` across every database) is judged, the older
  ones are set aside as superseded; one run id found in several databases (a merged copy
  and its source) is one run;
* a run still running is INVALID; any other run is judged like ``soakd gate RUN_ID``
  (``soakd.analysis.evaluate``), so a crashed or aborted run is never PASS;
* with a plan, a cell without a run is MISSING and a run outside its cells is set aside as
  "not in plan";
* the gate exits 0 only when every cell passed; any FAIL exits 1; otherwise 3 (INVALID or
  MISSING cells, or no matching run at all: nothing was soaked).

Databases are opened read-only and nothing is stored: a release gate does not change its
evidence.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from soakd.analysis import evaluate
from soakd.analysis.fleet import (
    MISSING,
    CellResult,
    FleetResult,
    RunRef,
    SetAside,
    problems_of,
)
from soakd.analysis.model import OVERALL_FAIL, OVERALL_INVALID, OVERALL_PASS
from soakd.errors import ExitCode, UsageError
from soakd.store import db as store_db
from soakd.store import runs
from soakd.store.runs import RunRow
from soakd.store.schema import check_schema

#: the migration that added labels: a database without it holds no labelled run
LABELS_MIGRATION = "0004_labels"
SUPERSEDED, NOT_IN_PLAN = "superseded", "not in plan"
_NAMES_SHOWN = 5  # cell names a reason lists before "and N more"


class PlanCell(Protocol):
    """What the gate reads of a plan cell (``soakd.studies.plan.Cell``)."""

    @property
    def name(self) -> str: ...


class PlanLike(Protocol):
    """What the gate reads of a plan (``soakd.studies.plan.Plan``)."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def cells(self) -> Sequence[PlanCell]: ...


@dataclass(frozen=True, slots=True)
class Found:
    """A matching run, the database it was found in (the path as given) and its cell."""

    run: RunRow
    db: str
    cell: str


# --------------------------------------------------------------------------- pure rules


def selection_labels(labels: Mapping[str, str], plan: PlanLike | None = None) -> dict[str, str]:
    """The labels every gated run must carry: ``labels``, plus a plan's labels and
    ``plan=<name>``. A label given with another value than the plan's is a UsageError (it
    could match no run of the plan)."""
    want = dict(labels)
    if plan is None:
        return want
    theirs = {**{k: str(v) for k, v in plan.labels.items()}, "plan": plan.name}
    for key, value in theirs.items():
        if want.get(key, value) != value:
            raise UsageError(
                f"--label {key}={want[key]} contradicts plan {plan.name!r} ({key}={value})"
            )
        want[key] = value
    return want


def cell_of(run: RunRow, *, in_plan: bool = False) -> str:
    """The cell a run measured: its ``cell`` label (``plan/cell`` when it has a ``plan``
    label and the gate is not over that one plan), else
    ``name-or-kind/FPSfps/GPU-or-cpu/hash8``."""
    cell = run.labels.get("cell")
    if cell is not None:
        plan = run.labels.get("plan")
        return f"{plan}/{cell}" if plan and not in_plan else cell
    what = run.name or run.workload_kind or "run"
    fps = f"{run.fps:g}fps" if run.fps else "?fps"
    gpu = run.environment.get("gpu_name") or "cpu"
    return f"{what}/{fps}/{gpu}/{run.config_hash[:8]}"


def _newest_last(f: Found) -> tuple[float, str, bool]:
    # among copies of one run id, a finished copy sorts after a running one
    return (f.run.started_unix, f.run.id, f.run.status != "running")


def latest_per_cell(found: Sequence[Found]) -> tuple[dict[str, Found], list[Found]]:
    """The latest run of each cell (by ``started_unix``, then id) and the older runs it
    supersedes. Copies of the chosen run id (the same run in another database) are neither."""
    by_cell: dict[str, list[Found]] = {}
    for f in found:
        by_cell.setdefault(f.cell, []).append(f)
    chosen: dict[str, Found] = {}
    superseded: list[Found] = []
    for cell, group in by_cell.items():
        group.sort(key=_newest_last)
        chosen[cell] = group[-1]
        older = {f.run.id: f for f in group[:-1] if f.run.id != group[-1].run.id}
        superseded += older.values()
    return chosen, superseded


def _names(cells: Sequence[CellResult], status: str) -> str:
    names = [c.cell for c in cells if c.status == status]
    more = len(names) - _NAMES_SHOWN
    return ", ".join(names[:_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def outcome(cells: Sequence[CellResult], nothing: str | None) -> tuple[str, ExitCode, str]:
    """PASS (0) only when every cell passed; any FAIL (1); otherwise INVALID (3): INVALID or
    MISSING cells, no cells, or ``nothing`` (no run matched: the reason)."""
    if any(c.status == OVERALL_FAIL for c in cells):
        return OVERALL_FAIL, ExitCode.FAIL, f"{_names(cells, OVERALL_FAIL)} failed"
    if nothing is not None or not cells:
        return OVERALL_INVALID, ExitCode.INVALID, nothing or "no cell to judge"
    parts = [
        f"{_names(cells, status)} {word}"
        for status, word in ((OVERALL_INVALID, "invalid"), (MISSING, "missing"))
        if any(c.status == status for c in cells)
    ]
    if parts:
        return OVERALL_INVALID, ExitCode.INVALID, "; ".join(parts)
    return OVERALL_PASS, ExitCode.PASS, "every cell passed"


def natural(cell: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key putting ``fps=2`` before ``fps=16``: digit runs compare as numbers."""
    return tuple((0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", cell))


# --------------------------------------------------------------------------- databases


def _open(stack: ExitStack, path: Path) -> sqlite3.Connection:
    """The database opened read-only (no migration, no orphan marking, query_only)."""
    try:
        conn = store_db.connect(path, readonly=True)
    except store_db.StoreError as exc:
        raise UsageError(str(exc)) from None
    stack.callback(conn.close)
    return conn


@contextmanager
def _reading(db: str) -> Iterator[None]:
    """A damaged database is one line naming it (a UsageError), never a traceback."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        damaged = "malformed" in str(exc) or "not a database" in str(exc)
        raise UsageError(
            store_db.corrupt_message(Path(db), exc) if damaged else f"{db}: {exc}"
        ) from None


def _matching(
    conn: sqlite3.Connection, db: str, labels: Mapping[str, str], *, in_plan: bool
) -> tuple[list[Found], list[str]]:
    """The soak runs of one database carrying every label, and notes about the database."""
    with _reading(db):
        if LABELS_MIGRATION not in check_schema(conn):
            return [], [f"{db}: written before labels existed: no labelled run in it"]
        rows = runs.find_runs(conn, labels=labels, mode="soak")
    return [Found(r, db, cell_of(r, in_plan=in_plan)) for r in rows], []


def _ref(f: Found) -> RunRef:
    r = f.run
    return RunRef(
        id=r.id,
        db=f.db,
        host=r.host,
        started_at=r.started_at,
        status=r.status,
        name=r.name,
        duration_s=r.duration_s,
        stored_verdict=r.verdict,
        labels=dict(r.labels),
    )


def judge_found(conn: sqlite3.Connection, f: Found) -> CellResult:
    """The cell's verdict from its latest run: INVALID while it is still running, else the
    run re-judged from its rows with its own criteria (nothing stored)."""
    ref = _ref(f)
    if f.run.status == "running":
        with _reading(f.db):
            gone = f.run.id in runs.find_orphaned_runs(conn)
        why = "its process on this host is gone (crashed?)" if gone else f"since {ref.started_at}"
        return CellResult(f.cell, OVERALL_INVALID, f"still running ({why})", ref)
    with _reading(f.db):
        _, verdict = evaluate(conn, f.run.id)
    warnings = list(verdict.warnings)
    if ref.stored_verdict is not None and ref.stored_verdict != verdict.status:
        warnings.insert(
            0, f"stored verdict {ref.stored_verdict}; re-evaluated now: {verdict.status}"
        )
    return CellResult(
        f.cell, verdict.status, verdict.reason, ref, problems_of(verdict.criteria), tuple(warnings)
    )


# --------------------------------------------------------------------------- the gate


def _place(
    found: Sequence[Found], plan: PlanLike | None
) -> tuple[list[tuple[str, Found | None]], list[SetAside]]:
    """(cell, its latest run or None) in plan order (else sorted by cell), and the runs set
    aside: older runs of a gated cell (superseded) and, with a plan, every run whose cell
    the plan does not name (not in plan)."""
    chosen, superseded = latest_per_cell(found)
    if plan is None:
        order = sorted(chosen, key=natural)
        cells: list[tuple[str, Found | None]] = [(c, chosen[c]) for c in order]
        outside: list[Found] = []
    else:
        names = [c.name for c in plan.cells]
        cells = [(c, chosen.get(c)) for c in names]
        named = set(names)
        outside = list({f.run.id: f for f in found if f.cell not in named}.values())
        superseded = [f for f in superseded if f.cell in named]
    aside = [SetAside(f.cell, _ref(f), SUPERSEDED) for f in superseded]
    return cells, aside + [SetAside(f.cell, _ref(f), NOT_IN_PLAN) for f in outside]


def _judge(conns: Mapping[str, sqlite3.Connection], cell: str, f: Found | None) -> CellResult:
    if f is None:
        return CellResult(cell, MISSING, "no run of this cell")
    return judge_found(conns[f.db], f)


def _nothing(labels: Mapping[str, str], dbs: Sequence[str]) -> str:
    want = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(no label)"
    return f"no soak run carries {want} in {', '.join(dbs)}: nothing was soaked"


def gate_fleet(
    dbs: Sequence[Path], labels: Mapping[str, str], plan: PlanLike | None = None
) -> FleetResult:
    """Judge the latest run of every cell across ``dbs`` (opened read-only) and the gate's
    outcome. Raises UsageError for a database that cannot be opened or read, or for labels
    that contradict the plan."""
    want = selection_labels(labels, plan)
    names = list(dict.fromkeys(str(p) for p in dbs))
    found: list[Found] = []
    notes: list[str] = []
    with ExitStack() as stack:
        conns = {db: _open(stack, Path(db)) for db in names}
        for db, conn in conns.items():
            got, said = _matching(conn, db, want, in_plan=plan is not None)
            found, notes = found + got, notes + said
        cells, aside = _place(found, plan)
        results = tuple(_judge(conns, cell, f) for cell, f in cells)
    status, code, reason = outcome(results, None if found else _nothing(want, names))
    return FleetResult(
        cells=results,
        status=status,
        exit_code=code,
        reason=reason,
        labels=want,
        dbs=tuple(names),
        plan=plan.name if plan is not None else None,
        set_aside=tuple(aside),
        notes=tuple(notes),
    )

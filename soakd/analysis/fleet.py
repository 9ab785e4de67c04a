"""The vocabulary of a release gate over many runs (``soakd gate --label/--plan``): what
``soakd.studies.fleet`` decides and ``soakd.report.fleet`` renders.

Plain frozen dataclasses, no logic beyond counting: a ``FleetResult`` holds one
``CellResult`` per cell (PASS, FAIL, INVALID or MISSING), the runs it set aside (older runs
of a cell, runs outside the plan) and the overall status and exit code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from soakd.analysis.model import (
    FAIL,
    INVALID,
    OVERALL_FAIL,
    OVERALL_INVALID,
    OVERALL_PASS,
    CriterionResult,
)
from soakd.errors import ExitCode

SCHEMA = "soakd.gate/1"
#: Status of a cell a plan names but no run measured.
MISSING = "MISSING"
CELL_STATUSES: tuple[str, ...] = (OVERALL_PASS, OVERALL_FAIL, OVERALL_INVALID, MISSING)


@dataclass(frozen=True, slots=True)
class RunRef:
    """Where a run came from: its id, host, database (the path as given) and labels."""

    id: str
    db: str
    host: str | None
    started_at: str
    status: str
    name: str | None = None
    duration_s: float | None = None
    stored_verdict: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Problem:
    """A failing or invalid criterion of a cell's run, with its value."""

    criterion: str
    status: str  # fail | invalid
    value: float | None
    threshold: float | None
    unit: str
    detail: str

    @classmethod
    def of(cls, c: CriterionResult) -> Problem:
        return cls(c.criterion, c.status, c.value, c.threshold, c.unit, c.detail)


def problems_of(criteria: list[CriterionResult]) -> tuple[Problem, ...]:
    """The criteria that keep a run from passing (failed or invalid), in verdict order."""
    return tuple(Problem.of(c) for c in criteria if c.status in (FAIL, INVALID))


@dataclass(frozen=True, slots=True)
class CellResult:
    """One cell: its status (PASS, FAIL, INVALID, MISSING), why, and the run judged (None
    when MISSING)."""

    cell: str
    status: str
    reason: str
    run: RunRef | None = None
    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SetAside:
    """A matching run that was not judged: ``why`` is "superseded" (a newer run of its cell
    was judged) or "not in plan" (its cell is not one of the plan's)."""

    cell: str
    run: RunRef
    why: str


@dataclass(frozen=True, slots=True)
class FleetResult:
    """The gate over every cell: ``status`` PASS only when every cell passed."""

    cells: tuple[CellResult, ...]
    status: str
    exit_code: ExitCode
    reason: str
    labels: Mapping[str, str]
    dbs: tuple[str, ...]
    plan: str | None = None
    set_aside: tuple[SetAside, ...] = ()
    notes: tuple[str, ...] = ()  # about the databases (e.g. one older than labels)

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.cells)

    @property
    def summary(self) -> str:
        """``N cells: P passed, F failed, I invalid, M missing``."""
        n = len(self.cells)
        return (
            f"{n} cell{'' if n == 1 else 's'}: {self.count(OVERALL_PASS)} passed, "
            f"{self.count(OVERALL_FAIL)} failed, {self.count(OVERALL_INVALID)} invalid, "
            f"{self.count(MISSING)} missing"
        )

    def aside(self, why: str) -> list[SetAside]:
        return [s for s in self.set_aside if s.why == why]

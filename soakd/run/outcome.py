"""How a run ended, and the one function that turns that into the process's exit code."""

from __future__ import annotations

from dataclasses import dataclass

from soakd.analysis.model import Verdict
from soakd.errors import ExitCode


@dataclass(frozen=True, slots=True)
class Outcome:
    """``status``: completed | aborted. ``reason``: why it ended early (None = it ran its
    course). ``internal``: it ended on a bug or a failure of soakd itself (a driver crash,
    the store failing, the verdict not computable), which no verdict may hide."""

    status: str = "completed"
    reason: str | None = None
    internal: bool = False


def exit_code(outcome: Outcome, verdict: Verdict | None) -> ExitCode:
    """4 for soakd's own failure; else the verdict's code (0 PASS, 1 FAIL, 3 INVALID); a run
    that was not judged (a profile) exits 0 when it completed and 3 when it did not."""
    if outcome.internal:
        return ExitCode.INTERNAL
    if verdict is not None:
        return ExitCode(int(verdict.exit_code))
    return ExitCode.PASS if outcome.status == "completed" else ExitCode.INVALID

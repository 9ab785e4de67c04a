"""An observer that raises is dropped, never silently: real synthetic soaks store an
``observer_failed`` event and the verdict warns of it; when it is the early stop, the run
says that no early decision could come after it (``run.stop_on_fail`` was off)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from soakd.analysis.criteria import errors as errors_criterion
from soakd.config import Settings
from soakd.observers.base import Observer
from soakd.records import Sample
from soakd.run.runner import run_soak

pytestmark = pytest.mark.slow


def _failures(settings: Settings) -> list[tuple[str, dict[str, Any]]]:
    with sqlite3.connect(settings.run.db) as conn:  # type: ignore[arg-type]
        rows = conn.execute(
            "SELECT message, data FROM events WHERE kind = 'observer_failed'"
        ).fetchall()
    return [(m, json.loads(d)) for m, d in rows]


class _Breaks(Observer):
    """Raises at its fifth sample."""

    def __init__(self) -> None:
        self.n = 0

    def on_sample(self, sample: Sample) -> None:
        self.n += 1
        if self.n == 5:
            raise RuntimeError("display went away")


def test_an_observer_that_raises_is_a_run_event_and_a_verdict_warning(
    synthetic: Callable[..., Settings],
) -> None:
    """A healthy 3 s run whose own observer raises: the run goes on and is not failed by it
    (PASS, or INVALID where a busy host left too few windows to test a trend), with one
    observer_failed event naming the observer, hook and error, and a warning in the
    verdict."""
    s = synthetic()
    res = run_soak(s, observers=[_Breaks()])
    assert res.status == "completed", res.verdict.reason
    assert res.verdict.status == "PASS" or (
        res.verdict.status == "INVALID" and "observer" not in res.verdict.reason
    ), res.verdict.reason
    [(_msg, data)] = _failures(s)
    assert data == {"observer": "_Breaks", "hook": "on_sample", "decides": None,
                    "error": "RuntimeError: display went away"}  # fmt: skip
    assert any(w.startswith("an observer failed at") and "_Breaks" in w
               for w in res.verdict.warnings), res.verdict.warnings  # fmt: skip


def test_a_failed_early_stop_says_no_early_decision_can_come(
    synthetic: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every infer raising under run.stop_on_fail, with the errors look itself raising: the
    early stop is dropped, the run runs its whole 3 s (errors FAIL), and the event and the
    verdict say run.stop_on_fail could no longer end the run."""

    def broken(live: Any, crit: Any) -> None:
        raise ValueError("look broke")

    monkeypatch.setattr(errors_criterion, "early_fail", broken)
    s = synthetic("run.stop_on_fail=true", "workload.error_every=1")
    res = run_soak(s)
    assert res.status == "completed" and res.verdict.get("errors").status == "fail"
    [(msg, data)] = _failures(s)
    assert data["observer"] == "EarlyStop" and data["decides"] == "run.stop_on_fail", data
    assert "run.stop_on_fail can no longer end this run" in msg
    warned = [w for w in res.verdict.warnings if w.startswith("no early decision after")]
    assert warned and "ValueError: look broke" in warned[0], res.verdict.warnings

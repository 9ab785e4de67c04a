"""A PASS needs a soak: with the default criteria a run shorter than a minute is INVALID,
and memory judged on a floor window shortened below ``floor_window_s`` is INVALID, never
PASS. Runs are written through the store (tests/stored_runs.py) and judged as `soakd gate`
judges them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from soakd.config import CriteriaSettings
from soakd.store.db import connect

from .stored_runs import healthy, judged, status, store_run

DEFAULTS = CriteriaSettings().model_dump(exclude={"thresholds"})


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    return connect(tmp_path / "soakd.db")


def test_a_12_second_run_with_default_criteria_is_invalid_too_short_for_a_soak(
    conn: sqlite3.Connection,
) -> None:
    """A healthy 12 s run judged by the default criteria is INVALID: "too short for a soak"."""
    store_run(conn, "r12", healthy(dur=12.0), crit=DEFAULTS, dur=12.0)
    v = judged(conn, "r12")
    assert v.status == "INVALID"
    assert "too short for a soak: 12 s < 60 s" in v.get("run").detail  # type: ignore[union-attr]


def test_a_60_second_healthy_run_passes_with_default_criteria(conn: sqlite3.Connection) -> None:
    """A healthy 60 s run (5 s warm-up) passes every default criterion, memory included:
    the default floor window fits 12 windows after the warm-up."""
    store_run(conn, "r60", healthy(dur=60.0), crit=DEFAULTS, dur=60.0)
    v = judged(conn, "r60")
    assert v.status == "PASS", [(c.criterion, c.status, c.detail) for c in v.criteria]
    assert status(v, "memory_rss") == "pass"


@pytest.mark.parametrize("bounded", [False, True], ids=["exact", "bounded"])
@pytest.mark.parametrize(
    ("floor_window_s", "expected"),
    # 25 s after the warm-up: 10.9 windows (9 % short), 11.9 (within the 5 % slack), 12.5
    [(2.3, "invalid"), (2.1, "pass"), (2.0, "pass")],
)
def test_memory_on_a_floor_window_shortened_below_floor_window_s_is_invalid_never_pass(
    conn: sqlite3.Connection, floor_window_s: float, expected: str, bounded: bool
) -> None:
    """Flat memory over a 30 s run is INVALID when its 25 s after the warm-up hold fewer
    than 12 windows of floor_window_s (the window had to be shortened by more than 5 %),
    PASS at 12."""
    crit = {"max_memory_growth_mb_per_min": 1.5, "floor_window_s": floor_window_s}
    store_run(conn, "r30", healthy(dur=30.0), crit=crit, dur=30.0)
    v = judged(conn, "r30", bounded=bounded)
    assert status(v, "memory_rss") == expected
    if expected == "invalid":
        assert "floor window was shortened" in v.get("memory_rss").detail  # type: ignore[union-attr]

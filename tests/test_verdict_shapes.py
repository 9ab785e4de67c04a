"""Session and generator runs are judged on what those shapes can show: generators on
inter-frame interval stability instead of frame age, sessions on capture-to-output latency."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from soakd.config import Settings
from soakd.runner import run_soak

pytestmark = pytest.mark.slow

GEN = ['workload.kind="generator"', 'workload.factory="tests.fault_workloads:slowing_generator"']


def _statuses(res: object) -> dict[str, str]:
    v = res.verdict  # type: ignore[attr-defined]
    return {c.criterion: c.status for c in v.criteria}


def test_steady_generator_passes_on_intervals(synthetic: Callable[..., Settings]) -> None:
    """A generator with steady chunk gaps passes, judged on `interval`, not `frame_age`."""
    res = run_soak(
        synthetic(*GEN, "workload.options={base_ms = 10, slope = 0}", "run.fps=5", "run.duration=8")
    )
    st = _statuses(res)
    assert "interval" in st and "frame_age" not in st
    assert st["interval"] == "pass" and res.verdict.status == "PASS", res.verdict.reason


def test_generator_whose_intervals_creep_fails(synthetic: Callable[..., Settings]) -> None:
    """Chunk gaps growing 4 ms per second (120 ms/min per frame) fail `interval`."""
    res = run_soak(
        synthetic(
            *GEN,
            "workload.options={base_ms = 5, slope = 4}",
            "run.fps=3",
            "run.duration=14",
            "criteria.max_age_slope_ms_per_min=20",
        )
    )
    st = _statuses(res)
    assert st["interval"] == "fail", res.verdict.reason
    assert res.verdict.status == "FAIL"


def test_tiny_session_is_judged_on_output_latency(synthetic: Callable[..., Settings]) -> None:
    """The built-in tiny session's run is judged; jitter is measured on capture-to-output
    latency since the session hides its stages."""
    res = run_soak(synthetic('workload.kind="session"', "run.fps=4", "run.duration=6"))
    assert res.verdict is not None and res.verdict.status in ("PASS", "FAIL")
    jitter = res.verdict.get("jitter")
    assert jitter is not None and "output_latency" in jitter.detail

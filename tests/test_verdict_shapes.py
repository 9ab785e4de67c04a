"""Session and generator runs are judged on what those shapes can show: generators on
inter-frame interval stability instead of frame age, sessions on capture-to-output latency."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from soakd.config import Settings
from soakd.run.runner import run_soak

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


def test_tiny_session_is_judged_on_its_model_step(synthetic: Callable[..., Settings]) -> None:
    """The built-in tiny session's run is judged; jitter is measured on infer_ms, the model
    steps soakd's hooks time per frame (not on capture-to-output latency)."""
    res = run_soak(synthetic('workload.kind="session"', "run.fps=4", "run.duration=6"))
    assert res.verdict is not None
    jitter = res.verdict.get("jitter")
    assert jitter is not None and jitter.evidence["source"] == "infer_ms", jitter
    assert jitter.status in ("pass", "fail") and jitter.value is not None  # judged, measured


def test_frames_a_session_drops_count_as_lost(synthetic: Callable[..., Settings]) -> None:
    """Frames dropped inside a session model (its own frame queue) count in the drops
    criterion, also for a session brought in through kind = "python"."""
    res = run_soak(
        synthetic(
            'workload.kind="python"',
            "workload.factory='tests.tiny_session:factory'",
            "workload.options={script = 'ts', start_after_pushes = 12, frame_queue_size = 2,"
            " max_tokens_per_turn = 3}",
            "run.warmup_s=0",
            "run.duration=4",
        )
    )
    drops = res.verdict.get("drops")
    assert drops is not None and drops.evidence["session_dropped"] >= 10
    assert drops.status == "fail" and "dropped by the session" in drops.detail

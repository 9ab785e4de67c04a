"""bench/realtime_session.py's ``--quick`` version, for real (a test server subprocess, two
short soaks, a bare websockets loop), so the benchmark cannot rot; targets are reported in
docs/benchmarks.md, never asserted here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_bench_smoke import _check_well_formed, _run_module

pytestmark = pytest.mark.slow


def test_realtime_session_quick(tmp_path: Path) -> None:
    """bench.realtime_session --quick reports both arms' CPU per frame, the marginal cost and
    their ratios to the bare loop."""
    doc = _run_module("realtime_session", tmp_path / "rt.json", timeout=240)
    _check_well_formed(doc, "realtime_session")
    m = doc["metrics"]
    assert m["bare_cpu_us_per_frame"] > 0 and m["soakd_cpu_us_per_frame"] > 0
    assert m["bare_frames"] > 0 and m["soakd_frames"] > 0
    assert m["ratio"] == pytest.approx(m["soakd_cpu_us_per_frame"] / m["bare_cpu_us_per_frame"])

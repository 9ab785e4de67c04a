"""Smoke tests of the benchmarks under bench/: each runs its short ``--quick`` version for
real (real runs, real SQLite files, real subprocesses) so the benchmarks cannot rot.

They check that every benchmark produces a well-formed result, never that a performance
target is met: timing targets are reported in docs/benchmarks.md, not asserted here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.mutants import ALL as MUTANTS
from bench.mutate import REPO

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _run_module(name: str, out: Path, *extra: str, timeout: float = 120) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--quick", "--out", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"== {name}" in proc.stdout  # the table was printed
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def _is_num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_well_formed(doc: dict[str, Any], name: str) -> None:
    assert doc["schema"] == 1
    assert doc["benchmark"] == name
    assert doc["quick"] is True
    assert doc["machine"]["cpu_count"] >= 1
    assert _is_num(doc["elapsed_s"])
    assert doc["metrics"], "no metrics"
    for key, value in doc["metrics"].items():
        assert value is None or _is_num(value), (key, value)
    assert doc["targets"], "no targets"
    for t in doc["targets"]:
        assert set(t) >= {"name", "value", "limit", "op", "unit", "met"}
        assert t["op"] in ("<=", ">=")
        assert _is_num(t["value"]), t
        assert isinstance(t["met"], bool)
        assert t["met"] == (
            t["value"] <= t["limit"] if t["op"] == "<=" else t["value"] >= t["limit"]
        )


def test_store_quick(tmp_path: Path) -> None:
    """bench.store --quick writes a result with both writers' throughput and their ratio."""
    doc = _run_module("store", tmp_path / "store.json")
    _check_well_formed(doc, "store")
    m = doc["metrics"]
    assert m["raw_rows_per_s"] > 0 and m["soakd_rows_per_s"] > 0
    assert m["throughput_ratio"] == pytest.approx(m["soakd_rows_per_s"] / m["raw_rows_per_s"])
    assert {r["writer"] for r in doc["rows"]} == {"raw", "soakd"}


def test_overhead_quick(tmp_path: Path) -> None:
    """bench.overhead --quick reports soakd's and the bare loop's per-frame cost and the gap,
    and LoadGen's null SUT timed in the same run with soakd's cost as a ratio of it (without
    mlperf_loadgen it says so and still reports soakd)."""
    doc = _run_module("overhead", tmp_path / "overhead.json")
    _check_well_formed(doc, "overhead")
    m, notes = doc["metrics"], " ".join(doc["notes"])
    assert m["bare_us_per_frame"] > 0 and m["soakd_us_per_frame"] > 0
    assert m["added_us_per_frame"] == pytest.approx(
        m["soakd_us_per_frame"] - m["bare_us_per_frame"]
    )
    assert ("run.streams does not exist yet" in notes) != ("soakd_us_per_frame_4_streams" in m)
    if importlib.util.find_spec("mlperf_loadgen") is None:
        assert "mlperf_loadgen is not installed" in notes and "ratio_vs_loadgen" not in m
        return
    assert m["loadgen_us_per_query"] > 0 and all("loadgen_us_median" in r for r in doc["rows"])
    assert m["ratio_vs_loadgen"] == pytest.approx(
        m["soakd_us_per_frame"] / m["loadgen_us_per_query"]
    )
    assert any(t["name"].startswith("soakd per-frame / LoadGen") for t in doc["targets"])


def test_pacing_quick(tmp_path: Path) -> None:
    """bench.pacing --quick measures all three rates, each with a rate and a lateness target."""
    doc = _run_module("pacing", tmp_path / "pacing.json")
    _check_well_formed(doc, "pacing")
    assert [r["fps"] for r in doc["rows"]] == [30.0, 60.0, 240.0]
    assert len(doc["targets"]) == 6
    for fps in ("30", "60", "240"):
        assert doc["metrics"][f"{fps}fps_achieved_fps"] > 0


def test_sampler_quick(tmp_path: Path) -> None:
    """bench.sampler --quick samples under two busy processes and reports interval and CPU."""
    doc = _run_module("sampler", tmp_path / "sampler.json")
    _check_well_formed(doc, "sampler")
    m = doc["metrics"]
    assert m["samples"] >= 10  # ~30 ticks in 3 s at 10 Hz
    assert m["interval_p50_ms"] > 0 and m["sampler_cpu_pct_of_core"] >= 0
    assert "process" in doc["params"]["probes"]


def test_telemetry_overhead_quick(tmp_path: Path) -> None:
    """bench.telemetry_overhead --quick runs both arms; only the 'on' arm stores samples."""
    doc = _run_module("telemetry_overhead", tmp_path / "tel.json")
    _check_well_formed(doc, "telemetry_overhead")
    arms = {r["telemetry"]: r for r in doc["rows"]}
    assert arms["off"]["samples"] == 0 and arms["on"]["samples"] > 0
    assert arms["off"]["frames"] > 0 and arms["on"]["frames"] > 0


def test_openai_client_quick(tmp_path: Path) -> None:
    """bench.openai_client --quick times soakd's openai stages and a bare httpx loop against
    the same fixture server; soakd's arm includes the JPEG encode."""
    doc = _run_module("openai_client", tmp_path / "oa.json")
    _check_well_formed(doc, "openai_client")
    m = doc["metrics"]
    assert m["bare_us_p50"] > 0 and m["soakd_us_p50"] > 0
    assert 0 < m["encode_us_p50"] < m["soakd_us_p50"]


def test_verdict_quick(tmp_path: Path) -> None:
    """bench.verdict --quick judges and reports a short and a 10x longer generated run."""
    doc = _run_module("verdict", tmp_path / "verdict.json", "--workdir", str(tmp_path))
    _check_well_formed(doc, "verdict")
    assert [r["run"] for r in doc["rows"]] == ["short", "long"]
    assert doc["metrics"]["length_ratio"] == 10
    # generated healthy runs (a sawtooth under the floor window, no growth), both at least
    # min_duration_s long: both pass
    assert [r["verdict"] for r in doc["rows"]] == ["PASS", "PASS"]
    assert (tmp_path / "verdict-120s.db").exists()


def test_dbsize_quick(tmp_path: Path) -> None:
    """bench.dbsize --quick measures bytes per frame and per sample (soakd, the plain-table
    baseline, a VACUUMed copy, a real soak), projects run sizes and times a prune."""
    doc = _run_module("dbsize", tmp_path / "dbsize.json")
    _check_well_formed(doc, "dbsize")
    m = doc["metrics"]
    assert m["bytes_per_frame"] > 0 and m["bytes_per_sample_gpu"] > m["bytes_per_sample_cpu"]
    assert m["projected_gb_7_days"] > m["projected_gb_24_h"] > m["projected_gb_10_min"]
    assert m["prune_file_mb_after"] < m["prune_file_mb_before"]
    kinds = {r["database"] for r in doc["rows"]}
    assert {"soakd", "raw", "vacuumed", "real soak 3 s", "projected 7 days"} <= kinds


def test_leak_measure_short(tmp_path: Path) -> None:
    """bench.leak's measurement (soakd child + bare child, RSS floors) works on a short run."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench import leak
    finally:
        sys.path.remove(str(ROOT))
    res = leak.measure(tmp_path, quick=True, duration_s=6.0, warmup_s=1.0, window_s=1.5)
    doc = res.to_json()
    _check_well_formed(doc, "leak")
    m = doc["metrics"]
    assert m["samples"] >= 20  # every 150 ms for ~6 s
    assert m["rss_first_floor_bytes"] > 0 and m["frames_done"] > 0
    assert (tmp_path / "leak.db").exists()


def test_run_all_only_store(tmp_path: Path) -> None:
    """bench.run_all --only store writes the benchmark's JSON and a summary of its targets."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run_all",
            "--quick",
            "--only",
            "store",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [d["benchmark"] for d in summary["results"]] == ["store"]
    assert "== summary ==" in proc.stdout


def test_run_all_rejects_unknown_name(tmp_path: Path) -> None:
    """bench.run_all names an unknown benchmark in a one-line error and exits non-zero."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run_all", "--only", "nope", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "unknown benchmark(s): nope" in proc.stderr


def test_every_mutant_of_the_mutation_bench_still_matches_the_code() -> None:
    """bench/mutate.py's mutants name texts that are still in the code (a stale mutant would
    count as killed by nothing and hide a lost guard)."""
    stale = [m.name for m in MUTANTS if m.old not in (REPO / m.path).read_text()]
    assert not stale and len(MUTANTS) >= 30, stale

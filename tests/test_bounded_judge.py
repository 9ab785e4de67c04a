"""The bounded path (issue 14): a run too long to load is streamed from its database and
judged with the same statuses and criterion values as the exact path; the switch between
the two is ``soakd.analysis.data.use_bounded``. Runs are generated into real run databases
by bench/weeklong.py's generator (10 minutes at 30 fps each)."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.weeklong import add_run
from soakd.analysis import criteria_of, digest, evaluate, judge, quantiles
from soakd.analysis import data as analysis_data
from soakd.analysis.data import BOUNDED_ROWS, load_run_data, use_bounded
from soakd.analysis.model import FAIL, PASS, RunMeta, Verdict
from soakd.analysis.quantiles import StreamQuantiles
from soakd.report import render
from soakd.store import db as store
from soakd.studies import compare as compare_mod
from soakd.studies.compare import compare

RUNS: dict[str, dict[str, float]] = {
    "healthy": {},
    "leak": {"leak_mb_per_min": 5.0},
    "spike": {"spike_every": 300},
    "slowing": {"age_slope_ms_per_min": 100.0},
}
#: runs whose rows are then rewritten (``_REWRITE``): frames that raised, frames skipped as
#: stale (NULL stage times), a consume-oldest backlog, a session's hidden stages
SHAPED: dict[str, tuple[dict[str, Any], list[str]]] = {
    "errors": ({}, []),
    "oldest": ({}, ['run.consume="oldest"']),
    "session": ({"shape": "session"}, []),
}
_REWRITE = {
    "errors": [
        "UPDATE frames SET error = 'boom' WHERE run_id = 'errors' AND frame_id % 97 = 5",
        "UPDATE frames SET skipped = 1, pre_ms = NULL, infer_ms = NULL, decode_ms = NULL, "
        "total_ms = NULL, stale_count = frame_id / 700 WHERE run_id = 'errors' "
        "AND frame_id % 89 = 3",
    ],
    "oldest": ["UPDATE frames SET queue_len = (frame_id / 50) % 4 WHERE run_id = 'oldest'"],
    "session": [
        "UPDATE frames SET output_latency_ms = total_ms + frame_age_ms, pre_ms = NULL, "
        "infer_ms = NULL, decode_ms = NULL, session_dropped = (frame_id % 5000) / 40 "
        "+ frame_id / 9000 WHERE run_id = 'session'"
    ],
}
#: evidence the bounded path computes approximately, and says so (``approximate``)
APPROXIMATE = {"evidence.tail_cut_ms", "evidence.approximate.tail_cut_ms"}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bounded") / "runs.db"
    conn = store.connect(path)
    for i, (name, faults) in enumerate(RUNS.items()):
        add_run(conn, name, 600.0, seed=i, started_unix=1.8e9 + i, **faults)
    for i, (name, (workload, overrides)) in enumerate(SHAPED.items()):
        add_run(conn, name, 300.0, seed=10 + i, started_unix=1.9e9 + i, overrides=overrides,
                workload=workload)  # fmt: skip
        with store.atomic(conn):
            for sql in _REWRITE[name]:
                conn.execute(sql)
    conn.close()
    return path


def _both(db: Path, run_id: str) -> tuple[Verdict, Verdict]:
    conn = sqlite3.connect(db)
    try:
        out = []
        for bounded in (False, True):
            data = load_run_data(conn, run_id, bounded=bounded)
            out.append(judge(data, criteria_of(data)[0]))
        return out[0], out[1]
    finally:
        conn.close()


def _flat(d: dict[str, Any], pre: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{pre}{k}.") if isinstance(v, dict) else {f"{pre}{k}": v})
    return out


def _differences(exact: Verdict, bounded: Verdict) -> list[tuple[str, Any, Any]]:
    """Every criterion field (status, value, evidence) that differs beyond 1e-6 relative."""
    diffs = []
    for ce, cb in zip(exact.criteria, bounded.criteria, strict=True):
        if ce.criterion == "stage_trend":  # the digest keeps no stage windows: n/a there
            assert cb.status == "n/a", cb
            continue
        fe, fb = _flat(ce.row()), _flat(cb.row())
        for key in sorted((set(fe) | set(fb)) - APPROXIMATE):
            a, b = fe.get(key), fb.get(key)
            if isinstance(a, float) and isinstance(b, float):
                same = (
                    a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6)
                )
            else:
                same = a == b
            if not same:
                diffs.append((f"{ce.criterion}.{key}", a, b))
    return diffs


@pytest.mark.parametrize("run_id", [*RUNS, *SHAPED])
def test_bounded_path_gives_the_exact_paths_statuses_and_values(db: Path, run_id: str) -> None:
    exact, bounded = _both(db, run_id)
    assert (bounded.status, _differences(exact, bounded)) == (exact.status, [])


def test_the_shaped_runs_exercise_what_they_rewrite(db: Path) -> None:
    exact = {r: _both(db, r)[0] for r in SHAPED}
    errors, session = exact["errors"].get("errors"), exact["session"].get("jitter")
    assert errors is not None and errors.value and errors.value > 10
    assert exact["errors"].get("drops") is not None
    assert session is not None and session.evidence["source"] == "output_latency_ms"
    assert exact["oldest"].get("frame_age") is not None
    assert "backlog" in json.dumps(exact["oldest"].get("frame_age").evidence)  # type: ignore[union-attr]


def test_more_frames_over_the_cut_than_kept_are_queried_apart(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(digest, "MAX_POSITIONS", 10)
    exact, bounded = _both(db, "spike")
    je, jb = exact.get("jitter"), bounded.get("jitter")
    assert je is not None and jb is not None
    assert (jb.status, jb.value) == (je.status, pytest.approx(je.value, rel=1e-6))
    assert any("over 10 frames over k x median" in w for w in bounded.warnings)


@pytest.mark.parametrize(
    ("run_id", "criterion"),
    [("leak", "memory_rss"), ("spike", "jitter"), ("slowing", "frame_age")],
)
def test_a_planted_fault_still_fails_its_criterion_on_the_bounded_path(
    db: Path, run_id: str, criterion: str
) -> None:
    _exact, bounded = _both(db, run_id)
    got = bounded.get(criterion)
    assert got is not None and got.status == FAIL and bounded.status == "FAIL"


def test_the_healthy_run_passes_and_says_it_was_streamed(db: Path) -> None:
    _exact, bounded = _both(db, "healthy")
    assert bounded.status == "PASS" and all(c.status in (PASS, "n/a") for c in bounded.criteria)
    assert any("bounded path" in w for w in bounded.warnings)


def test_reports_of_a_streamed_run_keep_stage_percentiles_within_the_stated_bins(
    db: Path,
) -> None:
    conn = sqlite3.connect(db)
    sums = []
    for path in ("exact", "bounded"):
        data = load_run_data(conn, "spike", bounded=path == "bounded")
        verdict = judge(data, criteria_of(data)[0])
        sums.append(_flat(json.loads(render("json", data, verdict))["summary"]))
        assert render("html", data, verdict) and render("md", data, verdict)
    conn.close()
    exact, streamed = sums
    for key, a in exact.items():
        if isinstance(a, float):
            assert streamed[key] == pytest.approx(a, rel=2.0**-9), key


def test_runs_over_bounded_rows_are_streamed_others_loaded() -> None:
    meta = RunMeta("r")
    assert not use_bounded(meta, BOUNDED_ROWS // 2, BOUNDED_ROWS // 2)
    assert use_bounded(meta, BOUNDED_ROWS // 2 + 1, BOUNDED_ROWS // 2)
    assert not use_bounded(RunMeta("g", shape="generator"), BOUNDED_ROWS, BOUNDED_ROWS)
    assert not use_bounded(RunMeta("s", config={"run": {"streams": 2}}), BOUNDED_ROWS, 1)


def test_evaluate_streams_a_run_over_the_limit(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = sqlite3.connect(db)
    assert load_run_data(conn, "healthy").source is None
    monkeypatch.setattr(analysis_data, "BOUNDED_ROWS", 10_000)
    data, verdict = evaluate(conn, "healthy")
    conn.close()
    assert data.source is not None and data.n_frames == 0 and verdict.frame_summary is not None


def test_stream_quantiles_match_numpy_exactly_in_two_passes() -> None:
    rng = np.random.default_rng(0)
    y = np.r_[rng.lognormal(3, 0.05, 20_001), np.zeros(5), [1e4]].astype(np.float32)
    q = StreamQuantiles()
    for part in np.array_split(y, 7):
        q.add(part)
    q.want_percentiles((50.0, 95.0, 99.0))
    q.want({y.size - 3})
    for part in np.array_split(y, 3):
        q.refine(part)
    got = [q.median(), q.percentile(95.0), q.percentile(99.0), q.order_stat(y.size - 3)]
    want = [*np.percentile(y.astype(np.float64), [50, 95, 99]), np.sort(y)[-3]]
    assert got == pytest.approx([float(w) for w in want], rel=1e-12)


def _compare_both(db: Path, a: str, b: str) -> tuple[Any, Any]:
    conn = sqlite3.connect(db)
    try:
        return tuple(compare(conn, a, b, bounded=bounded) for bounded in (False, True))
    finally:
        conn.close()


def _rows(c: Any) -> list[tuple[Any, ...]]:
    return [(m.name, m.a, m.b, m.p, m.beyond_noise) for m in c.metrics]


@pytest.mark.parametrize(
    ("a", "b"), [("healthy", "spike"), ("healthy", "leak"), ("errors", "oldest")]
)
def test_bounded_compare_gives_the_exact_compares_answer_on_short_runs(
    db: Path, a: str, b: str
) -> None:
    exact, bounded = _compare_both(db, a, b)
    for (n, xa, xb, p, sig), got in zip(_rows(exact), _rows(bounded), strict=True):
        assert got[0] == n and (got[3], got[4]) == (p, sig), n
        assert got[1:3] == (pytest.approx(xa, rel=1e-6), pytest.approx(xb, rel=1e-6)), n
    assert bounded.run_a.measured_frames == exact.run_a.measured_frames


def test_bounded_compare_tests_a_sample_but_keeps_percentiles_exact(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compare_mod, "SAMPLE_N", 2_000)
    exact, bounded = _compare_both(db, "healthy", "slowing")
    for (n, xa, xb, _p, sig), got in zip(_rows(exact), _rows(bounded), strict=True):
        assert got[1:3] == (pytest.approx(xa, rel=1e-6), pytest.approx(xb, rel=1e-6)), n
        if n.startswith("frame_age_ms") or n.endswith("floor_slope"):
            assert got[4] == sig, n  # a large change is beyond noise on the sample too
    assert bounded.metric("frame_age_ms.p50").beyond_noise is True


def test_pass_two_ranges_hold_every_float64_that_rounds_into_a_wanted_bin() -> None:
    edges = np.array([0.5, 20.0, 1e-3, 333.0], dtype=np.float32)
    below = np.nextafter(edges, np.float32(0))  # the float32 just under each bin's floor
    mid = (edges.astype(np.float64) + below) / 2
    x = np.r_[np.nextafter(mid, np.inf), edges.astype(np.float64)]  # round up onto the edge
    q = StreamQuantiles()
    q.add(x.astype(np.float32))
    q.want(set(range(x.size)))
    keys = quantiles.ordered_keys(x.astype(np.float32)) >> quantiles.LOW_BITS
    bounds = dict(zip(q._low, q.bounds(), strict=True))
    assert all(bounds[int(k)][0] <= v <= bounds[int(k)][1] for k, v in zip(keys, x, strict=True))
    assert all(v < float(e) for v, e in zip(x[:4], edges, strict=True))  # below the floor

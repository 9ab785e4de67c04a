"""Verdict rules pinned at their boundaries (issue 23), each on a run written row by row
through the store (tests/stored_runs.py) and judged as ``soakd gate`` judges it, on the
exact path and, where the rule has its own code there, the bounded one. Each run sits a
few per cent from its rule's boundary on both sides, so the rule cannot drift unseen;
bench/mutate.py's mutants name this file for each."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from soakd.analysis import criteria_of, judge, stats
from soakd.analysis.data import load_run_data
from soakd.analysis.model import Verdict
from soakd.errors import ExitCode
from soakd.records import Emission, Event
from soakd.store import db as store

from .stored_runs import healthy, judged, status, store_run

BOTH = pytest.mark.parametrize("bounded", [False, True], ids=["exact", "bounded"])
DUR = 106.0  # at 10 fps with a 5 s warm-up: 1010 post-warm-up frames
RAMP_THRESHOLDS = {
    "p95(total_ms) < 1050": "fail",  # p95 is exactly 1050: a strict limit fails
    "p95(total_ms) <= 1050": "pass",
    "p95(total_ms) < 1051": "pass",
    "p95(total_ms) < 1049": "fail",
    "p95(total_ms) < 800": "fail",  # between p50 (600) and p95
    "p50(total_ms) < 601": "pass",
    "p50(total_ms) < 600": "fail",
    "min(total_ms) > 100": "fail",
    "min(total_ms) >= 100": "pass",
    "max(total_ms) <= 1100": "pass",  # the warm-up frames' 5000 ms are out
    "count(total_ms) <= 1001": "pass",  # measured frames only: 1010 - 9 skipped
    "count(total_ms) < 1001": "fail",
    "max(frame_age_ms) <= 100": "pass",  # the skipped frames' 900 ms ages are out
    "count(frame_age_ms) <= 1001": "pass",
    "max(queue_len) < 4": "fail",  # the max is exactly 4
    "max(queue_len) <= 4": "pass",
    "max(queue_len) < 5": "pass",
}


def _id(expr: str) -> str:
    return "threshold:" + expr.replace(" ", "")


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    c = store.connect(tmp_path_factory.mktemp("pins") / "runs.db")
    yield c
    c.close()


def _ramp_run(conn: sqlite3.Connection, rid: str, crit: dict[str, Any]) -> str:
    """1010 post-warm-up frames, 9 of them skipped as stale (900 ms old, no stage times):
    the 1001 measured ones take total_ms 100, 101, ... 1100 in shuffled order (so pNN is
    100 + 10 x NN exactly) and frame age 0, 0.1, ... 100 ms; queue_len peaks at 4 once.
    Warm-up frames (and the first) take 5000 ms at a queue of 9."""
    rng = np.random.default_rng(7)
    cols = healthy(DUR)
    warm = cols["warmup"]
    post = np.flatnonzero(~warm)
    skipped = post[np.linspace(50, post.size - 50, 9).astype(int)]
    cols["skipped"][skipped] = True
    cols["stale_count"] = np.cumsum(cols["skipped"])
    measured = np.setdiff1d(post, skipped)
    assert measured.size == 1001
    for name in ("pre_ms", "infer_ms", "decode_ms", "grab_ms", "total_ms"):
        cols[name] = cols[name].astype(float)
        cols[name][skipped] = np.nan
    cols["total_ms"][measured] = 100.0 + rng.permutation(1001)
    cols["total_ms"][warm] = 5000.0
    cols["frame_age_ms"][measured] = rng.permutation(1001) / 10.0
    cols["frame_age_ms"][skipped] = 900.0
    cols["queue_len"][measured] = rng.integers(0, 4, measured.size)
    cols["queue_len"][measured[500]] = 4
    cols["queue_len"][warm] = 9
    return store_run(conn, rid, cols, dur=DUR, crit=crit, summary={"stale": 9})


@pytest.fixture(scope="module")
def ramp(conn: sqlite3.Connection) -> str:
    return _ramp_run(conn, "ramp", {"thresholds": list(RAMP_THRESHOLDS)})


def _threshold_statuses(conn: sqlite3.Connection, rid: str, bounded: bool) -> dict[str, str]:
    v = judged(conn, rid, bounded)
    return {e: status(v, _id(e)) for e in RAMP_THRESHOLDS}


# --------------------------------------------------------------------------- thresholds


@BOTH
def test_a_value_exactly_at_a_strict_limit_fails_the_threshold(
    conn: sqlite3.Connection, ramp: str, bounded: bool
) -> None:
    """`<` and `>` are strict: max(queue_len) = 4 fails `< 4` and passes `<= 4`."""
    got = _threshold_statuses(conn, ramp, bounded)
    strict = ("max(queue_len) < 4", "max(queue_len) <= 4", "max(queue_len) < 5",
              "min(total_ms) > 100", "min(total_ms) >= 100", "p95(total_ms) < 1050")  # fmt: skip
    for expr in strict:
        assert got[expr] == RAMP_THRESHOLDS[expr], expr


@BOTH
def test_pnn_is_the_nnth_percentile_of_the_measured_frames(
    conn: sqlite3.Connection, ramp: str, bounded: bool
) -> None:
    """pNN(col) is numpy's linear NNth percentile: p95 of 100..1100 ms is 1050, p50 600."""
    got = _threshold_statuses(conn, ramp, bounded)
    for expr in RAMP_THRESHOLDS:
        if expr.startswith(("p95", "p50")):
            assert got[expr] == RAMP_THRESHOLDS[expr], expr


@BOTH
def test_frame_thresholds_leave_out_warmup_first_and_stale_skipped_frames(
    conn: sqlite3.Connection, ramp: str, bounded: bool
) -> None:
    """Frame thresholds count only measured frames: not warm-up, first or skipped ones."""
    got = _threshold_statuses(conn, ramp, bounded)
    assert got == RAMP_THRESHOLDS


# --------------------------------------------------------------------------- frame age


@BOTH
@pytest.mark.parametrize(("ceiling", "want"), [(94.0, "fail"), (96.0, "pass")])
def test_the_frame_age_ceiling_is_judged_on_the_p95_not_the_median(
    conn: sqlite3.Connection, bounded: bool, ceiling: float, want: str
) -> None:
    """max_age_p95_ms judges the p95 frame age (95 ms here), not the median (50 ms)."""
    rid = f"age{ceiling:g}"
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone() is None:
        _ramp_run(conn, rid, {"max_age_p95_ms": ceiling})
    c = judged(conn, rid, bounded).get("frame_age")
    assert c is not None and c.evidence["p95_ms"] == pytest.approx(95.0, abs=0.01)
    assert c.evidence["median_ms"] == pytest.approx(50.0, abs=0.01)
    assert c.status == want, c.detail


# --------------------------------------------------------------------------- warm-up


def _warm_losses_run(conn: sqlite3.Connection, rid: str, post_drops: int) -> str:
    """40 drops, 10 stale skips and 5 errors in the warm-up; then ``post_drops`` drops
    spread evenly over the 1010 post-warm-up rows (53: 4.99 % lost, 54: 5.08 %)."""
    cols = healthy(DUR)
    warm = np.flatnonzero(cols["warmup"])
    post = np.flatnonzero(~cols["warmup"])
    drops = np.zeros(cols["t_capture"].size, dtype=int)
    drops[warm] = np.arange(warm.size) * 40 // (warm.size - 1)
    at = post[np.linspace(1, post.size - 1, post_drops).astype(int)]
    drops[at] += 1
    drops[post] = 40 + np.cumsum(drops[post])
    cols["drop_count"] = drops
    cols["skipped"][warm[20:30]] = True
    cols["stale_count"] = np.cumsum(cols["skipped"])
    cols["error"][warm[31:36]] = "boom"
    crit = {"thresholds": ["rate(drops) < 0.05", "rate(stale) < 0.0001", "rate(errors) < 0.0001"]}
    summary = {"drops": 40 + post_drops, "stale": 10}
    return store_run(conn, rid, cols, dur=DUR, crit=crit, summary=summary)


@BOTH
@pytest.mark.parametrize(("post_drops", "want"), [(53, "pass"), (54, "fail")])
def test_losses_during_the_warmup_do_not_count_against_the_drop_fraction(
    conn: sqlite3.Connection, bounded: bool, post_drops: int, want: str
) -> None:
    """Warm-up drops, stale skips and errors are out of the drop fraction and the rates."""
    rid = f"warmloss{post_drops}"
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone() is None:
        _warm_losses_run(conn, rid, post_drops)
    v = judged(conn, rid, bounded)
    drops = v.get("drops")
    assert drops is not None
    assert drops.evidence["lost"] == post_drops, drops.detail
    assert drops.status == want, drops.detail
    assert status(v, _id("rate(drops) < 0.05")) == want
    assert status(v, _id("rate(stale) < 0.0001")) == "pass"
    assert status(v, _id("rate(errors) < 0.0001")) == "pass"
    assert status(v, "errors") == "pass"


@BOTH
@pytest.mark.parametrize("warmup_s", [0.0, 0.01])
def test_a_first_frame_50_times_slower_is_kept_out_of_every_criterion(
    conn: sqlite3.Connection, bounded: bool, warmup_s: float
) -> None:
    """With no (or a tiny) warm-up, the first frame (compile, CUDA init) is still out."""
    rid = f"first{warmup_s:g}"
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone() is None:
        cols = healthy(60.0, warm=0.0)
        cols["t_capture"] = cols["t_capture"] + 0.1  # the first capture after the warm-up
        for name in ("infer_ms", "total_ms", "frame_age_ms"):
            cols[name][0] *= 50
        crit = {"jitter_rule": "max", "max_age_p95_ms": 20.0,
                "thresholds": ["max(total_ms) < 100", "max(frame_age_ms) < 100"]}  # fmt: skip
        events = [Event("warmup_end", 0.05, 0.0)] if warmup_s else []
        store_run(conn, rid, cols, dur=60.0, crit=crit, run={"warmup_s": warmup_s},
                  events=events)  # fmt: skip
    v = judged(conn, rid, bounded)
    assert (v.status, v.exit_code) == ("PASS", ExitCode.PASS), v.reason
    assert v.window["measured_frames"] == 599


# --------------------------------------------------------------------------- jitter

#: frame ids of 10x spikes: five at random positions, four recurring every 600 frames
RANDOM_SPIKES = (173, 911, 1544, 2087, 2950)
REGULAR_SPIKES = (400, 1000, 1600, 2200)


@BOTH
@pytest.mark.parametrize(("spikes", "want"), [(RANDOM_SPIKES, "pass"), (REGULAR_SPIKES, "fail")])
def test_spikes_within_the_allowance_fail_jitter_only_when_4_or_more_recur_regularly(
    conn: sqlite3.Connection, bounded: bool, spikes: tuple[int, ...], want: str
) -> None:
    """With jitter_max_exceed = 6, 5 random spikes pass; 4 at regular positions fail."""
    assert stats.tail_periodicity(np.array(RANDOM_SPIKES)).regular is False
    rid = f"jitter{len(spikes)}"
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone() is None:
        cols = healthy(305.0)
        cols["infer_ms"][list(spikes)] *= 10
        store_run(conn, rid, cols, dur=305.0, crit={"jitter_max_exceed": 6})
    c = judged(conn, rid, bounded).get("jitter")
    assert c is not None and c.evidence["exceed_count"] == len(spikes)
    assert c.status == want, c.detail


# --------------------------------------------------------------------------- streams


def _streams_run(
    conn: sqlite3.Connection, rid: str, stream2_drops: int, first_t: tuple[float, ...],
    min_frames: int = 10,
) -> str:  # fmt: skip
    """Three cameras at 10 fps for 106 s; stream 2 drops ``stream2_drops`` frames evenly
    after the warm-up (53 of 1063 ticks: 4.99 %, 54: 5.08 %; of all three 1.7 %); stream s
    starts capturing at ``first_t[s]`` s."""
    base = healthy(DUR)
    n = base["t_capture"].size
    parts = []
    for s in range(3):
        cols = {k: v.copy() for k, v in base.items()}
        cols["stream"] = np.full(n, s)
        cols["frame_id"] = np.arange(n) * 3 + s
        cols["t_capture"] = cols["t_capture"] + s * 1e-3
        post = np.flatnonzero(~cols["warmup"])
        if s == 2 and stream2_drops:
            at = post[np.linspace(1, post.size - 1, stream2_drops).astype(int)]
            cols["drop_count"][at] = 1
            cols["drop_count"] = np.cumsum(cols["drop_count"])
        keep = cols["t_capture"] >= first_t[s]
        parts.append({k: v[keep] for k, v in cols.items()})
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(cols["frame_id"], kind="stable")
    cols = {k: v[order] for k, v in cols.items()}
    per = [{"drops": 0}, {"drops": 0}, {"drops": stream2_drops}]
    return store_run(conn, rid, cols, dur=DUR, fps=10.0, run={"streams": 3},
                     crit={"min_frames": min_frames},
                     summary={"drops": stream2_drops, "streams": per})  # fmt: skip


@pytest.mark.parametrize(("drops", "want"), [(53, ("PASS", "pass")), (54, ("FAIL", "fail"))])
def test_one_failing_stream_among_three_fails_the_run(
    conn: sqlite3.Connection, drops: int, want: tuple[str, str]
) -> None:
    """The streams criterion is the worst stream: one camera over the drop limit fails."""
    rid = _streams_run(conn, f"streams{drops}", drops, (0.0, 0.0, 0.0))
    v = judged(conn, rid)
    assert status(v, "drops") == "pass"  # all three together lose 1.7 %
    assert (v.status, status(v, "streams")) == want, v.reason
    assert v.exit_code == (ExitCode.PASS if want[0] == "PASS" else ExitCode.FAIL)


def test_an_invalid_stream_outranks_a_failing_one_exit_3(conn: sqlite3.Connection) -> None:
    """Among streams INVALID beats FAIL: one too short to judge, one failing: exit 3."""
    # stream 0 starts at 60 s: 460 measured frames, under min_frames = 900; stream 2 fails
    rid = _streams_run(conn, "streams_invalid", 60, (60.0, 0.0, 0.0), min_frames=900)
    v = judged(conn, rid)
    per = {r["stream"]: r["status"] for r in v.get("streams").evidence["streams"]}  # type: ignore[union-attr]
    assert per == {0: "INVALID", 1: "PASS", 2: "FAIL"}
    assert status(v, "drops") == "pass" and status(v, "run") == "pass"
    assert (v.status, v.exit_code, status(v, "streams")) == (
        "INVALID", ExitCode.INVALID, "invalid")  # fmt: skip


# --------------------------------------------------------------------------- generators


def _rollout(conn: sqlite3.Connection, rid: str, tail: float) -> str:
    """A rollout of one-frame chunks, ~30 ms apart, with a share ``tail`` of them 50 ms."""
    rng = np.random.default_rng(11)
    n = 2000
    iv = 30.0 + rng.uniform(-1.0, 1.0, n)
    iv[rng.permutation(n)[: round(tail * n)]] = 50.0
    t_emit = 0.2 + np.cumsum(iv) / 1e3
    t_cond = np.r_[0.2, t_emit[:-1]]
    cols = healthy(1.0)  # the shape of the columns, one row per chunk below
    one = {k: np.resize(v[1:2], n) for k, v in cols.items()}
    one.update(frame_id=np.arange(n), t_sched=t_cond, t_capture=t_cond, total_ms=iv,
               infer_ms=iv, frame_age_ms=np.full(n, 0.1), warmup=t_cond < 5.0,
               first=np.arange(n) == 0, emitted=np.ones(n, dtype=int))  # fmt: skip
    one["warmup"][0] = True
    ems = [Emission(i, 0, float(t_emit[i]), None if i == 0 else float(iv[i]), 0, 1, float(iv[i]))
           for i in range(n)]  # fmt: skip
    dur = float(t_emit[-1]) + 0.1
    return store_run(conn, rid, one, dur=dur, fps=1000 / 30, crit={"content_fps": 25.0},
                     emissions=ems, workload={"shape": "rollout"},
                     summary={"first_output_ms": 30.0})  # fmt: skip


@pytest.mark.parametrize(("tail", "want"), [(0.04, "pass"), (0.07, "fail")])
def test_content_fps_is_judged_on_the_interval_p95(
    conn: sqlite3.Connection, tail: float, want: str
) -> None:
    """A rollout with its median under 1000/content_fps fails when 7 % of intervals exceed it."""
    c = judged(conn, _rollout(conn, f"rollout{tail:g}", tail)).get("content_fps")
    assert c is not None and c.evidence["interval_p50_ms"] < 31 < 40  # the period: 40 ms
    assert c.status == want, c.detail


# --------------------------------------------------------------------------- boundaries


def _override(conn: sqlite3.Connection, rid: str, bounded: bool, **crit: Any) -> Verdict:
    """The stored run judged by its own criteria with ``crit`` changed."""
    data = load_run_data(conn, rid, bounded=bounded)
    own = criteria_of(data)[0]
    return judge(data, own.model_copy(update=crit))


@BOTH
@pytest.mark.parametrize(
    ("crit", "want"),
    [
        ({"min_duration_s": 106.0, "min_frames": 1001}, "pass"),
        ({"min_duration_s": 106.5}, "invalid"),
        ({"min_frames": 1002}, "invalid"),
    ],
)
def test_a_run_exactly_min_duration_long_with_exactly_min_frames_is_valid(
    conn: sqlite3.Connection, ramp: str, bounded: bool, crit: dict[str, Any], want: str
) -> None:
    """A run of exactly min_duration_s with exactly min_frames measured frames is valid."""
    assert status(_override(conn, ramp, bounded, **crit), "run") == want


@pytest.fixture(scope="module")
def exact_k(conn: sqlite3.Connection) -> str:
    """Infer exactly 20 ms but three frames at exactly 5 x that (100 ms) and one at
    100.5 ms; two frames raise after the warm-up."""
    cols = healthy(DUR)
    cols["infer_ms"] = np.full(cols["t_capture"].size, 20.0)
    cols["infer_ms"][[300, 600, 900]] = 100.0
    cols["infer_ms"][700] = 100.5
    cols["error"][[400, 800]] = "boom"
    return store_run(conn, "exact_k", cols, dur=DUR)


@BOTH
@pytest.mark.parametrize(("allowed", "want"), [(1, "pass"), (0, "fail")])
def test_a_frame_at_exactly_k_times_the_median_is_not_over_it(
    conn: sqlite3.Connection, exact_k: str, bounded: bool, allowed: int, want: str
) -> None:
    """Jitter fails above k x median only: 100 ms at exactly 5 x the median is not over."""
    v = _override(conn, exact_k, bounded, jitter_max_exceed=allowed,
                  jitter_max_exceed_fraction=0.0)  # fmt: skip
    c = v.get("jitter")
    assert c is not None and c.evidence["exceed_count"] == 1  # only the 100.5 ms frame
    assert c.status == want, c.detail


@BOTH
@pytest.mark.parametrize(("max_errors", "want"), [(2, "pass"), (1, "fail")])
def test_errors_fail_only_above_max_errors(
    conn: sqlite3.Connection, exact_k: str, bounded: bool, max_errors: int, want: str
) -> None:
    """Two frames raising after the warm-up pass max_errors = 2 and fail max_errors = 1."""
    assert status(_override(conn, exact_k, bounded, max_errors=max_errors), "errors") == want

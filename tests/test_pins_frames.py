"""The per-frame criteria pinned at their boundaries (issue 35): a generator's intervals and
content_fps, the losses the drop fraction counts, the drop rate's windows, frame age and
its backlog, jitter's floor and k, run validity, the per-GPU floors. Each run is written
row by row through the store (tests/stored_runs.py) and judged as ``soakd gate`` judges
it, on the exact path and, where the rule has its own code there, the bounded one; each
sits on both sides of its rule. bench/mutants/frames.py's mutants name this file."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from soakd.analysis import criteria_of, judge
from soakd.analysis.data import load_run_data
from soakd.analysis.model import CriterionResult, Verdict
from soakd.records import DeviceSample, Emission, Sample
from soakd.store import db as store
from soakd.store.gpu_samples import gpu_sample_values

from .stored_runs import MIB, flat_samples, healthy, judged, status, store_run

BOTH = pytest.mark.parametrize("bounded", [False, True], ids=["exact", "bounded"])
DUR = 106.0  # at 10 fps with a 5 s warm-up: 1010 post-warm-up rows


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    c = store.connect(tmp_path_factory.mktemp("pins_frames") / "runs.db")
    yield c
    c.close()


def _once(conn: sqlite3.Connection, rid: str, build: Callable[[], object]) -> str:
    """Store the run ``rid`` (``build`` writes it) unless an earlier test did."""
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone() is None:
        build()
    return rid


def _judge(conn: sqlite3.Connection, rid: str, bounded: bool = False, **crit: Any) -> Verdict:
    """The stored run judged by its own criteria with ``crit`` changed."""
    data = load_run_data(conn, rid, bounded=bounded)
    own = criteria_of(data)[0]
    return judge(data, own.model_copy(update=crit))


def _get(v: Verdict, criterion: str) -> CriterionResult:
    c = v.get(criterion)
    assert c is not None, f"no criterion {criterion}: {[x.criterion for x in v.criteria]}"
    return c


# --------------------------------------------------------------------------- generators

#: a rollout: 10 warm-up chunks 600 ms apart (the first 6 s), then 150 chunks exactly
#: 100 ms apart, each chunk 4 frames handed over at once (per-frame 25 ms, a wait of 100)
ROLL_WARM, ROLL_WARM_MS, ROLL_POST, ROLL_MS, ROLL_FRAMES = 10, 600.0, 150, 100.0, 4


def _rollout_run(conn: sqlite3.Connection, rid: str) -> str:
    gaps = np.r_[np.full(ROLL_WARM, ROLL_WARM_MS), np.full(ROLL_POST, ROLL_MS)]
    n = gaps.size
    t_emit = np.cumsum(gaps) / 1e3
    t_cond = np.r_[0.0, t_emit[:-1]]
    cols = healthy(1.0)
    one = {k: np.resize(v[1:2], n) for k, v in cols.items()}
    one.update(frame_id=np.arange(n), t_sched=t_cond, t_capture=t_cond, total_ms=gaps,
               infer_ms=gaps, frame_age_ms=np.full(n, 0.1), warmup=np.arange(n) < ROLL_WARM,
               first=np.arange(n) == 0, emitted=np.full(n, ROLL_FRAMES))  # fmt: skip
    ems = [
        Emission(i, j, float(t_emit[i]), None if i == 0 else float(gaps[i] / ROLL_FRAMES), 0,
                 ROLL_FRAMES, float(gaps[i]))
        for i in range(n)
        for j in range(ROLL_FRAMES)
    ]  # fmt: skip
    warm_end = float(t_emit[ROLL_WARM - 1]) + 0.05
    crit = {"content_fps": 10.0, "max_age_p95_ms": 40.0, "max_first_output_ms": 600.0}
    return store_run(conn, rid, one, dur=float(t_emit[-1]) + 0.05, fps=10.0, crit=crit,
                     run={"warmup_s": warm_end}, emissions=ems, workload={"shape": "rollout"},
                     summary={"first_output_ms": 600.0})  # fmt: skip


@pytest.fixture(scope="module")
def rollout(conn: sqlite3.Connection) -> str:
    return _once(conn, "rollout", lambda: _rollout_run(conn, "rollout"))


def test_a_rollouts_warmup_chunks_are_out_of_content_fps_jitter_and_the_interval(
    conn: sqlite3.Connection, rollout: str
) -> None:
    """content_fps, presentation jitter and the interval judge the chunks after the warm-up."""
    v = _judge(conn, rollout)
    fps = _get(v, "content_fps")
    assert fps.evidence["intervals"] == ROLL_POST, fps.detail
    assert fps.evidence["interval_max_ms"] == ROLL_MS and fps.status == "pass", fps.detail
    jit = _get(v, "jitter")
    assert (jit.status, jit.evidence["exceed_count"], jit.evidence["max_ms"]) == ("pass", 0, 100.0)
    iv = _get(v, "interval")
    assert iv.evidence["max_ms"] == ROLL_MS / ROLL_FRAMES and iv.status != "fail", iv.detail


@pytest.mark.parametrize(("content_fps", "want"), [(10.0, "pass"), (10.5, "fail")])
def test_content_fps_judges_the_wait_between_visible_updates_and_passes_at_its_limit(
    conn: sqlite3.Connection, rollout: str, content_fps: float, want: str
) -> None:
    """Chunks of 4 frames every 100 ms: a 100 ms wait passes 10 fps (not over), fails 10.5."""
    c = _get(_judge(conn, rollout, content_fps=content_fps), "content_fps")
    assert c.evidence["interval_p95_ms"] == ROLL_MS
    assert c.status == want, c.detail


def test_the_emitted_fps_is_over_the_measured_window(
    conn: sqlite3.Connection, rollout: str
) -> None:
    """emitted_fps: the frames emitted after the warm-up over the measured window (40 fps)."""
    c = _get(_judge(conn, rollout), "content_fps")
    assert c.evidence["emitted_fps"] == pytest.approx(ROLL_FRAMES * 1000 / ROLL_MS, rel=0.03)


@pytest.mark.parametrize(("limit", "want"), [(600.0, "pass"), (599.0, "fail")])
def test_a_first_output_exactly_at_its_limit_passes(
    conn: sqlite3.Connection, rollout: str, limit: float, want: str
) -> None:
    """max_first_output_ms fails above it only: a first output of exactly 600 ms passes 600."""
    assert status(_judge(conn, rollout, max_first_output_ms=limit), "first_output") == want


#: a generator: a request every 0.5 s, 3 chunks of 4 frames 200, 300 and 400 ms after
#: it starts; the stored intervals of a request's first chunk are the gap since the last
#: request (an older soakd's record: a request's first emit is its latency, never judged)
GEN_FPS, GEN_CHUNKS, GEN_FRAMES = 2.0, 3, 4


def _generator_run(conn: sqlite3.Connection, rid: str, chunks: int) -> str:
    cols = healthy(30.0, fps=GEN_FPS)
    ems = []
    for i, t in enumerate(cols["t_capture"]):
        for c in range(chunks):
            t_emit = float(t) + 0.2 + 0.1 * c
            gap = 100.0 if c else (None if i == 0 else 300.0)
            iv = None if gap is None or chunks == 1 else gap / GEN_FRAMES
            ems += [Emission(i, c * GEN_FRAMES + j, t_emit, iv, c, GEN_FRAMES, 100.0)
                    for j in range(GEN_FRAMES)]  # fmt: skip
    return store_run(conn, rid, cols, dur=30.0, fps=GEN_FPS, crit={"content_fps": 9.0},
                     emissions=ems, workload={"shape": "generator"})  # fmt: skip


@pytest.mark.parametrize(("content_fps", "want"), [(9.0, "pass"), (11.0, "fail")])
def test_a_generators_waits_are_its_emits_within_a_request_never_its_first(
    conn: sqlite3.Connection, content_fps: float, want: str
) -> None:
    """A request's later emits (each a 100 ms wait) are judged; its first emit, latency, is not."""
    rid = _once(conn, "generator", lambda: _generator_run(conn, "generator", GEN_CHUNKS))
    c = _get(_judge(conn, rid, content_fps=content_fps), "content_fps")
    assert c.evidence["interval_max_ms"] == 100.0, c.detail
    assert c.evidence["intervals"] == (GEN_CHUNKS - 1) * 50  # 50 requests after the warm-up
    assert c.status == want, c.detail


def test_a_generator_that_never_emits_twice_in_a_request_is_invalid_for_content_fps(
    conn: sqlite3.Connection,
) -> None:
    """content_fps set and no interval (one emit per request): INVALID, never PASS or n/a."""
    rid = _once(conn, "generator1", lambda: _generator_run(conn, "generator1", 1))
    assert status(judged(conn, rid), "content_fps") == "invalid"


# --------------------------------------------------------------------------- losses

#: post-warm-up losses of the losses run (1010 rows after the warm-up): 12 queue drops
#: among the rows and 8 after the last one (the summary's), 7 queued at the end, 26
#: missed ticks: 53 of 1063 ticks = 4.99 %; one more drop after the last row: 5.08 %
ROW_DROPS, QUEUED, MISSED = 12, 7, 26


def _losses_run(conn: sqlite3.Connection, rid: str, after: int, stale_after: int) -> str:
    cols = healthy(DUR)
    post = np.flatnonzero(~cols["warmup"])
    at = post[np.linspace(1, post.size - 1, ROW_DROPS).astype(int)]
    cols["drop_count"][at] = 1
    cols["drop_count"] = np.cumsum(cols["drop_count"])
    first_post = int(cols["frame_id"][post[0]])
    dropped = ROW_DROPS + after
    summary: dict[str, Any] = {
        "drops": dropped, "stale": stale_after, "queued_at_end": QUEUED, "in_flight_at_end": 0,
        "pacer_missed_ticks": MISSED, "missed_ticks_source": MISSED, "missed_ticks_pause": 0,
    }  # fmt: skip
    if not stale_after:  # every capture known: none unaccounted
        summary["frames_captured"] = first_post + post.size + dropped + QUEUED
    crit = {"thresholds": [f"rate(drops) < {x}" for x in (0.019, 0.0195)]}
    return store_run(conn, rid, cols, dur=DUR, crit=crit, summary=summary)


@BOTH
@pytest.mark.parametrize(("after", "want"), [(8, "pass"), (9, "fail")])
def test_the_drop_fraction_is_every_lost_tick_over_every_tick(
    conn: sqlite3.Connection, bounded: bool, after: int, want: str
) -> None:
    """Lost / ticks, both counting drops (after the last row too), queued, missed ones."""
    rid = _once(conn, f"losses{after}", lambda: _losses_run(conn, f"losses{after}", after, 0))
    c = _get(judged(conn, rid, bounded), "drops")
    dropped = ROW_DROPS + after
    lost = dropped + QUEUED + MISSED
    got = {k: c.evidence[k] for k in ("dropped", "queued_at_end", "missed_ticks", "unaccounted")}
    assert got == {"dropped": dropped, "queued_at_end": QUEUED, "missed_ticks": MISSED,
                   "unaccounted": 0}  # fmt: skip
    assert (c.evidence["lost"], c.evidence["ticks"]) == (lost, 1010 + lost)
    assert c.value == pytest.approx(lost / (1010 + lost))
    assert c.status == want, c.detail


@BOTH
def test_rate_drops_is_over_the_frames_captured_not_the_missed_ticks(
    conn: sqlite3.Connection, bounded: bool
) -> None:
    """rate(drops) = queue drops / captures (rows + drops + queued): 20 / 1037 = 1.93 %."""
    rid = _once(conn, "losses8", lambda: _losses_run(conn, "losses8", 8, 0))
    v = judged(conn, rid, bounded)
    assert 0.019 < 20 / 1037 < 0.0195 and 20 / 1063 < 0.019
    assert status(v, "threshold:rate(drops)<0.019") == "fail"
    assert status(v, "threshold:rate(drops)<0.0195") == "pass"


@BOTH
def test_frames_skipped_as_stale_after_the_last_row_count_as_lost(
    conn: sqlite3.Connection, bounded: bool
) -> None:
    """The summary's stale skips beyond the rows' counter are lost frames too."""
    rid = _once(conn, "stale_after", lambda: _losses_run(conn, "stale_after", 8, 5))
    c = _get(judged(conn, rid, bounded), "drops")
    assert c.evidence["stale"] == 5 and c.evidence["lost"] == 20 + QUEUED + MISSED + 5
    assert c.status == "fail", c.detail


def _streams_run(conn: sqlite3.Connection, rid: str) -> str:
    """Three cameras at 10 fps: each drops 20 frames in the warm-up and 10 after it."""
    base = healthy(DUR)
    n = base["t_capture"].size
    parts = []
    for s in range(3):
        cols = {k: v.copy() for k, v in base.items()}
        cols["stream"] = np.full(n, s)
        cols["frame_id"] = np.arange(n) * 3 + s
        cols["t_capture"] = cols["t_capture"] + s * 1e-3
        warm, post = np.flatnonzero(cols["warmup"]), np.flatnonzero(~cols["warmup"])
        cols["drop_count"][warm[np.linspace(1, warm.size - 1, 20).astype(int)]] = 1
        cols["drop_count"][post[np.linspace(1, post.size - 1, 10).astype(int)]] = 1
        cols["drop_count"] = np.cumsum(cols["drop_count"])
        parts.append(cols)
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(cols["frame_id"], kind="stable")
    per = [{"drops": 30}] * 3
    return store_run(conn, rid, {k: v[order] for k, v in cols.items()}, dur=DUR,
                     run={"streams": 3}, summary={"drops": 90, "streams": per})  # fmt: skip


def test_every_streams_warmup_drops_are_out_of_the_drop_count(conn: sqlite3.Connection) -> None:
    """Several streams: the drops counted are each stream's after the warm-up, summed (30)."""
    # (a run of several streams is always loaded whole: no bounded path)
    rid = _once(conn, "streams", lambda: _streams_run(conn, "streams"))
    c = _get(judged(conn, rid), "drops")
    assert (c.evidence["dropped"], c.evidence["lost"]) == (30, 30), c.detail


# --------------------------------------------------------------------------- drop rate


def _rate_run(conn: sqlite3.Connection, rid: str, every: int) -> str:
    """From 80 s on, one tick in ``every`` dropped (no row; the next row's counter counts it)."""
    cols = healthy(DUR)
    k = np.arange(cols["t_capture"].size)
    gone = (k >= 800) & (k % every == 5)
    cols["drop_count"] = np.cumsum(gone)
    cols = {name: v[~gone] for name, v in cols.items()}
    return store_run(conn, rid, cols, dur=DUR, summary={"drops": int(gone.sum())})


@BOTH
@pytest.mark.parametrize(("every", "end"), [(10, 0.1), (25, 0.04)])
def test_the_drop_rate_at_the_end_is_its_last_quarters_windows_losses_over_captures(
    conn: sqlite3.Connection, bounded: bool, every: int, end: float
) -> None:
    """rate_at_end: the mean over the last quarter's windows of lost / (rows + drops) in each."""
    rid = _once(conn, f"rate{every}", lambda: _rate_run(conn, f"rate{every}", every))
    c = _get(judged(conn, rid, bounded), "drops")
    assert c.evidence["window_s"] == 1.0 and c.value < 0.05, c.detail
    assert c.evidence["rate_at_end"] == pytest.approx(end, abs=1e-9), c.detail
    assert c.status == "pass", c.detail


# --------------------------------------------------------------------------- frame age


def _age_run(conn: sqlite3.Connection, rid: str, **over: Any) -> str:
    """1001 measured frames aged 0, 0.1 ... 100 ms (shuffled: p95 95.0 exactly) and 9
    stale-skipped ones 900 ms old, after the warm-up."""
    rng = np.random.default_rng(3)
    cols = healthy(DUR)
    post = np.flatnonzero(~cols["warmup"])
    skipped = post[np.linspace(50, post.size - 50, 9).astype(int)]
    cols["skipped"][skipped] = True
    cols["stale_count"] = np.cumsum(cols["skipped"])
    for name in ("pre_ms", "infer_ms", "decode_ms", "grab_ms", "total_ms"):
        cols[name] = cols[name].astype(float)
        cols[name][skipped] = np.nan
    measured = np.setdiff1d(post, skipped)
    cols["frame_age_ms"][measured] = rng.permutation(1001) / 10.0
    cols["frame_age_ms"][skipped] = 900.0
    return store_run(conn, rid, cols, dur=DUR, summary={"stale": 9}, **over)


@pytest.mark.parametrize(("ceiling", "want"), [(95.0, "pass"), (94.9, "fail")])
def test_a_frame_age_p95_exactly_at_its_ceiling_passes_and_skipped_frames_are_out(
    conn: sqlite3.Connection, ceiling: float, want: str
) -> None:
    """max_age_p95_ms fails above it only; stale-skipped frames' ages are not in the p95."""
    rid = _once(conn, "age", lambda: _age_run(conn, "age"))
    c = _get(_judge(conn, rid, max_age_p95_ms=ceiling), "frame_age")
    assert c.evidence["p95_ms"] == 95.0 and c.evidence["max_ms"] == 100.0
    assert c.status == want, c.detail


def _backlog_run(conn: sqlite3.Connection, rid: str) -> str:
    """consume = "oldest": frame age flat, the queue growing 0 to 4 over the run (2.4
    frames/min: 240 ms/min of frame age at 10 fps)."""
    cols = healthy(DUR)
    cols["queue_len"] = np.floor(np.linspace(0, 4.99, cols["t_capture"].size)).astype(int)
    return store_run(conn, rid, cols, dur=DUR, run={"consume": "oldest"},
                     summary={"queued_at_end": 4})  # fmt: skip


@pytest.mark.parametrize(("tolerance", "want"), [(200.0, "fail"), (300.0, "pass")])
def test_a_growing_backlog_fails_frame_age_at_the_slope_it_implies(
    conn: sqlite3.Connection, tolerance: float, want: str
) -> None:
    """A queue growing 2.4 frames/min at 10 fps is 240 ms/min: fails 200 ms/min, passes 300."""
    rid = _once(conn, "backlog", lambda: _backlog_run(conn, "backlog"))
    c = _get(_judge(conn, rid, max_age_slope_ms_per_min=tolerance), "frame_age")
    assert c.evidence["backlog"]["implied_age_slope_ms_per_min"] == pytest.approx(240, rel=0.15)
    assert c.status == want, c.detail


# --------------------------------------------------------------------------- jitter

REGULAR = (200, 400, 600, 800)  # 120 ms (6 x the 20 ms median): regular positions
RANDOM = (333, 911)  # 140 ms
ERRORS = tuple(range(150, 1000, 85))  # raised; their infer took 500 ms
SLOW_GRAB = tuple(range(170, 1000, 85))  # a 500 ms grab: the whole frame slow, not infer


def _jitter_run(conn: sqlite3.Connection, rid: str) -> str:
    cols = healthy(DUR)
    cols["infer_ms"] = np.full(cols["t_capture"].size, 20.0)
    cols["infer_ms"][list(REGULAR)] = 120.0
    cols["infer_ms"][list(RANDOM)] = 140.0
    cols["infer_ms"][list(ERRORS)] = 500.0
    cols["error"][list(ERRORS)] = "boom"
    cols["grab_ms"][list(SLOW_GRAB)] = 500.0
    cols["total_ms"] = cols["grab_ms"] + cols["pre_ms"] + cols["infer_ms"] + cols["decode_ms"]
    crit = {"jitter_min_ms": 150.0, "max_errors": len(ERRORS)}
    return store_run(conn, rid, cols, dur=DUR, crit=crit)


@pytest.fixture(scope="module")
def spiky(conn: sqlite3.Connection) -> str:
    return _once(conn, "spiky", lambda: _jitter_run(conn, "spiky"))


@BOTH
@pytest.mark.parametrize(
    ("crit", "over", "want"),
    [
        ({}, 0, "pass"),  # every spike under the 150 ms floor
        ({"jitter_min_ms": 100.0}, 6, "fail"),  # 6 over 100 ms, 4 of them regular
        ({"jitter_max_exceed": 0, "jitter_max_exceed_fraction": 0.0}, 0, "pass"),
    ],
)
def test_a_spike_under_jitter_min_ms_is_no_spike(
    conn: sqlite3.Connection, spiky: str, bounded: bool, crit: dict, over: int, want: str
) -> None:
    """Infer spikes count over k x median and jitter_min_ms; errored frames and grab never."""
    c = _get(_judge(conn, spiky, bounded, **crit), "jitter")
    assert (c.evidence["source"], c.evidence["max_ms"]) == ("infer_ms", 140.0)
    assert c.evidence["exceed_count"] == over
    assert c.status == want, c.detail


def test_the_count_rules_value_is_the_largest_frame_left_once_the_allowed_are_set_aside(
    conn: sqlite3.Connection, spiky: str
) -> None:
    """The count rule's value (what history learns): the 3rd largest / median, not the max."""
    c = _get(_judge(conn, spiky), "jitter")
    assert c.value == pytest.approx(6.0) and c.evidence["max_ratio"] == pytest.approx(7.0)


@pytest.mark.parametrize(("runs", "k", "want"), [(3, 7.5, "pass"), (2, 5.0, "fail")])
def test_k_comes_from_history_once_it_holds_jitter_history_min_runs(
    conn: sqlite3.Connection, spiky: str, runs: int, k: float, want: str
) -> None:
    """3 earlier ratios of 6 (min 3): k = 1.25 x 6 = 7.5; 2 of them: the default k = 5."""
    data = load_run_data(conn, spiky)
    crit = criteria_of(data)[0].model_copy(update={"jitter_k": "history", "jitter_min_ms": 0.0})
    c = _get(judge(data, crit, [6.0] * runs), "jitter")
    assert c.threshold == k and c.status == want, c.detail


# --------------------------------------------------------------------------- validity


def test_infinite_telemetry_makes_the_run_invalid(conn: sqlite3.Connection) -> None:
    """An infinite telemetry value is no measurement: the run cannot be judged (INVALID)."""

    def build() -> None:
        smp = flat_samples(60.0)
        smp[40] = Sample(40, smp[40].t, 0.0, 0.0, 0.1, {"rss_bytes": float("inf"), "cpu_pct": 50.0})
        store_run(conn, "inf", healthy(60.0), dur=60.0, samples=smp)

    c = _get(judged(conn, _once(conn, "inf", build)), "run")
    assert c.status == "invalid" and "samples.rss_bytes" in c.detail, c.detail


# --------------------------------------------------------------------------- GPUs


def _gpus_run(conn: sqlite3.Connection, rid: str, mode: str) -> str:
    """Two GPUs sampled apart for 120 s, GPU 0 holding still; GPU 1 grows 100 MB/min in the
    60 s warm-up (``"warm"``) or after it (``"after"``), or holds still and reports no used
    memory after the warm-up (``"gone"``)."""
    st = np.arange(0.0, 120.0, 0.5)
    grow = {"warm": np.minimum(st, 60.0), "after": np.clip(st - 60.0, 0, None)}.get(mode, 0 * st)
    rng = np.random.default_rng(5)
    used = {0: np.full(st.size, 1e9), 1: 2e9 + 100 * MIB * grow / 60}
    rows = [
        DeviceSample(i, float(t), g, f"GPU-{g}", None if mode == "gone" and g and t >= 60
                     else int(used[g][i] + rng.normal(0, 1e5)), 80 << 30)
        for i, t in enumerate(st)
        for g in (0, 1)
    ]  # fmt: skip
    store_run(conn, rid, healthy(120.0, warm=60.0), dur=120.0, run={"warmup_s": 60.0},
              crit={"max_memory_growth_mb_per_min": 5.0})  # fmt: skip
    with store.atomic(conn):
        store.insert_rows(conn, DeviceSample, rid, [gpu_sample_values(r) for r in rows])
    return rid


@pytest.mark.parametrize(("mode", "want"), [("warm", "pass"), ("after", "fail"), ("gone", "n/a")])
def test_a_gpus_memory_is_judged_after_the_warmup_only(
    conn: sqlite3.Connection, mode: str, want: str
) -> None:
    """GPU 1 growing only in the warm-up passes, after it fails; reported only in it: n/a."""
    rid = _once(conn, f"gpus_{mode}", lambda: _gpus_run(conn, f"gpus_{mode}", mode))
    v = judged(conn, rid)
    assert status(v, "memory_gpu[0]") == "pass"
    assert status(v, "memory_gpu[1]") == want, _get(v, "memory_gpu[1]").detail

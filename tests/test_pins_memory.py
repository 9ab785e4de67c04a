"""Memory's rules pinned at their boundaries (issue 35): the measured window (the warm-up
out, the span from the warm-up's end to the last sample), the floor windows, the units,
the shape of growth, headroom and stage_trend. Each run is written row by row through the
store (tests/stored_runs.py) and judged as ``soakd gate`` judges it, on the exact path and,
where the rule has its own code there, the bounded one; bench/mutants/memory.py's mutants
name this file."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from scipy.stats import norm

from soakd.analysis import criteria_of, judge
from soakd.analysis.data import load_run_data
from soakd.analysis.model import CriterionResult, Verdict
from soakd.records import Sample
from soakd.store import db as store

from .stored_runs import MIB, healthy, store_run

BOTH = pytest.mark.parametrize("bounded", [False, True], ids=["exact", "bounded"])
WARM = 5.0  # the stored runs' warm-up (a warmup_end event at 5 s)
TOL = 1.5  # MB/min: the default max_memory_growth_mb_per_min


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    c = store.connect(tmp_path_factory.mktemp("pins_memory") / "runs.db")
    yield c
    c.close()


def _samples(mb: Callable[[np.ndarray], np.ndarray], end: float, noise: float,
             seed: int) -> list[Sample]:  # fmt: skip
    """RSS ``mb(t)`` MB (MB = 2^20 bytes) plus ``noise`` MB, every 0.5 s from 0.3 s (no
    sample at the warm-up's end) and one at ``end``, after the last frame."""
    rng = np.random.default_rng(seed)
    t = np.r_[np.arange(0.3, end, 0.5), end]
    y = (mb(t) + rng.normal(0, noise, t.size)) * MIB
    return [Sample(i, float(a), 0.0, 0.0, 0.1, {"rss_bytes": int(b)})
            for i, (a, b) in enumerate(zip(t, y, strict=True))]  # fmt: skip


def _store(conn: sqlite3.Connection, rid: str, mb: Callable[[np.ndarray], np.ndarray],
           end: float, *, noise: float = 0.05, seed: int = 0, env: dict[str, Any] | None = None,
           ) -> str:  # fmt: skip
    """A healthy staged run at 2 fps to ``end`` s with the RSS ``mb(t)``, judged at the
    default memory tolerance (1.5 MB/min)."""
    return store_run(conn, rid, healthy(end, 2.0), dur=end, fps=2.0,
                     crit={"max_memory_growth_mb_per_min": TOL},
                     samples=_samples(mb, end, noise, seed), environment=env or {})  # fmt: skip


def _judge(conn: sqlite3.Connection, rid: str, bounded: bool = False, **crit: Any) -> Verdict:
    """The stored run judged by its criteria, ``crit`` changed (exact or bounded path)."""
    data = load_run_data(conn, rid, bounded=bounded)
    return judge(data, criteria_of(data)[0].model_copy(update=crit))


def _get(v: Verdict, name: str) -> CriterionResult:
    r = v.get(name)
    assert r is not None, [c.criterion for c in v.criteria]
    return r


def _flat(t: np.ndarray) -> np.ndarray:
    return 400.0 + 0 * t


# --------------------------------------------------------------------------- the window


@pytest.fixture(scope="module")
def spans(conn: sqlite3.Connection) -> dict[float, str]:
    """Flat runs whose last sample lies 45, 46, 49 and 50 s after the warm-up's end."""
    return {s: _store(conn, f"span{s:g}", _flat, WARM + s) for s in (45.0, 46.0, 49.0, 50.0)}


@BOTH
def test_the_span_from_the_warm_ups_end_decides_too_short(
    conn: sqlite3.Connection, spans: dict[float, str], bounded: bool
) -> None:
    """The span runs from the warm-up's end: 46 s of it lays 12 floor windows of 3.83 s
    (within 5 % of 4 s: judged), 45 s only 3.75 s ones: INVALID, 48 s (run.duration >= 53)."""
    short = _get(_judge(conn, spans[45.0], bounded), "memory_rss")
    assert short.status == "invalid", short.detail
    assert short.detail.startswith("too short to judge"), short.detail
    assert "run at least 48 s after the warm-up (run.duration >= 53 s)" in short.detail
    ok = _get(_judge(conn, spans[46.0], bounded), "memory_rss")
    assert ok.status == "pass", ok.detail
    assert ok.evidence["floor_window_s"] == pytest.approx(46.0 / 12)


@BOTH
def test_floor_windows_start_at_the_warm_ups_end_and_merge_a_short_stub(
    conn: sqlite3.Connection, spans: dict[float, str], bounded: bool
) -> None:
    """Floor windows of 4 s laid from the warm-up's end to the last sample: 49 s make 12
    (the 1 s stub merged), 50 s make 13 (a 2 s stub is half a window: its own)."""
    for span, n in ((49.0, 12), (50.0, 13)):
        v = _judge(conn, spans[span], bounded)
        assert (v.window["t0"], v.window["t1"]) == (WARM, WARM + span)
        r = _get(v, "memory_rss")
        assert r.evidence["n_windows"] == n, (span, r.evidence)
        assert v.series["memory_rss"].t[0] == pytest.approx(WARM + 2.0)


def test_a_long_run_s_floor_windows_are_lengthened_to_400(conn: sqlite3.Connection) -> None:
    """Past 400 windows of floor_window_s, the floor windows are lengthened to span / 400:
    1700 s after the warm-up make 400 windows of 4.25 s."""
    r = _get(_judge(conn, _store(conn, "long", _flat, WARM + 1700.0)), "memory_rss")
    assert r.evidence["floor_window_s"] == pytest.approx(1700.0 / 400)
    assert r.evidence["n_windows"] == 400 and r.status == "pass", r.detail


def test_the_bounded_path_lays_the_exact_path_s_floors(
    conn: sqlite3.Connection, spans: dict[float, str]
) -> None:
    """A run streamed from the store is judged on the same floor windows, floors and slope
    as when loaded whole (46 s after the warm-up: windows shortened to 3.83 s)."""
    exact, bounded = (_judge(conn, spans[46.0], b) for b in (False, True))
    a, b = exact.series["memory_rss"], bounded.series["memory_rss"]
    assert a.width_s == b.width_s and np.array_equal(a.t, b.t)
    assert np.array_equal(a.floor, b.floor)
    assert _get(exact, "memory_rss").value == _get(bounded, "memory_rss").value


def _creep(t: np.ndarray) -> np.ndarray:
    """Warm-up: 300 MB rising to a 900 MB load peak at 2 s, 500 MB from the warm-up's end
    on; one 530 MB spike at 60 s that falls back in 12, 12 and 6 MB steps."""
    warm = np.where(t < 2, 300 + 300 * t, 900 - 130 * (t - 2))
    y = np.where(t < WARM, warm, 500.0)
    for at, mb in ((60.0, 530.0), (60.5, 518.0), (61.0, 506.0)):
        y = np.where(np.isclose(t, at + 0.3), mb, y)
    return y


@pytest.fixture(scope="module")
def creep(conn: sqlite3.Connection) -> str:
    return _store(conn, "creep", _creep, 125.0, env={"host_mem_total_bytes": 1000 * MIB})


@BOTH
def test_the_warm_up_s_memory_is_never_judged(
    conn: sqlite3.Connection, creep: str, bounded: bool
) -> None:
    """A 900 MB warm-up peak falling to a flat 500 MB: memory_rss PASSes, its peak (530 MB),
    first floor (500 MB), sawtooth (2 steps over a quarter of the range, 12 MB) and the
    headroom's peak are the measured window's alone."""
    v = _judge(conn, creep, bounded)
    r = _get(v, "memory_rss")
    assert r.status == "pass", r.detail
    assert r.evidence["peak_mb"] == pytest.approx(530.0, abs=0.5)
    assert r.evidence["first_floor_mb"] == pytest.approx(500.0, abs=0.5)
    saw = r.evidence["sawtooth"]
    assert saw["drops"] == 2 and saw["drop_mb_median"] == pytest.approx(12.0, abs=0.5), saw
    head = _get(v, "memory_headroom")
    assert head.evidence["metrics"]["memory_rss"]["peak_mb"] == pytest.approx(530.0, abs=0.5)


# --------------------------------------------------------------------------- units, headroom

LEAK_MB_MIN = 3.0


@pytest.fixture(scope="module")
def leak(conn: sqlite3.Connection) -> str:
    """A 3 MB/min leak (MB = 2^20 bytes) from the warm-up's end, 2 minutes long; the host
    has 64 GiB, its cgroup 800 MB."""
    env = {"host_mem_total_bytes": 65536 * MIB, "cgroup_mem_max_bytes": 800 * MIB}
    return _store(conn, "leak", lambda t: 400 + LEAK_MB_MIN * np.clip(t - WARM, 0, None) / 60,
                  WARM + 120.0, env=env)  # fmt: skip


def test_a_leak_reads_in_mb_of_2_20_bytes_per_minute(conn: sqlite3.Connection, leak: str) -> None:
    """A 3 MB/min leak (3 x 2^20 bytes a minute) over the 1.5 MB/min tolerance FAILs at
    3.0 MB/min, its detail saying so."""
    r = _get(_judge(conn, leak), "memory_rss")
    assert r.status == "fail", r.detail
    assert r.value == pytest.approx(LEAK_MB_MIN, rel=0.02)
    said = re.match(r"floor rising ([\d.]+) MB/min", r.detail)
    assert said is not None and float(said.group(1)) == pytest.approx(LEAK_MB_MIN, rel=0.02)


def test_headroom_is_the_lower_limit_left_at_the_floor_slope(
    conn: sqlite3.Connection, leak: str
) -> None:
    """Headroom is against the lower of host memory and the cgroup's memory.max (800 MB),
    in hours: the MB left / (MB/min) / 60."""
    v = _judge(conn, leak)
    m = _get(v, "memory_headroom").evidence["metrics"]["memory_rss"]
    assert m["limit_source"] == "cgroup memory.max" and m["limit_mb"] == pytest.approx(800.0)
    slope = _get(v, "memory_rss").value
    assert m["hours"] == pytest.approx(m["headroom_mb"] / slope / 60, rel=0.01)


def test_headroom_fails_within_the_horizon_and_passes_beyond_it(
    conn: sqlite3.Connection, leak: str
) -> None:
    """memory_headroom FAILs when the memory runs out within criteria.horizon (seconds),
    or min_headroom_hours when set, and passes when it lasts 5 % longer."""
    hours = _get(_judge(conn, leak), "memory_headroom").value
    assert hours is not None and 1 < hours < 3
    for f, want in ((1.05, "fail"), (0.95, "pass")):
        h = _get(_judge(conn, leak, horizon=hours * f * 3600), "memory_headroom")
        assert h.status == want and h.threshold == pytest.approx(hours * f), (f, h.detail)
        h = _get(_judge(conn, leak, horizon=1e9, min_headroom_hours=hours * f), "memory_headroom")
        assert h.status == want, (f, h.detail)


@pytest.fixture(scope="module")
def flat(conn: sqlite3.Connection) -> str:
    """A flat 400 MB floor under 1 MB of noise whose slope happens to be positive (seed 3),
    with a few MB of host memory left."""
    return _store(conn, "flat", _flat, WARM + 120.0, noise=1.0, seed=3,
                  env={"host_mem_total_bytes": 406 * MIB})  # fmt: skip


def test_a_floor_without_a_significant_rise_never_runs_out_nor_grows_for_certain(
    conn: sqlite3.Connection, flat: str, leak: str
) -> None:
    """A positive floor slope that is not significant: memory_headroom PASSes (flat, hours
    none) however little is left, and no "grows for certain" warning; a significant one
    under the tolerance gets that warning."""
    v = _judge(conn, flat)
    r = _get(v, "memory_rss")
    assert r.status == "pass" and (r.value or 0) > 0 and r.evidence["p_value"] > 0.01, r.evidence
    assert not [w for w in r.warnings if "for certain" in w], r.warnings
    m = _get(v, "memory_headroom").evidence["metrics"]["memory_rss"]
    assert m["flat"] and m["hours"] is None, m
    assert _get(v, "memory_headroom").status == "pass"
    under = _get(_judge(conn, leak, max_memory_growth_mb_per_min=5.0), "memory_rss")
    assert under.status == "pass", under.detail
    assert [w for w in under.warnings if w.startswith("memory_rss: the floor grows 3")]


def test_the_detectable_slope_is_over_the_windows_span(conn: sqlite3.Connection) -> None:
    """The smallest detectable slope is (z_(1-alpha/2) + z_0.8) x noise x sqrt(12 / n_eff) /
    span of the window centres, in MB/min; "cannot see leaks under" is warned when the
    tolerance is under it, not when over it; a slope over the tolerance but not significant
    is undecided (INVALID), and says the run would decide it after span x (mds /
    tolerance)^(2/3), the span from the warm-up's end (60 s)."""
    rid = _store(conn, "noisy", _flat, WARM + 60.0, noise=3.0, seed=4)
    v = _judge(conn, rid)
    ev = _get(v, "memory_rss").evidence
    win = v.series["memory_rss"]
    t = win.t[win.nonempty()]
    z = norm.ppf(1 - 0.01 / 2) + norm.ppf(0.8)
    mds = z * ev["noise"] * np.sqrt(12 / ev["n_effective"]) / (t[-1] - t[0]) * 60 / MIB
    assert ev["min_detectable_slope"] == pytest.approx(mds, rel=1e-6)
    for f, warned in ((0.9, True), (1.1, False)):
        r = _get(_judge(conn, rid, max_memory_growth_mb_per_min=mds * f), "memory_rss")
        assert bool([w for w in r.warnings if "cannot see leaks under" in w]) == warned, f
    tol = ev["min_detectable_slope"] / 100
    r = _get(_judge(conn, rid, max_memory_growth_mb_per_min=tol), "memory_rss")
    assert r.status == "invalid" and r.value > tol and ev["p_value"] > 0.01, r.detail
    assert r.detail.startswith("undecided: "), r.detail
    need_min = 60.0 * (ev["min_detectable_slope"] / tol) ** (2 / 3) / 60
    assert f"; about {need_min:.0f} min after the warm-up would decide it" in r.detail, r.detail


# --------------------------------------------------------------------------- shape


def _plateau(drift: float = 0.0, ramp: float = 40.0) -> Callable[[np.ndarray], np.ndarray]:
    """50 MB allocated over ``ramp`` s after the warm-up, then level (or ``drift`` MB/min)."""
    return lambda t: (400 + 50 * np.clip((t - WARM) / ramp, 0, 1)
                      + drift * np.clip(t - WARM - ramp, 0, None) / 60)  # fmt: skip


@pytest.fixture(scope="module")
def plateau(conn: sqlite3.Connection) -> str:
    return _store(conn, "plateau", _plateau(), WARM + 120.0, noise=0.5,
                  env={"host_mem_total_bytes": 1000 * MIB})  # fmt: skip


@BOTH
def test_a_plateau_is_bounded_growth_of_its_rise_and_never_runs_out(
    conn: sqlite3.Connection, plateau: str, bounded: bool
) -> None:
    """50 MB over 40 s, then level: PASS, bounded growth of ~50 MB (the level tail's median
    over the first floor), and memory_headroom reads the level tail: flat, PASS."""
    v = _judge(conn, plateau, bounded)
    r = _get(v, "memory_rss")
    assert r.status == "pass" and r.evidence["shape"] == "bounded", r.detail
    assert 47 < r.evidence["settled"]["rise_mb"] < 53, r.evidence["settled"]
    head = _get(v, "memory_headroom")
    assert head.status == "pass" and head.evidence["metrics"]["memory_rss"]["flat"], head.detail


def test_a_worst_case_bound_alone_is_invalid_headroom_never_fail(
    conn: sqlite3.Connection, plateau: str
) -> None:
    """The plateau judged at a 1000 MB/min tolerance is only bounded (no trend test); the
    bound's rate would use up the 548 MB left in ~0.35 h: memory_headroom INVALID, not FAIL,
    the hours at the bound's rate."""
    v = _judge(conn, plateau, max_memory_growth_mb_per_min=1000.0)
    r = _get(v, "memory_rss")
    assert r.status == "pass" and r.evidence["decided_by"] == "bounded", r.detail
    head = _get(v, "memory_headroom")
    assert head.status == "invalid", head.detail
    m = head.evidence["metrics"]["memory_rss"]
    assert head.value == pytest.approx(m["headroom_mb"] / r.evidence["bound_slope"] / 60)


@pytest.fixture(scope="module")
def drift(conn: sqlite3.Connection) -> str:
    """50 MB over 30 s, then drifting 0.8 MB/min (seed 1: significant), 1000 MB of host."""
    return _store(conn, "drift", _plateau(0.8, ramp=30.0), WARM + 120.0, noise=0.5, seed=1,
                  env={"host_mem_total_bytes": 1000 * MIB})  # fmt: skip


def test_a_settled_floor_runs_out_at_its_tail_s_slope(conn: sqlite3.Connection, drift: str) -> None:
    """Bounded growth whose level tail still rises significantly: memory_headroom's hours are
    the MB left at the tail's slope, not the whole window's (not significant here)."""
    v = _judge(conn, drift)
    r = _get(v, "memory_rss")
    s = r.evidence["settled"]
    assert r.evidence["shape"] == "bounded" and s["p_value"] < 0.01 < r.evidence["p_value"], s
    m = _get(v, "memory_headroom").evidence["metrics"]["memory_rss"]
    assert m["hours"] == pytest.approx(m["headroom_mb"] / s["slope"] / 60, rel=1e-6), m


def test_a_settled_tail_passes_only_under_its_one_sided_upper_bound(
    conn: sqlite3.Connection, drift: str
) -> None:
    """After a plateau drifting 0.8 MB/min, bounded growth PASSes when the tail slope's
    one-sided upper bound (slope + z_(1-alpha) x se) is 3 % under the tolerance, and is
    INVALID "still settling" when it is 3 % over."""
    rid = drift
    s = _get(_judge(conn, rid), "memory_rss").evidence["settled"]
    slope, upper, mds = s["slope"], s["upper_slope"], s["min_detectable_slope"]
    se = mds / (norm.ppf(1 - 0.01 / 2) + norm.ppf(0.8))
    assert upper == pytest.approx(slope + norm.ppf(1 - 0.01) * se, rel=1e-6)
    assert slope > 0 and mds < slope + 0.97 * (upper - slope), s  # the bound decides here
    for f, want in ((1.03, "pass"), (0.97, "invalid")):
        r = _get(_judge(conn, rid, max_memory_growth_mb_per_min=slope + f * (upper - slope)),
                 "memory_rss")  # fmt: skip
        assert r.status == want and r.evidence["shape"] == "bounded", (f, r.detail)
    assert r.detail.startswith("still settling: bounded growth of"), r.detail


@BOTH
def test_a_rise_too_recent_to_show_its_level_is_still_settling(
    conn: sqlite3.Connection, bounded: bool
) -> None:
    """50 MB over 31 s of a 70 s window: the level after it (from the knee to the window's
    end) cannot show yet that it stays under the tolerance: INVALID "still settling"."""
    rid = f"settling{bounded}"
    if rid not in {r[0] for r in conn.execute("SELECT id FROM runs")}:
        _store(conn, rid, _plateau(ramp=31.0), WARM + 70.0, noise=0.5)
    v = _judge(conn, rid, bounded)
    r = _get(v, "memory_rss")
    assert r.status == "invalid" and r.detail.startswith("still settling"), r.detail
    s = r.evidence["settled"]
    assert s["tail_s"] == pytest.approx(v.window["t1"] - s["at_s"])
    assert f"but the {s['tail_s']:.0f} s after it cannot yet show" in r.detail, r.detail


# --------------------------------------------------------------------------- stage_trend

STAGE_FPS = 10.0


def _stage_run(conn: sqlite3.Connection, rid: str, end: float, infer: Callable) -> str:
    """A staged run at 10 fps to ``end`` s whose infer takes ``infer(t)`` ms, 3 ms old."""
    cols = healthy(end, STAGE_FPS)
    cols["infer_ms"] = infer(cols["t_capture"])
    cols["frame_age_ms"] = np.full(cols["infer_ms"].size, 3.0)
    cols["total_ms"] = cols["grab_ms"] + cols["pre_ms"] + cols["infer_ms"] + cols["decode_ms"]
    return store_run(conn, rid, cols, dur=end, fps=STAGE_FPS)


@pytest.fixture(scope="module")
def slowing(conn: sqlite3.Connection) -> str:
    """250 s at 10 fps, infer 20 ms slowing 8 ms/min (0.5 ms of jitter) from the warm-up."""
    rng = np.random.default_rng(3)
    return _stage_run(conn, "slowing", 250.0,
                      lambda t: 20 + 8 * np.clip(t - WARM, 0, None) / 60
                      + rng.normal(0, 0.5, t.size))  # fmt: skip


def test_a_stage_slowing_into_its_budget_within_the_horizon_fails(
    conn: sqlite3.Connection, slowing: str
) -> None:
    """stage_trend: windows of 5 frames or span/400 s; each of 8 tests (4 stages x floor,
    median) at alpha / 8; infer's slope in ms/min; the budget left is 1000 / fps less the
    median total of the last tenth of the frames, gone in left / slope / 60 h: FAIL when
    within the horizon, PASS when the horizon is 5 % shorter."""
    data = load_run_data(conn, slowing)
    v = judge(data, criteria_of(data)[0])
    r = _get(v, "stage_trend")
    ev = r.evidence
    assert r.status == "fail", r.detail
    assert ev["window_s"] == pytest.approx((v.window["t1"] - WARM) / 400)
    assert ev["alpha_per_test"] == pytest.approx(0.01 / 8)
    total = data.frames["total_ms"][data.measured(WARM)]
    left = 100.0 - float(np.median(total[-(total.size // 10) :]))
    assert ev["budget_ms"] == 100.0 and ev["budget_left_ms"] == pytest.approx(left)
    row = ev["stages"]["infer_ms median"]
    assert row["slope"] == pytest.approx(8.0, rel=0.05) and r.value == pytest.approx(row["slope"])
    hours = row["hours_to_budget"]
    assert hours == pytest.approx(left / row["slope"] / 60)
    for f, want in ((1.05, "fail"), (0.95, "pass")):
        got = _get(_judge(conn, slowing, horizon=hours * f * 3600), "stage_trend")
        assert got.status == want, (f, got.detail)


@pytest.mark.parametrize(("rate", "want"), [(0.08, "pass"), (0.087, "n/a")])
def test_a_stage_too_short_to_test_passes_only_when_its_range_bounds_it(
    conn: sqlite3.Connection, rate: float, want: str
) -> None:
    """3 s after the warm-up (6 windows: no trend test): infer rising ``rate`` ms/s passes
    "bounded" when its windows' range over their span allows at most 5 ms/min (0.083 ms/s),
    else n/a "untested", asking for N s after the warm-up (run.duration >= 5 + N s)."""
    rid = _stage_run(conn, f"brief{rate}", 8.0, lambda t: 20 + rate * np.clip(t - WARM, 0, None))
    r = _get(_judge(conn, rid), "stage_trend")
    assert r.status == want, r.detail
    assert r.evidence["stages"]["infer_ms floor"]["decided_by"] == (
        "bounded" if want == "pass" else "untested"
    )
    if want == "n/a":
        need = max(row.get("span_to_test_s", 0.0) for row in r.evidence["stages"].values())
        assert f"run at least {need:.0f} s after the warm-up" in r.detail, r.detail
        assert f"(run.duration >= {WARM + need:.0f} s)" in r.detail, r.detail


def test_a_bounded_pass_on_many_windows_says_few_of_them_are_independent(
    conn: sqlite3.Connection,
) -> None:
    """A slow 2 MB swell over 120 s: the floors' many windows move together, so the trend is
    untestable but bounded; the detail says how few of them are independent, never that
    there are too few windows."""
    rid = _store(conn, "swell", lambda t: 400.0 + 2 * np.sin(2 * np.pi * t / 115.0), 120.0,
                 noise=0.0)  # fmt: skip
    mem = _get(_judge(conn, rid, max_memory_growth_mb_per_min=10.0), "memory_rss")
    assert mem.status == "pass" and "independent" in mem.detail, mem.detail
    found = re.findall(r"\((\d+) windows, about (\d+) independent", mem.detail)
    n, n_eff = (int(x) for x in found[0])
    assert n >= 12 and n_eff < 3, mem.detail


def test_an_untested_trend_whose_range_allows_a_leak_is_invalid_never_pass(
    conn: sqlite3.Connection,
) -> None:
    """The same slow 2 MB swell at the default 1.5 MB/min: its windows' range allows 2.1
    MB/min and too few of them are independent to test, so memory_rss is INVALID
    "untested", never PASS."""
    rid = _store(conn, "swell_untested", lambda t: 400.0 + 2 * np.sin(2 * np.pi * t / 115.0),
                 120.0, noise=0.0)  # fmt: skip
    mem = _get(_judge(conn, rid), "memory_rss")
    assert mem.status == "invalid" and mem.detail.startswith("untested"), mem.detail

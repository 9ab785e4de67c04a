"""Property tests for soakd.analysis.stats: trends, floors, periodicity."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from soakd.analysis import stats

seeds = st.integers(0, 2**32 - 1)


@given(seeds, st.floats(-5, 5), st.floats(0.1, 10))
@settings(max_examples=40, deadline=None)
def test_theil_sen_recovers_planted_slope(seed: int, slope: float, noise: float) -> None:
    """The Theil–Sen slope of a line plus noise lands within a few standard errors."""
    rng = np.random.default_rng(seed)
    t = np.arange(200.0)
    y = slope * t + rng.normal(0, noise, t.size)
    tr = stats.trend(t, y)
    se = noise * np.sqrt(12 / 200) / 200
    assert abs(tr.slope - slope) < 6 * se + 1e-9


@given(seeds, st.floats(1e-3, 1e9), st.floats(-1e6, 1e6))
@settings(max_examples=40, deadline=None)
def test_trend_is_invariant_to_affine_scaling(seed: int, scale: float, shift: float) -> None:
    """Scaling y scales the slope, shifting y changes nothing; the test statistic is equal."""
    rng = np.random.default_rng(seed)
    t = np.arange(60.0)
    y = rng.normal(size=60) + 0.02 * t
    a, b = stats.trend(t, y), stats.trend(t, y * scale + shift)
    assert np.isclose(b.slope, a.slope * scale, rtol=1e-4, atol=1e-9 * scale)
    assert np.isclose(a.z, b.z, atol=1e-6)


@given(seeds)
@settings(max_examples=30, deadline=None)
def test_monotonic_series_is_significant(seed: int) -> None:
    """A strictly increasing series of 30 points is a significant upward trend."""
    rng = np.random.default_rng(seed)
    y = np.cumsum(rng.uniform(0.1, 1.0, 30))
    tr = stats.trend(np.arange(30.0), y, alpha=0.01)
    assert tr.z > 0 and tr.p < 0.01


def test_autocorrelated_noise_keeps_false_positive_rate_near_alpha() -> None:
    """AR(1) noise with φ = 0.7 and no trend is flagged at α = 1 % in under 4 % of runs."""
    hits = 0
    for seed in range(150):
        rng = np.random.default_rng(seed)
        e = np.zeros(200)
        for i in range(1, 200):
            e[i] = 0.7 * e[i - 1] + rng.normal()
        hits += stats.trend(np.arange(200.0), e, 0.01).p < 0.01
    assert hits / 150 < 0.04


@given(seeds, st.integers(5, 400))
@settings(max_examples=30, deadline=None)
def test_window_floor_is_min_and_counts_add_up(seed: int, n: int) -> None:
    """Window floors are the minima of their windows, counts sum to n, floor <= median <= max."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 100, n))
    y = rng.normal(size=n)
    w = stats.window_reduce(t, y, 7.0)
    assert w.count.sum() == n
    has = w.nonempty()
    assert np.all(w.floor[has] <= w.median[has] + 1e-12)
    assert np.all(w.median[has] <= w.max[has] + 1e-12)
    assert np.isclose(np.nanmin(w.floor), y.min())
    assert np.isclose(np.nanmax(w.max), y.max())


@given(seeds, st.integers(1, 100), st.floats(0.5, 5))
@settings(max_examples=30, deadline=None)
def test_window_median_matches_numpy(seed: int, n: int, width: float) -> None:
    """Per-window medians equal numpy's median of the window's values."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 20, n))
    y = rng.normal(size=n)
    w = stats.window_reduce(t, y, width, t0=0.0, t1=20.0)
    idx = np.clip((t / width).astype(int), 0, len(w.t) - 1)
    for i in np.flatnonzero(w.nonempty()):
        assert np.isclose(w.median[i], np.median(y[idx == i]))


@given(seeds, st.floats(1, 50))
@settings(max_examples=30, deadline=None)
def test_sawtooth_floors_are_flat_and_leak_lifts_them(seed: int, amp: float) -> None:
    """A sawtooth's window floors have no trend; the same sawtooth over a leak has one."""
    rng = np.random.default_rng(seed)
    t = np.arange(0, 600, 0.1)
    saw = amp * ((t % 7.0) / 7.0) + rng.normal(0, 0.01, t.size)
    flat = stats.window_reduce(t, saw, 20.0)
    leak = stats.window_reduce(t, saw + t * 0.05, 20.0)
    a = stats.trend(flat.t, flat.floor, 0.01)
    b = stats.trend(leak.t, leak.floor, 0.01)
    assert abs(a.slope) < 0.01
    assert b.rising(0.01, 0.04)


@given(st.floats(0.01, 100), st.floats(10, 1e5), st.floats(3, 1000))
def test_min_detectable_slope_shrinks_with_length(noise: float, span: float, n: float) -> None:
    """A longer run (or more points) detects a smaller slope; more noise needs a larger one."""
    base = stats.min_detectable_slope(noise, span, n, 0.01)
    assert stats.min_detectable_slope(noise, span * 2, n, 0.01) < base
    assert stats.min_detectable_slope(noise, span, n * 4, 0.01) < base
    assert stats.min_detectable_slope(noise * 2, span, n, 0.01) > base


@given(st.integers(3, 60), st.integers(0, 59), st.integers(4, 40), seeds)
@settings(max_examples=50, deadline=None)
def test_periodic_tail_positions_are_found(period: int, phase: int, count: int, seed: int) -> None:
    """Every-Nth-frame spikes (some missed) are regular with that period or a multiple."""
    rng = np.random.default_rng(seed)
    pos = phase % period + period * np.arange(count + 2)
    pos = np.delete(pos, rng.integers(0, pos.size, 1))
    res = stats.tail_periodicity(pos)
    assert res.regular and res.period is not None and res.period % period == 0


def test_random_tail_positions_are_rarely_called_regular() -> None:
    """Tail frames at random positions: at most 1 draw in 20 is called regular."""
    regular = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        pos = np.sort(rng.choice(5000, 25, replace=False))
        regular += bool(stats.tail_periodicity(pos).regular)
    assert regular <= 10, regular


def test_too_few_points_is_no_trend() -> None:
    """Fewer than three points give no trend and an infinite detectable slope."""
    tr = stats.trend(np.array([0.0, 1.0]), np.array([0.0, 5.0]))
    assert tr.p == 1.0 and tr.slope == 0.0 and tr.mds == float("inf")


def test_a_look_that_spends_no_alpha_can_detect_nothing_and_warns_nothing() -> None:
    """An early look's spending can round to alpha = 0: the smallest detectable slope is
    infinite, also for a flat series (noise 0), not NaN with a RuntimeWarning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stats.min_detectable_slope(0.0, 10.0, 20.0, 0.0) == float("inf")
        tr = stats.trend(np.arange(30.0), np.zeros(30), 0.0)
    assert tr.mds == float("inf") and not tr.testable(0.0)

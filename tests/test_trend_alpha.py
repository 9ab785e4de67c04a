"""The trend test at its stated alpha (issue 23): over seeded noise series without a trend
(white, and AR(1) with φ = 0.5, the autocorrelation the Yue–Wang correction is for), the
share that ``stats.trend`` calls significant stays under about 1.5 x alpha; and a strictly
rising line is significant from ``min_trend_points(alpha)`` points on, not one sooner,
which pins the Bonferroni correction of its two tests (``trend`` and ``min_trend_points``
must agree, or a run is called untested while its test could decide, or the reverse)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from soakd.analysis import stats

SEEDS = 400
TOLERANCE = 1.5  # x alpha: the false-positive rate allowed over the seeds


def _noise(phi: float, n: int, seed: int) -> np.ndarray:
    """SEEDS stationary AR(1) series of n points (φ = 0: white), one per row, all drawn at
    once."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(SEEDS, n))
    x = np.empty_like(e)
    x[:, 0] = e[:, 0] / math.sqrt(1 - phi**2)
    for i in range(1, n):
        x[:, i] = phi * x[:, i - 1] + e[:, i]
    return x


@pytest.fixture(scope="module")
def p_values() -> dict[str, np.ndarray]:
    """The trend test's p-value of each seeded series, by kind of noise."""
    out = {}
    for name, phi, n in (("white", 0.0, 24), ("ar1", 0.5, 48)):
        t = np.arange(n, dtype=np.float64) * 10.0  # window centres, 10 s apart
        out[name] = np.array([stats.trend(t, y).p for y in _noise(phi, n, seed=n)])
    return out


@pytest.mark.parametrize("alpha", [0.05, 0.01])
@pytest.mark.parametrize("noise", ["white", "ar1"])
def test_trend_rejects_flat_noise_at_no_more_than_its_alpha(
    p_values: dict[str, np.ndarray], noise: str, alpha: float
) -> None:
    """Flat noise series are called significant in at most ~1.5 x alpha of the seeds."""
    rate = float((p_values[noise] < alpha).mean())
    assert rate <= TOLERANCE * alpha, f"{noise}: {rate:.3f} of {SEEDS} at alpha {alpha}"


@pytest.mark.parametrize("alpha", [0.05, 0.01, 0.001])
def test_a_monotone_series_is_significant_from_min_trend_points_on(alpha: float) -> None:
    """A steadily rising line is significant at n = min_trend_points(alpha), not n - 1."""
    n = stats.min_trend_points(alpha)
    for k, want in ((n - 1, False), (n, True)):
        y = 400.0 + 2.5 * np.arange(k)
        tr = stats.trend(np.arange(k, dtype=np.float64), y, alpha)
        assert (tr.p < alpha) is want, (k, tr.p)

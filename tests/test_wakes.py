"""A soak's own wakes are few and fall together (issue 34: on a 2-vCPU VM a thread's wake
costs 60-130 µs of CPU, most of it a cold cache, about half that beside another thread's
wake; together the periodic wakes were most of soakd's own cost on a served run at 2
requests/s). The store writer's wake on the monitor's is tested in test_store.py."""

from __future__ import annotations

import itertools

import pytest

from soakd.run.runner import MONITOR_TICK_S, monitor_sleep_s


@pytest.mark.parametrize("period_ms", [50, 100, 150, 200, 333, 1000])
def test_the_monitor_wakes_on_a_sampler_tick_about_once_a_second(period_ms: int) -> None:
    """Each of the monitor's deadlines is a whole number of sampler periods from the run's
    start (it wakes with a sampler tick), about MONITOR_TICK_S apart, the next one after
    now."""
    t0, period = 5_000_000_000, period_ms * 1_000_000
    deadlines = []
    now = t0
    for _ in range(20):
        now += round(monitor_sleep_s(now, t0, period, None) * 1e9)
        deadlines.append(now)
        now += 1_234_567 % period  # woken a little late
    assert all((d - t0) % period == 0 for d in deadlines)
    steps = {b - a for a, b in itertools.pairwise(deadlines)}
    assert steps == {max(1, round(MONITOR_TICK_S * 1000 / period_ms)) * period}
    assert all(0.5 * MONITOR_TICK_S * 1e9 <= s <= 1.5 * MONITOR_TICK_S * 1e9 for s in steps)


def test_the_monitor_wakes_for_a_paced_runs_end_on_time() -> None:
    """A paced run's end before the next sampler-aligned deadline is woken for exactly."""
    t0, period = 0, 150_000_000
    end = t0 + 1_000_000_000  # between the 6th (0.9 s) and 12th (1.8 s) tick
    assert monitor_sleep_s(950_000_000, t0, period, end) == pytest.approx(0.05)
    assert monitor_sleep_s(1_100_000_000, t0, period, end) == 0.0

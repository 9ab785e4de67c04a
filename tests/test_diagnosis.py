"""Diagnosis hints name a cause only when its evidence is in the data: which side lost the
ticks (source, machine, model), and what infer spikes coincide with."""

from __future__ import annotations

from typing import Any

import numpy as np

from soakd.analysis import RunData, judge
from soakd.config import CriteriaSettings

from .test_verdict import MIB, planted

CRIT = CriteriaSettings()


def _summary(d: RunData, **over: float) -> dict[str, Any]:
    n = d.n_frames
    s: dict[str, Any] = {
        "frames_captured": n,
        "drops": 0,
        "stale": 0,
        "queued_at_end": 0,
        "in_flight_at_end": 0,
        "pacer_missed_ticks": 0,
        "missed_ticks_source": 0,
        "missed_ticks_pause": 0,
    }
    s.update(over)
    return s


def _missed(source: int, pause: int) -> list[str]:
    d = planted(dur=20.0, fps=20.0, warm=2.0)
    d.meta.summary = _summary(
        d, pacer_missed_ticks=source + pause, missed_ticks_source=source, missed_ticks_pause=pause
    )
    return judge(d, CRIT).hints


def test_missed_ticks_from_slow_reads_blame_the_source() -> None:
    """Ticks missed because a read took a whole period: the source is the bottleneck, and
    neither the machine nor the model is named."""
    hints = _missed(source=306, pause=0)
    assert any("the source is the bottleneck" in h and "306" in h for h in hints)
    assert not any("machine is the bottleneck" in h or "model is" in h for h in hints)


def test_missed_ticks_from_a_pause_blame_the_machine() -> None:
    """Ticks missed while the process did not run (SIGSTOP): the machine, not the source."""
    hints = _missed(source=0, pause=199)
    assert any("the machine is the bottleneck" in h and "199" in h for h in hints)
    assert not any("source is the bottleneck" in h for h in hints)


def test_frames_lost_in_the_queue_blame_the_model() -> None:
    """Frames captured but dropped or left queued: the model is the bottleneck."""
    d = planted(dur=20.0, fps=20.0, warm=2.0)
    n = d.n_frames
    d.meta.summary = _summary(d, frames_captured=n + 64, queued_at_end=64)
    hints = judge(d, CRIT).hints
    assert any("the model is the bottleneck for 64" in h for h in hints)
    assert not any("source is" in h or "machine is" in h for h in hints)


def test_a_healthy_run_names_no_bottleneck() -> None:
    """Nothing lost: no bottleneck hint at all."""
    d = planted(dur=60.0)
    d.meta.summary = _summary(d)
    assert not any("bottleneck" in h for h in judge(d, CRIT).hints)


def test_jitter_hints_do_not_blame_memory_when_rss_is_flat() -> None:
    """Random infer spikes with a flat RSS and no allocator release near them: no hint says
    memory pressure (the evidence does not show it), and none claims contention."""

    def spikes(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.05, t.size))
        y[rng.choice(t.size, 60, replace=False)] *= 8
        return y

    v = judge(planted(infer=spikes), CRIT)
    assert v.get("jitter").status == "fail"  # type: ignore[union-attr]
    assert not any("memory pressure" in h for h in v.hints), v.hints
    assert not any("contention" in h and "look for" not in h for h in v.hints), v.hints
    assert any("shows no cause" in h for h in v.hints)


def test_spikes_at_allocator_releases_are_called_memory_pressure() -> None:
    """Infer spikes within a second of the sawtooth's sharp drops: memory pressure."""
    period = 7.0

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + 300 * MIB * ((t % period) / period) + rng.normal(0, 0.1 * MIB, t.size)

    def spikes(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.05, t.size))
        at = (t % period) < 0.2  # right after each release
        y[at & (rng.random(t.size) < 0.3)] *= 8
        return y

    v = judge(planted(rss=rss, infer=spikes), CRIT)
    assert v.get("jitter").status == "fail"  # type: ignore[union-attr]
    assert any("memory pressure" in h for h in v.hints), v.hints

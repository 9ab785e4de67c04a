"""``run.stop_on_fail`` for the served model's server and for jitter (issue 31): the run's
own early-stop observer, fed samples and frames as a run hands them over, stops on
``memory_server_rss``, ``memory_server_gpu`` and ``server_queue`` when they rise for
certain, and on ``jitter`` once more frames lie over k x an upper bound of the median than
the whole run allows; the same series without the fault never stop it."""

from __future__ import annotations

import numpy as np
import pytest

from soakd.config import load_settings
from soakd.observers.base import Progress
from soakd.records import Event, FrameRecord, Sample, ServerMetric
from soakd.run.early_stop import EarlyStop, watch_early_stop


def _watch(*sets: str) -> EarlyStop:
    """The early stop of a 10-minute stop_on_fail run at 10 fps, warm-up over at 1 s."""
    s = load_settings(overrides=["run.stop_on_fail=true", "run.duration=600", "run.fps=10",
                                 "criteria.floor_window_s=1", *sets])  # fmt: skip
    [watch] = watch_early_stop(s, lambda e: None, lambda r: None)
    assert isinstance(watch, EarlyStop)
    watch.on_event(Event("warmup_end", 1.0, 0.0))
    return watch


def _tick(watch: EarlyStop, t: float) -> str | None:
    watch.on_progress(Progress(elapsed_s=t, remaining_s=600.0 - t, frames_done=0,
                               frames_captured=0, achieved_fps=10.0, drops=0, stale=0,
                               errors=0, age_p50_ms=None))  # fmt: skip
    return watch.fired.criterion if watch.fired else None


def _serve(watch: EarlyStop, seconds: float, rss_mb_min: float, gpu_mb_min: float,
           queue_per_min: float) -> tuple[str | None, float]:  # fmt: skip
    """A served model's samples every 0.2 s (server RSS, GPU memory, waiting requests
    rising at the rates given, with noise) and a look each second: what stopped, when."""
    rng = np.random.default_rng(0)
    i, t = 0, 1.0
    while t < seconds:
        m = t / 60.0
        values = {
            "rss_bytes": 3e8 + rng.normal(0, 2e5),
            "server_rss_bytes": 2e9 + rss_mb_min * 1e6 * m + rng.normal(0, 5e5),
            "server_gpu_mem_bytes": 8e9 + gpu_mb_min * 1e6 * m + rng.normal(0, 5e5),
        }
        waiting = max(0.0, 3.0 + queue_per_min * m + rng.normal(0, 1.0))
        metrics = (
            ServerMetric(i, t, "vllm:num_requests_waiting", 'model="a"', waiting / 2),
            ServerMetric(i, t, "vllm:num_requests_waiting", 'model="b"', waiting / 2),
        )
        watch.on_sample(Sample(i, t, 0.0, 0.0, 0.0, values, server=metrics))  # fmt: skip
        i, t = i + 1, t + 0.2
        if abs(t - round(t)) < 1e-6 and (got := _tick(watch, t)):
            return got, t
    return None, t


@pytest.mark.parametrize(
    ("rates", "want"),
    [((230.0, 0.0, 0.0), "memory_server_rss"), ((0.0, 230.0, 0.0), "memory_server_gpu"),
     ((0.0, 0.0, 20.0), "server_queue"), ((0.0, 0.0, 0.0), None)],
)  # fmt: skip
def test_a_served_model_s_server_stops_the_run_on_what_rises(
    rates: tuple[float, float, float], want: str | None
) -> None:
    """Server RSS or GPU memory leaking 230 MB/min, or its waiting requests growing by 20 a
    minute, stop a 10-minute run within 2 minutes on that criterion; a steady server runs
    those 2 minutes without a stop."""
    got, at = _serve(_watch(), 120.0, *rates)
    assert got == want, (got, at)


def _frames(watch: EarlyStop, seconds: float, spike_every: int, jitter_k: object = 5.0) -> float:
    """Frames at 10 fps, infer ~10 ms, every ``spike_every``-th 80 ms (0: none), a look
    each second; when the run was stopped on jitter (inf if never)."""
    rng = np.random.default_rng(1)
    for i in range(int(seconds * 10)):
        t = 1.0 + i / 10
        ms = 80.0 if spike_every and i % spike_every == spike_every - 1 else 10 + rng.gamma(2, 0.5)
        watch.on_frames([FrameRecord(i, t, t, t, t + ms / 1e3, 0.0, 0.1, infer_ms=ms,
                                     total_ms=ms + 1, frame_age_ms=0.1)])  # fmt: skip
        if i % 10 == 9 and _tick(watch, t) == "jitter":
            return t
    return float("inf")


def test_jitter_stops_the_run_once_more_frames_are_over_k_x_the_median_s_bound_than_allowed() -> (
    None
):
    """A spike of 8 x the median every 25th frame: 6 (by 15 s) are more than the 5 a
    10-minute run at 10 fps allows (0.1 % of its ~6000 frames), and a look within 30 s
    stops it on jitter; frames without spikes never, nor with jitter_k = "history" (its k
    is not known while the run goes)."""
    assert 15.0 <= _frames(_watch(), 30.0, 25) <= 30.0
    assert _frames(_watch(), 60.0, 0) == float("inf")
    assert _frames(_watch("criteria.jitter_k='history'"), 30.0, 25) == float("inf")


def test_a_look_tests_a_bounded_number_of_windows_however_long_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An hour of samples and frames: the memory and frame-age looks test at most
    LOOK_MAX_WINDOWS windows each (a Theil–Sen test allocates n² pairs; looks that grew
    with the run grew soakd's RSS 1.1 MB/min in bench/own_rss.py) and still stop a leak."""
    from soakd.analysis import stats
    from soakd.analysis.criteria import frame_age, memory
    from soakd.analysis.criteria.base import LOOK_MAX_WINDOWS

    seen: list[int] = []
    real = stats.trend

    def counting(t: np.ndarray, y: np.ndarray, alpha: float = 0.01) -> stats.Trend:
        seen.append(int(np.asarray(t).size))
        return real(t, y, alpha)

    monkeypatch.setattr(stats, "trend", counting)
    watch = _watch("run.duration=7200")
    live = watch.live
    for i in range(36000):  # an hour at 10 fps, a sample every 0.5 s
        t = 1.0 + i / 10
        live.add_age(t, 20.0 + (i % 7))
        if i % 5 == 0:
            live.samples.append([t, 3e8 + 0.1e6 * t, *[np.nan] * (len(live.samples.columns) - 2)])  # type: ignore[union-attr]
    live.now = 3601.0
    found = memory.early_fail(live, watch.crit)
    frame_age.early_fail(live, watch.crit)
    assert found is not None and found.criterion == "memory_rss"  # 6 MB/min
    assert len(seen) >= 2 and max(seen) <= LOOK_MAX_WINDOWS, seen

"""Each criterion module of soakd/analysis/criteria judged on its own, through its own
``judge(ctx)``: a run it passes and a run it fails (or cannot judge), one pair per module,
and a test that fails when a module has no pair here. The whole verdict's tests
(test_verdict*.py) judge the same rules composed."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from soakd.analysis.data import make_run_data
from soakd.analysis.model import FAIL, INVALID, PASS, CriterionResult, RunData, RunMeta
from soakd.analysis.verdict import CRITERIA, context
from soakd.config import CriteriaSettings

from .test_criteria_modules import _modules
from .test_gpu_devices import _two_gpus
from .test_verdict import CRIT, _leak, _small_host, planted


def judged(module: ModuleType, data: RunData, crit: CriteriaSettings = CRIT) -> dict[str, str]:
    """``module``'s own results on ``data`` (criterion -> status), its context built as the
    verdict builds it; headroom is given the memory results it reads."""
    ctx = context(data, crit)
    if module is MODULES["headroom"]:
        ctx.results["memory"] = MODULES["memory"].judge(ctx)
    results: list[CriterionResult] = module.judge(ctx)
    return {r.criterion: r.status for r in results}


def _rising_age(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return 5 + 2.0 * t + rng.normal(0, 1.0, t.size)  # 120 ms/min


def _spiky(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    infer = 20 * np.exp(rng.normal(0, 0.05, t.size))
    infer[::20] *= 10  # every 20th frame 10 x the median
    return infer


def _with_ooms(d: RunData) -> RunData:
    d.samples["torch_ooms"] = np.where(d.samples["t"] > 300, 1.0, 0.0)
    return d


def _gpus(leak: float) -> RunData:
    t, gpus = _two_gpus({0: 0.0, 1: leak})
    ft = np.arange(0.0, 600.0, 0.5)
    flat = np.ones(ft.size)
    d = make_run_data(
        RunMeta("r", duration_s=600, fps=2, device="cuda:0"),
        frames={"t_capture": ft, "total_ms": 20 * flat, "infer_ms": 15 * flat,
                "frame_age_ms": flat},
        samples={"t": t, "rss_bytes": 5e8 + 0 * t},
        events=[{"kind": "warmup_end", "t": 5.0}],
    )  # fmt: skip
    d.gpus = gpus
    return d


def _served(waiting_per_min: float) -> RunData:
    d = planted()
    d.meta.workload_kind = "openai"
    t = np.arange(0.0, 600.0, 1.0)
    rng = np.random.default_rng(0)
    d.server = {
        "vllm:num_requests_waiting": (t, 2 + waiting_per_min * t / 60 + rng.normal(0, 0.3, t.size))
    }
    return d


def _generator(first_output_ms: float) -> RunData:
    d = planted()
    d.meta.shape = "generator"
    d.meta.summary = {"first_output_ms": first_output_ms}
    return d


def _doubling(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Infer doubling from 20 to 40 ms over 2 minutes (10 ms/min), inside its 100 ms frame
    budget at 10 fps."""
    return (20 + 20 * t / 120) * np.exp(rng.normal(0, 0.05, t.size))


def _stages(infer: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None) -> RunData:
    return planted(dur=120.0, fps=10.0, infer=infer)


def _spoken(rtf: float) -> RunData:
    """A realtime session's run with ten answered turns, each at ``rtf`` x real time."""
    d = planted()
    d.meta.workload_kind = "realtime"
    t = np.arange(30.0, 580.0, 55.0)
    d.turns = {"t_capture": t, "t_done": t + 0.3, "warmup": np.zeros(t.size),
               "ttfd_ms": np.full(t.size, 80.0), "done_ms": np.full(t.size, 300.0),
               "delta_p95_ms": np.full(t.size, 20.0), "audio_s": np.full(t.size, 0.24),
               "audio_rtf": np.full(t.size, rtf), "underruns": np.zeros(t.size)}  # fmt: skip
    return d


def _slow(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return 40 * np.exp(rng.normal(0, 0.05, t.size))


P95_UNDER_40 = CriteriaSettings(thresholds=["p95(total_ms) < 40"])
GPUS = CriteriaSettings(max_drop_fraction=1.0)
FIRST_OUTPUT = CriteriaSettings(max_first_output_ms=500)

#: module -> (its criterion, a run it passes, a run it does not, that run's status, the
#: criteria both are judged by)
Case = tuple[str, Callable[[], RunData], Callable[[], RunData], str, CriteriaSettings]
CASES: dict[str, Case] = {
    "validity": ("run", planted, lambda: planted(status="aborted"), INVALID, CRIT),
    "drops": ("drops", planted, lambda: planted(drop_count=np.arange(18_000)), FAIL, CRIT),
    "frame_age": ("frame_age", planted, lambda: planted(age=_rising_age), FAIL, CRIT),
    "memory": ("memory_rss", planted, lambda: planted(rss=_leak(10)), FAIL, CRIT),
    "headroom": ("memory_headroom", lambda: _small_host(planted(), 1024),
                 lambda: _small_host(planted(rss=_leak(1.2)), 1024), FAIL, CRIT),
    "oom": ("oom", planted, lambda: _with_ooms(planted()), FAIL, CRIT),
    "gpu_devices": ("memory_gpu[1]", lambda: _gpus(0.0), lambda: _gpus(20.0), FAIL, GPUS),
    "jitter": ("jitter", planted, lambda: planted(infer=_spiky), FAIL, CRIT),
    "errors": ("errors", planted, lambda: planted(has_error=np.arange(18_000) % 30 == 0), FAIL,
               CRIT),
    "stage_trend": ("stage_trend", lambda: _stages(None), lambda: _stages(_doubling), FAIL, CRIT),
    "server_queue": ("server_queue", lambda: _served(0.0), lambda: _served(10.0), FAIL, CRIT),
    "intervals": ("first_output", lambda: _generator(300.0), lambda: _generator(900.0), FAIL,
                  FIRST_OUTPUT),
    "thresholds": ("threshold:p95(total_ms)<40", planted, lambda: planted(infer=_slow), FAIL,
                   P95_UNDER_40),
    "audio": ("audio_playback", lambda: _spoken(3.0), lambda: _spoken(0.5), FAIL, CRIT),
}  # fmt: skip
MODULES = {m.__name__.rpartition(".")[2]: m for m in CRITERIA}


def test_every_criterion_module_has_its_own_pair_here() -> None:
    """A module of soakd/analysis/criteria without a case here fails this test."""
    assert sorted(CASES) == sorted(MODULES) == _modules()


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_module_passes_its_healthy_run_and_names_its_broken_one(name: str) -> None:
    """The module's own judge: PASS on the healthy run, the expected status on the broken
    one, under the module's criterion id."""
    criterion, good, bad, status, crit = CASES[name]
    assert judged(MODULES[name], good(), crit).get(criterion) == PASS
    assert judged(MODULES[name], bad(), crit).get(criterion) == status


def test_modules_that_do_not_apply_say_nothing() -> None:
    """An in-process model has no server queue, a one-GPU run no per-GPU criteria, a model
    that does not generate frames no interval criteria: their modules return nothing."""
    d = planted()
    for name in ("server_queue", "gpu_devices", "intervals"):
        assert judged(MODULES[name], d) == {}, name

"""A workload soakd does not build itself (``kind = "python"``, an entry point) declares the
device(s) it runs on, so its run gets GPU telemetry and GPU memory criteria like a built-in.

No GPU runs here: NVML is the fake of tests/test_gpu_devices.py (three made-up GPUs); the
user's model is a CPU stand-in that only says it runs on CUDA."""

from __future__ import annotations

import sqlite3
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from soakd.analysis import evaluate
from soakd.analysis.model import INVALID, PASS
from soakd.config import ConfigError, Settings, load_settings
from soakd.records import Frame, StageOutput
from soakd.run.runner import run_soak
from soakd.store import db as store
from soakd.telemetry.devices import AUTO, gpus_of, run_probes
from soakd.telemetry.probes import NvmlProbe, ProcessProbe, TorchCudaProbe
from soakd.workloads.base import WorkloadContext
from tests.test_gpu_devices import GIB, fake_nvml
from tests.test_plugin import installed_plugin  # noqa: F401 (a fixture)

SEEN: list[tuple[str, Any]] = []  # (ctx.device, ctx.device_map) each factory call saw
FACTORY = "tests.test_workload_device:declared"


class _UserModel:
    """A user's staged model that claims CUDA and computes on the CPU."""

    shape = "staged"

    def setup(self) -> None: ...
    def preprocess(self, frame: Frame) -> Any:
        return frame.id

    def infer(self, inputs: Any) -> Any:
        return inputs

    def decode(self, outputs: Any) -> StageOutput:
        return StageOutput(text=str(outputs), tokens=1)

    def sync(self) -> None: ...
    def describe(self) -> dict[str, Any]:
        return {"model": "user"}

    def close(self) -> None: ...


def declared(options: dict[str, Any], ctx: WorkloadContext) -> _UserModel:
    SEEN.append((ctx.device, ctx.device_map))
    return _UserModel()


def python_workload(*overrides: str) -> Settings:
    return load_settings(
        overrides=['workload.kind="python"', f'workload.factory="{FACTORY}"', *overrides]
    )


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    m = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", m)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return m


def test_workload_device_is_a_key_of_a_python_workload_and_samples_that_gpu(
    nvml: types.ModuleType,
) -> None:
    """--set workload.device=cuda:1 on kind = "python": process, NVML on GPU 1, torch."""
    s = python_workload('workload.device="cuda:1"')
    assert [type(p) for p in run_probes(s)] == [ProcessProbe, NvmlProbe, TorchCudaProbe]


def test_a_device_given_only_in_options_is_the_declaration(nvml: types.ModuleType) -> None:
    """options.device = "cuda:0" (where a factory reads its own settings) declares it too."""
    s = python_workload('workload.options={device="cuda:0"}')
    assert s.workload.device == "cuda:0"
    assert [type(p) for p in run_probes(s)] == [ProcessProbe, NvmlProbe, TorchCudaProbe]


def test_an_entry_point_workload_declares_a_device_map_over_every_gpu(
    installed_plugin: str,  # noqa: F811 (the fixture imported above)
) -> None:
    """An installed plugin's kind with device_map = "auto" samples every visible GPU."""
    s = load_settings(overrides=[f"workload.kind={installed_plugin}", 'workload.device_map="auto"'])
    assert gpus_of(s).gpus == AUTO


def test_device_and_options_device_that_disagree_are_one_config_error() -> None:
    """device = "cpu" beside options.device = "cuda:0" is refused, naming both."""
    with pytest.raises(ConfigError) as err:
        python_workload('workload.device="cpu"', 'workload.options={device="cuda:0"}')
    assert str(err.value) == ("workload: device = 'cpu' but options.device = 'cuda:0': say it once")


def test_a_bad_device_in_options_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"^workload\.options\.device: must be cpu, cuda"):
        python_workload('workload.options={device="gpu0"}')


def _gpu_run(synthetic: Callable[..., Settings], *extra: str) -> tuple[str, dict[str, str]]:
    SEEN.clear()
    s = synthetic(
        'workload.kind="python"', f'workload.factory="{FACTORY}"', "run.duration=2", *extra
    )
    rid = run_soak(s, judge=False).run_id
    with store.connect(s.run.db) as conn:
        _, v = evaluate(conn, rid)
    return rid, {c.criterion: c.status for c in v.criteria}


def test_a_declared_cuda_workload_gets_gpu_samples_and_its_memory_judged(
    synthetic: Callable[..., Settings], db_path: Path, nvml: types.ModuleType
) -> None:
    """A python workload declaring cuda:1: the factory is told, every sample holds GPU 1's
    memory (2 GiB on the fake), and memory_gpu is judged, not "not applicable"."""
    rid, status = _gpu_run(synthetic, 'workload.device="cuda:1"')
    assert SEEN == [("cuda:1", None)]
    with sqlite3.connect(db_path) as conn:
        used = conn.execute(
            "SELECT count(*), min(gpu_mem_used_bytes), max(gpu_mem_used_bytes)"
            " FROM samples WHERE run_id = ?",
            (rid,),
        ).fetchone()
    assert used[0] > 5 and used[1:] == (2 * GIB, 2 * GIB)
    assert status["memory_gpu"] == PASS


def test_a_declared_cuda_workload_without_gpu_samples_is_never_a_pass(
    synthetic: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML unavailable while the workload says CUDA: memory_gpu is INVALID, not n/a."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    _, status = _gpu_run(synthetic, 'workload.device="cuda:0"')
    assert status["memory_gpu"] == INVALID

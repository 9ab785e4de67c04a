"""The GPU a scheduler binds (Slurm's ``--gpus-per-task``, a systemd env file) is the GPU a
run describes and samples: ``CUDA_VISIBLE_DEVICES`` maps CUDA ordinals to NVML devices for
``soakd.environment.gpu_facts`` and the NVML probe alike. No GPU runs here: NVML is a fake
module whose every answer says it is one."""

from __future__ import annotations

import sys
import types

import pytest

from soakd.config import load_settings
from soakd.environment import collect as collect_environment
from soakd.environment import gpu_facts
from soakd.run.runner import _gpu_ordinal
from soakd.telemetry.probes import NvmlProbe
from tests.test_telemetry import make_fake_pynvml

UUIDS = ("GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333")


def fake_nvml() -> types.ModuleType:
    """``make_fake_pynvml`` with three GPUs and the system queries ``gpu_facts`` asks."""
    m = make_fake_pynvml(uuids=UUIDS)
    m.nvmlDeviceGetName = lambda h: f"FAKE NVML GPU {h[1]} (test stand-in)".encode()  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: b"fake-driver-0.0"  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040  # type: ignore[attr-defined]
    return m


@pytest.mark.parametrize("visible", ["2", "GPU-cccc", "2,0"])
def test_gpu_facts_name_the_gpu_cuda_visible_devices_binds(
    visible: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under CUDA_VISIBLE_DEVICES=2 (an index or a UUID prefix) cuda:0 is physical GPU 2."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    facts = gpu_facts(0, fake_nvml())
    assert facts["gpu_name"] == "FAKE NVML GPU 2 (test stand-in)"
    assert facts["gpu_uuid"] == "GPU-cccc-3333"
    assert (facts["driver"], facts["cuda_driver"]) == ("fake-driver-0.0", "12.4")


def test_gpu_facts_without_cuda_visible_devices_take_nvml_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unset, CUDA ordinal N is NVML index N."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_facts(1, fake_nvml())["gpu_uuid"] == "GPU-bbbb-2222"


def test_gpu_facts_for_a_hidden_ordinal_say_why_and_shut_nvml_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cuda:1 with one visible GPU has no facts, a gpu_error naming why, and NVML is shut."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    nvml = fake_nvml()
    facts = gpu_facts(1, nvml)
    assert facts["gpu_name"] is None and facts["gpu_uuid"] is None
    assert "cuda:1 is not visible" in facts["gpu_error"]
    assert nvml.shutdowns == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(("visible", "device"), [("1", "cuda"), ("2,0", "cuda:1")])
def test_probe_samples_the_gpu_the_run_environment_names(
    visible: str, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NVML probe's device and gpu_facts' device are one and the same GPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = fake_nvml()
    probe = NvmlProbe.for_device(device, nvml)
    ordinal = int(device.partition(":")[2] or 0)
    assert nvml.nvmlDeviceGetUUID(probe.handle).decode() == gpu_facts(ordinal, nvml)["gpu_uuid"]
    probe.close()


def test_the_run_environment_describes_the_workloads_cuda_ordinal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run whose workload is on cuda:1 stores the facts of CUDA ordinal 1 (here, under
    CUDA_VISIBLE_DEVICES=2,0, physical GPU 0), not those of ordinal 0."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    settings = load_settings(flags={"workload.kind": "tiny-vlm", "workload.device": "cuda:1"})
    env = collect_environment(ordinal=_gpu_ordinal(settings))
    assert env["gpu_uuid"] == "GPU-aaaa-1111"
    assert _gpu_ordinal(load_settings(flags={"workload.kind": "synthetic"})) == 0

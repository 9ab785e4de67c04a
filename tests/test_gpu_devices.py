"""Telemetry for every GPU a run uses: one ``gpu_samples`` row per GPU per tick under its
NVML index and UUID (through CUDA_VISIBLE_DEVICES), ``memory_gpu[i]`` judged per GPU, and
one Prometheus series per GPU labelled ``gpu`` and ``UUID`` as dcgm-exporter labels them.

No GPU runs here: NVML is ``make_fake_pynvml`` (tests/test_telemetry.py), a fake module
with several made-up GPUs whose every answer says it is one; subprocesses import it as
``pynvml`` from tests/fake_nvml/."""

from __future__ import annotations

import os
import sqlite3
import sys
import time
import types
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from soakd.analysis import evaluate
from soakd.analysis.data import make_run_data
from soakd.analysis.model import FAIL, PASS, RunMeta
from soakd.analysis.verdict import judge
from soakd.config import ConfigError, CriteriaSettings, Settings, load_settings
from soakd.observers.metrics import MetricsObserver, start_exporter
from soakd.records import DeviceSample, Sample
from soakd.run.runner import run_soak
from soakd.store import db as store
from soakd.store.merge import merge
from soakd.store.prune import run_tables
from soakd.telemetry.devices import AUTO, GpuDevicesProbe, gpus_of, open_gpus, run_probes
from soakd.telemetry.probes import NvmlProbe, ProcessProbe, TorchCudaProbe
from tests.conftest import REPO, error_lines, run_cli
from tests.test_metrics import _info
from tests.test_telemetry import make_fake_pynvml

UUIDS = ("GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333")
GIB = 1 << 30


def fake_nvml(used: Callable[[int], int] | None = None) -> types.ModuleType:
    """Three fake GPUs; by default GPU i has (i + 1) GiB in use, so rows tell them apart."""
    return make_fake_pynvml(uuids=UUIDS, used=used or (lambda i: (i + 1) * GIB))


def fake_nvml_env(env: dict[str, str], gpus: int = 2) -> dict[str, str]:
    """A subprocess environment whose ``import pynvml`` is the fake (tests/fake_nvml)."""
    fake = str(REPO / "tests" / "fake_nvml")
    return {
        **env,
        "PYTHONPATH": os.pathsep.join([fake, str(REPO), env.get("PYTHONPATH", "")]),
        "SOAKD_FAKE_NVML_GPUS": str(gpus),
    }


def q(db: Path, sql: str, *args: object) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    m = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", m)
    return m


# --- which GPUs


def test_a_run_on_one_gpu_keeps_the_one_gpu_probes(nvml: types.ModuleType) -> None:
    """workload.device = "cuda:1" and no run.gpus: process, NVML on GPU 1, torch: as before."""
    s = load_settings(flags={"workload.kind": "tiny-vlm", "workload.device": "cuda:1"})
    probes = run_probes(s)
    assert [type(p) for p in probes] == [ProcessProbe, NvmlProbe, TorchCudaProbe]
    assert nvml.nvmlDeviceGetUUID(probes[1].handle).decode() == UUIDS[1]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("device_map", "want"),
    [("auto", AUTO), ({"model.layers.0": 0, "model.layers.1": "cuda:1", "lm_head": "cpu"}, (0, 1))],
)
def test_a_device_map_over_gpus_samples_each_gpu_it_spans(device_map: object, want: object) -> None:
    """A python workload whose options carry device_map="auto" samples every visible GPU;
    a mapping samples the CUDA devices it names."""
    s = Settings.model_validate(
        {
            "workload": {
                "kind": "python",
                "factory": "pkg.mod:fn",
                "options": {"device_map": device_map},
            }
        }
    )
    assert gpus_of(s).gpus == want


@pytest.mark.parametrize(("visible", "uuids"), [("1,2", UUIDS[1:]), (None, UUIDS)])
def test_auto_samples_every_gpu_cuda_visible_devices_shows(
    visible: str | None,
    uuids: tuple[str, ...],
    nvml: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run.gpus = "auto" under CUDA_VISIBLE_DEVICES=1,2 is NVML GPUs 1 and 2, unset all three."""
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    probe, primary = open_gpus(gpus_of(load_settings(flags={"run.gpus": "auto"})))
    assert isinstance(probe, GpuDevicesProbe) and primary == 0
    assert [u for _, u in probe.gpus] == list(uuids)


def test_a_gpu_run_gpus_names_that_this_host_lacks_is_exit_2(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """run.gpus = [0, 5] on a host with two GPUs: one line naming GPU 5, exit 2, no run row."""
    db = tmp_path / "s.db"
    p = run_cli(
        "run", "--db", str(db), "--set", "workload.kind=synthetic", "--set", "run.gpus=[0, 5]",
        env=fake_nvml_env(subprocess_env, gpus=2),
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    lines = error_lines(p.stderr)
    assert lines == ["soakd: error: run.gpus = [0, 5]: GPU index 5 not found (NVML sees 2)"]
    assert not db.exists() or q(db, "SELECT count(*) FROM runs") == [(0,)]


@pytest.mark.parametrize(
    ("value", "why"),
    [("[]", 'must be "auto" or a list'), ("[1, 1]", "each GPU once"), ("[-1]", "whole numbers")],
)
def test_a_bad_run_gpus_is_a_one_line_config_error(value: str, why: str) -> None:
    """run.gpus = [], [1, 1] or [-1] is refused when the config loads, naming the key."""
    with pytest.raises(ConfigError) as err:
        load_settings(overrides=[f"run.gpus={value}"])
    assert str(err.value).startswith("run.gpus: ") and why in str(err.value)
    assert "\n" not in str(err.value)


# --- per-GPU rows


def test_each_gpu_gets_rows_under_its_nvml_index_and_uuid(
    synthetic: Callable[..., Settings],
    db_path: Path,
    nvml: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run.gpus = [0, 1] under CUDA_VISIBLE_DEVICES=2,0: every tick one row for NVML GPU 2
    (cuda:0, the primary, whose numbers fill samples as well) and one for NVML GPU 0."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    result = run_soak(synthetic("run.gpus=[0, 1]", "run.duration=1.5"))
    rid = result.run_id
    ticks = q(db_path, "SELECT count(*) FROM samples WHERE run_id = ?", rid)[0][0]
    rows = q(
        db_path,
        "SELECT gpu, uuid, count(*), min(mem_used_bytes), max(mem_used_bytes), min(util_pct)"
        " FROM gpu_samples WHERE run_id = ? GROUP BY gpu, uuid ORDER BY gpu",
        rid,
    )
    assert ticks > 5
    assert rows == [
        (0, UUIDS[0], ticks, GIB, GIB, 93.0),
        (2, UUIDS[2], ticks, 3 * GIB, 3 * GIB, 93.0),
    ]
    joined = q(
        db_path,
        "SELECT count(*) FROM samples s JOIN gpu_samples g ON g.run_id = s.run_id AND g.seq = s.seq"
        " AND g.gpu = 2 WHERE s.run_id = ? AND s.gpu_mem_used_bytes = g.mem_used_bytes",
        rid,
    )
    assert joined == [(ticks,)]


def test_merge_export_and_prune_carry_the_gpu_rows(
    synthetic: Callable[..., Settings],
    db_path: Path,
    tmp_path: Path,
    nvml: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    subprocess_env: dict[str, str],
) -> None:
    """soakd merge copies a run's gpu_samples, export --table gpu_samples writes them, and
    prune's run tables include it (so deleting a run empties it)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rid = run_soak(synthetic("run.gpus=[0, 1]", "run.duration=1")).run_id
    n = q(db_path, "SELECT count(*) FROM gpu_samples WHERE run_id = ?", rid)[0][0]
    out = tmp_path / "merged.db"
    list(merge(out, [db_path]))
    assert q(out, "SELECT count(*) FROM gpu_samples WHERE run_id = ?", rid) == [(n,)]
    csv = tmp_path / "g.csv"
    p = run_cli("export", rid, "--db", str(db_path), "--table", "gpu_samples", "-o", str(csv),
                env=subprocess_env)  # fmt: skip
    assert p.returncode == 0, p.stderr
    lines = csv.read_text().splitlines()
    assert lines[0].startswith("seq,t,gpu,uuid,mem_used_bytes") and len(lines) == n + 1
    with store.connect(db_path) as conn:
        assert ("gpu_samples", ["run_id"]) in run_tables(conn)


# --- judging per GPU


def _two_gpus(
    leak_mb_per_min: dict[int, float],
) -> tuple[np.ndarray, dict[int, dict[str, np.ndarray]]]:
    t = np.arange(0.0, 600.0, 0.5)
    rng = np.random.default_rng(0)
    gpus = {
        g: {
            "t": t,
            "mem_used_bytes": (g + 1) * GIB
            + rate * (1 << 20) * t / 60
            + rng.normal(0, 1e5, t.size),
            "mem_total_bytes": np.full(t.size, 80.0 * GIB),
        }
        for g, rate in leak_mb_per_min.items()
    }
    return t, gpus


def test_a_leak_on_gpu_1_fails_memory_gpu_1_and_the_run_while_gpu_0_passes() -> None:
    """GPU 1 growing 20 MB/min under a 1.5 MB/min limit: memory_gpu[1] FAIL, memory_gpu[0]
    PASS, the verdict FAIL."""
    t, gpus = _two_gpus({0: 0.0, 1: 20.0})
    ft = np.arange(0.0, 600.0, 0.5)
    flat = np.full(ft.size, 1.0)
    data = make_run_data(
        RunMeta("r", duration_s=600, fps=2, device="cuda:0"),
        frames={
            "t_capture": ft,
            "total_ms": 20 * flat,
            "infer_ms": 15 * flat,
            "frame_age_ms": flat,
        },
        samples={"t": t, "rss_bytes": 5e8 + 0 * t, "gpu_mem_used_bytes": gpus[0]["mem_used_bytes"]},
        events=[{"kind": "warmup_end", "t": 5.0}],
    )
    data.gpus = gpus
    v = judge(data, CriteriaSettings(max_drop_fraction=1.0))
    by = {c.criterion: c for c in v.criteria}
    assert by["memory_gpu[1]"].status == FAIL, by["memory_gpu[1]"].detail
    assert by["memory_gpu[0]"].status == PASS, by["memory_gpu[0]"].detail
    assert v.status == "FAIL" and "memory_gpu[1]" in v.reason
    assert "memory_gpu[0]" not in v.reason


def test_stored_gpu_rows_are_judged_per_gpu(
    synthetic: Callable[..., Settings],
    db_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real run whose fake GPU 1 leaks 3 GB/min and GPU 0 holds still: judged from the
    database, memory_gpu[1] fails and memory_gpu[0] does not."""
    t0 = time.monotonic()
    leak = 3000 * (1 << 20) / 60  # bytes per second
    m = fake_nvml(lambda i: GIB + (int(leak * (time.monotonic() - t0)) if i == 1 else 0))
    monkeypatch.setitem(sys.modules, "pynvml", m)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rid = run_soak(synthetic("run.gpus=[0, 1]", "run.duration=4"), judge=False).run_id
    with store.connect(db_path) as conn:
        _, v = evaluate(conn, rid)
    by = {c.criterion: c.status for c in v.criteria}
    assert by["memory_gpu[1]"] == FAIL
    assert by["memory_gpu[0]"] != FAIL


# --- Prometheus


def test_the_exporter_serves_one_series_per_gpu_labelled_as_dcgm_exporter(
    nvml: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scraped over HTTP: soakd_gpu_device_memory_used_bytes once per fake GPU, with gpu =
    NVML index and UUID = its UUID beside the run labels."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    probe, _ = open_gpus(gpus_of(load_settings(flags={"run.gpus": [0, 1]})))
    assert isinstance(probe, GpuDevicesProbe)
    values: dict[str, float | int | None] = {}
    devices = probe.sample_devices(values, 0, 0.0)
    server = start_exporter("127.0.0.1:0")
    obs = MetricsObserver(server)
    try:
        obs.on_run_start(_info())
        obs.on_sample(Sample(0, 0.0, 0.0, 0.0, 0.0, values, devices=tuple(devices)))
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        obs.close()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    series = fams["soakd_gpu_device_memory_used_bytes"].samples
    got = sorted((s.labels["gpu"], s.labels["UUID"], s.value) for s in series)
    assert got == [("0", UUIDS[0], float(GIB)), ("2", UUIDS[2], float(3 * GIB))]
    assert all(s.labels["run"] == "run-1" for s in series)


def test_a_device_sample_with_unknown_memory_is_not_exported() -> None:
    """A GPU whose memory NVML never reported has no memory series (absent, not zero)."""
    obs = MetricsObserver()
    obs.on_run_start(_info())
    d = DeviceSample(seq=0, t=0.0, gpu=3, uuid="GPU-x", util_pct=50.0)
    obs.on_sample(Sample(0, 0.0, 0.0, 0.0, 0.0, {}, devices=(d,)))
    names = {
        m.name for m in obs.registry.collect() for s in m.samples if s.labels.get("gpu") == "3"
    }
    assert names == {"soakd_gpu_device_utilization_ratio"}

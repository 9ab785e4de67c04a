"""The transformers staged adapter: tiny-vlm default and hf local checkpoints."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.config import HfWorkload, TinyVlmWorkload, load_settings
from soakd.errors import ExitCode
from soakd.records import Frame, StageOutput
from soakd.workloads.base import StagedWorkload, WorkloadContext, WorkloadError
from soakd.workloads.hf import HfStaged, build_hf, build_tiny, resize_short_side
from soakd.workloads.registry import build_workload

pytestmark = pytest.mark.model


def _frame(i: int, h: int = 240, w: int = 320) -> Frame:
    img = np.random.default_rng(i).integers(0, 255, (h, w, 3), dtype=np.uint8)
    return Frame(id=i, t_sched_ns=0, t_capture_ns=0, grab_ns=0, image=img)


def _run(w: Any, frame: Frame) -> StageOutput:
    out = w.decode(w.infer(w.preprocess(frame)))
    w.sync()
    return out  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny(cache: Path) -> Iterator[HfStaged]:
    w = build_tiny(TinyVlmWorkload(cache_dir=str(cache)), WorkloadContext(width=320, height=240))
    w.setup()
    yield w
    w.close()


@pytest.fixture(scope="session")
def tiny_dir(tiny: HfStaged) -> Path:
    return Path(tiny.describe()["model_path"])


def test_tiny_default_generates_a_fixed_number_of_tokens(tiny: HfStaged) -> None:
    """Greedy decoding with min = max new tokens gives exactly max_new_tokens per frame."""
    outs = [_run(tiny, _frame(i)) for i in range(3)]
    assert [o.tokens for o in outs] == [8, 8, 8]
    assert all(isinstance(o.text, str) for o in outs)
    assert isinstance(tiny, StagedWorkload)


def test_tiny_reports_vision_tokens(tiny: HfStaged) -> None:
    """The 56-pixel LLaVA tower sees (56/14)^2 = 16 image tokens per frame."""
    assert _run(tiny, _frame(0)).vision_tokens == 16


def test_tiny_is_deterministic(tiny: HfStaged) -> None:
    """The same frame twice gives the same text (greedy, fixed weights)."""
    assert _run(tiny, _frame(4)).text == _run(tiny, _frame(4)).text


def test_describe_records_every_timing_setting(tiny: HfStaged) -> None:
    """describe() holds the generation settings, model class, params, dtype and device."""
    d = tiny.describe()
    for key in (
        "max_new_tokens",
        "min_new_tokens",
        "num_beams",
        "do_sample",
        "use_cache",
        "short_side",
        "prompt",
        "device",
        "attn_implementation",
        "trust_remote_code",
    ):
        assert key in d
    assert d["model_class"] == "LlavaForConditionalGeneration"
    assert d["min_new_tokens"] == d["max_new_tokens"] == 8
    assert 10_000 < d["param_count"] < 5_000_000
    assert d["dtype"] == "float32" and d["model_device"] == "cpu"
    assert d["arch"] == "llava" and json.dumps(d)


def test_tiny_loads_through_the_auto_classes(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """setup() loads with AutoProcessor / AutoModelForImageTextToText.from_pretrained."""
    import transformers

    calls: list[str] = []
    for name in ("AutoProcessor", "AutoModelForImageTextToText"):
        cls = getattr(transformers, name)
        original = cls.from_pretrained

        def spy(*args: Any, _o: Any = original, _n: str = name, **kw: Any) -> Any:
            calls.append(_n)
            return _o(*args, **kw)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    w = build_tiny(TinyVlmWorkload(cache_dir=str(cache)), WorkloadContext())
    w.setup()
    assert calls == ["AutoProcessor", "AutoModelForImageTextToText"]
    w.close()


def test_hf_adapter_loads_a_local_checkpoint(tiny_dir: Path) -> None:
    """kind = hf with the tiny model's directory runs and honours min_new_tokens."""
    settings = HfWorkload(
        model_path=str(tiny_dir),
        max_new_tokens=6,
        min_new_tokens=2,
        dtype="float32",
        short_side=56,
        attn_implementation="eager",
    )
    w = build_hf(settings, WorkloadContext())
    w.setup()
    out = _run(w, _frame(1))
    assert out.tokens is not None and 2 <= out.tokens <= 6
    d = w.describe()
    assert d["attn_implementation_used"] == "eager" and d["kind"] == "hf"
    w.close()


def test_registry_builds_the_default_workload(cache: Path) -> None:
    """The registry maps kind tiny-vlm to this adapter, configured from settings."""
    settings = load_settings(overrides=[f'workload.cache_dir="{cache}"', "workload.arch=llava"])
    w = build_workload(settings.workload, WorkloadContext())
    assert isinstance(w, HfStaged) and w.params.kind == "tiny-vlm"


def test_resize_keeps_aspect_and_sets_short_side() -> None:
    """A 240x320 frame resized to short side 56 becomes 56x75."""
    out = resize_short_side(np.zeros((240, 320, 3), np.uint8), 56)
    assert out.shape == (56, 75, 3)
    assert resize_short_side(np.zeros((20, 30, 3), np.uint8), None).shape == (20, 30, 3)


def test_missing_checkpoint_path_is_named(tmp_path: Path) -> None:
    """A model_path that does not exist fails at build, exit code 2, naming the path."""
    missing = tmp_path / "no-such-model"
    with pytest.raises(WorkloadError, match=r"no-such-model.*no such directory") as err:
        build_hf(HfWorkload(model_path=str(missing)), WorkloadContext())
    assert "\n" not in str(err.value)
    assert ExitCode.USAGE == 2  # the CLI maps WorkloadError to exit code 2


def test_not_a_model_dir_is_named(tmp_path: Path) -> None:
    """A directory without config.json, or a file, is rejected before loading."""
    with pytest.raises(WorkloadError, match="not a model directory"):
        build_hf(HfWorkload(model_path=str(tmp_path)), WorkloadContext())
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(WorkloadError, match=r"weights.bin.*not a directory"):
        build_hf(HfWorkload(model_path=str(f)), WorkloadContext())


def test_remote_code_model_needs_trust(tiny_dir: Path, tmp_path: Path) -> None:
    """A checkpoint with auto_map fails at setup unless trust_remote_code is set."""
    dst = tmp_path / "remote"
    shutil.copytree(tiny_dir, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForImageTextToText": "modeling_custom.CustomModel"}
    (dst / "config.json").write_text(json.dumps(cfg))
    w = build_hf(HfWorkload(model_path=str(dst)), WorkloadContext())
    with pytest.raises(WorkloadError, match=r"remote.*trust_remote_code = true"):
        w.setup()


def test_broken_checkpoint_is_a_one_line_error(tiny_dir: Path, tmp_path: Path) -> None:
    """Unloadable weights give a one-line error naming the path and the part."""
    dst = tmp_path / "broken"
    shutil.copytree(tiny_dir, dst)
    (dst / "model.safetensors").write_bytes(b"not safetensors")
    w = build_hf(HfWorkload(model_path=str(dst)), WorkloadContext())
    with pytest.raises(WorkloadError, match=r"broken.*cannot load the model") as err:
        w.setup()
    assert "\n" not in str(err.value)


def test_processor_rejecting_the_input_size_fails_setup(tiny_dir: Path, tmp_path: Path) -> None:
    """A processor that cannot take the configured frame size fails before the run."""
    dst = tmp_path / "strict"
    shutil.copytree(tiny_dir, dst)
    pc = json.loads((dst / "processor_config.json").read_text())
    pc["image_processor"]["size"] = {"shortest_edge": 0}  # resize to nothing: PIL refuses
    (dst / "processor_config.json").write_text(json.dumps(pc))
    w = build_hf(HfWorkload(model_path=str(dst)), WorkloadContext(width=320, height=240))
    with pytest.raises(WorkloadError, match="processor rejected a 320x240 input"):
        w.setup()


def test_cuda_device_without_cuda_is_named(tiny_dir: Path) -> None:
    """device = cuda on a host without CUDA fails at setup naming the device."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available on this host")
    w = build_hf(HfWorkload(model_path=str(tiny_dir), device="cuda:0"), WorkloadContext())
    with pytest.raises(WorkloadError, match="'cuda:0': CUDA is not available"):
        w.setup()


@pytest.mark.slow
def test_default_run_through_the_runner(cache: Path, tmp_path: Path) -> None:
    """The embedded default workload run by the runner stores fixed-length frame rows."""
    import sqlite3

    from soakd.run.runner import run_soak

    db = tmp_path / "tiny.db"
    settings = load_settings(
        overrides=[f'run.db="{db}"', f'workload.cache_dir="{cache}"', "workload.arch=llava"]
    )
    result = run_soak(settings, max_frames=4, paced=False, judge=False)
    assert result.summary["errors"] == 0 and result.summary["frames_done"] == 4
    rows = sqlite3.connect(db).execute("SELECT out_tokens, vision_tokens, infer_ms FROM frames")
    rows = rows.fetchall()
    assert len(rows) == 4
    for out_tokens, vision, infer_ms in rows:
        assert (out_tokens, vision) == (8, 16) and infer_ms > 0

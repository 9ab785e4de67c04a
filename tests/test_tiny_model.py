"""The built-in tiny models: deterministic, cached, written atomically, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from soakd.workloads import tiny
from soakd.workloads.base import WorkloadError
from soakd.workloads.tiny import (
    MARKER,
    TinySpec,
    default_cache_root,
    ensure_tiny_model,
    model_dir,
    torchvision_available,
    weights_digest,
)

pytestmark = pytest.mark.model


def test_same_seed_gives_same_weights_other_seed_does_not(tmp_path: Path) -> None:
    """Two builds with one seed hold identical weights; another seed gives others."""
    a = ensure_tiny_model(TinySpec("llava", seed=3), tmp_path / "a")
    b = ensure_tiny_model(TinySpec("llava", seed=3), tmp_path / "b")
    c = ensure_tiny_model(TinySpec("llava", seed=4), tmp_path / "a")
    assert a != b and a.name == b.name
    assert weights_digest(a) == weights_digest(b)
    assert weights_digest(a) != weights_digest(c)


def test_build_does_not_disturb_the_callers_rng(tmp_path: Path) -> None:
    """Building a model under its own seed leaves torch's global RNG where it was."""
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ensure_tiny_model(TinySpec("llava", seed=9), tmp_path)
    assert torch.equal(torch.rand(3), expected)


def test_second_call_reuses_the_cache_and_leaves_no_temp_dirs(tmp_path: Path) -> None:
    """A complete model is found again without rebuilding, and no temp dir remains."""
    spec = TinySpec("llava", seed=0)
    path = ensure_tiny_model(spec, tmp_path)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(spec, tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert json.loads((path / MARKER).read_text())["arch"] == "llava"


def test_failed_build_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A builder that crashes midway leaves neither the model dir nor a temp dir."""

    def crash(spec: TinySpec, dst: Path) -> None:
        (dst / "config.json").write_text("{}")
        raise RuntimeError("disk on fire")

    monkeypatch.setitem(tiny._BUILDERS, "llava", crash)
    with pytest.raises(RuntimeError, match="disk on fire"):
        ensure_tiny_model(TinySpec("llava"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_half_written_dir_without_marker_is_rebuilt(tmp_path: Path) -> None:
    """A directory at the final path without the completion marker is never used."""
    spec = TinySpec("llava", seed=1)
    final = model_dir(spec, tmp_path)
    final.mkdir(parents=True)
    (final / "config.json").write_text("{ half")
    path = ensure_tiny_model(spec, tmp_path)
    assert path == final and (path / MARKER).is_file()
    assert json.loads((path / "config.json").read_text())["model_type"] == "llava"


def test_concurrent_builders_agree(tmp_path: Path) -> None:
    """Two processes building the same model at once both end with one complete copy."""
    code = (
        "import sys; from soakd.workloads.tiny import TinySpec, ensure_tiny_model, "
        "weights_digest; p = ensure_tiny_model(TinySpec('llava', seed=5), sys.argv[1]); "
        "print(p, weights_digest(p))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] and outs[0]
    assert [p.name for p in tmp_path.iterdir()] == [Path(outs[0].split()[0]).name]


def test_cache_root_follows_systemd_cache_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    """$CACHE_DIRECTORY (first entry) wins; otherwise ~/.cache/soakd/models."""
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/soakd:/var/cache/other")
    assert default_cache_root() == Path("/var/cache/soakd/models")
    monkeypatch.delenv("CACHE_DIRECTORY")
    assert default_cache_root() == Path(os.path.expanduser("~/.cache/soakd/models"))
    spec = TinySpec("llava", seed=2)
    assert model_dir(spec).name == f"llava-{spec.digest()}"


def test_omni_parts_load_through_from_pretrained(tmp_path: Path) -> None:
    """The tiny Qwen2.5-Omni checkpoint is laid out as published: its config, feature
    extractor, image processor and tokenizer each load back with the Auto* from_pretrained
    path from the one directory."""
    from transformers import AutoConfig, AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer

    path = ensure_tiny_model(TinySpec("qwen2.5-omni"), tmp_path)
    assert AutoConfig.from_pretrained(path).model_type == "qwen2_5_omni"
    fe = AutoFeatureExtractor.from_pretrained(path)
    assert (type(fe).__name__, fe.feature_size) == ("WhisperFeatureExtractor", 128)
    assert AutoImageProcessor.from_pretrained(path).merge_size == 2
    assert AutoTokenizer.from_pretrained(path).convert_tokens_to_ids("<|AUDIO|>") > 0


@pytest.mark.skipif(torchvision_available(), reason="torchvision is installed here")
def test_qwen2_vl_without_torchvision_is_a_clear_error(tmp_path: Path) -> None:
    """Without torchvision, qwen2-vl fails before building with a one-line fix."""
    with pytest.raises(WorkloadError, match=r"needs torchvision.*arch = 'llava'"):
        ensure_tiny_model(TinySpec("qwen2-vl"), tmp_path)
    assert not tmp_path.joinpath("models").exists() and list(tmp_path.iterdir()) == []


def test_unknown_arch_is_a_workload_error(tmp_path: Path) -> None:
    """An architecture that is not built in is named in the error."""
    with pytest.raises(WorkloadError, match="'gpt-9'"):
        ensure_tiny_model(TinySpec("gpt-9"), tmp_path)

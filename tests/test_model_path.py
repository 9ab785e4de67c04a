"""`soakd model-path`: the folder of the embedded tiny model that `transformers serve` is given
(configs/openai-endpoint.toml), through a real subprocess into a temporary cache."""

from __future__ import annotations

import re
from pathlib import Path

from soakd.workloads.tiny import MARKER
from tests.conftest import REPO, run_cli


def test_model_path_prints_the_default_models_folder_built_and_loadable(tmp_path: Path) -> None:
    """It prints one line, the folder under the cache named by the config's arch and digest,
    with the model's files in it (built when missing); another seed is another folder."""
    cache = f"workload.cache_dir={str(tmp_path)!r}"
    p = run_cli("model-path", "--set", cache)
    assert p.returncode == 0, p.stderr
    folder = Path(p.stdout.strip())
    assert p.stdout.count("\n") == 1 and folder.parent == tmp_path
    assert re.fullmatch(r"llava-[0-9a-f]{12}", folder.name)
    assert (folder / MARKER).is_file() and (folder / "config.json").is_file()
    other = run_cli("model-path", "--set", cache, "--set", "workload.seed=1")
    assert other.returncode == 0 and Path(other.stdout.strip()) != folder


def test_model_path_of_a_served_config_is_a_one_line_error() -> None:
    """A config whose workload is not the embedded tiny model: exit 2, one line naming it."""
    p = run_cli("model-path", "configs/openai-endpoint.toml")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "soakd: error: workload.kind is 'openai': model-path names the tiny-vlm model's folder"
    ]


def test_every_test_file_a_config_names_exists() -> None:
    """configs/*.toml name only test files that exist (the served config once named
    tests/test_openai_e2e.py)."""
    for cfg in sorted((REPO / "configs").glob("*.toml")):
        for name in re.findall(r"tests/[\w/]+\.py", cfg.read_text()):
            assert (REPO / name).is_file(), f"{cfg.name} names {name}, which does not exist"

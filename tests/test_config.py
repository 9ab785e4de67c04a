"""Settings: layering, validation messages, the shipped configs."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soakd.config import ConfigError, load_settings, parse_duration, parse_set

REPO = Path(__file__).resolve().parents[1]


def test_embedded_default_is_the_shipped_default() -> None:
    """configs/default.toml is byte-identical to the embedded default `soakd run` uses."""
    assert (REPO / "configs/default.toml").read_bytes() == (
        REPO / "soakd/default.toml"
    ).read_bytes()


def test_default_settings_are_the_tiny_vlm() -> None:
    """With no config at all the workload is the embedded tiny VLM on the CPU."""
    s = load_settings()
    assert s.workload.kind == "tiny-vlm"
    assert s.source.kind == "synthetic"
    assert s.run.max_queue == 1 and s.run.consume == "newest"


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path: Path) -> None:
    """Each file in configs/ is a valid configuration."""
    load_settings(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["run.fps=-2"], "run.fps: must be > 0, got -2"),
        (["run.fpss=2"], "run.fpss: unknown key"),
        (["run.consume=sideways"], "run.consume: must be 'newest' or 'oldest', got 'sideways'"),
        (["run.sample_interval_ms=20"], "run.sample_interval_ms: must be >= 50, got 20"),
        (["source.kind=video"], "source.path: required when kind = 'video'"),
        (["workload.kind=nope"], "workload.kind: unknown workload 'nope'"),
        (["workload.kind=synthetic", "workload.infer_ms=fast"], "workload.infer_ms: must be"),
        (["workload.kind=synthetic", "workload.colour=1"], "workload.colour: unknown key"),
        (["run.duration=soon"], "run.duration: expected a duration"),
        (["criteria.jitter_k=0.5"], "criteria.jitter_k: must be >= 1 or 'history'"),
    ],
)
def test_bad_values_name_the_key_path(overrides: list[str], message: str) -> None:
    """A bad value is rejected with one line that starts with its key path."""
    with pytest.raises(ConfigError) as info:
        load_settings(overrides=overrides)
    text = str(info.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_layers_flags_beat_set_beat_file(tmp_path: Path) -> None:
    """defaults < file < --set < flags."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[run]\nfps = 3.0\nduration = "2m"\n[workload]\nkind = "synthetic"\n')
    s = load_settings(cfg)
    assert (s.run.fps, s.run.duration, s.workload.kind) == (3.0, 120.0, "synthetic")
    s = load_settings(cfg, overrides=["run.fps=4"])
    assert s.run.fps == 4.0
    s = load_settings(cfg, overrides=["run.fps=4"], flags={"run.fps": 5.0, "run.db": None})
    assert s.run.fps == 5.0


def test_changing_workload_kind_replaces_the_table() -> None:
    """Switching kind with --set drops the default workload's keys instead of merging them."""
    s = load_settings(overrides=["workload.kind=synthetic", "workload.infer_ms=7"])
    assert s.workload.kind == "synthetic" and s.workload.infer_ms == 7  # type: ignore[union-attr]


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    """A missing file and a TOML syntax error are one-line ConfigErrors naming the file."""
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nfps=1")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        load_settings(bad)


def test_settings_are_immutable() -> None:
    """Validated settings cannot be changed after the fact."""
    s = load_settings()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        s.run.fps = 3  # type: ignore[misc]


def test_config_hash_ignores_duration_and_db_but_not_fps() -> None:
    """Runs of the same setup share a config hash whatever their length or database."""
    a = load_settings(overrides=["run.duration=10m", "run.db=a.db"])
    b = load_settings(overrides=["run.duration=1h", "run.db=b.db"])
    c = load_settings(overrides=["run.fps=3"])
    assert a.config_hash() == b.config_hash() != c.config_hash()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10m", 600),
        ("90s", 90),
        ("1h30m", 5400),
        ("250ms", 0.25),
        ("600", 600),
        (12, 12),
        ("1.5m", 90),
    ],
)
def test_parse_duration(text: str | int, seconds: float) -> None:
    """Durations read as humans write them."""
    assert parse_duration(text) == pytest.approx(seconds)


@given(st.integers(0, 10**6))
def test_parse_duration_round_trips_seconds(n: int) -> None:
    """Any whole number of seconds written as '<n>s' parses back to n."""
    assert parse_duration(f"{n}s") == n


def test_parse_set_reads_toml_values() -> None:
    """--set values are TOML when they parse as TOML, else bare strings."""
    assert parse_set("run.fps=2.5") == (["run", "fps"], 2.5)
    assert parse_set("run.consume=oldest") == (["run", "consume"], "oldest")
    assert parse_set('workload.prompt="a b"') == (["workload", "prompt"], "a b")
    with pytest.raises(ConfigError):
        parse_set("fps")


def test_cli_config_error_exit_code_2(tmp_path: Path) -> None:
    """`soakd run` with a bad value exits 2 with the one-line message on stderr."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "soakd",
            "run",
            "--set",
            "run.fps=-2",
            "--db",
            str(tmp_path / "x.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert "run.fps: must be > 0, got -2" in p.stderr
    assert not (tmp_path / "x.db").exists()  # nothing started


def test_default_toml_documents_every_key() -> None:
    """Every key of every section in the embedded default has a comment beside it."""
    text = (REPO / "soakd/default.toml").read_text()
    tomllib.loads(text)
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            assert "#" in line, f"undocumented key: {line}"

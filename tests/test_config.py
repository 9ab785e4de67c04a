"""Settings: layering, validation messages, the shipped configs."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from soakd.config import (
    ConfigError,
    Settings,
    flatten,
    load_settings,
    parse_duration,
    parse_set,
)
from soakd.studies.plan import load_plan

from .conftest import run_cli

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


SHIPPED = sorted((REPO / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", [p for p in SHIPPED if not p.name.startswith("plan-")],
                         ids=lambda p: p.name)  # fmt: skip
def test_every_shipped_config_validates(path: Path) -> None:
    """Each run config in configs/ is a valid configuration."""
    load_settings(path)


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.name.startswith("plan-")],
                         ids=lambda p: p.name)  # fmt: skip
def test_every_shipped_plan_validates_every_cell(path: Path) -> None:
    """Each plan in configs/ (plan-*.toml) loads, every cell's config validated."""
    assert load_plan(path).cells


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["run.fps=-2"], "run.fps: must be > 0, got -2"),
        (["run.fps=0"], "run.fps: must be > 0, got 0"),
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


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("run.fsp", " (did you mean run.fps?)"),
        ("criteria.min_duraton_s", " (did you mean criteria.min_duration_s?)"),
        ("workload.infer_mss", " (did you mean workload.infer_ms?)"),
        ("run.zzz", ""),  # nothing close: no guess
        # a key of other workload kinds: those kinds, never itself as the guess
        ("workload.dtype", " (a key of workload kinds av, hf, session, tiny-vlm; not of this one)"),
    ],
)
def test_an_unknown_key_close_to_a_known_one_says_which_it_may_be(key: str, hint: str) -> None:
    """A typo of a key in the same section is named: "run.fsp: unknown key (did you mean
    run.fps?)"; a key close to none gets no guess."""
    with pytest.raises(ConfigError) as info:
        load_settings(overrides=["workload.kind=synthetic", f"{key}=2"])
    assert str(info.value) == f"{key}: unknown key{hint}"


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
    with pytest.raises(ValidationError, match="Instance is frozen"):
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


# --- floats must be finite


def _has_float(tp: Any) -> bool:
    return tp is float or any(_has_float(a) for a in typing.get_args(tp))


def _float_fields() -> list[tuple[str, list[str]]]:
    """(dotted key, overrides that select its section's model) for every float field of
    every section model reachable from Settings (each workload kind included), discovered
    from the models so that a new float field is covered without touching this test."""
    out: list[tuple[str, list[str]]] = []
    for section, info in Settings.model_fields.items():
        models = [info.annotation, *typing.get_args(info.annotation)]
        for model in models:
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                continue
            base: list[str] = []
            if "kind" in model.model_fields and section == "workload":
                base.append(f"{section}.kind={model.model_fields['kind'].default!r}")
                # required keys (hf: model_path) get a value valid as a path and a factory
                base += [
                    f"{section}.{k}='pkg.mod:fn'"
                    for k, f in model.model_fields.items()
                    if f.is_required() and k != "kind"
                ]
            for name, field in model.model_fields.items():
                if typing.get_origin(field.annotation) is dict:
                    continue  # a free-form table (generate_kwargs): its own validator, below
                if _has_float(field.annotation):
                    out.append((f"{section}.{name}", base))
    return out


FLOAT_FIELDS = _float_fields()


def test_float_field_discovery_finds_every_section() -> None:
    """The discovery sees floats of every section with floats, durations and optionals."""
    keys = {k for k, _ in FLOAT_FIELDS}
    assert {"run.fps", "run.duration", "run.max_age_ms", "source.open_timeout_s"} <= keys
    assert {"audio.freq_hz", "criteria.jitter_k", "service.metrics_linger_s"} <= keys
    assert {"workload.spike_ms", "workload.poll_timeout_s", "workload.video_fps"} <= keys


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize(("key", "base"), FLOAT_FIELDS, ids=[k for k, _ in FLOAT_FIELDS])
def test_every_float_setting_refuses_nan_and_infinity(
    key: str, base: list[str], value: str
) -> None:
    """NaN and +-infinity (TOML literals through --set) are refused for every float setting
    with one line naming the key path."""
    load_settings(overrides=base)  # the section itself is valid
    with pytest.raises(ConfigError) as info:
        load_settings(overrides=[*base, f"{key}={value}"])
    assert str(info.value) == f"{key}: must be a finite number, got {value}"


@pytest.mark.parametrize(
    "expr",
    ['run.fps="nan"', 'run.duration="inf"', "run.warmup_s=Infinity", "run.stall_timeout_s=1e400"],
)
def test_nan_and_infinity_given_as_strings_are_refused(expr: str) -> None:
    """Strings that read as NaN or infinity (quoted, bare, overflowing) are refused too."""
    key = expr.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{key}: must be a finite number, got "):
        load_settings(overrides=[expr])


def test_toml_nan_and_inf_literals_in_a_file_are_refused(tmp_path: Path) -> None:
    """A config file's TOML nan/inf literals are refused like --set values."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("[criteria]\njitter_k = nan\n")
    with pytest.raises(ConfigError, match=r"^criteria\.jitter_k: must be a finite number"):
        load_settings(cfg)
    cfg.write_text("[run]\nduration = inf\n")
    with pytest.raises(ConfigError, match=r"^run\.duration: must be a finite number, got inf$"):
        load_settings(cfg)


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "Infinity", 1e400, float("nan")])
def test_parse_duration_refuses_nan_and_infinity(text: str | float) -> None:
    """A duration is a finite number of seconds."""
    with pytest.raises(ValueError, match="must be a finite number"):
        parse_duration(text)


def test_cli_nan_criterion_exit_code_2(tmp_path: Path) -> None:
    """`soakd run --set criteria.jitter_k=nan` exits 2 with one line on stderr."""
    p = run_cli("run", "--set", "criteria.jitter_k=nan", "--db", str(tmp_path / "x.db"))
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        "soakd: error: criteria.jitter_k: must be a finite number, got nan"
    ]
    assert not (tmp_path / "x.db").exists()


# --- Settings.with_value and Settings.flat


def test_with_value_is_set_with_the_same_message() -> None:
    """with_value sets one dotted key exactly as --set does, with the same one-line error."""
    s = load_settings()
    assert s.with_value("run.fps", 3).run.fps == 3.0
    assert s.with_value("run.duration", "2m").run.duration == 120.0
    assert s.run.fps == 2.0  # a copy: the original is unchanged
    for key, value in [("run.fps", -2), ("run.fpss", 2), ("criteria.jitter_k", float("nan"))]:
        with pytest.raises(ConfigError) as via_set:
            load_settings(overrides=[f"{key}={value}"])
        with pytest.raises(ConfigError) as via_value:
            s.with_value(key, value)
        assert str(via_value.value) == str(via_set.value)
    with pytest.raises(ConfigError, match=r"expected section\.key"):
        s.with_value("fps", 3)


def test_with_value_of_another_workload_kind_replaces_the_table() -> None:
    """A new workload kind starts from that kind's defaults, as with --set."""
    s = load_settings().with_value("workload.kind", "synthetic")
    assert s == load_settings(overrides=["workload.kind=synthetic"])
    s = s.with_value("workload.infer_ms", 7)
    assert s.workload.infer_ms == 7  # type: ignore[union-attr]


def test_flat_is_the_dotted_keys_of_the_settings() -> None:
    """flat() maps each dotted key to its value; empty tables stay leaves."""
    s = load_settings(overrides=["workload.kind=generator"])
    flat = s.flat()
    assert flat["run.fps"] == 2.0 and flat["workload.kind"] == "generator"
    assert flat["workload.options"] == {}
    assert flat == flatten(s.to_dict())
    assert flatten({"a": {"b": {"c": 1}}, "d": {}}) == {"a.b.c": 1, "d": {}}

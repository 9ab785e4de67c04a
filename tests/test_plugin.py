"""Users' own workloads: ``kind = "python"`` factories (the docs example included), the
``soakd.workloads`` entry-point group (through a real installed distribution), and the
one-line errors for factories that cannot be imported or return something else."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from soakd.config import ConfigError, PythonWorkload, Settings, load_settings
from soakd.errors import UsageError
from soakd.run.runner import run_soak
from soakd.workloads import registry
from soakd.workloads.base import WorkloadContext, WorkloadError
from soakd.workloads.plugin import build_python, check_workload

from .conftest import REPO, soakd_cmd

EXAMPLES = REPO / "docs" / "examples"


class NotAWorkload:
    def __init__(self, options: dict[str, Any], ctx: WorkloadContext) -> None:
        self.options = options


class HalfSession:
    shape = "session"

    def setup(self) -> None: ...
    def start(self) -> None: ...


def returns_a_string(options: dict[str, Any], ctx: WorkloadContext) -> str:
    return "model"


def returns_half_session(options: dict[str, Any], ctx: WorkloadContext) -> HalfSession:
    return HalfSession()


def raises(options: dict[str, Any], ctx: WorkloadContext) -> None:
    raise FileNotFoundError("/models/x/weights.bin")


@pytest.fixture
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


@pytest.fixture
def py_settings(db_path: Path) -> Callable[..., Settings]:
    def make(factory: str, *overrides: str) -> Settings:
        base = [
            f"run.db={str(db_path)!r}",
            "run.duration=2",
            "run.fps=10",
            "run.warmup_s=0.3",
            "run.log_every=0",
            "source.width=64",
            "source.height=48",
            "workload.kind=python",
            f"workload.factory={factory!r}",
        ]
        return load_settings(overrides=[*base, *overrides])

    return make


def test_docs_example_runs_as_a_python_workload(
    examples_on_path: None, py_settings: Callable[..., Settings], db_path: Path
) -> None:
    """The example in docs/examples/my_workload.py soaks through kind = 'python': every
    dispatched frame has pre, infer and decode times and the describe() is stored."""
    res = run_soak(py_settings("my_workload:make", "workload.options={kernel = 3}"), judge=False)
    assert res.status == "completed", res.reason
    conn = sqlite3.connect(db_path)
    rows = conn.execute(
        "SELECT pre_ms, infer_ms, decode_ms, error FROM frames WHERE run_id = ? AND skipped = 0",
        (res.run_id,),
    ).fetchall()
    assert len(rows) >= 10
    assert all(p > 0 and i > 0 and d > 0 and e is None for p, i, d, e in rows)
    desc = conn.execute("SELECT workload FROM runs WHERE id = ?", (res.run_id,)).fetchone()[0]
    assert '"kernel": 3' in desc
    assert res.summary["sample_output"].startswith("peak bin ")


def test_example_option_errors_are_one_line(examples_on_path: None) -> None:
    """A bad option is the factory's own one-line WorkloadError."""
    with pytest.raises(WorkloadError, match=r"^workload.options.kernel: must be a positive odd"):
        build_python(
            PythonWorkload(factory="my_workload:make", options={"kernel": 4}), WorkloadContext()
        )


def test_factory_that_cannot_be_imported_is_named() -> None:
    """A factory whose module is missing is a WorkloadError naming the module."""
    with pytest.raises(WorkloadError, match=r"cannot import 'acme_missing_pkg.pipeline'"):
        build_python(PythonWorkload(factory="acme_missing_pkg.pipeline:make"), WorkloadContext())


def test_factory_attribute_missing_is_named() -> None:
    """A module without the named function is a WorkloadError naming both."""
    with pytest.raises(WorkloadError, match=r"module 'json' has no attribute 'make_model'"):
        build_python(PythonWorkload(factory="json:make_model"), WorkloadContext())


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("tests.test_plugin:returns_a_string", r"returned str, not a workload: its 'shape'"),
        ("tests.test_plugin:NotAWorkload", r"returned NotAWorkload, not a workload"),
        (
            "tests.test_plugin:returns_half_session",
            r"'session' workload without method\(s\) push, poll, describe, close",
        ),
        ("tests.test_plugin:raises", r"failed: FileNotFoundError: /models/x/weights.bin"),
    ],
)
def test_factory_returning_a_non_workload_is_refused(factory: str, message: str) -> None:
    """What a factory returns must satisfy a protocol; the error says what is missing."""
    with pytest.raises(WorkloadError, match=message) as err:
        build_python(PythonWorkload(factory=factory), WorkloadContext())
    assert "\n" not in str(err.value)


def test_check_workload_pins_the_expected_shape() -> None:
    """A generator factory returning a session workload is refused."""
    with pytest.raises(WorkloadError, match=r"returned a 'session' workload, expected 'generator'"):
        check_workload(HalfSession(), "factory 'x:y'", expect="generator")


def test_malformed_factory_reference_is_a_config_error() -> None:
    """factory must look like package.module:function, checked when settings load."""
    with pytest.raises(ConfigError, match=r"^workload.factory: must look like"):
        load_settings(overrides=["workload.kind=python", "workload.factory='pipeline.py'"])


def test_unimportable_factory_fails_the_run_before_it_starts(
    py_settings: Callable[..., Settings], db_path: Path
) -> None:
    """Through the runner, an unimportable factory is a UsageError (exit 2) and no run row."""
    with pytest.raises(UsageError, match="cannot import 'acme_missing_pkg'") as err:
        run_soak(py_settings("acme_missing_pkg:make"), judge=False)
    assert int(err.value.exit_code) == 2
    if db_path.exists():
        n = sqlite3.connect(db_path).execute("SELECT count(*) FROM runs").fetchone()[0]
        assert n == 0


def test_cli_exits_2_when_the_factory_returns_a_non_workload(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """`soakd run` with a factory returning a non-workload exits 2 with a one-line error."""
    subprocess_env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        soakd_cmd(
            "run",
            "--db",
            str(tmp_path / "p.db"),
            "--duration",
            "2s",
            "--no-live",
            "--set",
            "workload.kind=python",
            "--set",
            "workload.factory='tests.test_plugin:returns_a_string'",
        ),
        capture_output=True,
        text=True,
        env=subprocess_env,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    hits = [ln for ln in proc.stderr.splitlines() if "not a workload" in ln]
    assert len(hits) == 1


# --- the soakd.workloads entry-point group, through a real installed distribution


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A distribution 'acme-soak-plugin' installed in a folder on sys.path (dist-info with
    entry_points.txt), registering workload 'acme-blur' -> my_workload:make."""
    site = tmp_path / "site"
    dist = site / "acme_soak_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-soak-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[soakd.workloads]\nacme-blur = my_workload:make\n")
    (site / "my_workload.py").write_text((EXAMPLES / "my_workload.py").read_text())
    monkeypatch.syspath_prepend(str(site))
    registry.entry_point_names.cache_clear()
    yield "acme-blur"
    registry.entry_point_names.cache_clear()


def test_entry_point_workload_is_found_and_built(installed_plugin: str) -> None:
    """A workload registered in the soakd.workloads group is a valid kind; its options go
    to the factory and the result is checked like a python factory's."""
    settings = load_settings(
        overrides=[f"workload.kind={installed_plugin}", "workload.options={kernel = 7}"]
    )
    assert settings.workload.kind == installed_plugin
    wl = registry.build_workload(settings.workload, WorkloadContext())
    assert wl.shape == "staged" and wl.describe()["kernel"] == 7


def test_entry_point_factory_errors_are_one_line(installed_plugin: str) -> None:
    """An entry-point factory rejecting its options is a WorkloadError before the run."""
    settings = load_settings(
        overrides=[f"workload.kind={installed_plugin}", "workload.options={kernel = 2}"]
    )
    with pytest.raises(WorkloadError, match="must be a positive odd number"):
        registry.build_workload(settings.workload, WorkloadContext())


def test_unknown_kind_lists_the_installed_entry_points(installed_plugin: str) -> None:
    """An unknown kind is a ConfigError that lists built-ins and installed entry points."""
    with pytest.raises(ConfigError, match=r"unknown workload 'acme-blurr'.*acme-blur"):
        load_settings(overrides=["workload.kind=acme-blurr"])

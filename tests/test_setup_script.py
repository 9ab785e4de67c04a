""".ci/setup, run for real in a copy of the repository whose .venv/bin/python is a stand-in
that logs each call (no download): each step says what it installs before it starts, and
--serve installs the `serve` extra (transformers[serving]) that pyproject.toml defines."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/calls.log"
case "$*" in
  *"print("*) echo "torch 0 transformers 0" ;;
  *"torch.__version__"*) echo "2.13.0" ;;
esac
exit 0
"""


# a stand-in uv: logs its calls beside python's, fails where FAIL_UV is set
FAKE_UV = """#!/usr/bin/env bash
echo "uv $*" >> "$(dirname "$0")/calls.log"
[ -z "${FAIL_UV:-}" ]
"""


def _setup(
    tmp_path: Path, *args: str, uv: bool = False, fail_uv: bool = False
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    (tmp_path / ".ci").mkdir(parents=True)
    shutil.copy(REPO / ".ci" / "setup", tmp_path / ".ci" / "setup")
    py = tmp_path / ".venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    for path, text in [(py, FAKE_PYTHON)] + [(py.with_name("uv"), FAKE_UV)] * uv:
        path.write_text(text)
        path.chmod(0o755)
    env = {**os.environ, "PATH": "/usr/bin:/bin", "PIP_FIND_LINKS": "/opt/wheels"}
    env.pop("FAIL_UV", None)
    if fail_uv:
        env["FAIL_UV"] = "1"
    p = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "setup"), *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    log = py.parent / "calls.log"
    return p, (log.read_text().splitlines() if log.exists() else [])


def test_setup_serve_installs_the_serve_extra_and_says_each_step(tmp_path: Path) -> None:
    """`bash .ci/setup --serve` prints a line before each install and pip-installs '.[serve]',
    the extra that brings transformers[serving]."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("transformers[serving]") for d in extras["serve"])
    p, calls = _setup(tmp_path, "--serve")
    assert p.returncode == 0, p.stderr
    assert "-m pip install -q -e .[serve]" in calls
    lines = p.stdout.splitlines()
    assert any(ln.startswith("setup: no uv: upgrading pip") for ln in lines)
    assert any("installing soakd and its dependencies" in ln and "[serve]" in ln for ln in lines)
    assert lines[-1].startswith("setup: ok")


def test_setup_takes_both_flags_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    """--test --serve installs both extras at once; an unknown argument is a one-line error,
    exit 2, before anything is installed."""
    p, calls = _setup(tmp_path / "a", "--test", "--serve")
    assert p.returncode == 0, p.stderr
    assert "-m pip install -q -e .[dev,serve]" in calls
    p, calls = _setup(tmp_path / "b", "--srve")
    assert p.returncode == 2
    assert p.stderr.strip() == "setup: unknown argument --srve (known: --test, --serve)"
    assert calls == []


def test_setup_installs_with_uv_where_it_has_one_and_with_pip_where_uv_fails(
    tmp_path: Path,
) -> None:
    """With uv in the venv, soakd and its extras are installed by `uv pip install` (bytecode
    compiled, as pip does) into the venv's python (with the find-links pip is given), pip
    never called; where uv fails, pip installs the same. (The stand-in python has torch: it
    is kept.)"""
    p, calls = _setup(tmp_path / "a", "--test", uv=True)
    assert p.returncode == 0, p.stderr
    uv = "uv pip install --python .venv/bin/python -q --compile-bytecode --find-links /opt/wheels"
    assert [c for c in calls if "pip" in c] == [f"{uv} -e .[dev]"]
    assert calls.index(f"{uv} -e .[dev]") < calls.index("-c import soakd, torch, transformers")
    p, calls = _setup(tmp_path / "b", "--test", uv=True, fail_uv=True)
    assert p.returncode == 0, p.stderr
    assert f"{uv} -e .[dev]" in calls and "-m pip install -q -e .[dev]" in calls
    assert "setup: uv failed: installing with pip" in p.stdout

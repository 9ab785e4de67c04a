"""Shared fixtures: settings for short synthetic runs and a run database in tmp_path."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from soakd.config import Settings, load_settings

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "soakd.db"


@pytest.fixture
def synthetic(db_path: Path) -> Callable[..., Settings]:
    """Settings for a synthetic-workload run writing to ``db_path``; extra ``--set``-style
    overrides as positional strings."""

    def make(*overrides: str, **flags: object) -> Settings:
        base = [
            "workload.kind=synthetic",
            f"run.db={str(db_path)!r}",
            "run.duration=3",
            "run.fps=20",
            "run.warmup_s=0.5",
            "run.sample_interval_ms=100",
            "run.log_every=0",
            "source.width=64",
            "source.height=48",
            "criteria.min_duration_s=1",
            "criteria.min_frames=5",
        ]
        return load_settings(
            overrides=[*base, *overrides], flags={k.replace("__", "."): v for k, v in flags.items()}
        )

    return make


def soakd_cmd(*args: str) -> list[str]:
    """The command line of a real ``soakd`` subprocess (the installed module)."""
    return [sys.executable, "-m", "soakd", *args]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``soakd ARGS`` as a real subprocess from the repository root."""
    return subprocess.run(
        soakd_cmd(*args), capture_output=True, text=True, cwd=REPO, timeout=timeout
    )


@pytest.fixture
def subprocess_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env.pop("STATE_DIRECTORY", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env

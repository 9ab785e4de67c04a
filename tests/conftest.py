"""Shared fixtures: settings for short synthetic runs, a run database in tmp_path, and
``make_run`` (one ``runs`` row written the way the runner writes it)."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from soakd.config import Settings, load_settings
from soakd.store.db import atomic
from soakd.store.runs import NewRun, close_run, open_run

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
            # 12 floor windows in the 2 s after a 2.5 s run's warm-up: a shortened one is
            # INVALID
            "criteria.floor_window_s=0.1",
            # the suite's machine is busy: judge the model, not the host (SYNTH_CLI says why)
            "criteria.contended_cpu_pct=100",
        ]
        return load_settings(
            overrides=[*base, *overrides], flags={k.replace("__", "."): v for k, v in flags.items()}
        )

    return make


#: ``soakd run`` flags for a short synthetic soak whose criteria a few seconds can meet
SYNTH_CLI = [
    "--set", "workload.kind=synthetic",
    "--set", "run.warmup_s=0.5",
    "--set", "run.log_every=0",
    "--set", "source.width=64",
    "--set", "source.height=48",
    "--set", "criteria.min_duration_s=1",
    "--set", "criteria.min_frames=5",
    # 12 memory-floor windows in the 1.5 s after a 2 s soak's warm-up (shortened: INVALID)
    "--set", "criteria.floor_window_s=0.1",
    # a few seconds cannot test memory growth: a 0.1 MB allocation after warm-up reads as
    # 1.5 MB/min (the default limit), so the floor trend is untested (INVALID) or, under
    # load, rising (FAIL) on a healthy soak; tests of the memory criteria set their own
    "--set", "criteria.max_memory_growth_mb_per_min=1000",
    # nor can they bound it for a week: soakd's own first hand-on of frames to the store
    # and the observers after the warm-up (about a second in) bounds the floors at a few
    # MB/min, and 24 GB at that lasts days, not the default week (memory_headroom INVALID)
    "--set", "criteria.horizon=1h",
    # the machine running the suite is busy: a rule's test judges the model, whatever else
    # runs (host contention has its own tests, tests/test_contention.py, at the default)
    "--set", "criteria.contended_cpu_pct=100",
]  # fmt: skip


def soakd_cmd(*args: str) -> list[str]:
    """The command line of a real ``soakd`` subprocess (the installed module)."""
    return [sys.executable, "-m", "soakd", *args]


#: the commands that read a database (or write one: prune, merge, baseline) and print, and
#: run no soak, start no server and load no model: ``run_cli`` runs them through
#: soakd.cli.main in this process, as sqlite-utils' tests run its CLI. A subprocess each paid
#: ~0.5 s of CPU to start Python and import the CLI, about a tenth of the suite's CPU
#: (docs/benchmarks.md, "The test suite's wall time"); what the command does is the same
IN_PROCESS = frozenset(
    {"runs", "show", "report", "gate", "export", "compare", "baseline", "merge", "prune"}
)


def run_cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``soakd ARGS`` from the repository root: its exit code, stdout and stderr. A command
    of ``IN_PROCESS`` given no ``env`` and called from the main thread runs in this process
    (the captured stdout is the process's: calls from a pool of threads get subprocesses).
    Any other (``run``, ``plan``, ``profile``, ``sweep``, ...) or one given ``env`` (e.g. the
    ``subprocess_env`` fixture) runs as a real subprocess. A test that needs a process of its
    own (a signal, a pipe, exit at interpreter shutdown) uses ``soakd_cmd``."""
    if env is None and args and args[0] in IN_PROCESS and _main_thread():
        return _in_process(list(args))
    return subprocess.run(
        soakd_cmd(*args), capture_output=True, text=True, cwd=REPO, timeout=timeout, env=env
    )


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _in_process(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``soakd ARGV`` through soakd.cli.main, stdout and stderr captured as a subprocess's
    pipes would be (bytes decoded as text with universal newlines, no terminal), the working
    directory the repository's for the call."""
    from soakd.cli import main

    pipes = [_Pipe(), _Pipe()]
    out, err = (io.TextIOWrapper(pipe, encoding="utf-8", write_through=True) for pipe in pipes)
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        os.chdir(cwd)
    text = [_text(pipe.getvalue().decode()) for pipe in pipes]
    return subprocess.CompletedProcess(soakd_cmd(*argv), code, *text)


class _Pipe(io.BytesIO):
    """What a command wrote, kept when it closes its stdout (as a process may)."""

    def close(self) -> None:
        pass


def _text(decoded: str) -> str:
    """What ``text=True`` makes of a pipe's output: universal newlines."""
    return decoded.replace("\r\n", "\n").replace("\r", "\n")


#: the settings every short soak of a served model (openai, realtime) shares: a small
#: picture, 100 ms samples, 12 memory-floor windows of 0.3 s in the 4 s after a 1 s warm-up,
#: and the busy suite machine's host load not judged (SYNTH_CLI says why)
SERVED_SHORT_RUN = (
    "run.sample_interval_ms=100",
    "run.log_every=0",
    "source.width=64",
    "source.height=48",
    "criteria.min_duration_s=1",
    "criteria.min_frames=5",
    "criteria.floor_window_s=0.3",
    "criteria.contended_cpu_pct=100",
)


def error_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are not structured log records (the JSON lines soakd logs
    when stderr is not a terminal, e.g. a ``phase`` line before a model loads): what a person
    reads as the error."""
    out = []
    for line in stderr.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not (isinstance(rec, dict) and "msg" in rec and "level" in rec):
            out.append(line)
    return out


@pytest.fixture
def subprocess_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env.pop("STATE_DIRECTORY", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


_made_runs = itertools.count(1)


def make_run(conn: sqlite3.Connection, **overrides: Any) -> str:
    """Write one ``runs`` row through ``soakd.store.runs`` (open_run, then close_run unless
    ``status="running"``) and return its id. Any ``NewRun`` field, ``status``, ``reason``,
    ``started_unix``, ``duration_s`` and ``summary`` can be overridden; ``host`` and ``pid``
    (which open_run takes from this process) are set afterwards when given. ``config`` may be
    a dict or ``Settings`` (then ``config_hash`` and ``workload_kind`` follow it)."""
    o = dict(overrides)
    cfg = o.pop("config", {})
    if isinstance(cfg, Settings):
        o.setdefault("config_hash", cfg.config_hash())
        o.setdefault("workload_kind", cfg.workload.kind)
        cfg = cfg.to_dict()
    run = NewRun(
        id=o.pop("id", f"run{next(_made_runs):04d}"),
        name=o.pop("name", None),
        mode=o.pop("mode", "soak"),
        workload_kind=o.pop("workload_kind", "synthetic"),
        fps=o.pop("fps", None),
        config=cfg,
        config_hash=o.pop("config_hash", "h"),
        workload=o.pop("workload", {}),
        environment=o.pop("environment", {}),
    )
    started = float(o.pop("started_unix", time.time()))
    status = o.pop("status", "completed")
    duration = o.pop("duration_s", None)
    host, pid = o.pop("host", None), o.pop("pid", None)
    close = {
        "reason": o.pop("reason", None),
        "summary": o.pop("summary", {}),
        "duration_s": duration,
    }
    if o:
        raise TypeError(f"make_run: unknown fields {sorted(o)}")
    with atomic(conn):
        open_run(conn, run, started)
        if status != "running":
            end = started + (duration or 0.0)
            close_run(conn, run.id, status=status, ended_unix=end, **close)
        if host is not None or pid is not None:  # open_run records this process's own
            conn.execute(
                "UPDATE runs SET host = coalesce(?, host), pid = coalesce(?, pid) WHERE id = ?",
                (host, pid, run.id),
            )
    return run.id


#: the test files that hold a worker longest, longest first (seconds in one suite run:
#: docs/benchmarks.md; mostly waiting on soaks, a real Prometheus, systemd or Slurm):
#: collected first, so pytest-xdist (--dist loadfile --no-loadscope-reorder, .ci/test) starts
#: them first and the rest fill around them (last, they would add their whole length to the
#: suite's wall time; xdist's own reorder, by number of tests, started the 180 s Prometheus
#: file, two tests, near the end)
LONGEST_FIRST = (
    "test_verdict.py", "test_prometheus_server.py", "test_openai.py", "test_docs.py",
    "test_report_browser.py", "test_cli_grammar.py", "test_cli.py", "test_run_outcomes.py",
    "test_nspawn.py", "test_streams.py", "test_store_faults.py", "test_bench_smoke.py",
    "test_install.py", "test_openai_serve.py", "test_report.py", "test_verdict_shapes.py",
    "test_terminal_width.py", "test_early_stop.py", "test_systemd_unit.py", "test_slurm.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its order

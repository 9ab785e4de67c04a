"""A served model's odd answers, through real sockets to tests/openai_test_server.py (a test
fixture, not a model): each is data (an error row naming its kind, or a good answer), never
a crash, a hang past ``workload.request_timeout_s`` or a success that was not one."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from soakd.config import load_settings
from soakd.observers.base import RunResult
from soakd.run.runner import run_soak
from tests.openai_test_server import ServerProcess, start_server

pytestmark = pytest.mark.slow


@pytest.fixture
def soak(db_path: Path) -> Iterator[Callable[..., RunResult]]:
    """Start the fixture with ``args`` and soak it for 3 s at 4 fps (``overrides`` more)."""
    started: list[ServerProcess] = []

    def run(*args: str, overrides: tuple[str, ...] = ()) -> RunResult:
        srv = start_server(*args)
        started.append(srv)
        base = [
            "workload.kind=openai",
            f"workload.base_url={srv.base_url!r}",
            "workload.max_tokens=6",
            "workload.ready_timeout_s=10",
            f"run.db={str(db_path)!r}",
            "run.duration=3",
            "run.fps=4",
            "run.warmup_s=0.5",
            "run.log_every=0",
            "source.width=64",
            "source.height=48",
            "criteria.min_duration_s=1",
            "criteria.min_frames=3",
        ]
        return run_soak(load_settings(overrides=[*base, *overrides]))

    yield run
    for s in started:
        s.stop()


def errors(db: Path, run_id: str) -> list[str | None]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT error FROM frames WHERE run_id = ? AND t_done IS NOT NULL ORDER BY frame_id",
            (run_id,),
        )
        return [r[0] for r in rows]


def test_a_token_count_of_10_to_the_23_is_an_error_row_not_an_exit_4(soak, db_path) -> None:
    """usage.completion_tokens = 10**23: each answer a 'malformed' error row, the run ends
    completed and judged (no 'int too large' abort)."""
    res = soak("--huge-usage")
    assert res.status == "completed", res.reason
    assert res.exit_code != 4
    errs = errors(db_path, res.run_id)
    assert len(errs) >= 5
    assert all(e is not None and e.startswith("RequestFailed: malformed: usage.") for e in errs)


def test_tokens_that_decode_to_no_text_are_a_whole_answer(soak, db_path) -> None:
    """A valid stream whose deltas are empty and whose usage counts 6 tokens: no error,
    6 tokens on every frame."""
    res = soak("--usage-only")
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute(
            "SELECT error, out_tokens FROM frames WHERE run_id = ? AND t_done IS NOT NULL",
            (res.run_id,),
        ).fetchall()
    assert len(rows) >= 5
    assert rows == [(None, 6)] * len(rows)


def test_request_timeout_is_a_deadline_for_the_whole_answer(soak, db_path) -> None:
    """A server sending an SSE comment every 0.2 s and never a token: each request ends a
    'timeout' error at request_timeout_s = 1 s; the 3 s run ends completed, not stalled."""
    t0 = time.monotonic()
    res = soak("--keepalive-ms", "200", overrides=("workload.request_timeout_s=1",))
    took = time.monotonic() - t0
    assert res.status == "completed", res.reason
    assert took < 20  # (a per-read timeout: no request ever ends, the run stalls at 60 s)
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute(
            "SELECT error, t_done - t_dispatch FROM frames WHERE run_id = ? AND t_done IS NOT NULL",
            (res.run_id,),
        ).fetchall()
    assert len(rows) >= 2
    for error, seconds in rows:
        assert error.startswith("RequestFailed: timeout: ReadTimeout: no whole answer within")
        assert 1.0 <= seconds < 1.0 + 2.0  # the deadline (and a loaded host's lateness)


def test_a_stream_closed_cleanly_after_its_first_token_is_truncated(soak, db_path) -> None:
    """Every 2nd stream ends after one token with no finish_reason, usage or [DONE]: an
    error row 'truncated', never a 1-token answer; the others are whole."""
    res = soak("--cut-every", "2")
    errs = errors(db_path, res.run_id)
    assert len(errs) >= 6
    cut = [e for e in errs if e is not None]
    assert cut and all(e.startswith("RequestFailed: truncated: the stream ended") for e in cut)
    assert len(cut) in range(len(errs) // 2 - 1, len(errs) // 2 + 2)
    with sqlite3.connect(db_path) as conn:
        tokens = conn.execute(
            "SELECT DISTINCT out_tokens FROM frames WHERE run_id = ? AND error IS NULL AND "
            "t_done IS NOT NULL",
            (res.run_id,),
        ).fetchall()
    assert tokens == [(6,)]


def test_chunks_of_a_wrong_shape_are_malformed_not_a_python_error(soak, db_path) -> None:
    """choices not a list, a choice not an object, delta a string, content a list: each an
    error row of kind 'malformed' (never AttributeError / TypeError)."""
    res = soak("--odd-shapes")
    errs = errors(db_path, res.run_id)
    assert len(errs) >= 8
    assert all(e is not None and e.startswith("RequestFailed: malformed: ") for e in errs), errs
    assert len({e.split(":")[2] for e in errs if e}) == 4  # the four shapes, each named

"""The exit code is the verdict: real `soakd run` and `soakd gate` subprocesses on planted
synthetic soaks, the settings that must be refused before a run starts, and the record
fields the verdict's timing rules rest on."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis.model import Verdict
from soakd.clock import MonotonicClock
from soakd.config import ConfigError, load_settings
from soakd.errors import ExitCode
from soakd.records import Frame
from soakd.run.drivers.context import DriverContext, WarmUp
from soakd.run.outcome import Outcome, exit_code
from soakd.run.sink import FrameSink

from .conftest import SYNTH_CLI as SYNTH
from .conftest import run_cli

SOAKS = {"healthy": [], "errors": ["--set", "workload.error_every=3"]}


def _stored(db: Path) -> tuple[str, int]:
    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT verdict, exit_code FROM runs").fetchall()
    finally:
        conn.close()
    assert len(row) == 1, row
    return str(row[0][0]), int(row[0][1])


@pytest.fixture(scope="module")
def soaks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, Path, str]]:
    """Each planted soak run once through the real CLI: (exit code, database, stderr)."""
    out = {}
    for name, extra in SOAKS.items():
        db = tmp_path_factory.mktemp(name) / "soakd.db"
        r = run_cli(
            "run", "--duration", "4s", "--fps", "20", "--db", str(db), "--no-live",
            *SYNTH, *extra,
        )  # fmt: skip
        out[name] = (r.returncode, db, r.stderr[-2000:])
    return out


@pytest.mark.slow
def test_soakd_run_exits_with_the_stored_verdict_0_pass_1_fail(
    soaks: dict[str, tuple[int, Path, str]],
) -> None:
    """A healthy synthetic soak exits 0 with PASS stored; the same soak raising on every
    3rd frame exits 1 with FAIL stored; each run's exit code is the one stored with it."""
    got = {name: (rc, *_stored(db)) for name, (rc, db, _) in soaks.items()}
    assert got == {"healthy": (0, "PASS", 0), "errors": (1, "FAIL", 1)}, soaks


@pytest.mark.slow
def test_soakd_gate_exits_with_the_verdict_of_the_run(
    soaks: dict[str, tuple[int, Path, str]],
) -> None:
    """`soakd gate --latest` on each soak's database exits 0 for the PASS, 1 for the FAIL."""
    got = {name: run_cli("gate", "--latest", "--db", str(db)).returncode
           for name, (_, db, _) in soaks.items()}  # fmt: skip
    assert got == {"healthy": 0, "errors": 1}


@pytest.mark.parametrize("fps", ["0", "-1"])
def test_a_frame_rate_of_zero_or_less_is_refused(fps: str) -> None:
    """run.fps must be > 0: the config loader refuses 0 and negatives, naming the key."""
    with pytest.raises(ConfigError, match=r"run\.fps"):
        load_settings(overrides=["workload.kind=synthetic", f"run.fps={fps}"])


def test_soakd_run_fps_0_is_a_one_line_usage_error_exit_2(tmp_path: Path) -> None:
    """`soakd run --fps 0` exits 2 with one `soakd: error: ... run.fps ...` line and never
    opens a run."""
    db = tmp_path / "soakd.db"
    r = run_cli("run", "--fps", "0", "--duration", "2s", "--db", str(db), "--no-live", *SYNTH)
    assert r.returncode == ExitCode.USAGE, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("soakd: error:") and "run.fps" in lines[0]
    assert not db.exists() or _count_runs(db) == 0


def _count_runs(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def test_lateness_is_grab_start_minus_deadline_and_age_is_dispatch_minus_capture() -> None:
    """docs/schema.md: lateness_ms = grab start - deadline, frame_age_ms = dispatch -
    capture. A frame due at 1.000 s whose grab started at 1.002 s and took 3 ms, dispatched
    at 1.050 s, is 2 ms late and 45 ms old."""
    ms = 1_000_000
    t0 = 10_000 * ms
    ctx: DriverContext[None] = DriverContext(
        settings=load_settings(overrides=["workload.kind=synthetic"]),
        workload=None,
        clock=MonotonicClock(),
        t0_ns=t0,
        stop=threading.Event(),
        sink=FrameSink(lambda batch: None, t0),
        emit=lambda r: None,
        event=lambda e: None,
        queue=None,
        grab=None,
        warm=WarmUp(t0),
    )
    frame = Frame(
        id=7,
        t_sched_ns=t0 + 1000 * ms,
        t_capture_ns=t0 + 1005 * ms,
        grab_ns=3 * ms,
        image=np.zeros((2, 2, 3), np.uint8),
    )
    rec = ctx.record(frame, 0, t0 + 1050 * ms)
    assert rec.lateness_ms == pytest.approx(2.0)
    assert rec.frame_age_ms == pytest.approx(45.0)
    assert (rec.t_sched, rec.t_capture, rec.t_dispatch) == pytest.approx((1.0, 1.005, 1.05))


def _verdict(status: str, code: ExitCode) -> Verdict:
    return Verdict(run_id="r", status=status, exit_code=code, reason="", criteria=[])


@pytest.mark.parametrize(
    ("status", "code"),
    [("PASS", ExitCode.PASS), ("FAIL", ExitCode.FAIL), ("INVALID", ExitCode.INVALID)],
)
def test_a_judged_run_exits_with_its_verdict_unless_soakd_itself_failed(
    status: str, code: ExitCode
) -> None:
    """exit_code: the verdict's code (0 / 1 / 3) for a run that ended on its own or was
    aborted; 4 whenever soakd itself failed, whatever the verdict says."""
    v = _verdict(status, code)
    assert exit_code(Outcome("completed"), v) == code
    assert exit_code(Outcome("aborted", "signal SIGTERM"), v) == code
    assert exit_code(Outcome("completed", None, internal=True), v) == ExitCode.INTERNAL


def test_an_unjudged_run_exits_0_only_when_it_completed() -> None:
    """A profile (no verdict): 0 when it ran its course, 3 when it was aborted."""
    assert exit_code(Outcome("completed"), None) == ExitCode.PASS
    assert exit_code(Outcome("aborted", "stalled"), None) == ExitCode.INVALID

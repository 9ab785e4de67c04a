"""End-to-end soaks with real components: real threads, a real SQLite file, real video and
image files written by OpenCV, real subprocesses and signals."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest

from soakd.config import Settings
from soakd.errors import ExitCode
from soakd.run.runner import run_soak

from .conftest import soakd_cmd

pytestmark = pytest.mark.slow


def q(db: Path, sql: str, *args: object) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def test_counts_match_rate_duration_and_interval(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """A 3 s run at 20 fps stores ~60 frames and ~30 samples at 100 ms, flags the first frame
    and the warm-up, and closes the run as completed."""
    res = run_soak(
        synthetic("workload.infer_ms=5", "workload.pre_ms=1", "workload.decode_ms=1"), judge=False
    )
    assert res.status == "completed" and res.reason is None
    ((n, first, warm, errs, drops),) = q(
        db_path,
        "SELECT count(*), sum(first), sum(warmup), count(error), max(drop_count) "
        "FROM frames WHERE run_id = ?",
        res.run_id,
    )
    assert 57 <= n <= 62, n
    assert first == 1 and 9 <= warm <= 12 and errs == 0 and drops == 0
    ((ns, seq_ok),) = q(
        db_path,
        "SELECT count(*), max(seq) = count(*) - 1 FROM samples WHERE run_id = ?",
        res.run_id,
    )
    assert 26 <= ns <= 32 and seq_ok
    ((rss,),) = q(db_path, "SELECT min(rss_bytes) FROM samples WHERE run_id = ?", res.run_id)
    assert rss > 10 << 20  # a real RSS reading
    ((status, env, cfg_hash, _verdict),) = q(
        db_path,
        "SELECT status, environment, config_hash, verdict FROM runs WHERE id = ?",
        res.run_id,
    )
    assert status == "completed" and '"host"' in env and len(cfg_hash) == 16
    # frames: stage times add up, age is small for a workload faster than the rate
    rows = q(
        db_path,
        "SELECT grab_ms + pre_ms + infer_ms + decode_ms - total_ms, frame_age_ms,"
        " lateness_ms FROM measured_frames WHERE run_id = ?",
        res.run_id,
    )
    assert all(abs(r[0]) < 1e-6 for r in rows)
    assert max(r[1] for r in rows) < 20 and max(r[2] for r in rows) < 20


def test_slow_workload_drops_frames(synthetic: Callable[..., Settings], db_path: Path) -> None:
    """A workload slower than the frame rate drops frames: every captured frame is either
    dispatched or counted as a drop."""
    res = run_soak(
        synthetic("run.fps=50", "workload.infer_ms=45", "workload.jitter=0"), judge=False
    )
    s = res.summary
    assert s["drops"] > 60
    ((dispatched, last_drop, max_id),) = q(
        db_path,
        "SELECT count(*), max(drop_count), max(frame_id) FROM frames WHERE run_id = ?",
        res.run_id,
    )
    assert dispatched == s["frames_dispatched"]
    # drop_count is taken at dispatch: every earlier frame was dispatched or dropped
    assert max_id + 1 - dispatched == last_drop
    # the queue may still hold one undispatched frame at the end
    assert s["frames_captured"] - dispatched - s["drops"] in (0, 1)
    assert 15 <= res.summary["achieved_fps"] <= 22


def test_oldest_consumption_ages_frames_and_skips_stale(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """consume = "oldest" with a deep queue lets frame age grow; frames older than max_age_ms
    are skipped and counted as stale, never dispatched."""
    res = run_soak(
        synthetic(
            "run.fps=40",
            "run.max_queue=16",
            'run.consume="oldest"',
            "run.max_age_ms=150",
            "workload.infer_ms=40",
            "workload.jitter=0",
        ),
        judge=False,
    )
    ((skipped, stale, dispatched_old),) = q(
        db_path,
        "SELECT sum(skipped), max(stale_count), "
        "sum(skipped = 0 AND frame_age_ms > 150 AND first = 0) FROM frames WHERE run_id = ?",
        res.run_id,
    )
    assert skipped > 0 and stale == skipped == res.summary["stale"]
    assert dispatched_old == 0
    ages = [
        r[0]
        for r in q(
            db_path,
            "SELECT frame_age_ms FROM frames WHERE run_id = ? AND "
            "skipped = 0 ORDER BY frame_id LIMIT 10",
            res.run_id,
        )
    ]
    assert ages[-1] > ages[1]  # age rises as the queue fills


def test_workload_errors_are_recorded_and_the_run_goes_on(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """Every 5th infer raises: the error text is stored on its frame and in events."""
    res = run_soak(synthetic("workload.error_every=5", "workload.infer_ms=2"), judge=False)
    assert res.status == "completed"
    errs = q(
        db_path,
        "SELECT frame_id, error, total_ms, infer_ms FROM frames WHERE run_id = ? "
        "AND error IS NOT NULL",
        res.run_id,
    )
    assert len(errs) == res.summary["errors"] >= 10
    assert all("planted error" in e[1] and e[2] is None and e[3] is None for e in errs)
    ((nev,),) = q(
        db_path, "SELECT count(*) FROM events WHERE run_id = ? AND kind = 'error'", res.run_id
    )
    assert nev == len(errs)


def test_stalled_workload_aborts_the_run(synthetic: Callable[..., Settings], db_path: Path) -> None:
    """A model that hangs is recorded as a stall and the run ends aborted, not hung."""
    t = time.monotonic()
    res = run_soak(
        synthetic("run.duration=30", "workload.stall_after_s=1", "run.stall_timeout_s=1"),
        judge=False,
    )
    assert time.monotonic() - t < 8
    assert res.status == "aborted" and res.reason == "stalled"
    assert q(db_path, "SELECT kind FROM events WHERE run_id = ? AND kind = 'stall'", res.run_id)
    ((status, reason),) = q(db_path, "SELECT status, reason FROM runs WHERE id = ?", res.run_id)
    assert (status, reason) == ("aborted", "stalled")


def _write_video(path: Path, n: int, fps: float, size: tuple[int, int] = (64, 48)) -> None:
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, size)
    assert w.isOpened()
    for i in range(n):
        img = np.full((size[1], size[0], 3), (i * 10) % 255, np.uint8)
        w.write(img)
    w.release()


def test_video_file_is_sampled_at_the_target_rate_and_looped(
    synthetic: Callable[..., Settings], db_path: Path, tmp_path: Path
) -> None:
    """A 1 s clip at 25 fps soaked at 10 fps for 3 s loops and yields ~30 frames."""
    clip = tmp_path / "clip.avi"
    _write_video(clip, 25, 25.0)
    res = run_soak(
        synthetic(
            'source.kind="video"', f"source.path={str(clip)!r}", "run.fps=10", "workload.infer_ms=2"
        ),
        judge=False,
    )
    assert res.status == "completed"
    ((n,),) = q(db_path, "SELECT count(*) FROM frames WHERE run_id = ?", res.run_id)
    assert 28 <= n <= 32


def test_video_that_ends_aborts_with_reason(
    synthetic: Callable[..., Settings], db_path: Path, tmp_path: Path
) -> None:
    """A clip without looping that ends mid-run is a source_end event and an aborted run."""
    clip = tmp_path / "short.avi"
    _write_video(clip, 10, 10.0)
    res = run_soak(
        synthetic(
            'source.kind="video"',
            f"source.path={str(clip)!r}",
            "source.loop=false",
            "run.duration=10",
            "workload.infer_ms=2",
        ),
        judge=False,
    )
    assert res.status == "aborted" and res.reason and res.reason.startswith("source ended")
    assert res.duration_s < 5
    assert q(db_path, "SELECT 1 FROM events WHERE run_id = ? AND kind = 'source_end'", res.run_id)


def test_image_folder_source(
    synthetic: Callable[..., Settings], db_path: Path, tmp_path: Path
) -> None:
    """A folder of images is read in order and looped."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i:03d}.png"), np.full((20, 30, 3), i * 50, np.uint8))
    res = run_soak(
        synthetic(
            'source.kind="images"',
            f"source.path={str(folder)!r}",
            "run.duration=1.5",
            "workload.infer_ms=1",
        ),
        judge=False,
    )
    assert res.status == "completed" and res.summary["frames_done"] >= 25


def test_reader_during_a_run_sees_consistent_rows(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """A reader polling the database while the run writes never fails and sees the frame
    count only grow, with drop counts consistent with frame order."""
    seen: list[int] = []
    problems: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
                rows = conn.execute(
                    "SELECT frame_id, drop_count FROM frames ORDER BY frame_id"
                ).fetchall()
                conn.close()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc) or "unable to open" in str(exc):
                    continue
                problems.append(str(exc))
                return
            seen.append(len(rows))
            drops = [r[1] for r in rows]
            if drops != sorted(drops):
                problems.append("drop_count not monotonic in frame order")
            time.sleep(0.05)

    t = threading.Thread(target=reader)
    t.start()
    try:
        run_soak(synthetic("run.fps=60", "workload.infer_ms=20"), judge=False)
    finally:
        stop.set()
        t.join(5)
    assert not problems, problems
    assert len(seen) > 10 and seen == sorted(seen) and seen[-1] > 0
    # rows became visible during the run, not only at its end (a flush about once a
    # second, with the monitor's tick: two counts at least, one before the last flush)
    assert len({n for n in seen if n > 0}) >= 2


def test_unopenable_source_is_a_usage_error_before_the_run(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """`soakd run` on a missing video file exits 2 with one line naming it; no run row."""
    db = tmp_path / "s.db"
    p = subprocess.run(
        soakd_cmd(
            "run",
            "--db",
            str(db),
            "--set",
            "workload.kind=synthetic",
            "--set",
            'source.kind="video"',
            "--set",
            f"source.path={str(tmp_path / 'nope.mp4')!r}",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env,
    )
    assert p.returncode == ExitCode.USAGE, p.stderr
    errline = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert errline and "nope.mp4" in errline[0]
    if db.exists():
        assert q(db, "SELECT count(*) FROM runs") == [(0,)]


def test_ctrl_c_stops_cleanly_with_everything_stored(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """SIGINT (Ctrl-C) ends `soakd run` as aborted with the signal as reason, INVALID
    (exit 3), with the frames so far stored."""
    db = tmp_path / "s.db"
    p = subprocess.Popen(
        soakd_cmd(
            "run",
            "--db",
            str(db),
            "--duration",
            "60s",
            "--fps",
            "20",
            "--set",
            "workload.kind=synthetic",
            "--set",
            "workload.infer_ms=5",
            "--no-live",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if db.exists():
            try:
                if q(db, "SELECT count(*) FROM frames")[0][0] >= 20:
                    break
            except sqlite3.OperationalError:
                pass
    p.send_signal(signal.SIGINT)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == ExitCode.INVALID, err[-2000:]
    ((status, reason, verdict),) = q(db, "SELECT status, reason, verdict FROM runs")
    assert status == "aborted" and reason == "signal SIGINT" and verdict == "INVALID"
    assert q(db, "SELECT count(*) FROM frames")[0][0] >= 20


def test_keyboard_interrupt_in_library_use_ends_the_run_cleanly(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """run_soak called from a script without signal handlers: Ctrl-C (SIGINT raising
    KeyboardInterrupt in the main thread) still closes the run as aborted, rows stored."""
    import os

    from soakd.observers.base import Observer

    class InterruptWhenReady(Observer):
        def on_ready(self) -> None:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()

    # a script's own SIGINT handling: Python's default (KeyboardInterrupt), whatever an
    # earlier test or the test runner's worker left installed
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        res = run_soak(synthetic("run.duration=30"), observers=[InterruptWhenReady()],
                       judge=False)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, before)
    assert (res.status, res.reason) == ("aborted", "signal SIGINT")
    assert res.duration_s < 10
    assert q(db_path, "SELECT status FROM runs") == [("aborted",)]
    assert q(db_path, "SELECT count(*) FROM frames")[0][0] > 0

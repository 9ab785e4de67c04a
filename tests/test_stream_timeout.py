"""A stream whose server accepts and never answers, through the real CLI in a subprocess:
the open times out cleanly, one line on stderr, exit code 2, no SIGABRT from a thread left
inside FFmpeg (issue 10, item 9)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from soakd.errors import ExitCode
from tests.conftest import REPO, error_lines, soakd_cmd
from tests.silent_server import silent_listener

pytestmark = pytest.mark.slow

OPEN_TIMEOUT_S = 2.0
SLACK_S = 6.0  # after the connection: the grace soakd gives FFmpeg's own timeout, then exit


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("NOTIFY_SOCKET", "STATE_DIRECTORY", "OPENCV_LOG_LEVEL", "OPENCV_FFMPEG_LOGLEVEL"):
        env.pop(key, None)
    return env


@pytest.mark.parametrize("scheme", ["rtsp", "http"])
def test_stream_that_accepts_and_never_answers_exits_2_with_one_line(
    scheme: str, tmp_path: Path
) -> None:
    """soakd run on a silent stream: exit 2 (not 134), one stderr line naming the URL and
    the timeout, within open_timeout_s + a few seconds of connecting."""
    accepted: list[float] = []
    with silent_listener(accepted) as port:
        url = f"{scheme}://127.0.0.1:{port}/x"
        cmd = soakd_cmd(
            "run", "--db", str(tmp_path / "soakd.db"), "--duration", "5s",
            "--set", "source.kind=stream", "--set", f"source.url={url}",
            "--set", f"source.open_timeout_s={OPEN_TIMEOUT_S}",
            "--set", "source.read_timeout_s=2",
        )  # fmt: skip
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=60
        )
        ended = time.monotonic()
    lines = error_lines(proc.stderr)
    assert proc.returncode == ExitCode.USAGE == 2, proc.stderr
    assert lines == [
        f"soakd: error: stream {url}: not opened within open_timeout_s = 2 s (no answer)"
    ], proc.stderr
    assert "terminate called" not in proc.stderr
    # timed from the connection, not the process start: a loaded host's slow imports are
    # not the open timeout's failure
    assert accepted and ended - accepted[0] < OPEN_TIMEOUT_S + SLACK_S


def test_thread_stuck_in_ffmpeg_at_exit_keeps_the_exit_code(tmp_path: Path) -> None:
    """A thread a source abandoned inside FFmpeg (tracked, its own timeout far away) when
    the CLI finishes: the process still leaves promptly with the command's own exit code."""
    script = textwrap.dedent(
        """
        import sys, threading, cv2
        from soakd.sources import native
        from soakd.cli import main

        params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 60000, cv2.CAP_PROP_READ_TIMEOUT_MSEC, 60000]
        url = "http://127.0.0.1:{}/x".format(sys.argv[1])
        stuck = threading.Thread(
            target=lambda: cv2.VideoCapture(url, cv2.CAP_FFMPEG, params), daemon=True
        )
        stuck.start()
        native.track(stuck)
        sys.argv = ["soakd", "run", "--bogus"]
        raise SystemExit(main())
        """
    )
    with silent_listener() as port:
        t = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", script, str(port)],
            capture_output=True, text=True, cwd=REPO, env=_env(), timeout=60,
        )  # fmt: skip
        elapsed = time.monotonic() - t
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "No such option: --bogus" in proc.stderr
    assert elapsed < 20  # the 60 s FFmpeg timeout was not waited for

"""`soakd run` as a service: a real subprocess with the synthetic workload, a real
sd_notify socket bound by the test, real signals, a real SQLite file and the exporter scraped
over loopback HTTP.

The signal-handler unit tests at the end raise real signals in this process or a child.

Waiting is event-driven: the test blocks on the notify socket (READY=1, the once-a-second
STATUS/WATCHDOG datagrams) or on the process's exit, never on sleeps or retries.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from soakd.service.signals import abort_reason, install_signal_handlers, signal_name

REPO = Path(__file__).resolve().parent.parent
WAIT_S = 30.0  # generous upper bound for any one expected message; never hit when all is well


Msg = dict[str, str]


@dataclass
class Daemon:
    """A `soakd run` subprocess and the service manager's end of its notify socket."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    db: Path
    stderr: Path
    seen: list[Msg]

    def next_message(self, timeout: float = WAIT_S) -> Msg:
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096)
        msg = dict(line.split("=", 1) for line in data.decode().split("\n"))
        self.seen.append(msg)
        return msg

    def wait_for(self, pred: Callable[[Msg], bool], what: str) -> Msg:
        """Read datagrams until one matches ``pred`` (fails if the process ends first)."""
        while True:
            try:
                msg = self.next_message()
            except TimeoutError:
                pytest.fail(f"no {what} within {WAIT_S} s; got {self.seen}; rc={self.proc.poll()}")
            if pred(msg):
                return msg

    def wait_watchdogs(self, n: int) -> None:
        for _ in range(n):
            self.wait_for(lambda m: "WATCHDOG" in m, "WATCHDOG=1")

    def finish(self, timeout: float = 60.0) -> int:
        """Wait for the exit, then collect every datagram still queued."""
        rc = self.proc.wait(timeout=timeout)
        self.sock.setblocking(False)
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return rc
            self.seen.append(dict(line.split("=", 1) for line in data.decode().split("\n")))


def _kinds(msgs: list[Msg]) -> list[str]:
    """Each datagram's main assignment (STATUS only when it came alone)."""
    return [next((k for k in m if k != "STATUS"), "STATUS") for m in msgs]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def _start(*args: str, duration: str = "60s", fps: int = 10) -> Daemon:
        name = f"soakd-e2e-{uuid.uuid4().hex}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(b"\0" + name.encode())
        db = tmp_path / "soakd.db"
        err = tmp_path / f"stderr-{len(started)}.log"
        env = {
            **os.environ,
            "NOTIFY_SOCKET": "@" + name,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        cmd = [
            sys.executable, "-m", "soakd", "run",
            "--set", "workload.kind=synthetic",
            "--set", "run.warmup_s=0",
            "--duration", duration, "--fps", str(fps),
            "--db", str(db), "--no-live", "--log-json",
            *args,
        ]  # fmt: skip
        with open(err, "wb") as ferr:
            proc = subprocess.Popen(
                cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=ferr
            )
        d = Daemon(proc, sock, db, err, [])
        started.append(d)
        return d

    yield _start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(timeout=30)
        d.sock.close()


def _run_row(db: Path) -> sqlite3.Row:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT * FROM runs ORDER BY started_unix DESC LIMIT 1").fetchone()
    finally:
        conn.close()


def _count(db: Path, sql: str, *params: object) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute(sql, params).fetchone()[0])
    finally:
        conn.close()


@pytest.mark.slow
def test_sigterm_notify_order_and_clean_abort(start: Callable[..., Daemon]) -> None:
    """READY, fed WATCHDOGs, then on SIGTERM: STOPPING and a run stored as aborted by SIGTERM."""
    d = start()
    d.wait_for(lambda m: m.get("READY") == "1", "READY=1")
    d.wait_watchdogs(2)
    d.proc.send_signal(signal.SIGTERM)
    rc = d.finish()

    kinds = _kinds(d.seen)
    assert kinds[0] == "STATUS" and d.seen[0]["STATUS"].startswith("starting run")
    ready = kinds.index("READY")
    stopping = kinds.index("STOPPING")
    assert ready < kinds.index("WATCHDOG") < stopping
    assert "READY" not in kinds[ready + 1 :] and "WATCHDOG" not in kinds[stopping:]
    assert d.seen[stopping]["STATUS"] == "stopping: signal SIGTERM"
    progress = [m["STATUS"] for m in d.seen[ready + 1 : stopping] if "WATCHDOG" in m]
    assert all(" fps, " in s and "drops " in s and "age p50 " in s for s in progress)

    row = _run_row(d.db)
    assert (row["status"], row["reason"]) == ("aborted", "signal SIGTERM")
    assert _count(d.db, "SELECT count(*) FROM frames WHERE run_id = ?", row["id"]) >= 10
    assert rc == 3
    assert _run_row(d.db)["verdict"] == "INVALID"
    assert d.seen[-1]["STATUS"].endswith("verdict INVALID, exit 3")


@pytest.mark.slow
def test_sigkill_leaves_a_consistent_db_and_the_next_command_marks_it_crashed(
    start: Callable[..., Daemon],
) -> None:
    """After SIGKILL the WAL database passes integrity_check, loses at most ~1 s of frames,
    and `soakd runs` marks the orphaned run as crashed."""
    fps = 10
    d = start(fps=fps)
    d.wait_for(lambda m: m.get("READY") == "1", "READY=1")
    d.wait_watchdogs(3)
    d.proc.send_signal(signal.SIGKILL)
    assert d.finish() == -signal.SIGKILL

    logged = [json.loads(line) for line in d.stderr.read_text().splitlines() if '"frame"' in line]
    logged_frames = [r for r in logged if r.get("msg") == "frame"]
    assert len(logged_frames) >= 2 * fps
    conn = sqlite3.connect(d.db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = conn.execute("SELECT count(*) FROM frames").fetchone()[0]
        status = conn.execute("SELECT status FROM runs").fetchone()[0]
    finally:
        conn.close()
    assert status == "running"  # nothing has looked at it yet
    lost = len(logged_frames) - stored
    assert 0 <= lost <= fps * 1.0 + 2, f"{lost} frames lost (flush interval is 1 s at {fps} fps)"

    out = subprocess.run(
        [sys.executable, "-m", "soakd", "runs", "--db", str(d.db), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert [r["status"] for r in runs] == ["crashed"]
    row = _run_row(d.db)
    assert row["status"] == "crashed" and "killed or power loss" in row["reason"]
    assert _count(d.db, "SELECT count(*) FROM events WHERE kind = 'crashed'") == 1


@pytest.mark.slow
def test_stall_starves_the_watchdog_and_aborts_as_stalled(start: Callable[..., Daemon]) -> None:
    """A model that hangs: WATCHDOG stops, a stall event is stored, the run ends 'stalled'."""
    d = start(
        "--set", "workload.stall_after_s=2", "--set", "run.stall_timeout_s=2.5", fps=10
    )  # fmt: skip
    d.wait_for(lambda m: m.get("READY") == "1", "READY=1")
    rc = d.finish()

    kinds = _kinds(d.seen)
    last_watchdog = len(kinds) - 1 - kinds[::-1].index("WATCHDOG")
    stopping = kinds.index("STOPPING")
    starved = [m["STATUS"] for m in d.seen[last_watchdog + 1 : stopping] if "STATUS" in m]
    assert any("NO FRAME FOR" in s for s in starved), d.seen
    assert any(s.startswith("stall: no frame finished") for s in starved), d.seen
    assert d.seen[stopping]["STATUS"] == "stopping: stalled"
    assert "WATCHDOG" not in kinds[last_watchdog + 1 :]

    row = _run_row(d.db)
    assert (row["status"], row["reason"]) == ("aborted", "stalled")
    assert _count(d.db, "SELECT count(*) FROM events WHERE kind = 'stall'") == 1
    assert rc == 3 and row["verdict"] == "INVALID"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_exporter_is_scraped_over_loopback_during_a_run(start: Callable[..., Daemon]) -> None:
    """`--metrics-addr` serves live frame counters and stage histograms for the running run."""
    port = _free_port()
    d = start("--metrics-addr", f"127.0.0.1:{port}")
    d.wait_for(lambda m: m.get("READY") == "1", "READY=1")
    d.wait_watchdogs(2)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    d.proc.send_signal(signal.SIGTERM)
    d.finish()

    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    run_id = _run_row(d.db)["id"]

    def one(name: str, **labels: str) -> float:
        hits = [v for (n, lbl), v in samples.items() if n == name and set(labels.items()) <= lbl]
        assert len(hits) == 1, (name, labels, len(hits))
        return hits[0]

    frames = one("soakd_frames_total", run=run_id, modelName="none")
    assert frames >= 10
    # a scrape reads each metric on its own while frames keep finishing: one frame apart
    assert abs(one("soakd_stage_latency_seconds_count", run=run_id, stage="infer") - frames) <= 1
    infer_mean = one("soakd_stage_latency_seconds_sum", stage="infer") / frames
    assert 0.010 < infer_mean < 0.2  # the synthetic infer stage is 20 ms
    assert one("soakd_target_frames_per_second", run=run_id) == 10
    assert one("soakd_run_status", status="running") == 1
    assert one("soakd_rss_bytes") > 10 * 2**20
    # a 20 ms model at 10 fps keeps up: a counter that counted frames (or ticks) would not
    assert one("soakd_dropped_frames_total") <= 0.1 * frames


def test_signal_handlers_route_sigterm_and_restore() -> None:
    """SIGTERM calls on_signal once with its number, and restore() puts the old handler back."""
    before = signal.getsignal(signal.SIGTERM)
    got: list[int] = []
    with install_signal_handlers(got.append) as sig:
        assert signal.getsignal(signal.SIGTERM) is not before
        signal.raise_signal(signal.SIGTERM)
    assert got == [signal.SIGTERM]
    assert sig.received == signal.SIGTERM and sig.reason == "signal SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    assert abort_reason(signal.SIGINT) == "signal SIGINT" and signal_name(99) == "signal 99"


def test_second_signal_forces_exit() -> None:
    """A second SIGINT while stopping ends the process at once with that signal."""
    code = (
        "import signal, time\n"
        "from soakd.service.signals import install_signal_handlers\n"
        "got = []\n"
        "install_signal_handlers(got.append)\n"
        "signal.raise_signal(signal.SIGINT)\n"
        "assert got == [signal.SIGINT], got\n"
        "signal.raise_signal(signal.SIGINT)\n"
        "raise SystemExit(7)  # not reached\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == -signal.SIGINT, proc.stderr


def test_handlers_need_the_main_thread() -> None:
    """Installing from another thread is refused with a clear error instead of a ValueError."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            install_signal_handlers(lambda signum: None)
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=body, name="test-not-main")
    t.start()
    t.join(timeout=10)
    assert len(errors) == 1 and "main thread" in str(errors[0])

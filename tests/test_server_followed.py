"""The served model's server is followed, not assumed (soakd/telemetry/server.py,
soakd/analysis/server.py): real uvicorn servers of tests/openai_test_server.py sharing a port
with SO_REUSEPORT, killed mid-run, real soaks into a real SQLite file."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from soakd.analysis.data import make_run_data
from soakd.analysis.model import RunMeta
from soakd.analysis.verdict import judge
from soakd.config import CriteriaSettings, Settings, load_settings
from soakd.run.runner import RunResult, run_soak
from soakd.telemetry.probes import Values
from soakd.telemetry.server import ServerProcessProbe, find_server
from tests.conftest import SERVED_SHORT_RUN, run_cli

pytestmark = pytest.mark.slow

MB = 1024**2
TESTS = Path(__file__).resolve().parent

# tests/openai_test_server.py's app on a socket bound with SO_REUSEPORT, so a second server
# can take the port over (a blue/green restart); prints "READY <port>" once it listens
_REUSEPORT = textwrap.dedent(
    """
    import asyncio, socket, sys
    import uvicorn
    sys.path.insert(0, sys.argv.pop(1))
    import openai_test_server as fixture

    opts = fixture.build_parser().parse_args(sys.argv[1:])
    sys.stdin.readline()  # bind on cue: the start-up's imports are paid before it
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", opts.port))
    sock.listen(128)

    async def serve():
        config = uvicorn.Config(fixture.create_app(opts), lifespan="off",
                                log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        print("READY", sock.getsockname()[1], flush=True)
        await task

    asyncio.run(serve())
    """
)


class Shared:
    """Fixture servers on one port (SO_REUSEPORT), each a real process."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.port = 0

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        """A server process that has imported everything and binds when ``bind`` tells it:
        on a loaded host its start-up can take seconds, its takeover then does not."""
        argv = [sys.executable, "-c", _REUSEPORT, str(TESTS), "--port", str(self.port), *args]
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def bind(self, proc: subprocess.Popen[str]) -> subprocess.Popen[str]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        line = proc.stdout.readline()  # "" when it exited before it listened
        assert line.startswith("READY "), f"fixture server did not start: {line!r}"
        self.port = int(line.split()[1])
        return proc

    def start(self, *args: str) -> subprocess.Popen[str]:
        return self.bind(self.spawn(*args))

    def kill(self, proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)


@pytest.fixture
def shared() -> Iterator[Shared]:
    s = Shared()
    yield s
    s.close()


def _settings(db: Path, port: int, *overrides: str) -> Settings:
    return load_settings(
        overrides=[
            "workload.kind=openai",
            f"workload.base_url='http://127.0.0.1:{port}/v1'",
            "workload.max_tokens=4",
            "workload.ready_timeout_s=10",
            "workload.unreachable_timeout_s=60",
            f"run.db={str(db)!r}",
            "run.fps=6",
            "run.warmup_s=1",
            *SERVED_SHORT_RUN,
            "criteria.max_memory_growth_mb_per_min=40",
            *overrides,
        ]
    )


def _soak_while(settings: Settings, act: Any) -> RunResult:
    """run_soak in a thread while ``act()`` runs in this one; the run's result."""
    out: list[RunResult] = []
    runner = threading.Thread(target=lambda: out.append(run_soak(settings)))
    runner.start()
    try:
        act()
    finally:
        runner.join(60)
    assert out, "the soak did not finish"
    return out[0]


def _events(db: Path, run_id: str, kind: str) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as c:
        rows = c.execute(
            "SELECT t, message, data FROM events WHERE run_id = ? AND kind = ? ORDER BY t",
            (run_id, kind),
        ).fetchall()
    return [{"t": t, "message": m, "data": json.loads(d or "null")} for t, m, d in rows]


def _verdict(db: Path, run_id: str, criterion: str) -> tuple[str, str]:
    with sqlite3.connect(db) as c:
        row = c.execute(
            "SELECT status, detail FROM verdicts WHERE run_id = ? AND criterion = ?",
            (run_id, criterion),
        ).fetchone()
    return row[0], row[1]


def _after(seconds: float, since: float) -> None:
    time.sleep(max(0.0, since + seconds - time.monotonic()))


def _run_started(db: Path, timeout: float = 60) -> float:
    """The monotonic time at which the soak writing ``db`` stored its run row: the run's
    clock starts about then, however long a loaded host took to get there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with closing(sqlite3.connect(db)) as c:
                if c.execute("SELECT count(*) FROM runs").fetchone()[0]:
                    return time.monotonic()
        except sqlite3.OperationalError:  # the file or its schema not written yet
            pass
        time.sleep(0.05)
    raise AssertionError("the soak never stored its run row")


# --------------------------------------------------------------------------- real soaks


def test_a_server_replaced_on_its_port_is_followed_and_its_leak_fails(
    db_path: Path, shared: Shared
) -> None:
    """A second server takes the port over (SO_REUSEPORT) and the first is killed mid-run:
    a server_replaced event (old and new pid), the samples follow the new process, and
    memory_server_rss FAILs on the new server's leak though the first one's memory was
    flat."""
    first = shared.start()
    s = _settings(db_path, shared.port, "run.duration=13")
    holder: dict[str, subprocess.Popen[str]] = {}

    pending = shared.spawn("--leak-mb-per-request", "1")  # ~360 MB/min at 6 fps

    def replace() -> None:
        t0 = _run_started(db_path)
        _after(3.0, t0)
        holder["second"] = shared.bind(pending)
        shared.kill(first)

    result = _soak_while(s, replace)
    second = holder["second"]
    replaced = _events(db_path, result.run_id, "server_replaced")
    assert len(replaced) == 1, replaced
    data = replaced[0]["data"]
    assert (data["old_pid"], data["new_pid"]) == (first.pid, second.pid)
    assert f"{first.pid}" in replaced[0]["message"] and f"{second.pid}" in replaced[0]["message"]
    with sqlite3.connect(db_path) as c:
        last = c.execute(
            "SELECT server_rss_bytes FROM samples WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
            (result.run_id,),
        ).fetchone()[0]
    real = psutil.Process(second.pid).memory_info().rss
    assert last is not None and abs(last - real) < 0.2 * real  # the new process, sampled
    status, detail = _verdict(db_path, result.run_id, "memory_server_rss")
    assert status == "fail", detail
    assert str(second.pid) in detail
    shown = run_cli("show", result.run_id, "--db", str(db_path))
    assert f"pid {first.pid} replaced by pid {second.pid}" in shown.stdout, shown.stdout


def test_a_replacement_too_short_to_judge_is_invalid_never_pass(
    db_path: Path, shared: Shared
) -> None:
    """A server replaced too late in the run for its own memory to be judged: INVALID "the
    server was replaced at t = ...", never PASS on the first server's samples."""
    first = shared.start()
    s = _settings(db_path, shared.port, "run.duration=9")
    second = shared.spawn()

    def replace() -> None:
        t0 = _run_started(db_path)
        _after(6.5, t0)  # leaves the new server ~2.5 s: under 12 windows of 0.3 s
        shared.bind(second)
        shared.kill(first)

    result = _soak_while(s, replace)
    replaced = _events(db_path, result.run_id, "server_replaced")
    assert len(replaced) == 1, replaced
    status, detail = _verdict(db_path, result.run_id, "memory_server_rss")
    assert status == "invalid", detail
    assert f"replaced at t = {replaced[0]['t']:.1f} s" in detail


def test_a_server_that_dies_with_no_replacement_is_lost_and_never_pass(
    db_path: Path, shared: Shared
) -> None:
    """A server killed mid-run with nothing taking its port: a server_lost event naming its
    pid, and memory_server_rss is not PASS on the dead process's samples."""
    first = shared.start()
    s = _settings(db_path, shared.port, "run.duration=8")

    def kill() -> None:
        t0 = _run_started(db_path)
        _after(5.0, t0)
        shared.kill(first)

    result = _soak_while(s, kill)
    lost = _events(db_path, result.run_id, "server_lost")
    assert len(lost) == 1, lost
    assert lost[0]["data"]["pid"] == first.pid
    status, detail = _verdict(db_path, result.run_id, "memory_server_rss")
    assert status in ("invalid", "fail"), detail
    assert "lost at t =" in detail


# --------------------------------------------------------------------------- the probe

# a stand-in server holding ``MB`` megabytes, listening with SO_REUSEPORT on PORT (0: any);
# prints its port; a line on stdin closes its socket (it lives on, serving nothing)
_HOLDER = textwrap.dedent(
    """
    import socket, sys, time
    held = bytearray(b"\\x01") * (int(sys.argv[2]) << 20)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen()
    print(s.getsockname()[1], flush=True)
    sys.stdin.readline()
    s.close()
    print(flush=True)
    time.sleep(60)
    """
)


def _holder(port: int, mb: int) -> tuple[subprocess.Popen[str], int]:
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(port), str(mb)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def _sample(probe: ServerProcessProbe) -> Values:
    into: Values = {}
    probe.sample(into)
    return into


def test_the_probe_follows_the_port_to_a_new_process_and_says_so() -> None:
    """Port mode: when the sampled process exits and another holds the port, the next tick
    samples the new one (its own RSS) and hands on one server_replaced naming both pids;
    with nothing left on the port, one server_lost."""
    a, port = _holder(0, 10)
    b = None
    try:
        settings = load_settings(
            overrides=["workload.kind=openai", f"workload.base_url='http://127.0.0.1:{port}/v1'"]
        )
        pid, mem, _how = find_server(settings)
        probe = ServerProcessProbe(pid, mem, port=port)
        assert (_sample(probe).get("server_rss_bytes") or 0) > 10 * MB
        b, _ = _holder(port, 60)
        a.kill()
        a.wait(5)
        got = _sample(probe)
        assert abs((got.get("server_rss_bytes") or 0) - psutil.Process(b.pid).memory_info().rss) < (
            5 * MB
        )
        events = probe.take_changes()
        assert [(e.kind, e.data["old_pid"], e.data["new_pid"]) for e in events] == [
            ("server_replaced", a.pid, b.pid)
        ]
        b.kill()
        b.wait(5)
        assert _sample(probe).get("server_rss_bytes") is None
        lost = probe.take_changes()
        assert [(e.kind, e.data["pid"]) for e in lost] == [("server_lost", b.pid)]
        assert _sample(probe).get("server_rss_bytes") is None
        assert probe.take_changes() == []  # lost once, not once a tick
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(5)


# a server that starts a worker holding 30 MB when told to (a line on stdin), and ends it
# on the next line
_SPAWNER = textwrap.dedent(
    """
    import subprocess, sys
    print(flush=True)
    sys.stdin.readline()
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; held = bytearray(b'\\x01') * (30 << 20); "
         "print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    worker.stdout.readline()
    print(worker.pid, flush=True)
    sys.stdin.readline()
    worker.kill()
    worker.wait()
    print(flush=True)
    sys.stdin.readline()
    """
)


def test_a_port_that_changes_hands_is_followed_though_the_old_server_lives_on() -> None:
    """The sampled server closes its listening socket (alive, serving nothing) while
    another process listens on the port: within TREE_REFRESH_S the probe says
    server_replaced and samples the new one."""
    from soakd.telemetry import server as srv

    a, port = _holder(0, 10)
    b = None
    try:
        probe = ServerProcessProbe(a.pid, port=port)
        b, _ = _holder(port, 60)
        assert a.stdin is not None and a.stdout is not None
        a.stdin.write("close\n")
        a.stdin.flush()
        a.stdout.readline()
        deadline = time.monotonic() + srv.TREE_REFRESH_S + 5
        changes: list[Any] = []
        while not changes:
            assert time.monotonic() < deadline, "the port's new holder was never followed"
            _sample(probe)
            changes = probe.take_changes()
            time.sleep(0.1)
        assert [(c.kind, c.data["old_pid"], c.data["new_pid"]) for c in changes] == [
            ("server_replaced", a.pid, b.pid)
        ]
        assert (_sample(probe).get("server_rss_bytes") or 0) > 60 * MB
        assert a.poll() is None  # the old server lives on: it left the port, it did not die
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(5)


def test_the_port_is_checked_by_the_socket_s_fd_not_the_host_s_tcp_table_each_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Port mode, the tree listed on every tick: while the server holds the socket it was
    found listening with, the host's TCP table (psutil's net_connections, milliseconds on a
    busy host) is read once, not at every refresh; once it closes that socket, the table is
    read again and the port's new holder is followed."""
    from soakd.telemetry import server as srv

    monkeypatch.setattr(srv, "TREE_REFRESH_S", 0.0)
    reads = 0
    real = psutil.Process.net_connections

    def counted(self: psutil.Process, kind: str = "inet") -> Any:
        nonlocal reads
        reads += 1
        return real(self, kind)

    monkeypatch.setattr(psutil.Process, "net_connections", counted)
    a, port = _holder(0, 10)
    b = None
    try:
        probe = ServerProcessProbe(a.pid, port=port)
        for _ in range(10):
            assert (_sample(probe).get("server_rss_bytes") or 0) > 10 * MB
        assert reads <= 1, reads
        b, _ = _holder(port, 60)
        assert a.stdin is not None and a.stdout is not None
        a.stdin.write("close\n")
        a.stdin.flush()
        a.stdout.readline()
        assert (_sample(probe).get("server_rss_bytes") or 0) > 60 * MB
        assert [c.kind for c in probe.take_changes()] == ["server_replaced"]
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(5)


def test_the_process_tree_is_not_walked_every_tick_yet_workers_are_followed() -> None:
    """The server's children are listed again every TREE_REFRESH_S, or at once when one
    of them vanishes, never on every tick; a worker started later is counted once the tree
    is refreshed, and one that ended is not."""
    from soakd.telemetry import server as srv

    walks = 0
    real = ServerProcessProbe._tree

    def counted(self: ServerProcessProbe, root: psutil.Process) -> list[psutil.Process]:
        nonlocal walks
        walks += 1
        return real(self, root)

    parent = subprocess.Popen(
        [sys.executable, "-c", _SPAWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdin is not None and parent.stdout is not None
    parent.stdout.readline()  # started: its RSS is its own from here on
    ServerProcessProbe._tree = counted  # type: ignore[method-assign]
    try:
        probe = ServerProcessProbe(parent.pid)
        alone = _sample(probe)["server_rss_bytes"] or 0
        walks = 0
        for _ in range(20):
            _sample(probe)
        assert walks <= 1  # 20 ticks within one refresh period: the tree is kept
        parent.stdin.write("spawn\n")
        parent.stdin.flush()
        worker = int(parent.stdout.readline())
        deadline = time.monotonic() + srv.TREE_REFRESH_S + 5
        while (_sample(probe)["server_rss_bytes"] or 0) < alone + 25 * MB:
            assert time.monotonic() < deadline, "the new worker was never counted"
            time.sleep(0.1)
        parent.stdin.write("end\n")
        parent.stdin.flush()
        parent.stdout.readline()
        assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == "zombie"
        walks = 0
        got = _sample(probe)["server_rss_bytes"] or 0
        assert got < alone + 10 * MB  # the worker that ended counts nothing
        assert walks >= 1  # its vanishing refreshed the tree at once
    finally:
        ServerProcessProbe._tree = real  # type: ignore[method-assign]
        parent.kill()
        parent.wait(5)


# --------------------------------------------------------------------------- the verdict


def test_an_earlier_lifetime_s_leak_is_not_hidden_by_a_flat_last_one() -> None:
    """Two server lifetimes, each long enough to judge: the first leaks, the second (the
    last) is flat: memory_server_rss FAILs, naming the first server's pid."""
    t = np.arange(0.0, 120.0, 0.5)
    first = t < 60
    rss = np.where(first, 100 * MB + t * (10 * MB / 60), 80 * MB)  # 10 MB/min, then flat
    events = [
        {"t": 1.0, "kind": "warmup_end", "frame_id": None, "message": "", "data": None},
        {
            "t": 60.0,
            "kind": "server_replaced",
            "frame_id": None,
            "message": "",
            "data": {"old_pid": 111, "new_pid": 222, "t": 60.0},
        },
    ]
    meta = RunMeta("r", fps=5, workload_kind="openai", duration_s=120.0, warmup_s=1.0)
    frames = {"t_capture": t[::2] + 0.01, "t_dispatch": t[::2] + 0.01, "t_done": t[::2] + 0.05}
    data = make_run_data(
        meta, frames=frames, samples={"t": t, "server_rss_bytes": rss}, events=events
    )
    v = judge(data, CriteriaSettings())
    got = v.get("memory_server_rss")
    assert got is not None
    assert got.status == "fail", got.detail
    assert "111" in got.detail


def test_server_changes_beyond_the_loaded_events_make_memory_invalid_not_pass() -> None:
    """A run whose stored server_replaced events outnumber the events loaded (load_events
    reads the first 200) cannot have its lifetimes told apart: INVALID, not a PASS over
    several servers' samples."""
    t = np.arange(0.0, 60.0, 0.5)
    meta = RunMeta("r", fps=5, workload_kind="openai", duration_s=60.0, warmup_s=1.0)
    frames = {"t_capture": t[::2] + 0.01, "t_dispatch": t[::2] + 0.01, "t_done": t[::2] + 0.05}
    warm = [{"t": 1.0, "kind": "warmup_end", "frame_id": None, "message": "", "data": None}]
    data = make_run_data(
        meta, frames=frames, samples={"t": t, "server_rss_bytes": np.full(t.size, 80.0 * MB)},
        events=warm,
    )  # fmt: skip
    assert judge(data, CriteriaSettings()).get("memory_server_rss").status == "pass"  # type: ignore[union-attr]
    data.event_counts["server_replaced"] = 3  # stored, but past the loaded events
    got = judge(data, CriteriaSettings()).get("memory_server_rss")
    assert got is not None and got.status == "invalid", got
    assert "3 more server_replaced" in got.detail


def test_a_server_that_took_over_has_a_warm_up_of_its_own() -> None:
    """A server replaced at 100 s whose successor loads for the run's warm-up (20 s: 50 MB
    to 250 MB), then holds flat: its lifetime is judged from the end of its own warm-up, a
    flat floor, and its loading is not called growth."""
    t = np.arange(0.0, 135.0, 0.25)
    rss = np.where(t < 100, 80 * MB, np.minimum(50 * MB + (t - 100) * 10 * MB, 250 * MB))
    events = [
        {"t": 20.0, "kind": "warmup_end", "frame_id": None, "message": "", "data": None},
        {"t": 100.0, "kind": "server_replaced", "frame_id": None, "message": "",
         "data": {"old_pid": 111, "new_pid": 222, "t": 100.0}},
    ]  # fmt: skip
    meta = RunMeta("r", fps=5, workload_kind="openai", duration_s=135.0, warmup_s=20.0)
    frames = {"t_capture": t[::2] + 0.01, "t_dispatch": t[::2] + 0.01, "t_done": t[::2] + 0.05}
    data = make_run_data(
        meta, frames=frames, samples={"t": t, "server_rss_bytes": rss}, events=events
    )
    got = judge(data, CriteriaSettings(floor_window_s=1.0)).get("memory_server_rss")
    assert got is not None and got.status == "pass", got
    assert "floor slope +0 MB/min" in got.detail and "growth" not in got.detail, got.detail


def _two_servers_live(changes: list[float]) -> Any:
    """A run planned for 100 s at its 95th second (warm-up 20 s): a server flat at 200 MB
    until 75 s, then one taking its place that loads for its own warm-up (100 MB to 400 MB
    by 95 s); the server changes the run was told of."""
    from soakd.analysis.criteria.base import Live, LiveTable

    live = Live(planned_s=100.0, fps=10.0, streams=1, now=95.0, t0=20.0)
    live.samples = LiveTable(("t", "server_rss_bytes"))
    for ti in np.arange(20.0, 95.0, 0.1):
        live.samples.append((ti, 200 * MB if ti < 75 else 100 * MB + (ti - 75) * 15 * MB))
    live.server_changes = changes
    return live


def test_an_early_look_judges_each_server_process_alone() -> None:
    """Told of the replacement at 75 s (the run's server_replaced event), a look judges
    each server process alone, the new one only after a warm-up as long as the run's: its
    loading does not stop the run, which pooled with its predecessor's samples reads as
    growth that started late and goes on."""
    from soakd.analysis.criteria import memory
    from soakd.records import Event
    from soakd.run.early_stop import EarlyStop

    crit = CriteriaSettings(floor_window_s=1.0, max_memory_growth_mb_per_min=5)
    live = _two_servers_live([])
    watch = EarlyStop(live, crit, [memory], event=lambda e: None, stop=lambda r: None)
    watch.on_event(Event("server_replaced", 75.0, 0.0, data={"old_pid": 1, "new_pid": 2}))
    assert live.server_spans() == [(20.0, 75.0)]
    assert memory.early_fail(live, crit) is None
    pooled = memory.early_fail(_two_servers_live([]), crit)
    assert pooled is not None and pooled.criterion == "memory_server_rss", pooled

"""sd_notify over a real AF_UNIX datagram socket bound by the test, and the systemd observer
that drives it."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from soakd.config import Settings
from soakd.observers.base import Progress, RunInfo, RunResult
from soakd.observers.notify import Notifier, socket_address, watchdog_interval_s
from soakd.observers.systemd import SystemdObserver, format_status, watchdog_warning
from soakd.records import Event


class Manager:
    """The service manager's end: a bound datagram socket that collects messages."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address

    def messages(self) -> list[dict[str, str]]:
        """Every datagram received so far, each parsed into its assignments."""
        out = []
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return out
            out.append(dict(line.split("=", 1) for line in data.decode().split("\n")))


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Manager]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    yield Manager(sock, str(path))
    sock.close()


@pytest.fixture
def abstract_manager() -> Iterator[Manager]:
    name = f"soakd-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.setblocking(False)
    yield Manager(sock, "@" + name)
    sock.close()


def _progress(**kw: object) -> Progress:
    base: dict[str, object] = dict(
        elapsed_s=12.0,
        remaining_s=48.0,
        frames_done=24,
        frames_captured=25,
        achieved_fps=2.0,
        drops=1,
        stale=0,
        errors=0,
        age_p50_ms=12.34,
    )
    base.update(kw)
    return Progress(**base)  # type: ignore[arg-type]


def test_messages_arrive_as_single_datagrams_in_order(manager: Manager) -> None:
    """Each call is one datagram with newline-separated assignments, received in call order."""
    n = Notifier(manager.address)
    assert n.enabled
    assert n.extend_timeout(90, status="loading model")
    assert n.ready()
    assert n.status("soaking")
    assert n.watchdog()
    assert n.stopping()
    n.close()
    assert manager.messages() == [
        {"EXTEND_TIMEOUT_USEC": "90000000", "STATUS": "loading model"},
        {"READY": "1"},
        {"STATUS": "soaking"},
        {"WATCHDOG": "1"},
        {"STOPPING": "1"},
    ]
    assert n.sent == 5 and n.failures == 0


def test_abstract_namespace_socket(abstract_manager: Manager) -> None:
    """A NOTIFY_SOCKET starting with '@' reaches an abstract-namespace socket."""
    n = Notifier.from_env({"NOTIFY_SOCKET": abstract_manager.address})
    assert n.ready(status="up")
    assert abstract_manager.messages() == [{"READY": "1", "STATUS": "up"}]


def test_unset_notify_socket_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without NOTIFY_SOCKET the notifier is off and every call returns False."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = Notifier.from_env()
    assert not n.enabled
    assert n.ready() is False
    assert n.watchdog() is False
    assert SystemdObserver.from_env({}) is None


def test_missing_socket_is_reported_not_swallowed(tmp_path: Path) -> None:
    """Sending to a socket nobody listens on returns False, counts each failure, logs once."""
    n = Notifier(str(tmp_path / "nobody.sock"))
    assert n.enabled
    with capture_logs() as logs:
        assert n.ready() is False
        assert n.watchdog() is False
    assert n.failures == 2 and n.sent == 0
    assert len(logs) == 1 and logs[0]["log_level"] == "warning"
    assert "nobody.sock" in logs[0]["error"]


def test_status_newlines_cannot_inject_assignments(manager: Manager) -> None:
    """A newline inside STATUS text is flattened so it cannot forge e.g. READY=1."""
    Notifier(manager.address).status("line one\nREADY=1")
    assert manager.messages() == [{"STATUS": "line one READY=1"}]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("/run/systemd/notify", "/run/systemd/notify"), ("@x/y", b"\0x/y")],
)
def test_socket_address_forms(raw: str, expected: str | bytes) -> None:
    """Paths are used as they are; '@name' becomes a leading NUL (abstract namespace)."""
    assert socket_address(raw) == expected


@pytest.mark.parametrize("raw", ["relative.sock", "@", "vsock:2:1234"])
def test_socket_address_rejects_unusable_forms(raw: str) -> None:
    """Relative paths, a bare '@' and vsock addresses are refused with a message."""
    with pytest.raises(ValueError, match="NOTIFY_SOCKET"):
        socket_address(raw)


def test_bad_address_disables_and_reports() -> None:
    """An unusable NOTIFY_SOCKET leaves the notifier disabled instead of raising."""
    n = Notifier("relative.sock")
    assert not n.enabled and n.ready() is False


def test_watchdog_interval_parsing() -> None:
    """WATCHDOG_USEC is read in microseconds and ignored when WATCHDOG_PID is another process."""
    me = os.getpid()
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "5000000", "WATCHDOG_PID": str(me)}) == 5.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "5000000", "WATCHDOG_PID": str(me + 1)}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval_s({}) is None


def _info() -> RunInfo:
    s = Settings()
    return RunInfo(run_id="r1", settings=s, db_path=Path("x.db"), config_hash=s.config_hash())


def test_observer_sequence_and_watchdog_only_while_progressing(manager: Manager) -> None:
    """READY after loading, WATCHDOG only with progress, STOPPING last; a stall starves it."""
    obs = SystemdObserver(Notifier(manager.address))
    obs.on_run_start(_info())
    obs.on_loading("loading workload", 120.0)
    obs.on_ready()
    obs.on_progress(_progress())
    obs.on_progress(_progress(elapsed_s=13.0, progressing=False, stalled_s=1.5))
    obs.on_event(Event("stall", 14.0, 0.0, "no frame finished for 1 s"))
    obs.on_stopping("stalled")
    obs.on_run_end(RunResult("r1", "aborted", "stalled", 14.0, {}, "INVALID", 3))
    obs.close()
    msgs = manager.messages()
    kinds = [next((k for k in m if k != "STATUS"), "STATUS") for m in msgs]
    assert kinds == [
        "STATUS",
        "EXTEND_TIMEOUT_USEC",
        "READY",
        "WATCHDOG",
        "STATUS",
        "STATUS",
        "STOPPING",
        "STATUS",
    ]
    assert msgs[1]["EXTEND_TIMEOUT_USEC"] == "120000000"
    assert "2.0 fps" in msgs[3]["STATUS"] and "drops 1" in msgs[3]["STATUS"]
    assert "NO FRAME FOR" in msgs[4]["STATUS"]
    assert msgs[5]["STATUS"].startswith("stall:")
    assert msgs[6]["STATUS"] == "stopping: stalled"
    assert msgs[7]["STATUS"] == "run r1 aborted (stalled), verdict INVALID, exit 3"


def test_format_status_fields() -> None:
    """The status line carries elapsed/planned, fps, frames, drops, stale, errors and age."""
    text = format_status(_progress(warmup=True, age_p50_ms=None))
    assert text == (
        "warming up 12/60s, 2.0 fps, 24 frames, drops 1, stale 0, errors 0, age p50 n/a"
    )


def test_an_auto_runs_status_line_says_what_its_last_look_waits_on(manager: Manager) -> None:
    """After a look of a ``duration = "auto"`` run, the STATUS line ``systemctl status``
    shows names the criteria it still waits on, then says when every one is decided."""
    obs = SystemdObserver(Notifier(manager.address))
    look = [["memory_rss", "undecided", 3.2, 1.5, "MB/min", ""],
            ["drops", "decided", None, 0.05, "fraction", ""]]  # fmt: skip
    obs.on_progress(_progress())
    obs.on_event(Event("look", 60.0, 0.0, "", data={"criteria": look}))
    obs.on_progress(_progress())
    look[0][1] = "decided"
    obs.on_event(Event("look", 70.0, 0.0, "", data={"criteria": look}))
    obs.on_progress(_progress())
    before, waiting, decided = (m["STATUS"] for m in manager.messages())
    assert "waiting" not in before and "decided" not in before
    assert waiting.endswith(", age p50 12.3 ms, waiting on memory_rss"), waiting
    assert decided.endswith(", every criterion decided"), decided


def test_watchdog_shorter_than_stall_timeout_is_flagged() -> None:
    """A WatchdogSec that would pre-empt soakd's own stall detection is named in a warning."""
    msg = watchdog_warning(30.0, 60.0)
    assert msg is not None and "WatchdogSec (30 s)" in msg and "stall_timeout_s (60 s)" in msg
    assert watchdog_warning(180.0, 60.0) is None
    assert watchdog_warning(None, 60.0) is None

"""journald: ``<N>`` priority prefixes on log lines under systemd, and structured entries
over the native journal protocol (a real unix datagram socket standing in for journald)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from soakd.observers.journal import Journal, JournalObserver, encode, journal_stream
from tests.conftest import REPO, SYNTH_CLI, run_cli, soakd_cmd


def decode(data: bytes) -> dict[str, str]:
    """The journal's reading of one native-protocol datagram."""
    out: dict[str, str] = {}
    while data:
        line, nl, rest = data.partition(b"\n")
        if b"=" in line:
            key, _, value = line.partition(b"=")
            out[key.decode()] = value.decode()
            data = rest
        else:
            (size,) = struct.unpack("<Q", rest[:8])
            out[line.decode()] = rest[8 : 8 + size].decode()
            assert rest[8 + size : 9 + size] == b"\n"
            data = rest[9 + size :]
        assert nl
    return out


@dataclass
class Journaled:
    stderr: str
    returncode: int
    entries: list[dict[str, str]]


def _soak_on_journal_stream(env: dict[str, str], db: Path) -> tuple[int, str]:
    """`soakd run` whose stderr is a pipe named by ``$JOURNAL_STREAM`` (device:inode), as
    systemd connects a service's stderr to journald."""
    r, w = os.pipe()
    st = os.fstat(w)
    env = env | {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    cmd = soakd_cmd(
        "run", *SYNTH_CLI, "--set", "workload.error_every=10", "--duration", "5s",
        "--fps", "20", "--db", str(db),
    )  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=w)
    os.close(w)
    with os.fdopen(r, encoding="utf-8") as f:
        stderr = f.read()
    return proc.wait(timeout=120), stderr


@pytest.fixture(scope="module")
def journaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Journaled]:
    """A real `soakd run` as systemd would start it, with planted frame errors (warnings)
    and its journal socket bound here (a short path: sun_path is 108 bytes)."""
    sock_dir = Path(tempfile.mkdtemp(prefix="sj", dir="/tmp"))
    path = sock_dir / "journal.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env["SOAKD_JOURNAL_SOCKET"] = str(path)
    entries: list[dict[str, str]] = []
    done = threading.Event()

    def read() -> None:  # as journald does, while the soak runs (its queue holds 10)
        sock.settimeout(0.1)
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                entries.append(decode(sock.recv(65536)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code, stderr = _soak_on_journal_stream(env, tmp_path_factory.mktemp("journal") / "j.db")
    time.sleep(0.3)
    done.set()
    reader.join(5)
    sock.close()
    path.unlink()
    sock_dir.rmdir()
    yield Journaled(stderr, code, entries)


def test_every_log_line_under_systemd_starts_with_its_syslog_priority(
    journaled: Journaled,
) -> None:
    """Info lines carry <6>, warnings <4>; behind the prefix each line is still JSON."""
    assert journaled.returncode == 1, journaled.stderr  # FAIL: frame errors
    lines = journaled.stderr.splitlines()
    assert lines and all(line[:3] in ("<6>", "<4>", "<3>") for line in lines), lines
    by_level = {json.loads(line[3:])["level"]: line[:3] for line in lines}
    assert by_level["info"] == "<6>" and by_level["warning"] == "<4>"


def test_native_journal_entries_name_the_run_and_its_verdict(journaled: Journaled) -> None:
    """Start, warning and verdict entries arrive with SOAKD_RUN_ID; the verdict with
    SOAKD_VERDICT and a priority that follows it."""
    events = {e["SOAKD_EVENT"]: e for e in journaled.entries}
    start, end = events["start"], events["verdict"]
    assert start["SOAKD_RUN_ID"] == end["SOAKD_RUN_ID"] == events["error"]["SOAKD_RUN_ID"]
    assert start["PRIORITY"] == "6" and events["error"]["PRIORITY"] == "4"
    assert end["SOAKD_VERDICT"] == "FAIL" and end["PRIORITY"] == "4"  # errors > max_errors
    assert f"run {end['SOAKD_RUN_ID']}" in end["MESSAGE"]


def test_a_multiline_value_uses_the_binary_length_form() -> None:
    """A value with a newline is sent as KEY, 64-bit length, bytes: journald keeps it whole."""
    entry = {"MESSAGE": "two\nlines", "PRIORITY": 4}
    assert decode(encode(entry)) == {"MESSAGE": "two\nlines", "PRIORITY": "4"}
    assert b"MESSAGE\n" + struct.pack("<Q", 9) + b"two\nlines\n" in encode(entry)


def test_without_a_journal_socket_nothing_is_sent_and_nothing_raises(tmp_path: Path) -> None:
    """An absent socket means no observer; a socket gone later drops the entry quietly."""
    missing = str(tmp_path / "none.sock")
    env = {"JOURNAL_STREAM": "8:1", "SOAKD_JOURNAL_SOCKET": missing}
    assert JournalObserver.from_env(env) is None
    assert JournalObserver.from_env({}) is None
    assert Journal(missing).send("hello", 6) is False


def test_a_journal_that_reads_nothing_never_blocks_a_send(tmp_path: Path) -> None:
    """A bound socket nobody reads (its queue holds 10): 50 sends return at once, the
    entries past the queue dropped and counted."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "j.sock"))
    journal = Journal(str(tmp_path / "j.sock"))
    t0 = time.monotonic()
    sent = [journal.send(f"entry {i}", 6) for i in range(50)]
    assert time.monotonic() - t0 < 2.0
    assert sent[0] and not sent[-1] and journal.dropped == sent.count(False) > 0
    sock.close()


def test_stderr_redirected_away_from_the_journal_gets_no_prefix(tmp_path: Path) -> None:
    """Only the stream $JOURNAL_STREAM names is the journal; another file is left plain."""
    with open(tmp_path / "a", "w") as a, open(tmp_path / "b", "w") as b:
        st = os.fstat(a.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert journal_stream(a, env) and not journal_stream(b, env)
    assert not journal_stream(a, {"JOURNAL_STREAM": "garbage"})


def test_a_soak_outside_systemd_logs_plain_json(tmp_path: Path) -> None:
    """Without $JOURNAL_STREAM no line carries a priority prefix."""
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "NOTIFY_SOCKET")}
    out = run_cli(
        "run", *SYNTH_CLI, "--duration", "1s", "--fps", "20", "--db", str(tmp_path / "p.db"),
        env=env,
    )  # fmt: skip
    assert out.stderr and all(line.startswith("{") for line in out.stderr.splitlines())


def test_closing_summary_in_the_journal_has_no_box_drawing(tmp_path: Path) -> None:
    """When stdout is the journal stream, the stage and verdict tables print as aligned
    columns: no box-drawing characters reach the journal."""
    r, w = os.pipe()
    st = os.fstat(w)
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env |= {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}", "SOAKD_JOURNAL_SOCKET": "/nonexistent"}
    cmd = soakd_cmd(
        "run", *SYNTH_CLI, "--duration", "5s", "--fps", "20", "--db", str(tmp_path / "b.db"),
    )  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=w, stderr=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r, encoding="utf-8") as f:
        stdout = f.read()
    proc.wait(timeout=120)
    assert "infer" in stdout and "PASS" in stdout, stdout
    assert not set(stdout) & set("─━│┃┏┓┗┛┡┩└┘┌┐╇╈┼"), stdout

"""journald: the native journal protocol, with no dependency on libsystemd.

Under systemd (``$JOURNAL_STREAM`` or ``$INVOCATION_ID`` set) soakd sends the run's start,
its warnings and its verdict as structured journal entries, so ``journalctl SOAKD_RUN_ID=...``
finds a run and ``journalctl -p warning`` its trouble. An entry is one datagram to
``/run/systemd/journal/socket`` (``$SOAKD_JOURNAL_SOCKET`` overrides it): ``KEY=value``
lines, or, for a value with a newline, ``KEY\\n`` + its length as 64-bit little-endian +
the value + ``\\n`` (systemd's "Native Journal Protocol"). When the socket is absent or
refuses the datagram the entry is dropped silently: the stderr log lines still carry it.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

from soakd import redact
from soakd.observers.base import Observer, RunInfo, RunResult
from soakd.records import Event

DEFAULT_SOCKET = "/run/systemd/journal/socket"
SOCKET_ENV = "SOAKD_JOURNAL_SOCKET"
IDENTIFIER = "soakd"
#: syslog priorities journald reads (``PRIORITY=``, and the ``<N>`` stream prefix)
ERR, WARNING, INFO = 3, 4, 6
_WARN_EVENTS = ("error", "oom", "stall", "source_end", "signal", "sampler_crashed", "pause")
MAX_VALUE = 48_000  # keep one entry within a datagram without the memfd fallback


def under_systemd(env: Mapping[str, str] | None = None) -> bool:
    """True when systemd started this process (its stdout/stderr go to the journal)."""
    env = os.environ if env is None else env
    return bool(env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"))


def journal_stream(stream: Any, env: Mapping[str, str] | None = None) -> bool:
    """True when ``stream`` is the journal stream systemd connected: ``$JOURNAL_STREAM``
    (``device:inode``) names its file, as systemd documents checking (stderr redirected
    elsewhere by the unit or a shell is then left alone)."""
    env = os.environ if env is None else env
    dev, _, ino = env.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(stream.fileno())
        return (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (AttributeError, OSError, ValueError):
        return False


def encode(fields: Mapping[str, object]) -> bytes:
    """One native-protocol entry: ``KEY=value\\n`` each, binary-safe for multi-line values."""
    out = bytearray()
    for key, value in fields.items():
        data = str(value).encode("utf-8", "replace")[:MAX_VALUE]
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class Journal:
    """A datagram socket to journald; ``send`` never raises and never blocks: an entry
    journald has no room for right now (its queue full: unix datagram sockets hold 10 by
    default) is dropped, and counted in ``dropped``, rather than stalling the soak. The
    same line still reaches the journal through stderr."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self.dropped = 0

    def send(self, message: str, priority: int, **fields: object) -> bool:
        entry = {"MESSAGE": message, "PRIORITY": priority, "SYSLOG_IDENTIFIER": IDENTIFIER}
        entry.update({k: v for k, v in fields.items() if v is not None})
        entry = redact.data({k: str(v) for k, v in entry.items()})  # no secret leaves
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto(encode(entry), self.path)
        except BlockingIOError:
            self.dropped += 1
            return False
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class JournalObserver(Observer):
    """Run start, warning events and the verdict as journal entries with ``SOAKD_RUN_ID``."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.run_id: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JournalObserver | None:
        """An observer under systemd (or with ``$SOAKD_JOURNAL_SOCKET``) whose socket exists."""
        env = os.environ if env is None else env
        path = env.get(SOCKET_ENV) or DEFAULT_SOCKET
        if not (under_systemd(env) or env.get(SOCKET_ENV)) or not os.path.exists(path):
            return None
        return cls(Journal(path))

    def on_run_start(self, info: RunInfo) -> None:
        self.run_id = info.run_id
        s = info.settings
        self.journal.send(
            f"run {info.run_id} started: {s.workload.kind} @ {s.run.fps:g} fps "
            f"for {s.run.duration:g} s",
            INFO,
            SOAKD_RUN_ID=info.run_id,
            SOAKD_EVENT="start",
            SOAKD_DB=str(info.db_path),
        )

    def on_event(self, event: Event) -> None:
        if event.kind in _WARN_EVENTS:
            self.journal.send(
                f"{event.kind}: {event.message}",
                WARNING,
                SOAKD_RUN_ID=self.run_id,
                SOAKD_EVENT=event.kind,
                SOAKD_FRAME=event.frame_id,
            )

    def on_run_end(self, result: RunResult) -> None:
        verdict = verdict_word(result.verdict)
        text = f"run {result.run_id} {result.status}"
        text += f" ({result.reason})" if result.reason else ""
        text += f", verdict {verdict}" if verdict else ""
        text += f", exit {result.exit_code}" if result.exit_code is not None else ""
        self.journal.send(
            text,
            _end_priority(verdict, result.exit_code),
            SOAKD_RUN_ID=result.run_id,
            SOAKD_EVENT="verdict",
            SOAKD_VERDICT=verdict,
            SOAKD_STATUS=result.status,
            SOAKD_EXIT_CODE=result.exit_code,
        )

    def close(self) -> None:
        self.journal.close()


def verdict_word(verdict: object) -> str | None:
    """``PASS`` / ``FAIL`` / ``INVALID`` from a Verdict (or a plain string), else None."""
    if verdict is None:
        return None
    word = verdict if isinstance(verdict, str) else getattr(verdict, "status", None)
    if word is None:
        return None
    return str(getattr(word, "value", word)).upper()


def _end_priority(verdict: str | None, exit_code: int | None) -> int:
    if exit_code == 4:
        return ERR
    return INFO if verdict == "PASS" else WARNING

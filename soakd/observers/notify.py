"""sd_notify, written here: one ``AF_UNIX`` ``SOCK_DGRAM`` datagram per message.

The protocol (``man 3 sd_notify``) is a single datagram of newline-separated
``VARIABLE=value`` assignments sent to the socket named by ``$NOTIFY_SOCKET``: a filesystem
path, or a Linux abstract-namespace name written with a leading ``@``. Nothing is sent when
``$NOTIFY_SOCKET`` is unset, so the same code runs under systemd and on a laptop.

Unlike the ``sdnotify`` package this module does not swallow errors: ``send`` returns False
when the datagram could not be delivered, and the first failure is logged (once, so that a
missing socket cannot flood the log of a long run).

``watchdog_interval_s`` reads ``$WATCHDOG_USEC`` / ``$WATCHDOG_PID`` the way
``sd_watchdog_enabled(3)`` does; ``Notifier.extend_timeout`` sends ``EXTEND_TIMEOUT_USEC``,
which pushes back the start (or stop, or runtime) timeout of a ``Type=notify`` unit by that
much from now and must be repeated before it runs out.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from types import TracebackType

import structlog

from soakd import redact

_log = structlog.get_logger("soakd.observers.notify")

#: Seconds -> microseconds, the unit of every ``*_USEC`` variable.
_USEC_PER_S = 1_000_000


def socket_address(raw: str) -> str | bytes:
    """``$NOTIFY_SOCKET`` -> an address for ``socket.sendto``.

    ``@name`` is the abstract namespace (a leading NUL byte on the wire); anything else is
    a filesystem path. Raises ValueError for an address this module cannot use (empty,
    relative, or the ``vsock:`` form that needs an ``AF_VSOCK`` socket).
    """
    if raw.startswith("@"):
        if len(raw) < 2:
            raise ValueError("NOTIFY_SOCKET: '@' names no abstract socket")
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    raise ValueError(f"NOTIFY_SOCKET: expected an absolute path or '@name', got {raw!r}")


def watchdog_interval_s(
    env: Mapping[str, str] | None = None, pid: int | None = None
) -> float | None:
    """The watchdog timeout systemd expects keep-alives within, in seconds, or None.

    None when ``$WATCHDOG_USEC`` is unset, not a positive integer, or when ``$WATCHDOG_PID``
    names another process (the variables were inherited, the watchdog is not ours). Send
    ``WATCHDOG=1`` at least every half of this.
    """
    env = os.environ if env is None else env
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    wpid = env.get("WATCHDOG_PID")
    if wpid:
        try:
            if int(wpid) != (os.getpid() if pid is None else pid):
                return None
        except ValueError:
            return None
    try:
        usec = int(raw)
    except ValueError:
        return None
    return usec / _USEC_PER_S if usec > 0 else None


def _escape_status(text: str) -> str:
    """STATUS= is one line: newlines would start a new assignment; no secret (soakd.redact)."""
    return redact.text(text).replace("\n", " ").replace("\r", " ")


class Notifier:
    """A client of the service manager's notification socket.

    ``Notifier.from_env()`` reads ``$NOTIFY_SOCKET``; when it is unset the notifier is
    disabled and every call is a no-op that returns False. Thread-safe: the runner's
    threads may send concurrently (each message is one ``sendto``).
    """

    def __init__(self, address: str | None) -> None:
        self.raw_address = address or None
        self._addr: str | bytes | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._failed_once = False
        self.sent = 0
        self.failures = 0
        if self.raw_address is not None:
            try:
                self._addr = socket_address(self.raw_address)
            except ValueError as exc:
                self._report(str(exc))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if env is None else env
        return cls(env.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        """True when there is a usable address to send to."""
        return self._addr is not None

    # --- the wire
    def send(self, *assignments: str) -> bool:
        """Send ``assignments`` (``"READY=1"``, ``"STATUS=..."``) as one datagram.

        Returns True when the datagram was handed to the kernel; False when notification
        is off or sending failed (the first failure is logged, later ones only counted).
        """
        if self._addr is None or not assignments:
            return False
        payload = "\n".join(assignments).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(
                        socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                    )
                self._sock.sendto(payload, self._addr)
            except OSError as exc:
                self.failures += 1
                self._report(f"NOTIFY_SOCKET {self.raw_address}: {exc.strerror or exc}")
                return False
            self.sent += 1
            return True

    def _report(self, message: str) -> None:
        if not self._failed_once:
            self._failed_once = True
            _log.warning("sd_notify failed; later failures are not logged", error=message)

    # --- the messages soakd uses
    def ready(self, status: str | None = None) -> bool:
        """``READY=1``: start-up is finished (the model is loaded and warm)."""
        extra = () if status is None else (f"STATUS={_escape_status(status)}",)
        return self.send("READY=1", *extra)

    def status(self, text: str) -> bool:
        """``STATUS=``: one line shown by ``systemctl status``."""
        return self.send(f"STATUS={_escape_status(text)}")

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: a keep-alive; send it only while the service makes progress."""
        return self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: shutdown has begun."""
        extra = () if status is None else (f"STATUS={_escape_status(status)}",)
        return self.send("STOPPING=1", *extra)

    def extend_timeout(self, seconds: float, status: str | None = None) -> bool:
        """``EXTEND_TIMEOUT_USEC=``: allow ``seconds`` more from now for the current phase
        (start-up while the model loads, or stop while the verdict is written)."""
        usec = max(1, int(seconds * _USEC_PER_S))
        extra = () if status is None else (f"STATUS={_escape_status(status)}",)
        return self.send(f"EXTEND_TIMEOUT_USEC={usec}", *extra)

    # --- lifetime
    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __enter__(self) -> Notifier:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

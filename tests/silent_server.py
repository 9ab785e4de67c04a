"""A real TCP listener on 127.0.0.1 that accepts every connection and never sends a byte:
the stream server that hangs a naive client forever."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def silent_listener(accepted: list[float] | None = None) -> Iterator[int]:
    """Listen on an ephemeral loopback port (yielded); accepted sockets are held open, unread
    and unanswered, until the block ends. Each accept's ``time.monotonic()`` is appended to
    ``accepted`` when given."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)
            if accepted is not None:
                accepted.append(time.monotonic())

    thread = threading.Thread(target=accept, name="silent-listener", daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2.0)
        for conn in held:
            conn.close()
        server.close()

"""Write a command's text to stdout or to a file (``-o/--output``), and the one way every
command reports a write that failed."""

from __future__ import annotations

import errno
import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from soakd.cli.common import console, error
from soakd.errors import ExitCode

#: write errors that are the environment failing (exit 4, as a disk filling up mid-run), not
#: a bad -o (exit 2)
ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


@contextmanager
def writing(output: Path | None) -> Iterator[None]:
    """Around a command's writing to ``output`` (None: stdout): a reader that went away
    (``| head``) ends the command quietly, exit 0; any other write error is one line naming
    where and why: exit 4 when the device is full or failing (``-o /dev/full`` as much as a
    full stdout), else 2 (a bad -o)."""
    try:
        yield
        if output is None:
            sys.stdout.flush()
    except BrokenPipeError:
        if output is None:
            stdout_to_devnull()
        raise typer.Exit(0) from None
    except OSError as exc:
        if output is None:
            stdout_to_devnull()
        known = [e for e in ENVIRONMENT_ERRNOS if e == exc.errno or os.strerror(e) in str(exc)]
        where = f"{output or 'stdout'}: cannot write"
        if known:
            raise error(f"{where}: {os.strerror(known[0])}", ExitCode.INTERNAL) from None
        raise error(f"{where}: {exc.strerror or exc}") from None


def stdout_to_devnull() -> None:
    """stdout cannot take more: point its descriptor at /dev/null, so the interpreter's last
    flush of what is still buffered does not fail again ("Exception ignored ...")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing is flushed to a descriptor
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def write_output(text: str, output: Path | None) -> None:
    """Write ``text`` to stdout (newline-terminated unless empty) when ``output`` is None,
    else to that file as is. A folder that does not exist or a file that cannot be written
    is a usage error: one line naming the path and the reason, exit 2; a full device exit 4
    (``writing``)."""
    if output is not None and not output.parent.exists():
        raise error(f"{output}: cannot write: folder {output.parent} does not exist")
    with writing(output):
        if output is None:
            sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        else:
            output.write_text(text, encoding="utf-8")


def print_rich(renderables: list[Any], output: Path | None) -> None:
    """Print rich tables and lines to stdout, or as plain text to ``output`` (-o)."""
    buf = io.StringIO() if output is not None else None
    con = console(buf)
    if buf is None:
        with writing(None):
            for r in renderables:
                con.print(r)
        return
    for r in renderables:
        con.print(r)
    write_output(buf.getvalue(), output)

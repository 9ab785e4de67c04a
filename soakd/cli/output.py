"""Write a command's text to stdout or to a file (``-o/--output``)."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

from soakd.cli.common import console, error


def write_output(text: str, output: Path | None) -> None:
    """Write ``text`` to stdout (newline-terminated unless empty) when ``output`` is None,
    else to that file as is. A folder that does not exist or a file that cannot be written
    is a usage error: one line naming the path and the reason, exit 2."""
    if output is None:
        sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        return
    if not output.parent.exists():
        raise error(f"{output}: cannot write: folder {output.parent} does not exist")
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise error(f"{output}: cannot write: {exc.strerror or exc}") from None


def print_rich(renderables: list[Any], output: Path | None) -> None:
    """Print rich tables and lines to stdout, or as plain text to ``output`` (-o)."""
    buf = io.StringIO() if output is not None else None
    con = console(buf)
    for r in renderables:
        con.print(r)
    if buf is not None:
        write_output(buf.getvalue(), output)

"""``soakd export``: one run's raw rows (frames, samples or emissions) as CSV, JSON lines or
Parquet, streamed in chunks from ``soakd.store.export`` (never the whole table at once)."""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from soakd.cli.common import (
    choice_option,
    db_option,
    error,
    format_option,
    latest_mode,
    latest_option,
    mode_option,
    output_option,
    reading,
    run_id_argument,
    run_ref,
)
from soakd.cli.output import writing
from soakd.errors import SoakdError
from soakd.store import export as rows
from soakd.store import runs

EXPORT_FORMATS = ("csv", "jsonl", "parquet")
FORMAT_HELP = "csv (header row), jsonl (one JSON object a row) or parquet (needs -o)."
TABLE_HELP = (
    "Which rows: frames (one per frame), samples (telemetry), gpu_samples (one per GPU per"
    " tick, runs on several GPUs), emissions, chunk_stages (one per named stage per"
    " rollout chunk) or server_metrics (a served model's server metrics, per tick)."
)
PARQUET_MISSING = (
    "-f parquet needs pyarrow, which is not installed: pip install 'soakd[export]'"
    " (or pip install pyarrow)"
)


def export_cmd(
    run_id: Annotated[str | None, run_id_argument()] = None,
    latest: Annotated[bool, latest_option()] = False,
    mode: Annotated[str, mode_option()] = "soak",
    fmt: Annotated[str, format_option(FORMAT_HELP, *EXPORT_FORMATS, default="csv")] = "csv",
    table: Annotated[
        str, choice_option("--table", values=tuple(rows.EXPORT_TABLES), help=TABLE_HELP)
    ] = "frames",
    output: Annotated[Path | None, output_option()] = None,
    db: Annotated[Path | None, db_option()] = None,
) -> None:
    """Write one run's frames, samples or emissions for a notebook or a spreadsheet, one
    row per stored row (run_id left out). Exit code: 0 written (or the reader of a pipe
    stopped early, as `| head` does), 2 usage error, 4 the device is full."""
    ref = run_ref(run_id, latest)
    if fmt == "parquet" and output is None:
        raise error("-f parquet writes a binary file: give -o PATH")
    if output is not None and not output.parent.exists():
        raise error(f"{output}: cannot write: folder {output.parent} does not exist")
    if fmt == "parquet":
        _pyarrow()
    writer = _WRITERS[fmt]
    with reading(db) as conn:
        try:
            rid = runs.resolve(conn, ref, latest=latest, mode=latest_mode(mode))
        except SoakdError as exc:
            raise error(str(exc), exc.exit_code) from None
        cols = rows.columns(conn, table)
        # closed here, before the connection: its cursor then closes while the database is open
        with closing(rows.iter_chunks(conn, table, rid)) as chunks:
            _write(writer, cols, chunks, output)


def _write(writer: Writer, cols: Columns, chunks: Chunks, output: Path | None) -> None:
    """Run ``writer`` (``output.writing``: a reader that went away ends it quietly, exit 0;
    a full device is exit 4, any other write error exit 2, one line)."""
    with writing(output):
        writer(cols, chunks, output)


@contextmanager
def _text_out(output: Path | None) -> Iterator[IO[str]]:
    if output is None:
        yield sys.stdout
        sys.stdout.flush()
        return
    with output.open("w", encoding="utf-8", newline="") as f:
        yield f


Chunks = Iterator[list[tuple[Any, ...]]]
Columns = list[tuple[str, str]]
Writer = Callable[[Columns, Chunks, Path | None], None]


def _write_csv(cols: list[tuple[str, str]], chunks: Chunks, output: Path | None) -> None:
    with _text_out(output) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([name for name, _ in cols])
        for chunk in chunks:
            w.writerows(chunk)


def _write_jsonl(cols: list[tuple[str, str]], chunks: Chunks, output: Path | None) -> None:
    names = [name for name, _ in cols]
    with _text_out(output) as f:
        for chunk in chunks:
            f.write("".join(_json_line(dict(zip(names, r, strict=True))) + "\n" for r in chunk))


#: how JSON lines write a number JSON has no spelling for (an infinity soakd never stores,
#: written by hand or by another tool): the strings Python's float() and pandas read back
_NON_FINITE = {math.inf: "inf", -math.inf: "-inf"}


def _json_line(row: dict[str, Any]) -> str:
    """One row as strict JSON: ±inf as the strings "inf" / "-inf" (not ``Infinity``, which
    no JSON parser but Python's accepts), NaN (never stored: NULL is null) as "nan"."""
    try:
        return json.dumps(row, allow_nan=False)
    except ValueError:
        return json.dumps(
            {k: _NON_FINITE.get(v, "nan") if _non_finite(v) else v for k, v in row.items()}
        )


def _non_finite(v: Any) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise error(PARQUET_MISSING) from None
    return pyarrow


def _arrow_type(pa: Any, declared: str) -> Any:
    """The Arrow column type for a declared SQLite column type."""
    if "INT" in declared:
        return pa.int64()
    if any(t in declared for t in ("REAL", "FLOA", "DOUB")):
        return pa.float64()
    return pa.string()


def _write_parquet(cols: list[tuple[str, str]], chunks: Chunks, output: Path | None) -> None:
    pa = _pyarrow()
    assert output is not None  # checked by export_cmd
    schema = pa.schema([(name, _arrow_type(pa, t)) for name, t in cols])
    with pa.parquet.ParquetWriter(str(output), schema) as w:
        for chunk in chunks:
            columns = list(zip(*chunk, strict=True))
            w.write_batch(pa.record_batch([list(c) for c in columns], schema=schema))


_WRITERS: dict[str, Writer] = {
    "csv": _write_csv,
    "jsonl": _write_jsonl,
    "parquet": _write_parquet,
}


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)

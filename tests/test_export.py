"""`soakd export`: one run's frames, samples or emissions as CSV, JSON lines or Parquet, read
back with the csv module, json and pyarrow; row counts match the store's."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from soakd.store import export
from soakd.store.db import connect

from .conftest import SYNTH_CLI, make_run, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def soak_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One short synthetic soak through the real CLI, and a second made-up run (with
    emissions) so every export has to pick its own run's rows."""
    db = tmp_path_factory.mktemp("export") / "soakd.db"
    p = run_cli("run", "--db", str(db), "--duration", "2s", "--fps", "20", "--no-live", *SYNTH_CLI)
    # a completed run to export, whatever its verdict (a loaded host can FAIL a 2 s soak)
    assert p.returncode in (0, 1, 3), p.stderr[-2000:]
    conn = sqlite3.connect(db)
    (rid, status) = conn.execute("SELECT id, status FROM runs").fetchone()
    conn.close()
    assert status == "completed", p.stderr[-2000:]
    conn = connect(db)
    other = make_run(conn, id="other", started_unix=1000.0)  # older: --latest is the soak
    rows = [(other, f, i, f + i / 10, 1.5, None, None, None) for f in range(4) for i in range(3)]
    conn.executemany("INSERT INTO emissions VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    return db, rid


def _count(db: Path, table: str, rid: str) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(
            conn.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", (rid,)).fetchone()[0]
        )
    finally:
        conn.close()


def _export(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("export", "--db", str(db), *args)


@pytest.mark.parametrize("table", ["frames", "samples"])
def test_csv_to_stdout_has_a_header_and_every_row_of_the_run(
    soak_db: tuple[Path, str], table: str
) -> None:
    """`export RUN --table T` (csv by default) prints a header and one row per stored row."""
    db, rid = soak_db
    p = _export(db, rid, "--table", table)
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    assert len(rows) == _count(db, table, rid) > 0
    assert "run_id" not in rows[0]
    key = "frame_id" if table == "frames" else "seq"
    assert [int(r[key]) for r in rows] == list(range(len(rows)))


def test_jsonl_to_a_file_is_one_object_per_row_with_nulls_kept(
    soak_db: tuple[Path, str], tmp_path: Path
) -> None:
    """`-f jsonl -o PATH` writes one JSON object a line; NULL stays null, numbers stay numbers."""
    db, rid = soak_db
    out = tmp_path / "frames.jsonl"
    p = _export(db, "--latest", "-f", "jsonl", "-o", str(out))
    assert p.returncode == 0 and p.stdout == "", p.stderr
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(rows) == _count(db, "frames", rid)
    assert rows[0]["first"] == 1 and isinstance(rows[0]["infer_ms"], float)
    assert rows[0]["error"] is None


def test_emissions_export_only_the_named_run(soak_db: tuple[Path, str]) -> None:
    """`--table emissions` of the made-up run gives its 12 rows in (frame_id, idx) order; the
    soak run has none and exports only the header."""
    db, rid = soak_db
    p = _export(db, "other", "--table", "emissions", "-f", "jsonl")
    rows = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert [(r["frame_id"], r["idx"]) for r in rows] == [(f, i) for f in range(4) for i in range(3)]
    p = _export(db, rid, "--table", "emissions")
    assert p.returncode == 0 and p.stdout.splitlines()[0].startswith("frame_id,idx,t_emit")
    assert len(p.stdout.splitlines()) == 1


def test_parquet_round_trips_with_typed_columns(soak_db: tuple[Path, str], tmp_path: Path) -> None:
    """`-f parquet -o PATH` writes a Parquet file pyarrow reads back with the same row count,
    integer and float columns typed as such."""
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is the 'export' extra")
    db, rid = soak_db
    out = tmp_path / "samples.parquet"
    p = _export(db, rid, "--table", "samples", "-f", "parquet", "-o", str(out))
    assert p.returncode == 0, p.stderr
    t = pq.read_table(out)
    assert t.num_rows == _count(db, "samples", rid) > 0
    assert str(t.schema.field("seq").type) == "int64"
    assert str(t.schema.field("t").type) == "double"


def test_chunks_never_exceed_the_chunk_size_and_cover_every_row(
    soak_db: tuple[Path, str],
) -> None:
    """The store streams rows `chunk_rows` at a time: no chunk is larger, none is lost."""
    db, rid = soak_db
    conn = connect(db)
    try:
        chunks = list(export.iter_chunks(conn, "frames", rid, chunk_rows=7))
    finally:
        conn.close()
    assert chunks and all(len(c) <= 7 for c in chunks)
    assert sum(len(c) for c in chunks) == _count(db, "frames", rid)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--latest", "-f", "parquet"], "-f parquet writes a binary file: give -o PATH"),
        ([], "give a RUN_ID or --latest"),
        (["--latest", "--table", "events"], "'events' is not one of frames, samples, emissions"),
        (["--latest", "-f", "xlsx"], "'xlsx' is not one of csv, jsonl, parquet"),
        (["nope"], "no run 'nope'"),
    ],
)
def test_bad_export_requests_are_one_line_usage_errors(
    soak_db: tuple[Path, str], args: list[str], message: str
) -> None:
    """Parquet without -o, no run, an unknown table or format, an unknown run: exit 2, one
    line on stderr naming the problem, nothing on stdout."""
    db, _ = soak_db
    p = _export(db, *args)
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("soakd: error: ") and message in line

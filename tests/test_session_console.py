"""The end-of-run stage table of a session run (`soakd show`, `soakd run`'s end): its
untimed stages and total are not rows of dashes, and the capture -> next output latency it
does measure is a row ("next output"). A real database, a real subprocess."""

from __future__ import annotations

from pathlib import Path

from soakd.store import db as store
from tests.conftest import make_run, run_cli


def test_a_session_runs_table_shows_its_next_output_row_and_no_empty_total(
    tmp_path: Path,
) -> None:
    """A session run whose frames carry only output_latency_ms: the table has a "next
    output" row with its p50 and no "total" row of dashes; a staged run keeps its total."""
    db = tmp_path / "s.db"
    conn = store.connect(db)
    rid = make_run(conn, id="sess", workload_kind="session", fps=4,
                   config={"workload": {"kind": "session"}}, duration_s=30)  # fmt: skip
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, warmup, first, "
        "output_latency_ms) VALUES (?,?,?,?,0,?,?)",
        [(rid, i, i / 4, i / 4, int(i == 0), 400.0 + i) for i in range(100)],
    )
    staged = make_run(conn, id="staged", fps=4, config={"workload": {"kind": "synthetic"}})
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, warmup, first, infer_ms, "
        "total_ms) VALUES (?,?,?,?,0,?,20,25)",
        [(staged, i, i / 4, i / 4, int(i == 0)) for i in range(40)],
    )
    conn.commit()
    conn.close()
    out = run_cli("show", "sess", "--db", str(db)).stdout
    rows = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.count("│") > 3}
    assert "next output" in rows and "449" in rows["next output"], out
    assert "total" not in rows and "infer" not in rows
    out = run_cli("show", "staged", "--db", str(db)).stdout
    rows = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.count("│") > 3}
    assert "total" in rows and "next output" not in rows

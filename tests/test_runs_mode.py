"""`soakd runs --mode any` is accepted as `prune`, `show` and `report` accept it: every mode,
through a real subprocess on a real database."""

from __future__ import annotations

import json
from pathlib import Path

from soakd.store import db as store
from tests.conftest import make_run, run_cli


def test_runs_mode_any_lists_every_mode_and_a_bad_mode_is_refused(tmp_path: Path) -> None:
    """--mode any lists the soak and the profile run; --mode profile the profile only; a mode
    soakd does not know is a one-line usage error, exit 2."""
    db = tmp_path / "r.db"
    conn = store.connect(db)
    make_run(conn, id="soak1", mode="soak")
    make_run(conn, id="prof1", mode="profile")
    conn.commit()
    conn.close()
    r = run_cli("runs", "--mode", "any", "--json", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(ln)["run_id"] for ln in r.stdout.splitlines()) == ["prof1", "soak1"]
    r = run_cli("runs", "--mode", "profile", "--json", "--db", str(db))
    assert [json.loads(ln)["run_id"] for ln in r.stdout.splitlines()] == ["prof1"]
    r = run_cli("runs", "--mode", "nope", "--db", str(db))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1

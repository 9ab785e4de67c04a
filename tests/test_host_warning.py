"""A run measured while other processes held the host's CPUs carries a host-load warning in
every format (console, Markdown, JSON, JUnit, HTML), not only in the HTML utilisation
panel's title; a run on a quiet host carries none. Real databases, real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis import judge_run
from soakd.store import db as store
from tests.conftest import SYNTH_CLI, make_run, run_cli

WARNING = "host busy: other processes kept"


def _run(db: Path, host_cpu_pct: float) -> str:
    """A healthy 70 s run (10 fps, 2 CPUs) whose samples read the host's CPUs at
    ``host_cpu_pct`` and soakd's own at 20 % of one CPU."""
    conn = store.connect(db)
    cfg = {"workload": {"kind": "synthetic", "device": "cpu"}, "run": {"warmup_s": 2.0}}
    rid = make_run(conn, fps=10, config=cfg, duration_s=70.0, environment={"cpu_count": 2})
    rng = np.random.default_rng(0)
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, warmup, infer_ms, total_ms,"
        " frame_age_ms) VALUES (?,?,?,?,?,?,?,3)",
        [(rid, i, i / 10, i / 10, int(i < 20), 20 + rng.normal(0, 0.3), 25.0)
         for i in range(700)],
    )  # fmt: skip
    conn.executemany(
        "INSERT INTO samples (run_id, seq, t, wall, rss_bytes, cpu_pct, host_cpu_pct, "
        "host_load1) VALUES (?,?,?,0,?,20,?,?)",
        [(rid, i, i * 0.2, 400 << 20, host_cpu_pct, host_cpu_pct / 8) for i in range(350)],
    )
    judge_run(conn, rid)
    conn.close()
    return rid


@pytest.mark.parametrize(("host", "warned"), [(95.0, True), (30.0, False)])
def test_every_report_of_a_run_on_a_busy_host_carries_the_host_warning(
    tmp_path: Path, host: float, warned: bool
) -> None:
    """Host at 95 % (others 85 %): `gate` (its table), `report -f md|json|junit|html` each
    carry the warning with the figures; at 30 % none does."""
    db = tmp_path / "r.db"
    rid = _run(db, host)
    outs = {"gate": run_cli("gate", rid, "--db", str(db)).stdout}
    for fmt in ("md", "json", "junit", "html"):
        r = run_cli("report", rid, "--db", str(db), "-f", fmt)
        assert r.returncode == 0, r.stderr
        outs[fmt] = r.stdout
    for name, text in outs.items():
        assert (WARNING in text) is warned, name
    if warned:
        warnings = json.loads(outs["json"])["warnings"]
        assert any(w.startswith(f"{WARNING} 85 % of the host's 2 CPUs") for w in warnings)


def test_run_prints_the_host_warning_under_its_verdict_beside_busy_cpus(
    tmp_path: Path,
) -> None:
    """`soakd run` beside two CPU spinners on this host prints the host-load warning with
    its verdict table."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        r = run_cli("run", "--no-live", "--db", str(tmp_path / "r.db"), "--duration", "4",
                    *SYNTH_CLI, timeout=180)  # fmt: skip
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    assert r.returncode in (0, 1, 3), r.stderr[-2000:]
    assert f"warning: {WARNING}" in " ".join(r.stdout.split())

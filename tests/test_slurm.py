"""Slurm for real: docs/fleet/slurm/submit.sh on a single-node cluster (tests/slurm_cluster.py)
soaks a 4-cell plan as a 4-task array, each task into its own database on node-local disk,
and the dependent job merges the copies and gates the release: one planted failing cell makes
the gate print it and exit 1.

Needs root and Slurm + munge (``bash .ci/setup --test`` installs them); skips without them,
and fails instead when ``CI`` is set, since CI installs them."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from soakd.store.runs import find_runs
from tests.conftest import REPO
from tests.slurm_cluster import SlurmCluster, missing_prerequisite, slurm_cluster

SUBMIT = REPO / "docs" / "fleet" / "slurm" / "submit.sh"
CELLS = ("fps=10", "fps=15", "fps=20", "fps20-planted-fail")
FAILING = "fps20-planted-fail"
#: three healthy short synthetic soaks (the flags of tests/conftest.py SYNTH_CLI; a 3 s soak's
#: first allocations read as MB/min of growth, so the memory tolerance is opened and the
#: headroom judged over an hour) and one with a threshold no frame can meet
PLAN = """\
[plan]
name = "slurm-ci"
set = [
    "workload.kind=synthetic", "run.duration=3", "run.warmup_s=0.5", "run.log_every=0",
    "run.sample_interval_ms=100", "source.width=64", "source.height=48",
    "criteria.min_duration_s=1", "criteria.min_frames=5", "criteria.floor_window_s=0.2",
    "criteria.max_memory_growth_mb_per_min=1000", "criteria.horizon=1h",
]

[matrix]
"run.fps" = [10, 15, 20]

[[cell]]
name = "fps20-planted-fail"
set = ["run.fps=20", 'criteria.thresholds=["max(total_ms) < 0.001"]']
"""


def require_slurm() -> None:
    """Skip without root or Slurm, saying which; in CI (which installs them) fail instead."""
    reason = missing_prerequisite()
    if reason and os.environ.get("CI"):
        pytest.fail(f"CI installs Slurm and runs as root, yet: {reason}")
    if reason:
        pytest.skip(reason)


def submit(cluster: SlurmCluster, plan: Path, results: Path) -> tuple[str, str]:
    """submit.sh as an operator runs it, with this checkout's soakd: (array job, gate job)."""
    env = {
        **cluster.env,
        "SOAKD": f"{sys.executable} -m soakd",
        "PYTHON": sys.executable,
        "SLURM_TMPDIR": str(cluster.node_tmp),
    }
    out = subprocess.run(["bash", str(SUBMIT), str(plan), str(results)], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    array, gate = out.stdout.split()
    return array, gate


def test_slurm_array_soaks_every_cell_and_the_dependent_job_gates_the_merge(
    tmp_path: Path,
) -> None:
    """4 array tasks -> 4 databases copied off node-local disk -> merged (4 runs, cell labels,
    the node's host) -> the gate names the failing cell and exits 1, as the gate job's code."""
    require_slurm()
    plan, results = tmp_path / "plan.toml", tmp_path / "results"
    plan.write_text(PLAN)
    with slurm_cluster() as cluster:
        array, gate = submit(cluster, plan, results)
        gate_job = cluster.wait_job(gate, timeout=100)
        tasks = {i: cluster.job(f"{array}_{i}") for i in range(len(CELLS))}
        left_on_node = sorted(p.name for p in cluster.node_tmp.iterdir())
    log = (results / "logs" / f"gate-{gate}.out").read_text()
    assert sorted(p.name for p in (results / "cells").glob("*.db")) == [
        f"{array}_{i}.db" for i in range(len(CELLS))
    ], log
    assert left_on_node == []  # each task removed its local database once it was copied
    codes = {i: t["ExitCode"] for i, t in tasks.items()}
    gate_table = (results / "gate.txt").read_text() if (results / "gate.txt").exists() else log
    assert codes == {0: "0:0", 1: "0:0", 2: "0:0", 3: "1:0"}, gate_table  # each cell's reason

    conn = sqlite3.connect(results / "merged.db")
    merged = find_runs(conn, labels={"plan": "slurm-ci"})
    conn.close()
    assert sorted(r.labels["cell"] for r in merged) == sorted(CELLS)
    assert {r.host for r in merged} == {cluster.node}

    table = (results / "gate.txt").read_text()
    failing_rows = [line for line in table.splitlines() if FAILING in line]
    assert failing_rows and "FAIL" in failing_rows[0], table
    assert (results / "gate.rc").read_text().strip() == "1"
    assert (gate_job["JobState"], gate_job["ExitCode"]) == ("FAILED", "1:0")


def test_a_cancelled_array_task_still_copies_its_database(tmp_path: Path) -> None:
    """scancel mid-soak (as a time limit does): soakd stores the run as aborted, and the task
    copies the database off the node before it ends, with the soak's exit 3 as its code."""
    require_slurm()
    plan, results = tmp_path / "plan.toml", tmp_path / "results"
    plan.write_text(PLAN.replace('"run.duration=3"', '"run.duration=120"'))
    with slurm_cluster() as cluster:
        array, _ = submit(cluster, plan, results)
        log = results / "logs" / f"cell-{array}_0.out"
        cluster.wait_for(lambda: log.is_file() and '"warm-up"' in log.read_text(), timeout=60)
        cluster.run("scancel", array)
        task = cluster.wait_job(f"{array}_0", timeout=60)
    cell_db = results / "cells" / f"{array}_0.db"
    assert cell_db.is_file(), log.read_text()[-2000:]
    conn = sqlite3.connect(cell_db)
    (run,) = find_runs(conn, labels={"cell": CELLS[0]})
    conn.close()
    assert (run.status, run.exit_code) == ("aborted", 3), run.reason
    assert (task["JobState"], task["ExitCode"]) == ("CANCELLED", "3:0")

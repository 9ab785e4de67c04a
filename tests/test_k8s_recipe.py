"""The Kubernetes recipe (docs/fleet/k8s/): an Indexed Job soaking one plan cell per pod on
one GPU each, and a Job that merges the cells' databases and gates the release. No cluster
here: its structure is checked, and each pod's script is run as the pod would run it, its
mounts mapped to local folders and ``soakd`` this checkout's, on a small synthetic plan."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from soakd.store.runs import find_runs
from tests.conftest import REPO, run_cli

K8S = REPO / "docs" / "fleet" / "k8s"
SOAK_JOB = K8S / "soakd-indexed-job.yaml"
GATE_JOB = K8S / "soakd-merge-gate-job.yaml"
FAILING = "planted-fail"
#: two short synthetic cells (the flags of tests/conftest.py SYNTH_CLI), one failing its
#: threshold
TINY_PLAN = """\
[plan]
name = "k8s-ci"
set = [
    "workload.kind=synthetic", "run.duration=3", "run.fps=20", "run.warmup_s=0.5",
    "run.log_every=0", "run.sample_interval_ms=100", "source.width=64", "source.height=48",
    "criteria.min_duration_s=1", "criteria.min_frames=5", "criteria.floor_window_s=0.2",
    # 3 s cannot tell soakd's own first-seconds RSS growth (about 1 MB/min) from a leak
    "criteria.max_memory_growth_mb_per_min=1000",
]

[[cell]]
name = "healthy"
set = []

[[cell]]
name = "planted-fail"
set = ['criteria.thresholds=["max(total_ms) < 0.001"]']
"""


def documents(path: Path) -> dict[str, dict[str, Any]]:
    """The YAML documents of ``path`` by ``kind/name``."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def container(job: dict[str, Any]) -> dict[str, Any]:
    (only,) = job["spec"]["template"]["spec"]["containers"]
    return dict(only)


def exit_action(job: dict[str, Any], code: int) -> str:
    """What the Job's podFailurePolicy does with a pod whose container exits ``code``: the
    first matching exit-code rule's action, else ``Count`` (the default: retried)."""
    name = container(job)["name"]
    for rule in job["spec"].get("podFailurePolicy", {}).get("rules", []):
        on = rule.get("onExitCodes")
        if not on or on.get("containerName", name) != name:
            continue
        if (code in on["values"]) == (on["operator"] == "In"):
            return str(rule["action"])
    return "Count"


def test_the_soak_job_is_indexed_one_cell_per_pod_on_one_gpu(tmp_path: Path) -> None:
    """An Indexed Job with a completion per plan cell, one GPU per pod, the plan from the
    ConfigMap and results to the PersistentVolumeClaim; a verdict is not retried, a crash is."""
    docs = documents(SOAK_JOB)
    job = docs["Job/soakd-soak"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    plan_dir = docs["ConfigMap/soakd-plan"]["data"]
    assert spec["completionMode"] == "Indexed"
    assert 1 <= spec["parallelism"] <= spec["completions"] == cell_count(plan_dir, tmp_path)
    assert pod["restartPolicy"] == "Never"
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == 1
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container(job)["volumeMounts"]}
    assert mounts["/plan"]["configMap"]["name"] == "soakd-plan"
    claim = mounts["/results"]["persistentVolumeClaim"]["claimName"]
    assert f"PersistentVolumeClaim/{claim}" in docs
    assert spec["backoffLimitPerIndex"] >= 1 and spec["backoffLimit"] >= spec["completions"]
    assert {c: exit_action(job, c) for c in (1, 2, 3, 4, 137)} == {
        1: "FailIndex", 2: "FailIndex", 3: "FailIndex", 4: "Count", 137: "Count"
    }  # fmt: skip
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    script = container(job)["args"][0]
    assert 'soakd plan run /plan/plan.toml --cell "$JOB_COMPLETION_INDEX"' in script


def test_the_gate_job_reads_the_same_plan_and_results_and_does_not_retry_a_verdict() -> None:
    """The merge + gate Job mounts the soak Job's ConfigMap and claim; its verdict exits
    (1, 3) and a merge refusal (2) end the Job, a crash is retried."""
    soak, gate = documents(SOAK_JOB)["Job/soakd-soak"], documents(GATE_JOB)["Job/soakd-gate"]

    def sources(job: dict[str, Any]) -> dict[str, Any]:
        vols = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
        return {m["mountPath"]: vols[m["name"]] for m in container(job)["volumeMounts"]}

    for path in ("/plan", "/results"):
        assert sources(gate)[path] == sources(soak)[path]
    assert gate["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert {c: exit_action(gate, c) for c in (1, 2, 3, 4)} == {
        1: "FailJob", 2: "FailJob", 3: "FailJob", 4: "Count"
    }  # fmt: skip


def cell_count(files: dict[str, str], folder: Path) -> int:
    """How many cells ``soakd plan show`` finds in the ConfigMap's plan, its files written to
    ``folder`` as the ConfigMap mounts them."""
    for name, text in files.items():
        (folder / name).write_text(text)
    out = run_cli("plan", "show", str(folder / "plan.toml"), "-f", "json", timeout=60)
    assert out.returncode == 0, out.stderr
    return len(json.loads(out.stdout)["cells"])


# ---------------------------------------------------------------------------------------
# The pods' scripts, run here


def pod_script(job: dict[str, Any], mounts: dict[str, Path]) -> list[str]:
    """The container's command line with each mount path replaced by a local folder."""
    cmd = [*container(job)["command"], *container(job)["args"]]
    mounted = {m["mountPath"] for m in container(job)["volumeMounts"]}
    assert mounted <= set(mounts), mounted - set(mounts)
    for path in sorted(mounts, key=len, reverse=True):
        cmd = [part.replace(path + "/", f"{mounts[path]}/") for part in cmd]
    return cmd


def run_pod(
    job: dict[str, Any], mounts: dict[str, Path], bin_dir: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run one pod's script: ``soakd`` and ``python3`` on PATH are this checkout's."""
    for d in mounts.values():
        d.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(pod_script(job, mounts), capture_output=True, text=True, env=full,
                          cwd=REPO, timeout=120)  # fmt: skip


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """``soakd`` and ``python3`` as the image has them, here this checkout's interpreter."""
    d = tmp_path / "bin"
    d.mkdir()
    for name, line in (("soakd", f'exec {sys.executable} -m soakd "$@"'),
                       ("python3", f'exec {sys.executable} "$@"')):  # fmt: skip
        (d / name).write_text(f"#!/bin/sh\n{line}\n")
        (d / name).chmod(0o755)
    return d


@pytest.mark.slow
def test_each_index_soaks_its_cell_and_the_gate_job_gates_the_merge(
    tmp_path: Path, bin_dir: Path
) -> None:
    """Index i soaks plan cell i into /scratch and copies its database to /results/cells;
    the exit codes are the verdicts (FAIL: FailIndex, no retry); the gate pod merges the
    copies, names the failing cell and exits 1, which ends the gate Job without a retry."""
    soak, gate = documents(SOAK_JOB)["Job/soakd-soak"], documents(GATE_JOB)["Job/soakd-gate"]
    plan, results = tmp_path / "plan", tmp_path / "results"
    plan.mkdir()
    (plan / "plan.toml").write_text(TINY_PLAN)
    codes = {}
    for i in range(2):
        mounts = {"/plan": plan, "/results": results, "/scratch": tmp_path / f"scratch-{i}",
                  "/models": tmp_path / "models"}  # fmt: skip
        out = run_pod(soak, mounts, bin_dir, JOB_COMPLETION_INDEX=str(i), HOSTNAME=f"pod-{i}")
        codes[i] = out.returncode
        assert f"database in {results}/cells/{i}-pod-{i}.db" in out.stdout, out.stderr
        assert list(mounts["/scratch"].iterdir()) != []  # the live database stayed on scratch
    assert codes == {0: 0, 1: 1} and exit_action(soak, codes[1]) == "FailIndex"
    conn = sqlite3.connect(results / "cells" / "1-pod-1.db")
    (run,) = find_runs(conn, labels={"plan": "k8s-ci"})
    conn.close()
    assert run.labels["cell"] == FAILING

    mounts = {"/plan": plan, "/results": results, "/scratch": tmp_path / "scratch-gate"}
    out = run_pod(gate, mounts, bin_dir)
    assert out.returncode == 1, out.stdout + out.stderr
    assert exit_action(gate, out.returncode) == "FailJob"
    table = (results / "gate.txt").read_text()
    assert [ln for ln in table.splitlines() if FAILING in ln and "FAIL" in ln], table
    assert (results / "gate.rc").read_text().strip() == "1"
    assert (results / "gate.xml").read_text().count("<testcase") == 2
    conn = sqlite3.connect(results / "merged.db")
    assert sorted(r.labels["cell"] for r in find_runs(conn, labels={"plan": "k8s-ci"})) == [
        "healthy",
        FAILING,
    ]
    conn.close()

"""A real OpenAI-compatible server: `transformers serve` of the embedded tiny LLaVA (the
folder `soakd run` builds), on 127.0.0.1 and the CPU, soaked end to end through the CLI with
configs/openai-endpoint.toml."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from soakd.workloads.tiny import TinySpec, ensure_tiny_model
from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.model]

SERVE = Path(sys.executable).with_name("transformers")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(base_url, pid) of a running `transformers serve` of the tiny LLaVA."""
    if not SERVE.exists():
        pytest.skip(f"{SERVE} missing: install the test extra (transformers[serving])")
    root = tmp_path_factory.mktemp("serve")
    model = ensure_tiny_model(TinySpec(arch="llava", seed=0, short_side=56), root / "cache")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = (root / "serve.log").open("w")
    proc = subprocess.Popen(
        [str(SERVE), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
         "--device", "cpu"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
    )  # fmt: skip
    try:
        # readiness polled while the server lives; the ceiling only stops a hung start (a
        # busy host loads the model in minutes: issue 32)
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((root / "serve.log").read_text()[-3000:])
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _tree_rss(pid: int) -> int:
    p = psutil.Process(pid)
    return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])


def test_a_soak_of_transformers_serve_judges_the_server_and_reports_ttft_and_itl(
    served, tmp_path, subprocess_env
):
    """configs/openai-endpoint.toml against the real server: frames with 8 usage tokens, the
    server's RSS sampled and judged, time to first token and chunk-gap rows reported."""
    base_url, pid = served
    db = tmp_path / "serve.db"
    out = run_cli(
        "run", "configs/openai-endpoint.toml", "--no-live", "--db", str(db),
        "--set", f"workload.base_url={base_url!r}", "--duration", "10", "--fps", "4",
        "--set", "run.warmup_s=2", "--set", "workload.max_tokens=8",
        "--set", "source.width=160", "--set", "source.height=120",
        "--set", "criteria.min_duration_s=1", "--set", "criteria.min_frames=10",
        env=subprocess_env, timeout=180,
    )  # fmt: skip
    assert out.returncode in (0, 1, 3), out.stderr[-3000:]
    with sqlite3.connect(db) as conn:
        (run_id,) = conn.execute("SELECT id FROM runs").fetchone()
        tokens = {r[0] for r in conn.execute("SELECT out_tokens FROM frames WHERE error IS NULL")}
        verdict = dict(conn.execute("SELECT criterion, status FROM verdicts"))
        (rss,) = conn.execute(
            "SELECT server_rss_bytes FROM samples ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        n_ok = conn.execute("SELECT count(*) FROM frames WHERE error IS NULL").fetchone()[0]
        # requests whose text came in two or more pieces: the server's streamer sends text
        # at word boundaries, so a greedy answer of the random-weight model without a space
        # (it differs with the CPU's float kernels) comes whole, with no inter-token interval
        (with_itl,) = conn.execute(
            "SELECT count(*) FROM measured_frames WHERE error IS NULL"
            " AND json_extract(extra, '$.itl_p50_ms') IS NOT NULL"
        ).fetchone()
    # answers came back (how many of the 40 ticks a host shared with other jobs serves is
    # its speed, not this test's subject: 14 seen under load)
    assert n_ok >= 2
    # usage tokens recorded, max_tokens honoured (random weights may emit the end token early)
    assert 8 in tokens and tokens <= set(range(1, 9)), tokens
    assert verdict["memory_server_rss"] in ("pass", "fail", "invalid")  # judged, never n/a
    assert abs(rss - _tree_rss(pid)) < 0.15 * rss  # the server's processes, not soakd's
    md = run_cli("report", run_id, "--db", str(db), "-f", "md", env=subprocess_env)
    assert md.returncode == 0, md.stderr
    rows = {line.split("|")[1].strip(): line for line in md.stdout.splitlines() if "|" in line}
    assert "time to first token" in rows
    for label in ("chunk gap p50 (per request)", "chunk gap p95 (per request)"):
        if with_itl >= 2:
            assert label in rows, label
        elif with_itl == 0:
            assert label not in rows, label  # no row without a measured interval
    assert "| memory_server_rss |" in md.stdout

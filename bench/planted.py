"""The planted-fault table: each fault soakd promises to catch, planted in a real soak of the
synthetic workload through the real CLI, and the verdict soakd gives with the criteria that
name it. docs/verdict.md quotes the table this prints.

    .venv/bin/python -m bench.planted            # all faults, 3 at a time (about 2 minutes)
    .venv/bin/python -m bench.planted leak pause # some of them

Each row is a separate ``soakd run`` subprocess on its own database; the pause is a real
SIGSTOP/SIGCONT of that process. Exits 1 when a fault did not end in the expected outcome.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from soakd.environment import cpu_model

REPO = Path(__file__).resolve().parents[1]

BASE = (
    "workload.kind=synthetic", "run.fps=25", "run.warmup_s=2", "run.sample_interval_ms=100",
    "run.log_every=0", "source.width=64", "source.height=48", "criteria.min_duration_s=10",
    "criteria.min_frames=50", "criteria.floor_window_s=1", "workload.pre_ms=1",
    "workload.infer_ms=10", "workload.decode_ms=1", "workload.jitter=0.05",
)  # fmt: skip


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    settings: tuple[str, ...]
    expect: str  # PASS, FAIL or INVALID
    duration: str = "20s"
    pause_s: float = 0.0  # SIGSTOP the run this long, 6 s in


FAULTS = (
    Fault("healthy", "nothing planted (jitter 10 %)", ("workload.jitter=0.1",), "PASS"),
    Fault("leak", "120 MB/min RSS leak", ("workload.leak_mb_per_min=120",), "FAIL"),
    Fault(
        "leak-under-sawtooth",
        "120 MB/min leak under a 40 MB, 0.5 s sawtooth",
        (
            "workload.sawtooth_mb=40",
            "workload.sawtooth_period_s=0.5",
            "workload.leak_mb_per_min=120",
        ),
        "FAIL",
    ),
    Fault(
        "sawtooth",
        "40 MB sawtooth, no leak",
        ("workload.sawtooth_mb=40", "workload.sawtooth_period_s=0.5"),
        "PASS",
    ),
    Fault(
        "slowing-model",
        "infer slows 600 ms/min, consume oldest, deep queue",
        (
            "run.consume='oldest'",
            "run.max_queue=1000",
            "run.fps=20",
            "workload.infer_ms=40",
            "workload.drift_ms_per_min=600",
        ),
        "FAIL",
    ),
    Fault("overload", "60 ms model at 25 fps", ("workload.infer_ms=60",), "FAIL"),
    Fault(
        "periodic-spikes",
        "100 ms spike every 20th frame",
        ("workload.spike_every=20", "workload.spike_ms=100"),
        "FAIL",
    ),
    Fault("errors", "every 30th frame raises", ("workload.error_every=30",), "FAIL"),
    Fault(
        "late-stall",
        "the model hangs 15 s into a 20 s run",
        ("workload.stall_after_s=15",),
        "INVALID",
    ),
    Fault("slow-source", "a 10 fps source under a 25 fps run", ("source.max_fps=10",), "FAIL"),
    Fault("pause", "the process stopped for 3 s (SIGSTOP)", (), "FAIL", pause_s=3.0),
    Fault(
        "backlog",
        "consume oldest, 80 ms model at 25 fps, queue of 1000",
        ("run.consume='oldest'", "run.max_queue=1000", "workload.infer_ms=80"),
        "FAIL",
    ),
    Fault("short-run", "a 4 s run (criteria need 10 s)", (), "INVALID", duration="4s"),
)


def _cmd(f: Fault, db: Path) -> list[str]:
    sets = [a for kv in (*BASE, *f.settings) for a in ("--set", kv)]
    return [sys.executable, "-m", "soakd", "run", "--no-live", "--db", str(db),
            "--duration", f.duration, *sets]  # fmt: skip


def _wait_for_frames(db: Path, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(db, timeout=5) as conn:
                if conn.execute("SELECT count(*) FROM frames").fetchone()[0] >= n:
                    return
        except sqlite3.OperationalError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{db}: no frames after {timeout} s")


def run_fault(f: Fault, folder: Path) -> dict[str, object]:
    """One planted fault through the real CLI: exit code, verdict, non-passing criteria."""
    db = folder / f"{f.name}.db"
    proc = subprocess.Popen(_cmd(f, db), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    if f.pause_s:
        _wait_for_frames(db, 150)  # 6 s in at 25 fps
        proc.send_signal(signal.SIGSTOP)
        time.sleep(f.pause_s)
        proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=300)
    with sqlite3.connect(db) as conn:
        rid, verdict = conn.execute(
            "SELECT id, verdict FROM runs ORDER BY started_unix DESC LIMIT 1"
        ).fetchone()
        named = [
            f"{c} ({s})"
            for c, s in conn.execute(
                "SELECT criterion, status FROM verdicts WHERE run_id = ? AND status NOT IN "
                "('pass', 'n/a') ORDER BY rowid",
                (rid,),
            )
        ]
    return {"fault": f.name, "what": f.what, "expect": f.expect, "verdict": verdict,
            "exit": proc.returncode, "named": named, "stderr": err.strip()[-300:]}  # fmt: skip


def table(rows: list[dict[str, object]]) -> str:
    out = ["| planted fault | verdict | exit | criteria that name it | as expected |",
           "|---|---|---:|---|---|"]  # fmt: skip
    for r in rows:
        named = ", ".join(r["named"]) or "-"  # type: ignore[arg-type]
        ok = "yes" if r["verdict"] == r["expect"] else f"**no** (expected {r['expect']})"
        out.append(f"| {r['fault']}: {r['what']} | {r['verdict']} | {r['exit']} | {named} | {ok} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    chosen = [f for f in FAULTS if not argv or f.name in argv]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(3) as pool:
        rows = list(pool.map(lambda f: run_fault(f, Path(tmp)), chosen))
    print(f"CPU: {cpu_model()}\n")
    print(table(rows))
    bad = [r for r in rows if r["verdict"] != r["expect"]]
    for r in bad:
        print(f"\n{r['fault']}: {json.dumps(r, default=str)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

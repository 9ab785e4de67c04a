"""Jitter under host contention: healthy and spiking synthetic models soaked quiet, beside
bounded Python CPU spinners and beside stress-ng, and what the jitter criterion says of
each (docs/verdict.md, "Host contention", quotes the table this prints).

    .venv/bin/python -m bench.contention --keep DIR      # 4 models x 5 loads x 2 seeds (10-25 min)
    .venv/bin/python -m bench.contention --judge DIR     # the table of kept runs, judged again
    .venv/bin/python -m bench.contention --seeds 1 --duration 10

Each row is one ``soakd run`` subprocess on its own database, the load started before it and
ended after it (spinners: ``python -c`` busy loops with a deadline; stress-ng: ``--cpu N
--timeout``, skipped when it is not installed). The table counts, per model and load, the
runs whose jitter criterion FAILed, was INVALID for contention, or PASSed, and the others'
CPU share soakd measured (host CPU minus its own process's, median over the run's ticks).
A healthy model that FAILs is a false FAIL; a spiking model that PASSes a false PASS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
NCPU = os.cpu_count() or 1

BASE = (
    "workload.kind=synthetic", "run.warmup_s=2", "run.sample_interval_ms=100",
    "run.log_every=0", "source.width=64", "source.height=48", "criteria.min_duration_s=5",
    "criteria.min_frames=50", "criteria.floor_window_s=0.5",
    "criteria.max_memory_growth_mb_per_min=1000",
)  # fmt: skip


@dataclass(frozen=True)
class Model:
    name: str
    what: str
    settings: tuple[str, ...]
    healthy: bool


MODELS = (
    Model(
        "cpu-0.5ms",
        "healthy, 0.5 ms of its own CPU per infer at 50 fps",
        (
            "run.fps=50",
            "workload.cpu_bound=true",
            "workload.infer_ms=0.5",
            "workload.pre_ms=0",
            "workload.decode_ms=0",
            "workload.jitter=0.05",
        ),
        True,
    ),
    Model(
        "sleep-10ms",
        "healthy, 10 ms infer (a wait, as on a GPU) at 25 fps",
        (
            "run.fps=25",
            "workload.infer_ms=10",
            "workload.pre_ms=1",
            "workload.decode_ms=1",
            "workload.jitter=0.05",
        ),
        True,
    ),
    Model(
        "cpu-spikes",
        "0.5 ms CPU model, a 5 ms spike every 20th frame",
        (
            "run.fps=50",
            "workload.cpu_bound=true",
            "workload.infer_ms=0.5",
            "workload.pre_ms=0",
            "workload.decode_ms=0",
            "workload.jitter=0.05",
            "workload.spike_every=20",
            "workload.spike_ms=5",
        ),
        False,
    ),
    Model(
        "sleep-spikes",
        "10 ms model, a 100 ms spike every 20th frame",
        (
            "run.fps=25",
            "workload.infer_ms=10",
            "workload.pre_ms=1",
            "workload.decode_ms=1",
            "workload.jitter=0.05",
            "workload.spike_every=20",
            "workload.spike_ms=100",
        ),
        False,
    ),
)

_SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass"


def loads(duration: float) -> dict[str, list[list[str]]]:
    """The planted loads: each a list of command lines, started before a run."""
    spin = [sys.executable, "-c", _SPIN.format(s=duration + 8)]
    out: dict[str, list[list[str]]] = {
        "quiet": [],
        f"{NCPU} spinners": [spin] * NCPU,
        f"{2 * NCPU} spinners": [spin] * (2 * NCPU),
    }
    if shutil.which("stress-ng"):
        t = f"{int(duration + 8)}s"
        out[f"stress-ng --cpu {NCPU}"] = [["stress-ng", "--cpu", str(NCPU), "--timeout", t, "-q"]]
        out[f"stress-ng --cpu {NCPU} --cpu-load 50"] = [
            ["stress-ng", "--cpu", str(NCPU), "--cpu-load", "50", "--timeout", t, "-q"]
        ]
    return out


def soak(model: Model, load: list[list[str]], db: Path, seed: int, duration: float) -> int:
    """One soak beside ``load`` (started first, ended after): the exit code."""
    hogs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in load]
    try:
        time.sleep(0.5 if load else 0)
        sets = [a for kv in (*BASE, *model.settings, f"run.seed={seed}") for a in ("--set", kv)]
        argv = [sys.executable, "-m", "soakd", "run", "--no-live", "--db", str(db),
                "--duration", f"{duration:g}s", *sets]  # fmt: skip
        # cwd: the run's folder, so that a PYTHONPATH given to the benchmark picks the soakd
        # that runs the soaks (the one judging them is this process's)
        return subprocess.run(argv, cwd=db.parent, capture_output=True, timeout=300).returncode
    finally:
        for h in hogs:
            h.terminate()
        for h in hogs:
            h.wait(30)


def judged(db: Path) -> dict[str, object]:
    """The run judged by this soakd (``soakd gate RUN_ID``'s re-evaluation): its jitter
    status and detail, the stored verdict's jitter status (the soakd that ran it), and the
    others' CPU share soakd measured (median over the ticks)."""
    from soakd.analysis import evaluate
    from soakd.analysis.contention import other_cpu_pct

    with sqlite3.connect(db) as conn:
        rid = conn.execute("SELECT id FROM runs ORDER BY started_unix DESC LIMIT 1").fetchone()[0]
        stored = conn.execute(
            "SELECT status FROM verdicts WHERE run_id = ? AND criterion = 'jitter'", (rid,)
        ).fetchone()
        data, verdict = evaluate(conn, rid)
    j = verdict.get("jitter")
    others = other_cpu_pct(data)
    return {
        "jitter": j.status if j else None,
        "stored": stored[0] if stored else None,
        "detail": j.detail if j else "",
        "others_median": float(np.nanmedian(others)) if np.isfinite(others).any() else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--duration", type=float, default=12.0)
    p.add_argument("--keep", type=Path, default=None, help="keep the run databases here")
    p.add_argument("--models", nargs="*", default=[m.name for m in MODELS])
    p.add_argument("--judge", type=Path, default=None, help="only re-judge the --keep folder")
    args = p.parse_args(argv)
    if args.judge is not None:
        return rejudge(args.judge)
    folder = Path(tempfile.mkdtemp()) if args.keep is None else args.keep
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for load_name, load in loads(args.duration).items():
        for model in (m for m in MODELS if m.name in args.models):
            for seed in range(args.seeds):
                db = folder / f"{model.name}-{load_name.replace(' ', '_')}-{seed}.db"
                before = os.getloadavg()[0]
                code = soak(model, load, db, seed, args.duration)
                row = {"model": model, "load": load_name, "exit": code, "load1": before}
                row.update(judged(db))
                rows.append(row)
                print(
                    f"{model.name:13} {load_name:28} exit {code} "
                    f"jitter {row['stored']} -> {row['jitter']} others {row['others_median']} "
                    f"load1 {before:.2f}  {row['detail'][:90]}",
                    flush=True,
                )
    print()
    print(table(rows))
    if args.keep is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def rejudge(folder: Path) -> int:
    """The table of a kept folder's runs (``MODEL-LOAD-SEED.db``), judged by this soakd."""
    rows = []
    by_name = {m.name: m for m in MODELS}
    for db in sorted(folder.glob("*.db")):
        model = next(m for n, m in by_name.items() if db.stem.startswith(f"{n}-"))
        load = db.stem[len(model.name) + 1 :].rsplit("-", 1)[0].replace("_", " ")
        rows.append({"model": model, "load": load, **judged(db)})
    print(table(rows))
    return 0


def table(rows: list[dict[str, object]]) -> str:
    out = [
        "| model | load | runs | jitter FAIL | INVALID (contended) | PASS | FAIL without the "
        "contention rule (stored verdict) | others' CPU, median |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    keys = dict.fromkeys((r["model"], r["load"]) for r in rows)
    for model, load in keys:
        rs = [r for r in rows if r["model"] is model and r["load"] == load]
        n = Counter(str(r["jitter"]) for r in rs)
        oth = [r["others_median"] for r in rs if r["others_median"] is not None]
        share = "-" if not oth else ", ".join(f"{o:.0f} %" for o in oth)  # type: ignore[str-format]
        out.append(
            f"| {model.name}: {model.what} | {load} | {len(rs)} | {n['fail']} | "  # type: ignore[attr-defined]
            f"{n['invalid']} | {n['pass']} | {sum(r['stored'] == 'fail' for r in rs)} | {share} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())

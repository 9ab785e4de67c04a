"""soakd's own buffers against the RSS ``memory_rss`` judges (issue 31): no-op soaks (the
synthetic workload at 0 ms, 60 fps) run through the CLI, plain, with ``run.stop_on_fail``,
and with another connection holding the database's write lock (``BEGIN EXCLUSIVE``) for
``--lock-s`` seconds from ``--lock-at``, each judged afterwards: the ``memory_rss`` floor
slope (MB/min) and its p-value, as the verdict reports them.

    .venv/bin/python -m bench.own_rss                        # 90 s each, 4 runs one by one
    .venv/bin/python -m bench.own_rss --repeat 3 --duration 120

A soakd whose buffers grow with the early stop or the lock shows a larger slope in those
runs than in the plain one.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import noop_overrides

CONFIGS = {
    "plain": ((), False),
    "stop_on_fail": (("run.stop_on_fail=true",), False),
    "db lock": ((), True),
    "stop_on_fail + db lock": (("run.stop_on_fail=true",), True),
}


def _hold_lock(db: Path, at_s: float, hold_s: float) -> None:
    time.sleep(at_s)
    conn = sqlite3.connect(db, timeout=30.0, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    time.sleep(hold_s)
    conn.execute("COMMIT")
    conn.close()


def one(name: str, duration: float, lock_at: float, lock_s: float) -> tuple[float, float]:
    """(memory_rss slope in MB/min, its p) of one run of config ``name``."""
    sets, lock = CONFIGS[name]
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "own.db"
        # a no-op's infer takes about a microsecond: a few-microsecond hiccup is 5 x that, and
        # jitter, early-stoppable under stop_on_fail, would end the run (jitter_min_ms)
        args = [a for kv in (*noop_overrides(db, fps=60.0, duration_s=duration, warmup_s=5.0),
                             "criteria.jitter_min_ms=1", *sets) for a in ("--set", kv)]  # fmt: skip
        cmd = [sys.executable, "-m", "soakd", "run", "--no-live", "--log-json", *args]
        holder = threading.Thread(target=_hold_lock, args=(db, lock_at, lock_s), daemon=True)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if lock:
            holder.start()
        proc.wait()
        if lock:
            holder.join()
        from soakd.analysis import evaluate
        from soakd.store.db import connect

        conn = connect(db, readonly=True)
        rid = conn.execute("SELECT id FROM runs ORDER BY rowid DESC LIMIT 1").fetchone()[0]
        _data, v = evaluate(conn, rid)
        conn.close()
        mem = v.get("memory_rss")
        assert mem is not None
        return float(mem.value or 0.0), float(mem.evidence.get("p_value", 1.0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--lock-at", type=float, default=30.0)
    ap.add_argument("--lock-s", type=float, default=18.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=list(CONFIGS))
    a = ap.parse_args(argv)
    print(f"no-op soaks at 60 fps, {a.duration:g} s each (warm-up 5 s); lock from "
          f"{a.lock_at:g} s for {a.lock_s:g} s; memory_rss floor slope, MB/min (p)")  # fmt: skip
    for name in a.only:
        got = [one(name, a.duration, a.lock_at, a.lock_s) for _ in range(a.repeat)]
        figures = ", ".join(f"{s:.3g} ({p:.2g})" for s, p in got)
        print(f"  {name:24s} {figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

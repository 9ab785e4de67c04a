"""Replay hostile input against the real CLI and count the tracebacks (issue 32's target: 0).

``python -m bench.hostile [--out FILE] [--workdir DIR]`` runs each attempt as a real
``python -m soakd`` subprocess: an empty ``--db``, TOML nested 500 deep, values written by
hand into a real run's database (text in a numeric column, infinities), a damaged file,
workloads that call ``sys.exit`` or raise text with a lone surrogate, the disk filling as
the verdict is stored (a real 20 MB tmpfs filled to the last byte: root only, else
skipped), an older schema on read-only storage (a tmpfs remounted read-only: root only),
a full ``-o`` / stdout (``/dev/full``), control characters in ``run.name`` and more. Each
row says what came back: the exit code against the one documented for it, and whether
stderr held a Python traceback or more than one error line. Nothing here asserts; the
targets (0 tracebacks, 0 unexpected exit codes) are reported as met or missed.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BenchResult, Target, bench_main

ROOT = Path(__file__).resolve().parent.parent

#: ``soakd run`` flags for a short synthetic soak whose criteria a few seconds can meet
SYNTH = [
    "--fps", "20", "--no-live", "--set", "workload.kind=synthetic", "--set", "run.warmup_s=0.5",
    "--set", "run.log_every=0", "--set", "source.width=64", "--set", "source.height=48",
    "--set", "criteria.min_duration_s=1", "--set", "criteria.min_frames=5",
    "--set", "criteria.floor_window_s=0.1", "--set", "criteria.max_memory_growth_mb_per_min=1000",
]  # fmt: skip

#: ``python -c FILL_THEN_STORE ARGS`` is ``soakd ARGS`` with the database's filesystem
#: filled right before the verdict is stored: a filler file takes every free byte (a real
#: full disk, not a stand-in error)
FILL_THEN_STORE = """
import os, sys
from soakd.run import runner
real = runner.store_verdict
def fill_then_store(conn, verdict):
    folder = os.path.dirname(conn.execute("PRAGMA database_list").fetchone()[2])
    with open(os.path.join(folder, "filler"), "wb") as f:
        try:
            while True:
                f.write(bytes(65536)); f.flush()
        except OSError:
            pass
    real(conn, verdict)
runner.store_verdict = fill_then_store
from soakd.cli import main
sys.exit(main(sys.argv[1:]))
"""


def old_database(path: Path, migrations: int) -> None:
    """A database an older soakd wrote: the first ``migrations`` migrations only, one
    finished 6 s run (id ``old1``) of 120 frames and 60 samples, in plain SQL."""
    from soakd.store.schema import MIGRATIONS

    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    for name, script in MIGRATIONS[:migrations]:
        conn.executescript(script)
        conn.execute("INSERT INTO _migrations VALUES (?, '2026-01-01T00:00:00Z')", (name,))
    crit = {"min_duration_s": 1, "min_frames": 5, "floor_window_s": 0.1,
            "max_memory_growth_mb_per_min": 1000}  # fmt: skip
    t0 = time.time() - 100
    conn.execute(
        "INSERT INTO runs (id, mode, status, started_at, started_unix, ended_at, duration_s,"
        " workload_kind, fps, config, config_hash) VALUES ('old1', 'soak', 'completed',"
        " '2026-01-01T00:00:00Z', ?, '2026-01-01T00:00:06Z', 6.0, 'synthetic', 20.0, ?, 'x')",
        (t0, json.dumps({"criteria": crit, "run": {"warmup_s": 0.5}})),
    )
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, t_dispatch, t_done, grab_ms,"
        " pre_ms, infer_ms, decode_ms, total_ms, queue_len, frame_age_ms, e2e_ms, drop_count,"
        " warmup, first, skipped) VALUES ('old1', ?, ?, ?, ?, ?, 0.1, 1, ?, 1, ?, 0, 0.2, 18,"
        " 0, ?, ?, 0)",
        [(i, i / 20, i / 20, i / 20, i / 20 + 0.02, 15 + i % 3, 17 + i % 3, int(i < 10),
          int(i == 0)) for i in range(120)],
    )  # fmt: skip
    conn.executemany(
        "INSERT INTO samples (run_id, seq, t, wall, rss_bytes) VALUES ('old1', ?, ?, ?, 1e8)",
        [(i, i * 0.1, t0 + i * 0.1) for i in range(60)],
    )
    conn.commit()
    conn.close()


@dataclass
class Attempt:
    """One hostile input: the soakd arguments (``python -c`` code first when ``code``), the
    exit codes documented for it, and where stdout goes (None: captured)."""

    name: str
    args: list[str]
    expect: tuple[int, ...]
    stdout_to: str | None = None
    code: str | None = None


def _sql(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db)
    try:
        for s in statements:
            conn.execute(s)
        conn.commit()
    finally:
        conn.close()


def _copy(src: Path, dst: Path, *statements: str) -> Path:
    shutil.copy(src, dst)
    if statements:
        _sql(dst, *statements)
    return dst


def _damage_page(db: Path, table: str) -> None:
    """Overwrite ``table``'s root page with 0xff bytes (a damaged sector)."""
    conn = sqlite3.connect(db)
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    (page,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    with db.open("r+b") as f:
        f.seek((root - 1) * page)
        f.write(b"\xff" * page)


@contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[bool]:
    """A tmpfs of ``size`` at ``where``: True when mounted (root), else False."""
    where.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    ok = subprocess.run(cmd, capture_output=True, check=False).returncode == 0
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _soakd(a: Attempt, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    head = [sys.executable, "-c", a.code] if a.code else [sys.executable, "-m", "soakd"]
    out: Any = subprocess.PIPE
    if a.stdout_to is not None:
        out = open(a.stdout_to, "w")  # noqa: SIM115 (closed below)
    try:
        return subprocess.run(
            [*head, *a.args], stdout=out, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env=env, timeout=180, check=False,
        )  # fmt: skip
    finally:
        if a.stdout_to is not None:
            out.close()


def _error_lines(stderr: str) -> list[str]:
    """stderr's lines that are not structured log records (JSON with msg and level)."""
    out = []
    for line in stderr.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if line.strip() and not (isinstance(rec, dict) and "msg" in rec and "level" in rec):
            out.append(line)
    return out


def _passing_run(db: Path, env: dict[str, str]) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "soakd", "run", "--db", str(db), "--duration", "6", *SYNTH],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=180, check=False,
    )  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"the base run did not PASS (exit {p.returncode}): {p.stderr[-2000:]}")


def _attempts(work: Path, base: Path) -> Iterator[Attempt]:
    """Every attempt, its files made as it comes (a run's database copied and changed)."""
    reads = [["runs"], ["show", "--latest"], ["gate", "--latest"], ["report", "--latest"],
             ["export", "--latest"], ["baseline", "list"]]  # fmt: skip
    for cmd in reads:
        yield Attempt(f"{cmd[0]} --db ''", [*cmd, "--db", ""], (2,))
    for cmd in ("show", "gate", "report", "export"):
        yield Attempt(f"{cmd} ''", [cmd, "", "--db", str(base)], (2,))
    deep = "[" * 500 + "]" * 500
    conf, plan = work / "deep.toml", work / "deep-plan.toml"
    conf.write_text(f"[run]\nname = {deep}\n", encoding="utf-8")
    plan.write_text(f'[plan]\nname = "p"\n[axes]\n"run.fps" = {deep}\n', encoding="utf-8")
    nowhere = str(work / "no-such-folder" / "soakd.db")
    yield Attempt(
        "--set nested 500 deep", ["run", "--db", nowhere, "--set", f"run.name={deep}"], (2,)
    )
    yield Attempt("config nested 500 deep", ["run", str(conf), "--db", nowhere], (2,))
    yield Attempt("plan nested 500 deep", ["plan", "show", str(plan)], (2,))
    damages = {
        "text in frames.infer_ms": "UPDATE frames SET infer_ms = 'abc' WHERE frame_id = 30",
        "text in samples.rss_bytes": "UPDATE samples SET rss_bytes = 'abc' WHERE seq = 5",
        "+inf in samples.t": "UPDATE samples SET t = 9e999 WHERE seq = 5",
        "+inf in runs.duration_s": "UPDATE runs SET duration_s = 9e999",
    }
    for i, (what, sql) in enumerate(damages.items()):
        db = _copy(base, work / f"damaged{i}.db", sql)
        for cmd in (["gate"], ["report"], ["report", "-f", "html"], ["show"]):
            yield Attempt(f"{' '.join(cmd)}: {what}", [*cmd, "--latest", "--db", str(db)], (2,))
    for i, col in enumerate(("infer_ms", "frame_age_ms")):
        for sign in ("", "-"):
            sql = f"UPDATE frames SET {col} = {sign}9e999 WHERE frame_id = 30"
            db = _copy(base, work / f"inf{i}{sign}.db", sql)
            yield Attempt(
                f"gate: {sign or '+'}inf {col} (INVALID)",
                ["gate", "--latest", "--db", str(db)],
                (3,),
            )
            yield Attempt(
                f"export jsonl: {sign or '+'}inf {col}",
                ["export", "--latest", "-f", "jsonl", "--db", str(db)],
                (0,),
            )
    bad = _copy(base, work / "bad-pages.db")
    _damage_page(bad, "samples")
    yield Attempt(
        "run on a damaged database", ["run", "--db", str(bad), "--duration", "2", *SYNTH], (2,)
    )
    two = _copy(base, work / "other.db")
    _damage_page(two, "frames")
    yield Attempt(
        "merge good + damaged", ["merge", str(work / "merged.db"), str(base), str(two)], (2,)
    )
    for what in ("system_exit", "surrogate"):
        yield Attempt(
            f"infer raises {what}",
            ["run", "--db", str(work / f"{what}.db"), "--duration", "3", *SYNTH,
             "--set", "workload.kind=python",
             "--set", "workload.factory=tests.hostile_workloads:raises",
             "--set", f'workload.options={{what="{what}", every=2}}'],
            (1,),
        )  # fmt: skip
    for bad_max in ("bogus", "-5"):
        auto = ["--set", "run.duration=auto", "--set", f"run.max_duration={bad_max}"]
        yield Attempt(f"run.max_duration={bad_max}", ["run", "--db", nowhere, *auto], (2,))
    yield Attempt(
        "run.name with an ANSI escape",
        ["run", "--db", nowhere, "--set", 'run.name="a\\u001b[2Jb"'],
        (2,),
    )
    named = _copy(
        base, work / "named.db", "UPDATE runs SET name = 'ev' || char(0) || 'il' || char(27)"
    )
    yield Attempt("runs: NUL/ESC in a stored name", ["runs", "--db", str(named)], (0,))
    if Path("/dev/full").exists():
        for cmd in (["runs"], ["show", "--latest"], ["gate", "--latest"], ["report", "--latest"],
                    ["export", "--latest"], ["export", "--latest", "-f", "jsonl"]):  # fmt: skip
            yield Attempt(
                f"{' '.join(cmd)} -o /dev/full", [*cmd, "--db", str(base), "-o", "/dev/full"], (4,)
            )
            yield Attempt(
                f"{' '.join(cmd)} >/dev/full", [*cmd, "--db", str(base)], (4,), "/dev/full"
            )
    stall = ["--duration", "8", *SYNTH, "--set", "workload.stall_after_s=2"]
    yield Attempt("stall timeout reached", ["run", "--db", str(work / "stall.db"), *stall], (3,))


def _root_attempts(work: Path) -> Iterator[Attempt]:
    """The attempts that need a filesystem of their own (root: a tmpfs), each yielded while
    its filesystem is mounted."""
    disk = work / "full-disk"
    with _tmpfs(disk, "20M") as ok:
        if ok:
            fails = "criteria.thresholds=[{expr='p50(infer_ms) < 1', abort_on_fail=true}]"
            yield Attempt(
                "disk fills as the verdict is stored (stop_on_fail)",
                ["run", "--db", str(disk / "soakd.db"), "--duration", "4", *SYNTH,
                 "--set", "run.stop_on_fail=true", "--set", fails],
                (4,), code=FILL_THEN_STORE,
            )  # fmt: skip
    ro = work / "read-only"
    with _tmpfs(ro, "5M") as ok:
        if ok:
            old_database(ro / "old.db", 4)
            subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
            db = str(ro / "old.db")
            for cmd in (["gate", "old1"], ["report", "old1"], ["show", "old1"],
                        ["export", "old1", "--table", "server_metrics"]):  # fmt: skip
                yield Attempt(f"old schema, read-only: {' '.join(cmd)}", [*cmd, "--db", db], (0,))
            yield Attempt("old schema, read-only: merge", ["merge", str(work / "m2.db"), db], (2,))


def run(quick: bool, work: Path) -> BenchResult:
    res = BenchResult("hostile", quick)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("NOTIFY_SOCKET", None)
    env.pop("STATE_DIRECTORY", None)
    base = work / "base.db"
    _passing_run(base, env)
    tracebacks = unexpected = multi = 0
    # each root attempt is replayed as it is yielded: while its filesystem is mounted
    res.rows = [_replay(a, env) for a in _root_attempts(work)]
    res.rows += [_replay(a, env) for a in _attempts(work, base)]
    for row in res.rows:
        tracebacks += row["traceback"] == "YES"
        unexpected += row["code"] == "UNEXPECTED"
        multi += row["lines"] not in ("0", "1")
    if not any(r["attempt"].startswith("disk fills") for r in res.rows):
        res.notes.append("not root here: the full-disk and read-only-storage attempts were skipped")
    res.metrics = {
        "attempts": len(res.rows),
        "tracebacks": tracebacks,
        "unexpected_exit_codes": unexpected,
        "more_than_one_error_line": multi,
    }
    res.targets = [
        Target("tracebacks", tracebacks, 0, "<=", "attempts"),
        Target("unexpected exit codes", unexpected, 0, "<=", "attempts"),
    ]
    return res


def _replay(a: Attempt, env: dict[str, str]) -> dict[str, Any]:
    p = _soakd(a, env)
    lines = _error_lines(p.stderr)
    tb = "Traceback (most recent call last)" in p.stderr
    return {
        "attempt": a.name,
        "exit": p.returncode,
        "code": "ok" if p.returncode in a.expect else "UNEXPECTED",
        "traceback": "YES" if tb else "no",
        "lines": str(len(lines)),
        "last line": (lines[-1] if lines else "")[:90],
    }


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())

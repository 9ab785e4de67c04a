"""How much soak time ``run.stop_on_fail`` saves, and what it costs: each planted fault of
bench/planted.py soaked twice through the real CLI, the whole planned length and with
``run.stop_on_fail = true``, and healthy soaks (different seeds) with it. The table gives
each pair's verdicts (they must agree), how long each ran and the criterion that stopped
the run; then the healthy seeds, each of which must run its whole length and PASS (a false
early stop would be a FAIL a full run would not have given). docs/benchmarks.md quotes it.

    .venv/bin/python -m bench.early_stop               # 40 s runs, 3 at a time (~5 min)
    .venv/bin/python -m bench.early_stop --duration 60 --seeds 20
    .venv/bin/python -m bench.early_stop --auto --seeds 10 --duration 90
    .venv/bin/python -m bench.early_stop --auto --issue --jobs 8   # fixed 10 min (~30 min)
    .venv/bin/python -m bench.early_stop --spinners 2              # beside two CPU spinners

``--spinners N`` runs N busy-looping processes beside the soaks for the whole bench (killed
when it ends), the shared host of issue 31: a healthy seed must then not FAIL (INVALID "the
host was contended" is the honest answer), a planted fault must not PASS. The load average
before and after is printed.

``--issue`` soaks the three faults issue 22 names (a 5 MB/min leak, a creeping frame age, an
error storm) and the healthy seeds for a fixed 10 minutes with soakd's default criteria
(4 s floor windows, 60 s minimum), and against ``duration = "auto"``, ``max_duration``
10 minutes.

Exits 1 when a pair's verdicts differ or a healthy seed stopped early or did not PASS.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.planted import BASE, FAULTS, REPO
from soakd.environment import cpu_model

#: the planted faults of bench/planted.py that end in FAIL within a soak's length
FAULT_NAMES = ("leak", "leak-under-sawtooth", "overload", "errors", "slowing-model", "backlog")

#: issue 22's three faults, for a 10-minute soak at soakd's default floor window and minimum
#: length: (name, settings)
ISSUE_FAULTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leak (5 MB/min)", ("workload.leak_mb_per_min=5",)),
    # a backlog of tiny frames that grows by ~0.1 frame/s: frame age creeps ~0.5 s/min, no
    # frame is dropped and memory stays flat
    ("creeping frame age (99 ms model at 10 fps, consume oldest)",
     ("run.fps=10", "run.consume='oldest'", "run.max_queue=4096", "source.width=8",
      "source.height=8", "workload.infer_ms=99", "workload.decode_ms=0.5")),
    ("error storm (every 30th frame raises)", ("workload.error_every=30",)),
)  # fmt: skip
ISSUE_CRITERIA = ("criteria.min_duration_s=60", "criteria.floor_window_s=4")


def _run(name: str, sets: tuple[str, ...], duration: float, db: Path) -> dict[str, Any]:
    args = [a for kv in (*BASE, *sets) for a in ("--set", kv)]
    # --duration would beat a --set run.duration='auto' (flags beat --set)
    fixed = (
        []
        if any(kv.startswith("run.duration=") for kv in sets)
        else ["--duration", f"{duration:g}"]
    )
    cmd = [sys.executable, "-m", "soakd", "run", "--no-live", "--db", str(db), *fixed, *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=duration * 4)
    with sqlite3.connect(db) as conn:
        rid, verdict, dur = conn.execute(
            "SELECT id, verdict, duration_s FROM runs ORDER BY started_unix DESC LIMIT 1"
        ).fetchone()
        stop = conn.execute(
            "SELECT json_extract(data, '$.criterion'), t FROM events WHERE run_id = ?"
            " AND kind = 'early_stop'",
            (rid,),
        ).fetchone()
        decided = conn.execute(
            "SELECT t FROM events WHERE run_id = ? AND kind = 'decided'", (rid,)
        ).fetchone()
    return {"name": name, "verdict": verdict, "exit": proc.returncode, "duration_s": dur,
            "stopped_by": stop[0] if stop else None,
            "decided": f"decided at {decided[0]:.0f} s" if decided else None}  # fmt: skip


def _soak_all(
    jobs: list[tuple[str, tuple[str, ...]]], duration: float, workers: int = 3
) -> dict[str, Any]:
    """Every (name, settings) soaked, ``workers`` at a time, each on its own database: rows
    by name, each printed to stderr as it ends."""

    def one(i: int, job: tuple[str, tuple[str, ...]]) -> dict[str, Any]:
        row = _run(job[0], job[1], duration, Path(tmp) / f"{i}.db")
        why = row["stopped_by"] or row["decided"] or ""
        print(f"{row['name']}: {row['verdict']} after {row['duration_s']:.0f} s {why}",
              file=sys.stderr, flush=True)  # fmt: skip
        return row

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(workers) as pool:
        rows = list(pool.map(one, range(len(jobs)), jobs))
    return {r["name"]: r for r in rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=40.0, help="planned seconds a run")
    ap.add_argument("--seeds", type=int, default=10, help="healthy soaks with stop_on_fail")
    ap.add_argument(
        "--auto", action="store_true", help='the fixed length against run.duration = "auto"'
    )
    ap.add_argument(
        "--issue", action="store_true",
        help="with --auto: issue 22's three faults, a fixed 10 minutes, default criteria",
    )  # fmt: skip
    ap.add_argument("--jobs", type=int, default=3, help="soaks at a time")
    ap.add_argument("--spinners", type=int, default=0, help="CPU spinners beside the soaks")
    a = ap.parse_args(argv)
    with _spinners(a.spinners):
        return _main(a)


@contextmanager
def _spinners(n: int) -> Iterator[None]:
    """``n`` processes spinning on a CPU each for the block; the load average around it."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    print(f"spinners: {n}; load average before: {os.getloadavg()[0]:.1f}", file=sys.stderr)
    try:
        yield
    finally:
        print(f"load average at the end: {os.getloadavg()[0]:.1f}", file=sys.stderr)
        for p in procs:
            p.kill()
            p.wait()


def _main(a: argparse.Namespace) -> int:
    if a.issue:
        a.auto, a.duration = True, 600.0
    faults = [(f.name, f.settings) for f in FAULTS if f.name in FAULT_NAMES]
    if a.issue:
        faults = [(n, (*sets, *ISSUE_CRITERIA)) for n, sets in ISSUE_FAULTS]
    jobs: list[tuple[str, tuple[str, ...]]] = []
    if a.auto:
        return _auto(a, faults)
    for name, sets in faults:
        jobs += [(f"{name}|fixed", sets), (f"{name}|early", (*sets, "run.stop_on_fail=true"))]
    for seed in range(a.seeds):
        jobs.append((f"healthy-{seed}|early", ("workload.jitter=0.1", f"workload.seed={seed}",
                                                 "run.stop_on_fail=true")))  # fmt: skip
    by = _soak_all(jobs, a.duration, a.jobs)
    print(f"CPU: {cpu_model()}; planned {a.duration:g} s a run\n")
    print("| planted fault | verdict, whole length | verdict, stop_on_fail | ran | stopped by |")
    print("|---|---|---|---:|---|")
    bad, ratios = 0, []
    for name, _sets in faults:
        fx, ea = by[f"{name}|fixed"], by[f"{name}|early"]
        same = fx["verdict"] == ea["verdict"]
        bad += not same
        ratio = ea["duration_s"] / fx["duration_s"]
        ratios.append(ratio)
        print(f"| {name} | {fx['verdict']} | {ea['verdict']}{'' if same else ' **differs**'} "
              f"| {ea['duration_s']:.1f} s of {fx['duration_s']:.1f} s ({ratio:.0%}) "
              f"| {ea['stopped_by'] or '-'} |")  # fmt: skip
    print(
        f"\nmedian time to the verdict with stop_on_fail: {statistics.median(ratios):.0%} of"
        " the whole length"
    )
    healthy = [r for r in by.values() if r["name"].startswith("healthy-")]
    false_stops = [r for r in healthy if r["stopped_by"]]
    not_pass = [r for r in healthy if r["verdict"] != "PASS"]
    false_fails = [r for r in healthy if r["verdict"] == "FAIL"]
    false_passes = [r for r in by.values() if not r["name"].startswith("healthy-")
                    and r["verdict"] == "PASS"]  # fmt: skip
    print(
        f"healthy seeds: {len(healthy)}; stopped early: {len(false_stops)}; "
        f"FAIL (false FAILs): {len(false_fails)}; "
        f"not PASS: {len(not_pass)} {[(r['name'], r['verdict']) for r in not_pass]}\n"
        f"planted-fault runs PASSed (false PASSes): {len(false_passes)} of {2 * len(faults)}"
    )
    # beside spinners a healthy seed may be INVALID (the host's), never FAIL
    unjudged = not_pass if not a.spinners else []
    return 1 if bad or false_stops or false_fails or false_passes or unjudged else 0


def _auto(a: argparse.Namespace, faults: list[tuple[str, tuple[str, ...]]]) -> int:
    """Each fault and healthy seed soaked for the fixed length and with duration = "auto"
    (max_duration the same): the verdicts must agree (a healthy auto run PASSes, or is
    INVALID "undecided" where a fixed one PASSes untested: never a FAIL the fixed run does
    not give), and the time each took."""
    auto = ("run.duration='auto'", f"run.max_duration={a.duration:g}")
    healthy = ("workload.jitter=0.1", *(ISSUE_CRITERIA if a.issue else ()))
    cases = list(faults)
    cases += [(f"healthy-{i}", (*healthy, f"workload.seed={i}")) for i in range(a.seeds)]
    # the long fixed soaks first, so that the short auto ones fill the workers after them
    jobs = [(f"{n}|fixed", sets) for n, sets in cases] + [
        (f"{n}|auto", (*sets, *auto)) for n, sets in cases
    ]
    by = _soak_all(jobs, a.duration, a.jobs)
    print(f"CPU: {cpu_model()}; fixed {a.duration:g} s, auto at most {a.duration:g} s\n")
    print("| case | verdict, fixed | verdict, auto | auto ran | stopped by |")
    print("|---|---|---|---:|---|")
    bad, fail_t, pass_t = 0, list[float](), list[float]()
    for name, _ in cases:
        fx, au = by[f"{name}|fixed"], by[f"{name}|auto"]
        same = fx["verdict"] == au["verdict"]
        worse = au["verdict"] == "FAIL" and fx["verdict"] != "FAIL"
        bad += worse or (au["verdict"] == "PASS" and fx["verdict"] != "PASS")
        (fail_t if au["verdict"] == "FAIL" else pass_t).append(au["duration_s"] / fx["duration_s"])
        flag = "" if same else (" **worse**" if worse else " (differs)")
        print(f"| {name} | {fx['verdict']} | {au['verdict']}{flag} | {au['duration_s']:.1f} s "
              f"| {au['stopped_by'] or au['decided'] or '-'} |")  # fmt: skip
    if fail_t:
        print(f"\nmedian time to a FAIL: {statistics.median(fail_t):.0%} of the fixed length")
    if pass_t:
        print(f"median time to a PASS or INVALID: {statistics.median(pass_t):.0%}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

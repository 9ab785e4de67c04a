"""Mutation testing of the code that decides PASS or FAIL and of the exit-code path.

Each mutant is one hand-made bug a user would feel (a text replacement in one file) and the
test files that must catch it. The project is copied once to a temporary folder; each mutant
is applied there, its tests run with ``PYTHONPATH`` pointing at the copy (so the installed
package is shadowed), and the file restored. A mutant whose text is no longer in the code is
reported ``stale`` and counts against the score, so the list stays true as the code changes.

    nice -n 10 .venv/bin/python -m bench.mutate   # all mutants (docs/benchmarks.md: time)
    .venv/bin/python -m bench.mutate --check    # only check that no mutant is stale
    .venv/bin/python -m bench.mutate --only "untested trend"   # the mutants named so
    .venv/bin/python -m bench.mutate --only "(#23)"   # issue 23's boundary pins only
    .venv/bin/python -m bench.mutate --only "(#22)"   # stopping a run early
    .venv/bin/python -m bench.mutate --only "(#35"   # issue 35's criteria, early, server, served
    .venv/bin/python -m bench.mutate --jobs 2   # two mutants at once, each on its own copy

The mutants live in bench/mutants/, one module per area of the code. A mutant shown to be
equivalent (no verdict or reported number can change) keeps its reason there, is checked for
staleness, and is listed but neither run nor counted.

Exits 1 when fewer than 95 % of the mutants are killed (or any is stale). Every test file
and node id the mutants name is first run once on the unmutated copy: a mutant whose tests
already fail there (someone's work in progress, a flaky test) is reported ``baseline`` and
is not counted as killed.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.mutants import ALL, Mutant

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.95

MUTANTS: tuple[Mutant, ...] = tuple(m for m in ALL if not m.equivalent)
EQUIVALENT: tuple[Mutant, ...] = tuple(m for m in ALL if m.equivalent)


def _stale(m: Mutant, root: Path) -> bool:
    return m.old not in (root / m.path).read_text()


def _run_tests(m: Mutant, copy: Path, timeout_s: float) -> str:
    return _pytest(m.tests, copy, timeout_s)


def _pytest(tests: tuple[str, ...], copy: Path, timeout_s: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "2",
           *tests]  # fmt: skip
    try:
        r = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "killed (timeout)"
    return "survived" if r.returncode == 0 else "killed"


def broken_baselines(
    copy: Path, timeout_s: float, mutants: tuple[Mutant, ...] = MUTANTS
) -> set[tuple[str, ...]]:
    """The test sets (of ``mutants``) that do not pass on the unmutated copy: every test
    file or node id they name, run once together, and each set with a failure in it."""
    items = sorted({t for m in mutants for t in m.tests})
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-n", "2",
           *items]  # fmt: skip
    try:
        r = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True,
                           timeout=timeout_s * 4)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {m.tests for m in mutants}
    failed = [
        line.split()[1]
        for line in r.stdout.splitlines()
        if line.startswith(("FAILED ", "ERROR ")) and len(line.split()) > 1
    ]
    if r.returncode not in (0, 1) and not failed:  # collection or usage error: all suspect
        return {m.tests for m in mutants}
    return {m.tests for m in mutants if any(_names(t, f) for t in m.tests for f in failed)}


def _names(item: str, nodeid: str) -> bool:
    """``item`` (a test file or node id) names the failed test ``nodeid``."""
    return nodeid == item or nodeid.startswith((item + "::", item + "["))


def run_one(m: Mutant, copy: Path, timeout_s: float, broken: set[tuple[str, ...]]) -> str:
    if _stale(m, copy):
        return "stale"
    if m.tests in broken:
        return "baseline"
    f = copy / m.path
    original = f.read_text()
    f.write_text(original.replace(m.old, m.new, 1))
    try:
        return _run_tests(m, copy, timeout_s)
    finally:
        f.write_text(original)


def _copy_project(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("soakd", "tests", "bench", "configs", "pyproject.toml", "README.md"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = [m.name for m in ALL if _stale(m, REPO)]
        print("stale mutants: " + (", ".join(stale) if stale else "none"))
        return 1 if stale else 0
    # --only TEXT: just the mutants whose name contains TEXT (to rerun one after a fix)
    only = argv[argv.index("--only") + 1] if "--only" in argv[:-1] else ""
    chosen = tuple(m for m in MUTANTS if only in m.name)
    if not chosen:
        print(f"no mutant's name contains {only!r}", file=sys.stderr)
        return 2
    # --jobs N: N mutants at once, each job on its own copy of the project
    jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv[:-1] else 1
    results: list[tuple[Mutant, str, float]] = []
    with tempfile.TemporaryDirectory(prefix="soakd-mutate-") as tmp:
        copies: queue.SimpleQueue[Path] = queue.SimpleQueue()
        for j in range(max(1, jobs)):
            copies.put(_copy_project(Path(tmp) / f"job{j}"))
        first = copies.get()
        broken = broken_baselines(first, 300, chosen)
        copies.put(first)
        for tests in sorted(broken):
            print(f"baseline: {' '.join(tests)} fails unmutated", flush=True)
        lock = threading.Lock()

        def one(m: Mutant) -> None:
            copy = copies.get()
            try:
                t0 = time.monotonic()
                got = (m, run_one(m, copy, 300, broken), time.monotonic() - t0)
            finally:
                copies.put(copy)
            with lock:
                results.append(got)
                print(f"{got[1]:<17} {got[2]:6.1f} s  {m.name}", flush=True)

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            list(pool.map(one, chosen))
    killed = sum(r.startswith("killed") for _, r, _ in results)
    score = killed / len(results)
    print(f"\nmutation score: {killed}/{len(results)} killed = {score:.0%} (target {TARGET:.0%})")
    for m, r, _ in results:
        if not r.startswith("killed"):
            print(f"  {r}: {m.name} ({m.path})")
    equivalent = [m for m in EQUIVALENT if only in m.name]
    if equivalent:
        print(f"\n{len(equivalent)} equivalent mutant(s), not run and not counted:")
        for m in equivalent:
            print(f"  {m.name} ({m.path}): {m.equivalent}")
    return 0 if score >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
